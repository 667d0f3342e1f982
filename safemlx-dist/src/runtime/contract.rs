//! The launcher/rank contract, in one place: what a launcher puts in a
//! rank's environment, what a rank writes for its launcher, and how the
//! launcher reads it back.
//!
//! | direction | what | where |
//! |---|---|---|
//! | launcher -> rank | the run's secret | [`TOKEN_ENV`] |
//! | launcher -> rank | the launcher's `PID:START`, watched by the rank (it exits when its launcher is gone) | [`LAUNCHER_ENV`] |
//! | launcher -> rank | the progress directory | [`PROGRESS_DIR_ENV`] |
//! | launcher -> rank | the rank before it joins (ring, Open MPI) | [`RANK_ENVS`] |
//! | launcher -> rank | the backend it was started for | [`BACKEND_ENV`] |
//! | user -> rank | the collective and join timeouts | [`TIMEOUT_ENV`], [`JOIN_TIMEOUT_ENV`] |
//! | rank -> launcher | its last collective, one [`Record`] rewritten in place | `rank-R` ([`record_path`]) |
//! | rank -> launcher | its heartbeat, Unix milliseconds every [`HEARTBEAT`] | `alive-R` ([`heartbeat_path`]) |
//! | rank -> launcher | a wait that timed out | exit status [`TIMEOUT_EXIT`] |
//! | launcher -> rank | why the run is being stopped (`rank 1 failed (signal: 9 (SIGKILL))`), written before the ranks are signalled | `stopping` ([`stop_reason_path`]) |
//!
//! The rank's side (the progress records, the watchdog thread that writes
//! the heartbeat and ends a wait past its timeout, the launcher watch) is
//! in `progress.rs`, `deadline.rs` and `launcher_watch.rs`; the launcher's
//! (reading the records and heartbeats after a timeout) in
//! `launch/progress.rs`. Both use only what is here.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Seconds a wait on a collective may last (default: 600).
pub const TIMEOUT_ENV: &str = "SAFEMLX_DIST_TIMEOUT";
/// Seconds joining a group may last (default: the collective timeout, at
/// least [`MIN_JOIN_TIMEOUT`]): joining also waits for the slowest rank to
/// start.
pub const JOIN_TIMEOUT_ENV: &str = "SAFEMLX_DIST_JOIN_TIMEOUT";
/// The shortest default bound on joining a group: one minute.
pub const MIN_JOIN_TIMEOUT: Duration = Duration::from_secs(60);
/// The directory where each rank writes its progress (set by the launcher).
pub const PROGRESS_DIR_ENV: &str = "SAFEMLX_DIST_PROGRESS_DIR";
/// The exit status of a rank whose collective timed out (as `timeout(1)`'s).
pub const TIMEOUT_EXIT: i32 = 124;
/// The default timeout: 10 minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// The run's secret, which every rank of a group must hold and proves to
/// its peers at init. `safemlx-launch` sets a fresh one per run unless
/// `--env` gives one.
pub const TOKEN_ENV: &str = "SAFEMLX_DIST_TOKEN";
/// The launcher's identity, `PID:START` (START from `/proc/PID/stat`), set
/// for the ranks it starts.
pub const LAUNCHER_ENV: &str = "SAFEMLX_DIST_LAUNCHER";
/// The backend a rank was started for (`ring`, `mpi`).
pub const BACKEND_ENV: &str = "SAFEMLX_DIST_BACKEND";
/// Where a rank finds its rank before it joins: MLX's ring launcher's
/// variable, then Open MPI's.
pub const RANK_ENVS: [&str; 2] = ["MLX_RANK", "OMPI_COMM_WORLD_RANK"];
/// How often a rank writes its heartbeat.
pub const HEARTBEAT: Duration = Duration::from_millis(250);
/// A heartbeat older than this means the rank is stopped or stuck whole
/// (six missed heartbeats).
pub const SILENT: Duration = Duration::from_millis(1500);

/// This process's rank as its launcher set it ([`RANK_ENVS`]), before it
/// joins its group.
pub(crate) fn rank_from_env() -> Option<usize> {
    RANK_ENVS
        .iter()
        .find_map(|key| std::env::var(key).ok()?.trim().parse().ok())
}

/// Where Linux keeps shared memory.
pub(crate) const SHM: &str = "/dev/shm";

/// The directory for Open MPI's shared-memory segments (`vader_segment.*`)
/// of the run whose progress directory is `progress`: in `/dev/shm`,
/// named like it (`safemlx-launch-PID-N-shm-progress`), so that a killed
/// mpirun's segments are swept like its progress directory instead of
/// staying in `/dev/shm`.
pub(crate) fn shm_dir_for(progress: &Path) -> Option<PathBuf> {
    let name = progress.file_name()?.to_str()?.strip_suffix("-progress")?;
    Some(Path::new(SHM).join(format!("{name}-shm-progress")))
}

/// Why the run is being stopped, in the progress directory `dir`.
pub(crate) fn stop_reason_path(dir: &Path) -> PathBuf {
    dir.join("stopping")
}

/// The progress record of `rank` in the progress directory `dir`.
pub(crate) fn record_path(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank-{rank}"))
}

/// The heartbeat file of `rank` in the progress directory `dir`.
pub(crate) fn heartbeat_path(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("alive-{rank}"))
}

/// A heartbeat: the time `now_ms` (Unix milliseconds), padded to a fixed
/// width so that it is rewritten in place.
pub(crate) fn heartbeat_line(now_ms: u128) -> String {
    format!("{now_ms:>20}\n")
}

/// The time a heartbeat file says, if it says one.
pub(crate) fn parse_heartbeat(text: &str) -> Option<u128> {
    text.trim().parse().ok()
}

/// The group word of a record whose count belongs to no group (a point
/// to point send or receive, counted per rank, or joining): never compared
/// with another rank's.
pub(crate) const OWN_COUNT: &str = "own";

/// The group word of a record in the group of every rank of the run.
pub(crate) const WORLD: &str = "world";

/// A rank's last collective: `entered OP SEQ GROUP DETAIL`, or `waits OP
/// SEQ GROUP DETAIL` once its wait there timed out.
///
/// Counts are per group: two ranks' counts say who is behind only when
/// their records name the same group. GROUP is [`WORLD`], the group's
/// members as world ranks (`0,2`: a mesh axis), `split-C` (a user's split
/// of colour C) or [`OWN_COUNT`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    /// The rank's own timeout fired in it.
    pub(crate) waits: bool,
    /// The collective (`all_sum`, `joining`, ...).
    pub(crate) op: String,
    /// Its sequence number in its group.
    pub(crate) seq: u64,
    /// Which group counted it (see above).
    pub(crate) group: String,
}

impl Record {
    /// The record's line, with `detail` (shape, dtype, group) for people.
    pub(crate) fn line(&self, detail: &str) -> String {
        let state = if self.waits { "waits" } else { "entered" };
        format!("{state} {} {} {} {detail}", self.op, self.seq, self.group)
    }

    /// A record read back; `None` for anything else.
    pub(crate) fn parse(line: &str) -> Option<Self> {
        let mut words = line.split_whitespace();
        let waits = match words.next()? {
            "entered" => false,
            "waits" => true,
            _ => return None,
        };
        let op = words.next()?.to_owned();
        let seq = words.next()?.parse().ok()?;
        let group = words.next()?.to_owned();
        Some(Self {
            waits,
            op,
            seq,
            group,
        })
    }

    /// The world ranks of its group, when the record says them: all
    /// `ranks` for [`WORLD`], the listed ones for a mesh axis; `None` for
    /// a group whose members it does not say, or a count of its own.
    pub(crate) fn members(&self, ranks: usize) -> Option<Vec<usize>> {
        if self.group == WORLD {
            return Some((0..ranks).collect());
        }
        self.group
            .split(',')
            .map(|m| m.parse().ok().filter(|&m| m < ranks))
            .collect()
    }

    /// Whether its count can be compared with other ranks' at all.
    pub(crate) fn comparable(&self) -> bool {
        self.group != OWN_COUNT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_rank_writes_its_launcher_reads() {
        let record = Record {
            waits: true,
            op: "all_sum".to_owned(),
            seq: 38,
            group: "0,2".to_owned(),
        };
        let line = record.line("(group of 2, [4] Float32)");
        assert_eq!(line, "waits all_sum 38 0,2 (group of 2, [4] Float32)");
        assert_eq!(Record::parse(&line), Some(record.clone()));
        assert_eq!(record.members(4), Some(vec![0, 2]));
        assert_eq!(record.members(2), None);
        assert_eq!(Record::parse("garbage 1 2"), None);
        assert_eq!(Record::parse("entered all_sum 3"), None);
        let world = Record::parse("entered all_sum 3 world").unwrap();
        assert_eq!(world.members(3), Some(vec![0, 1, 2]));
        let own = Record::parse("entered stage_recv 3 own").unwrap();
        assert!(!own.comparable() && own.members(3).is_none());
        assert_eq!(
            parse_heartbeat(&heartbeat_line(1_733_000_000_123)),
            Some(1_733_000_000_123)
        );
        assert_eq!(record_path(Path::new("/p"), 3), PathBuf::from("/p/rank-3"));
        assert_eq!(
            shm_dir_for(Path::new("/tmp/safemlx-launch-7-12-progress")),
            Some(PathBuf::from("/dev/shm/safemlx-launch-7-12-shm-progress"))
        );
        assert_eq!(
            heartbeat_path(Path::new("/p"), 3),
            PathBuf::from("/p/alive-3")
        );
    }
}
