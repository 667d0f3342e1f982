//! The launcher's sentence after a timeout: which rank is behind, or
//! stopped, from the ranks' progress records and heartbeats (read by
//! `progress.rs`; written by the ranks, `runtime/progress.rs`).
//!
//! A rank's silence is judged against the newest heartbeat of the run,
//! and collective counts are compared only within one group: a pipeline
//! stage's sends and receives are counted per rank, and each stage's
//! tensor-parallel axis has counts of its own.

use crate::runtime::contract::{self, Record};

/// A heartbeat older than this means the rank is stopped or stuck whole
/// (see `runtime/contract.rs`).
const SILENT_MS: u64 = contract::SILENT.as_millis() as u64;

/// Each rank's silence: how much older its last heartbeat is than the
/// newest rank's (`None`: it never wrote one). Judged against the other
/// ranks, not the time the launcher reads: under load the launcher may
/// read after the rank whose wait timed out has exited, when every
/// heartbeat is old, but the stopped rank's is still older by about the
/// timeout.
pub(super) fn silences(heartbeats: &[Option<u128>]) -> Vec<Option<u64>> {
    let newest = heartbeats.iter().flatten().max().copied();
    heartbeats
        .iter()
        .map(|at| {
            let (at, newest) = (at.as_ref()?, newest?);
            Some(u64::try_from(newest.saturating_sub(*at)).unwrap_or(u64::MAX))
        })
        .collect()
}

/// The ranks that show no sign of life, with their silence (`None`: never
/// a heartbeat), when some other rank shows one; none otherwise (no
/// heartbeats at all: ranks of another program, or files not written).
fn silent(silences: &[Option<u64>]) -> Vec<(usize, Option<u64>)> {
    let alive = silences.iter().flatten().any(|&ms| ms < SILENT_MS);
    if !alive {
        return Vec::new();
    }
    silences
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_none_or(|ms| ms >= SILENT_MS))
        .map(|(r, &s)| (r, s))
        .collect()
}

/// The sentence for the ranks' records and heartbeats (see `diagnose`).
pub(super) fn explain(records: &[Option<Record>], silences: &[Option<u64>]) -> Option<String> {
    let silent = silent(silences);
    let sentence = diagnose(records);
    let latest = reference(records);
    let behind = latest.map_or_else(Vec::new, |latest| Compared::new(records, latest).behind);
    if silent.is_empty() {
        let all_alive = silences.iter().all(|s| s.is_some_and(|ms| ms < SILENT_MS));
        // Without a rank whose own timeout fired (the launcher's
        // `--timeout` cut the run), live ranks are a moving snapshot:
        // one may be a step ahead of another without anyone behind.
        let timed_out = records.iter().flatten().any(|r| r.waits);
        return match (sentence, latest) {
            (Some(s), _) if all_alive && !behind.is_empty() && timed_out => Some(format!(
                "{s}; every rank shows signs of life (none is stopped)"
            )),
            (Some(_), Some(latest)) if all_alive => Some(format!(
                "every rank shows signs of life and entered {} #{} (a slow run, or a transport problem; none is stopped)",
                latest.op, latest.seq
            )),
            (Some(s), _) => Some(s),
            // Only counts of their own (pipeline stages' transfers): where
            // each rank is, without comparing them.
            (None, _) if records.iter().any(Option::is_some) => {
                let all: Vec<usize> = (0..records.len()).collect();
                Some(where_live(&all, records))
            }
            (None, _) => None,
        };
    }
    let behind_silent = behind.iter().all(|r| silent.iter().any(|s| s.0 == *r));
    match sentence {
        // The records name who is behind, and they are the silent ones:
        // say so, and how long each has been silent.
        Some(sentence) if !behind.is_empty() && behind_silent => {
            let quiet: Vec<String> = silent.iter().map(|&(r, ms)| silence(r, ms)).collect();
            Some(format!("{sentence}; {}", quiet.join("; ")))
        }
        // Every rank entered the same collective, or a live rank counts
        // fewer operations than a silent one: the silence says who, first.
        _ => Some(name_silent(&silent, records)),
    }
}

/// The sentence naming the silent ranks, where each was, and what the
/// others wait in.
fn name_silent(silent: &[(usize, Option<u64>)], records: &[Option<Record>]) -> String {
    let each: Vec<String> = silent
        .iter()
        .map(|&(r, ms)| {
            let at = match &records[r] {
                Some(rec) => format!("it last entered {} #{}", rec.op, rec.seq),
                None => "it entered no collective".to_owned(),
            };
            format!("{}; {at}", silence(r, ms))
        })
        .collect();
    let quiet: Vec<usize> = silent.iter().map(|s| s.0).collect();
    let others: Vec<usize> = (0..records.len()).filter(|r| !quiet.contains(r)).collect();
    format!("{}; {}", each.join("; "), where_live(&others, records))
}

/// Where the live ranks `others` wait: `ranks 0, 2 wait in all_sum #4`
/// when their records agree, else each one's (`rank 0 waits in
/// stage_recv #3, rank 2 in all_sum #4`); never compared.
fn where_live(others: &[usize], records: &[Option<Record>]) -> String {
    let at = |r: usize| match &records[r] {
        Some(rec) if rec.op != "joining" => format!("in {} #{}", rec.op, rec.seq),
        _ => "to join the group".to_owned(),
    };
    let places: Vec<String> = others.iter().map(|&r| at(r)).collect();
    if places.windows(2).all(|w| w[0] == w[1]) {
        let verb = if others.len() == 1 { "waits" } else { "wait" };
        let place = places.first().cloned().unwrap_or_default();
        return format!("{} {verb} {place}", list(others));
    }
    let each: Vec<String> = others
        .iter()
        .zip(&places)
        .enumerate()
        .map(|(k, (r, place))| match k {
            0 => format!("rank {r} waits {place}"),
            _ => format!("rank {r} {place}"),
        })
        .collect();
    each.join(", ")
}

/// `rank R shows no sign of life for S s (stopped, or stuck whole)`.
fn silence(rank: usize, ms: Option<u64>) -> String {
    let since = ms.map_or_else(
        || "since it started".to_owned(),
        |ms| format!("for {:.1} s", ms as f64 / 1000.0),
    );
    format!("rank {rank} shows no sign of life {since} (stopped, or stuck whole)")
}

fn list(ranks: &[usize]) -> String {
    let names: Vec<String> = ranks.iter().map(ToString::to_string).collect();
    match ranks.len() {
        1 => format!("rank {}", names[0]),
        _ => format!("ranks {}", names.join(", ")),
    }
}

/// The record counts are compared against: the furthest wait that timed
/// out, else the furthest collective, among counts that belong to a group
/// (a stage's sends and receives are counted per rank: never compared).
fn reference(records: &[Option<Record>]) -> Option<&Record> {
    let comparable = || records.iter().flatten().filter(|r| r.comparable());
    comparable()
        .filter(|r| r.waits)
        .max_by_key(|r| r.seq)
        .or_else(|| comparable().max_by_key(|r| r.seq))
}

/// The ranks of the reference record's group, sorted by what their
/// records say of it.
struct Compared {
    /// Members at the reference's count.
    at: Vec<usize>,
    /// Members with a lower count in the same group, or no record.
    behind: Vec<usize>,
    /// Members whose last record is in another group: not comparable.
    elsewhere: Vec<usize>,
}

impl Compared {
    fn new(records: &[Option<Record>], reference: &Record) -> Self {
        let members = reference.members(records.len()).unwrap_or_else(|| {
            // A group whose members the record does not name: those that
            // say they are in it.
            (0..records.len())
                .filter(|&r| {
                    records[r]
                        .as_ref()
                        .is_some_and(|rec| rec.group == reference.group)
                })
                .collect()
        });
        let ahead = records
            .iter()
            .flatten()
            .filter(|r| r.group == reference.group)
            .map(|r| r.seq)
            .max()
            .unwrap_or(reference.seq);
        let mut sorted = Self {
            at: Vec::new(),
            behind: Vec::new(),
            elsewhere: Vec::new(),
        };
        for r in members {
            match &records[r] {
                Some(rec) if rec.group != reference.group => sorted.elsewhere.push(r),
                Some(rec) if rec.seq >= ahead => sorted.at.push(r),
                _ => sorted.behind.push(r),
            }
        }
        sorted
    }
}

/// The sentence for the ranks' records (`None`: no file, or no collective).
fn diagnose(records: &[Option<Record>]) -> Option<String> {
    let reference = reference(records)?;
    let ahead = records
        .iter()
        .flatten()
        .filter(|r| r.group == reference.group)
        .max_by_key(|r| r.seq)?;
    let Compared {
        at,
        behind,
        elsewhere,
    } = Compared::new(records, reference);
    let where_each = |ranks: &[usize]| -> Vec<String> {
        ranks
            .iter()
            .map(|&r| match &records[r] {
                Some(rec) => format!("rank {r} is at {} #{}", rec.op, rec.seq),
                None => format!("rank {r} entered no collective"),
            })
            .collect()
    };
    // Ranks of the group whose last record is in another group (a stage
    // transfer, a mesh axis): their counts say nothing of this one.
    let others = if elsewhere.is_empty() {
        String::new()
    } else {
        format!(
            "; {} in another group ({})",
            list(&elsewhere),
            where_each(&elsewhere).join(", ")
        )
    };
    if behind.is_empty() {
        let who = if at.len() == records.len() {
            "every rank".to_owned()
        } else {
            list(&at)
        };
        return Some(format!(
            "{who} entered {} #{} and none completed it (a transport problem, or a rank stuck inside it){others}",
            ahead.op, ahead.seq
        ));
    }
    // Those at the last collective wait in it (it needs the ranks behind),
    // whether or not their own timeout fired first.
    let waiting = if at.len() > 1 {
        "wait in it"
    } else {
        "waits in it"
    };
    Some(format!(
        "{} never entered {} #{} ({}); {} {waiting}{others}",
        list(&behind),
        ahead.op,
        ahead.seq,
        where_each(&behind).join(", "),
        list(&at),
    ))
}

#[cfg(test)]
#[path = "explain_tests.rs"]
mod tests;
