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
    format!("{pid}:{}", start_time(pid).unwrap_or_default())
}

/// Field 22 of `/proc/PID/stat`: when the process started, in clock ticks
/// since boot; `None` when there is no such process (or it is a zombie).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after it don't.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Starts the watch once per process, when this process is a rank started
/// by a launcher.
pub(crate) fn watch_launcher() {
    static START: Once = Once::new();
    START.call_once(|| {
        let Some((pid, start)) = std::env::var(LAUNCHER_ENV).ok().and_then(|v| {
            let (pid, start) = v.split_once(':')?;
            Some((pid.parse::<u32>().ok()?, start.parse::<u64>().ok()?))
        }) else {
            return;
        };
        if start_time(pid) != Some(start) {
            // Started by a launcher that is already gone, or the variable
            // was inherited from elsewhere: nothing to watch.
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("safemlx-dist-watchdog".to_owned())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(500));
                if start_time(pid) != Some(start) {
                    // The launcher read our stderr: the write may fail, and
                    // `eprintln!` would panic on that.
                    let _ = writeln!(
                        std::io::stderr(),
                        "safemlx-dist: the launcher (pid {pid}) is gone, so nothing would stop this rank on a failure; exiting"
                    );
                    remove_launcher_files();
                    super::native::exit_immediately(3);
                }
            });
        if let Err(e) = spawned {
            eprintln!("safemlx-dist: cannot watch the launcher: {e}");
        }
    });
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
        assert_eq!(start_time(std::process::id()), start.parse().ok());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = child.id();
        child.wait().unwrap();
        assert_eq!(start_time(id), None);
    }
}
