//! A rank ends when its launcher is gone.
//!
//! The launcher stops every rank when one fails or the run times out. If
//! the launcher itself is killed (SIGKILL, a test harness's timeout), nobody
//! would stop its ranks, and a rank waiting on a peer would wait forever. So
//! [`Launch`](super::Launch) tells each ring rank its pid, and a rank that
//! joins a group checks twice a second that the launcher is still its
//! parent; when it is not, the rank exits with status 3, saying why.

use std::io::Write;
use std::sync::Once;
use std::time::Duration;

/// The launcher's pid, set for the ranks it starts directly.
pub const LAUNCHER_ENV: &str = "SAFEMLX_DIST_LAUNCHER_PID";

/// Starts the watch once per process, when this process is a rank started
/// by a launcher that is still its parent.
pub(crate) fn watch_launcher() {
    static START: Once = Once::new();
    START.call_once(|| {
        let Some(launcher) = std::env::var(LAUNCHER_ENV)
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
        else {
            return;
        };
        if std::os::unix::process::parent_id() != launcher {
            // Started some other way (e.g. under mpirun): nothing to watch.
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("safemlx-dist-watchdog".to_owned())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(500));
                if std::os::unix::process::parent_id() != launcher {
                    // The launcher read our stderr: the write may fail, and
                    // `eprintln!` would panic on that.
                    let _ = writeln!(
                        std::io::stderr(),
                        "safemlx-dist: the launcher (pid {launcher}) is gone, so nothing would stop this rank on a failure; exiting"
                    );
                    std::process::exit(3);
                }
            });
        if let Err(e) = spawned {
            eprintln!("safemlx-dist: cannot watch the launcher: {e}");
        }
    });
}
