//! Unit cases of the launcher's sentence (`explain.rs`): made-up records
//! and heartbeats for stops before, inside and after each collective and
//! stage transfer, in tensor and pipeline layouts.

use super::*;

/// A record in the world group, or counted by the rank itself for a
/// stage transfer.
fn rec(waits: bool, op: &str, seq: u64) -> Option<Record> {
    let group = if op.starts_with("stage_") {
        contract::OWN_COUNT
    } else {
        contract::WORLD
    };
    rec_in(waits, op, seq, group)
}

fn rec_in(waits: bool, op: &str, seq: u64, group: &str) -> Option<Record> {
    Some(Record {
        waits,
        op: op.to_owned(),
        seq,
        group: group.to_owned(),
    })
}

#[test]
fn the_rank_behind_is_named() {
    assert_eq!(
        Record::parse("waits all_sum 38 world all_sum #38 (group of 4, [1, 576] Float32)"),
        rec(true, "all_sum", 38)
    );
    let records = [
        rec(true, "all_sum", 38),
        rec(true, "all_sum", 38),
        rec(false, "all_sum", 37),
        rec(true, "all_sum", 38),
    ];
    assert_eq!(
        diagnose(&records).unwrap(),
        "rank 2 never entered all_sum #38 (rank 2 is at all_sum #37); ranks 0, 1, 3 wait in it"
    );
    let records = [rec(true, "all_gather", 5), None];
    assert_eq!(
        diagnose(&records).unwrap(),
        "rank 1 never entered all_gather #5 (rank 1 entered no collective); rank 0 waits in it"
    );
    let records = [rec(true, "all_sum", 3), rec(true, "all_sum", 3)];
    assert!(diagnose(&records)
        .unwrap()
        .starts_with("every rank entered all_sum #3 and none completed it"));
    assert_eq!(diagnose(&[None, None]), None);
}

#[test]
fn a_rank_without_a_heartbeat_is_named_as_silent() {
    // Rank 1 stopped while its step ran: it entered what rank 0 waits in.
    let records = [rec(true, "all_gather", 187), rec(false, "all_gather", 187)];
    let quiet = silent(&[Some(40), Some(3200)]);
    assert_eq!(quiet, [(1, Some(3200))]);
    assert_eq!(
        name_silent(&quiet, &records),
        "rank 1 shows no sign of life for 3.2 s (stopped, or stuck whole); it last entered all_gather #187; rank 0 waits in all_gather #187"
    );
    // Stopped before it joined: no heartbeat, no record.
    let quiet = silent(&[Some(100), None, Some(90)]);
    assert_eq!(
        name_silent(&quiet, &[None, None, None]),
        "rank 1 shows no sign of life since it started (stopped, or stuck whole); it entered no collective; ranks 0, 2 wait to join the group"
    );
    // Pipeline stages count their own sends and receives: stage 0
    // waits in its receive #3 while the stopped stage 1 had entered its
    // all_sum #4. The stopped rank leads, not the live one "behind".
    let records = [rec(true, "stage_recv", 3), rec(false, "all_sum", 4)];
    assert_eq!(
        explain(&records, &[Some(30), Some(5400)]).unwrap(),
        "rank 1 shows no sign of life for 5.4 s (stopped, or stuck whole); it last entered all_sum #4; rank 0 waits in stage_recv #3"
    );
    // A silent rank that is behind in the same collectives: the
    // records' sentence, then its silence.
    let records = [
        rec(true, "all_sum", 8),
        rec(true, "all_sum", 8),
        rec(false, "all_sum", 7),
    ];
    assert_eq!(
        explain(&records, &[Some(10), Some(20), Some(2100)]).unwrap(),
        "rank 2 never entered all_sum #8 (rank 2 is at all_sum #7); ranks 0, 1 wait in it; rank 2 shows no sign of life for 2.1 s (stopped, or stuck whole)"
    );
    // Every rank alive (a slow run), or no heartbeats at all: nobody.
    assert!(silent(&[Some(10), Some(200)]).is_empty());
    assert!(silent(&[None, None]).is_empty());
}

/// Heartbeats as Unix milliseconds: rank `r` last beat at `at[r]`.
fn beats(at: &[Option<u128>]) -> Vec<Option<u64>> {
    silences(at)
}

#[test]
fn silence_is_judged_against_the_other_ranks_not_the_reading_time() {
    // Rank 0 timed out and exited at 100 s; rank 1 stopped 5 s before.
    // The launcher reads at any later time: rank 1 is still the silent one.
    assert_eq!(beats(&[Some(100_000), Some(95_000)]), [Some(0), Some(5000)]);
    assert_eq!(beats(&[Some(100_000), None]), [Some(0), None]);
    assert_eq!(beats(&[None, None]), [None, None]);
    // Stopped together (the launcher stopped them): nobody silent.
    assert!(silent(&beats(&[Some(100_000), Some(99_900)])).is_empty());
}

/// The sentence for 2 ranks of tensor parallelism (one world group):
/// rank 1 stopped 5 s before rank 0's timeout fired.
fn tensor(rank0: Option<Record>, rank1: Option<Record>) -> String {
    explain(&[rank0, rank1], &beats(&[Some(100_000), Some(95_000)])).unwrap()
}

#[test]
fn a_stopped_tensor_parallel_rank_is_named_wherever_it_stopped() {
    let silent1 = "rank 1 shows no sign of life for 5.0 s (stopped, or stuck whole)";
    // Before all_sum #4 (between #3 and #4), or after #3 completed.
    assert_eq!(
        tensor(rec(true, "all_sum", 4), rec(false, "all_sum", 3)),
        format!("rank 1 never entered all_sum #4 (rank 1 is at all_sum #3); rank 0 waits in it; {silent1}")
    );
    // Inside all_sum #4: both entered it.
    assert_eq!(
        tensor(rec(true, "all_sum", 4), rec(false, "all_sum", 4)),
        format!("{silent1}; it last entered all_sum #4; rank 0 waits in all_sum #4")
    );
    // Before it joined.
    assert_eq!(
        tensor(rec(true, "all_gather", 1), None),
        format!("rank 1 never entered all_gather #1 (rank 1 entered no collective); rank 0 waits in it; {silent1}")
    );
}

/// The sentence for 2 pipeline stages of one rank each: rank 1 stopped.
fn stages(rank0: Option<Record>, rank1: Option<Record>) -> String {
    explain(&[rank0, rank1], &beats(&[Some(100_000), Some(95_000)])).unwrap()
}

#[test]
fn a_stopped_pipeline_stage_is_named_and_transfer_counts_are_never_compared() {
    let silent1 = "rank 1 shows no sign of life for 5.0 s (stopped, or stuck whole)";
    // Inside its compute, after receiving: stage 0 waits for its reply.
    assert_eq!(
        stages(rec(true, "stage_recv", 3), rec(false, "stage_recv", 3)),
        format!("{silent1}; it last entered stage_recv #3; rank 0 waits in stage_recv #3")
    );
    // Before its send, after its receive; and inside the send.
    assert_eq!(
        stages(rec(true, "stage_recv", 3), rec(false, "stage_send", 2)),
        format!("{silent1}; it last entered stage_send #2; rank 0 waits in stage_recv #3")
    );
    // CI's case: stage 1 stopped inside a world all_sum (#4) while
    // stage 0 waits in its own receive #3: the counts are of different
    // groups; the healthy rank 0 is not blamed.
    assert_eq!(
        stages(rec(true, "stage_recv", 3), rec(false, "all_sum", 4)),
        format!("{silent1}; it last entered all_sum #4; rank 0 waits in stage_recv #3")
    );
    // Stage 0 entered the world collective; the stopped stage 1 is
    // still in its own send: rank 1 is named, not compared.
    assert_eq!(
        stages(rec(true, "all_sum", 4), rec(false, "stage_send", 9)),
        format!("{silent1}; it last entered stage_send #9; rank 0 waits in all_sum #4")
    );
    // Nobody silent (both stopped by the launcher's own timeout):
    // where each is, without a claim.
    assert_eq!(
        explain(
            &[rec(false, "stage_recv", 3), rec(false, "stage_send", 2)],
            &beats(&[Some(100_000), Some(99_900)])
        )
        .unwrap(),
        "rank 0 waits in stage_recv #3, rank 1 in stage_send #2"
    );
}

#[test]
fn a_stopped_rank_of_two_stages_of_two_is_named_in_its_stage() {
    // pp=2,tp=2: stage 0 = ranks 0, 1; stage 1 = ranks 2, 3 (their
    // axis group `2,3`). Rank 3 stopped before all_sum #7 of its stage.
    let records = [
        rec(false, "stage_recv", 2),
        rec(false, "stage_recv", 2),
        rec_in(true, "all_sum", 7, "2,3"),
        rec_in(false, "all_sum", 6, "2,3"),
    ];
    let heartbeats = beats(&[Some(100_000), Some(100_000), Some(100_000), Some(95_000)]);
    assert_eq!(
        explain(&records, &heartbeats).unwrap(),
        "rank 3 never entered all_sum #7 (rank 3 is at all_sum #6); rank 2 waits in it; rank 3 shows no sign of life for 5.0 s (stopped, or stuck whole)"
    );
    // Counts of stage 0's axis (`0,1`) are not compared with stage 1's.
    let records = [
        rec_in(true, "all_sum", 40, "0,1"),
        rec_in(false, "all_sum", 40, "0,1"),
        rec_in(false, "all_sum", 7, "2,3"),
        rec_in(false, "all_sum", 6, "2,3"),
    ];
    assert_eq!(
        diagnose(&records).unwrap(),
        "ranks 0, 1 entered all_sum #40 and none completed it (a transport problem, or a rank stuck inside it)"
    );
    // Rank 1 stopped in a stage transfer while rank 0 waits in their
    // axis's all_sum: rank 1 is in another group, not "behind".
    let records = [
        rec_in(true, "all_sum", 40, "0,1"),
        rec(false, "stage_send", 12),
        None,
        None,
    ];
    assert_eq!(
        explain(&records, &beats(&[Some(100_000), Some(90_000), Some(100_000), Some(100_000)])).unwrap(),
        "rank 1 shows no sign of life for 10.0 s (stopped, or stuck whole); it last entered stage_send #12; rank 0 waits in all_sum #40, rank 2 to join the group, rank 3 to join the group"
    );
}

#[test]
fn a_rank_stopped_before_it_started_is_named_while_the_others_join() {
    // MPI: rank 0 stopped before its first heartbeat; rank 1 timed out
    // joining (no record: records start once a rank has joined).
    assert_eq!(
        explain(&[None, None], &beats(&[None, Some(100_000)])).unwrap(),
        "rank 0 shows no sign of life since it started (stopped, or stuck whole); it entered no collective; rank 1 waits to join the group"
    );
}
