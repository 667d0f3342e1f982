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
    sweep_stale_in(&std::env::temp_dir());
    // Open MPI's shared-memory segments of a killed mpirun (see
    // `contract::shm_dir_for`).
    sweep_stale_in(Path::new(contract::SHM));
}

fn sweep_stale_in(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
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
            Some(stem) => (stem.strip_suffix("-shm").unwrap_or(stem), true),
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
        // Best effort: without it Open MPI uses /dev/shm itself.
        if let Some(shm) =
            contract::shm_dir_for(&path).filter(|_| Path::new(contract::SHM).is_dir())
        {
            let _ = std::fs::create_dir(shm);
        }
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

    /// Each rank's last heartbeat (Unix milliseconds; `None`: it never
    /// wrote one).
    fn heartbeats(&self, ranks: usize) -> Vec<Option<u128>> {
        (0..ranks)
            .map(|r| {
                let text = std::fs::read_to_string(contract::heartbeat_path(&self.path, r)).ok()?;
                contract::parse_heartbeat(&text)
            })
            .collect()
    }

    /// What the ranks' files say, as a sentence; `None` when no rank
    /// entered a collective or wrote a heartbeat.
    pub(crate) fn diagnose(&self, ranks: usize) -> Option<String> {
        super::explain::explain(
            &self.records(ranks),
            &super::explain::silences(&self.heartbeats(ranks)),
        )
    }

    /// Tells the ranks why the run is being stopped (`stopping`, read by
    /// `runtime::stop_reason`).
    pub(crate) fn tell_stopping(&self, reason: &str) {
        let _ = std::fs::write(contract::stop_reason_path(&self.path), reason);
    }

    /// Whether some rank's collective timed out (its file says `waits`).
    pub(crate) fn any_timed_out(&self, ranks: usize) -> bool {
        self.records(ranks).iter().flatten().any(|r| r.waits)
    }
}

impl Drop for ProgressDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
        if let Some(shm) = contract::shm_dir_for(&self.path) {
            let _ = std::fs::remove_dir_all(shm);
        }
    }
}
