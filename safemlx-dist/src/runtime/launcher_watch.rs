//! A rank ends when its launcher is gone: the rank's side of the launcher
//! contract (the launcher sets [`LAUNCHER_ENV`]; the rank watches it).
//!
//! The launcher stops every rank when one fails or the run times out. If
//! the launcher itself is killed (SIGKILL, a test harness's timeout), nobody
//! would stop its ranks, and a rank waiting on a peer would wait forever. So
//! the launcher (`launch::Launch`) tells each rank (ring and MPI) its pid and the
//! time it started, and a rank that joins a group checks twice a second
//! that this very process is still alive (the start time tells a reused
//! pid apart); when it is not, the rank exits with status 3, saying why,
//! through `_exit` (no exit handlers: OpenBLAS's can deadlock in
//! `pthread_join` while its workers are busy).

use std::io::Write;
use std::sync::Once;
use std::time::Duration;

use super::contract::LAUNCHER_ENV;

/// `PID:START` of this process, for [`LAUNCHER_ENV`].
pub(crate) fn this_launcher() -> String {
    let pid = std::process::id();
    let start = match liveness(pid) {
        Liveness::Alive(start) => start,
        _ => 0,
    };
    format!("{pid}:{start}")
}

/// What `/proc/PID/stat` says of a process.
#[derive(Debug, PartialEq)]
enum Liveness {
    /// It runs, started at this time (field 22: clock ticks since boot).
    Alive(u64),
    /// No such process, or a zombie.
    Gone,
    /// The file could not be read for another reason (EMFILE when a
    /// server holds every descriptor, ENOMEM): nothing is known.
    Unknown,
}

fn liveness(pid: u32) -> Liveness {
    classify(std::fs::read_to_string(format!("/proc/{pid}/stat")))
}

/// [`liveness`] from the result of reading `/proc/PID/stat`.
fn classify(read: std::io::Result<String>) -> Liveness {
    let stat = match read {
        Ok(stat) => stat,
        // ESRCH: the process went while the file was read.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ESRCH) =>
        {
            return Liveness::Gone
        }
        Err(_) => return Liveness::Unknown,
    };
    // The command name (field 2) may hold spaces; the fields after it don't.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return Liveness::Unknown;
    };
    let mut fields = rest.split_whitespace();
    if fields.next() == Some("Z") {
        return Liveness::Gone;
    }
    fields
        .nth(18)
        .and_then(|f| f.parse().ok())
        .map_or(Liveness::Unknown, Liveness::Alive)
}

/// Whether the launcher `pid` that started at `start` is gone: only "no
/// such process", a zombie, or another process under its pid says so.
fn launcher_gone(pid: u32, start: u64) -> bool {
    match liveness(pid) {
        Liveness::Alive(now) => now != start,
        Liveness::Gone => true,
        Liveness::Unknown => false,
    }
}

/// Starts the watch once per process, when this process is a rank started
/// by a launcher. A launcher that is already gone (killed while it started
/// the ranks) ends the rank at once.
pub(crate) fn watch_launcher() {
    static START: Once = Once::new();
    START.call_once(|| {
        let Some((pid, start)) = std::env::var(LAUNCHER_ENV).ok().and_then(|v| {
            let (pid, start) = v.split_once(':')?;
            Some((pid.parse::<u32>().ok()?, start.parse::<u64>().ok()?))
        }) else {
            return;
        };
        if launcher_gone(pid, start) {
            leave(pid);
        }
        let spawned = std::thread::Builder::new()
            .name("safemlx-dist-watchdog".to_owned())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(500));
                if launcher_gone(pid, start) {
                    leave(pid);
                }
            });
        if let Err(e) = spawned {
            eprintln!("safemlx-dist: cannot watch the launcher: {e}");
        }
    });
}

/// Says the launcher `pid` is gone, removes its files and exits with 3.
fn leave(pid: u32) -> ! {
    // The launcher read our stderr: the write may fail, and `eprintln!`
    // would panic on that.
    let _ = writeln!(
        std::io::stderr(),
        "safemlx-dist: the launcher (pid {pid}) is gone, so nothing would stop this rank on a failure; exiting"
    );
    remove_launcher_files();
    super::native::exit_immediately(3)
}

/// Why the launcher is stopping this run, when it said (a rank failed:
/// `rank 1 failed (signal: 9 (SIGKILL))`), for a rank to pass on before
/// it ends (a server tells its open requests). Read when the stop signal
/// arrives: the launcher writes it before it signals the ranks. `None`
/// outside a launch, or when the launcher gave no reason (its own
/// SIGTERM, its timeout, an MPI run, whose mpirun stops the ranks itself).
pub fn stop_reason() -> Option<String> {
    let dir = std::env::var_os(super::PROGRESS_DIR_ENV)?;
    let text = std::fs::read_to_string(super::contract::stop_reason_path(std::path::Path::new(
        &dir,
    )))
    .ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// The files a killed launcher could not remove: its temporary hostfile
/// and progress directory (named `safemlx-launch-*` in the temporary
/// directory; nothing else is touched). Every rank tries; one succeeds.
fn remove_launcher_files() {
    let ours = |path: &std::path::Path| {
        path.parent() == Some(std::env::temp_dir().as_path())
            && path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("safemlx-launch-"))
    };
    if let Some(file) = std::env::var_os("MLX_HOSTFILE").map(std::path::PathBuf::from) {
        if ours(&file) {
            let _ = std::fs::remove_file(file);
        }
    }
    if let Some(dir) = std::env::var_os(super::PROGRESS_DIR_ENV).map(std::path::PathBuf::from) {
        if ours(&dir) {
            if let Some(shm) = super::contract::shm_dir_for(&dir) {
                let _ = std::fs::remove_dir_all(shm);
            }
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_process_has_a_start_time_and_a_gone_one_has_none() {
        let me = this_launcher();
        let (pid, start) = me.split_once(':').unwrap();
        assert_eq!(pid, std::process::id().to_string());
        let start: u64 = start.parse().unwrap();
        assert_eq!(liveness(std::process::id()), Liveness::Alive(start));
        assert!(!launcher_gone(std::process::id(), start));
        assert!(launcher_gone(std::process::id(), start + 1));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = child.id();
        child.wait().unwrap();
        assert_eq!(liveness(id), Liveness::Gone);
        assert!(launcher_gone(id, 0));
        // Out of descriptors (a server holding every one): not a dead
        // launcher.
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        assert_eq!(classify(Err(emfile)), Liveness::Unknown);
        let esrch = std::io::Error::from_raw_os_error(libc::ESRCH);
        assert_eq!(classify(Err(esrch)), Liveness::Gone);
    }
}
