//! Reading the ranks' progress files after a timeout: which rank is behind.
//!
//! Each rank writes its last collective to `rank-R` in the run's progress
//! directory (see `SAFEMLX_DIST_PROGRESS_DIR`): `entered OP SEQ ...`, or
//! `waits OP SEQ ...` when its wait timed out. A rank that is stopped or
//! dead cannot say it is behind, but its file still says where it was.

use std::path::{Path, PathBuf};

use super::LaunchError;

/// A run's progress directory, removed on drop.
#[derive(Debug)]
pub(crate) struct ProgressDir {
    path: PathBuf,
}

impl ProgressDir {
    pub(crate) fn new() -> Result<Self, LaunchError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let path = std::env::temp_dir().join(format!(
            "safemlx-launch-{}-{nanos}-progress",
            std::process::id()
        ));
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
                let text = std::fs::read_to_string(self.path.join(format!("rank-{r}"))).ok()?;
                Record::parse(text.trim())
            })
            .collect()
    }

    /// What the ranks' files say, as a sentence; `None` when no rank
    /// entered a collective.
    pub(crate) fn diagnose(&self, ranks: usize) -> Option<String> {
        diagnose(&self.records(ranks))
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

#[derive(Debug, Clone, PartialEq)]
struct Record {
    /// The rank's own timeout fired in it.
    waits: bool,
    op: String,
    seq: u64,
}

impl Record {
    fn parse(line: &str) -> Option<Self> {
        let mut words = line.split_whitespace();
        let waits = match words.next()? {
            "entered" => false,
            "waits" => true,
            _ => return None,
        };
        let op = words.next()?.to_owned();
        let seq = words.next()?.parse().ok()?;
        Some(Self { waits, op, seq })
    }
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
}
