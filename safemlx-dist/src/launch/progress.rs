//! Reading the ranks' progress files after a timeout: which rank is behind.
//!
//! Each rank writes its last collective to `rank-R` in the run's progress
//! directory (see `SAFEMLX_DIST_PROGRESS_DIR`): `entered OP SEQ ...`, or
//! `waits OP SEQ ...` when its wait timed out. A rank that is stopped or
//! dead cannot say it is behind, but its file still says where it was.
//! A rank enters a collective when it builds it, before it runs it, so a
//! rank stopped while its step runs has entered what its peers wait in:
//! its heartbeat, `alive-R` (Unix milliseconds, written four times a
//! second by a thread of its own), tells it apart. The names and formats
//! are the launcher/rank contract's (`runtime/contract.rs`).

use std::path::{Path, PathBuf};

use super::LaunchError;
use crate::runtime::contract::{self, Record};

/// Removes what launchers that were SIGKILLed before any rank started
/// left in the temporary directory: `safemlx-launch-PID-N-progress`
/// directories (Open MPI's session directory inside) and
/// `safemlx-launch-PID-N.json` hostfiles whose launcher PID no longer
/// runs. (Once a rank has joined, the ranks remove them themselves.) A
/// PID that runs again, for another program, keeps its files.
pub(crate) fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        let Some(rest) = name.strip_prefix("safemlx-launch-") else {
            continue;
        };
        let (stem, is_dir) = match rest.strip_suffix("-progress") {
            Some(stem) => (stem, true),
            None => match rest.strip_suffix(".json") {
                Some(stem) => (stem, false),
                None => continue,
            },
        };
        let Some((pid, nanos)) = stem.split_once('-') else {
            continue;
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(pid) || !digits(nanos) || Path::new("/proc").join(pid).exists() {
            continue;
        }
        let path = entry.path();
        let _ = if is_dir {
            std::fs::remove_dir_all(path)
        } else {
            std::fs::remove_file(path)
        };
    }
}

/// A run's progress directory, removed on drop.
#[derive(Debug)]
pub(crate) struct ProgressDir {
    path: PathBuf,
}

/// `safemlx-launch-PID-N`, unique to this call: `N` is the time in
/// nanoseconds followed by four digits of a process-wide count, since two
/// launches of one process (tests run in threads) read the same clock
/// value often enough to collide (`File exists`, seen in CI).
pub(crate) fn temp_stem() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let count = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10_000;
    format!("safemlx-launch-{}-{nanos}{count:04}", std::process::id())
}

impl ProgressDir {
    pub(crate) fn new() -> Result<Self, LaunchError> {
        let path = std::env::temp_dir().join(format!("{}-progress", temp_stem()));
        std::fs::create_dir(&path)
            .map_err(|e| LaunchError::Io(format!("could not create {}: {e}", path.display())))?;
        Ok(Self { path })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn records(&self, ranks: usize) -> Vec<Option<Record>> {
        (0..ranks)
            .map(|r| {
                let text = std::fs::read_to_string(contract::record_path(&self.path, r)).ok()?;
                Record::parse(text.trim())
            })
            .collect()
    }

    /// Each rank's silence: milliseconds since its last heartbeat (`None`:
    /// it never wrote one).
    fn silences(&self, ranks: usize) -> Vec<Option<u64>> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        (0..ranks)
            .map(|r| {
                let text = std::fs::read_to_string(contract::heartbeat_path(&self.path, r)).ok()?;
                let at = contract::parse_heartbeat(&text)?;
                Some(u64::try_from(now.saturating_sub(at)).unwrap_or(u64::MAX))
            })
            .collect()
    }

    /// What the ranks' files say, as a sentence; `None` when no rank
    /// entered a collective or wrote a heartbeat.
    pub(crate) fn diagnose(&self, ranks: usize) -> Option<String> {
        explain(&self.records(ranks), &self.silences(ranks))
    }

    /// Whether some rank's collective timed out (its file says `waits`).
    pub(crate) fn any_timed_out(&self, ranks: usize) -> bool {
        self.records(ranks).iter().flatten().any(|r| r.waits)
    }
}

impl Drop for ProgressDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A heartbeat older than this means the rank is stopped or stuck whole
/// (see `runtime/contract.rs`).
const SILENT_MS: u64 = contract::SILENT.as_millis() as u64;

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
fn explain(records: &[Option<Record>], silences: &[Option<u64>]) -> Option<String> {
    let silent = silent(silences);
    let sentence = diagnose(records);
    let latest = records.iter().flatten().max_by_key(|r| r.seq);
    let behind: Vec<usize> = latest.map_or_else(Vec::new, |latest| {
        (0..records.len())
            .filter(|&r| records[r].as_ref().is_none_or(|rec| rec.seq < latest.seq))
            .collect()
    });
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
            (other, _) => other,
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
        // fewer operations than a silent one (pipeline stages count their
        // own sends and receives, so their numbers differ): the silence
        // says who, first.
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
    let verb = if others.len() == 1 { "waits" } else { "wait" };
    let waiting = records
        .iter()
        .enumerate()
        .filter(|(r, _)| others.contains(r))
        .filter_map(|(_, rec)| rec.as_ref())
        .max_by_key(|rec| rec.seq)
        .map_or_else(
            || format!("{verb} to join the group"),
            |rec| format!("{verb} in {} #{}", rec.op, rec.seq),
        );
    format!("{}; {} {waiting}", each.join("; "), list(&others))
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

/// The sentence for the ranks' records (`None`: no file, or no collective).
fn diagnose(records: &[Option<Record>]) -> Option<String> {
    let ahead = records.iter().flatten().max_by_key(|r| r.seq)?.clone();
    let behind: Vec<usize> = (0..records.len())
        .filter(|&r| records[r].as_ref().is_none_or(|rec| rec.seq < ahead.seq))
        .collect();
    let at: Vec<usize> = (0..records.len()).filter(|r| !behind.contains(r)).collect();
    if behind.is_empty() {
        return Some(format!(
            "every rank entered {} #{} and none completed it (a transport problem, or a rank stuck inside it)",
            ahead.op, ahead.seq
        ));
    }
    let lasts: Vec<String> = behind
        .iter()
        .map(|&r| match &records[r] {
            Some(rec) => format!("rank {r} is at {} #{}", rec.op, rec.seq),
            None => format!("rank {r} entered no collective"),
        })
        .collect();
    // Those at the last collective wait in it (it needs the ranks behind),
    // whether or not their own timeout fired first.
    let waiting = if at.len() > 1 {
        "wait in it"
    } else {
        "waits in it"
    };
    Some(format!(
        "{} never entered {} #{} ({}); {} {waiting}",
        list(&behind),
        ahead.op,
        ahead.seq,
        lasts.join(", "),
        list(&at),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(waits: bool, op: &str, seq: u64) -> Option<Record> {
        Some(Record {
            waits,
            op: op.to_owned(),
            seq,
        })
    }

    #[test]
    fn the_rank_behind_is_named() {
        assert_eq!(
            Record::parse("waits all_sum 38 all_sum #38 (group of 4, [1, 576] Float32)"),
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
}
