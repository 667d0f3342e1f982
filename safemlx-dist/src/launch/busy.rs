//! Keeping the machine's cores busy while a test runs: timing-dependent
//! behaviour (a launcher that reads the ranks' files late, a rank whose
//! heartbeat thread is slow to run) must hold on a loaded machine too.

use std::process::{Child, Command, Stdio};

/// Processes that spin until dropped (killed and reaped then).
///
/// ```
/// let load = safemlx_dist::launch::Busy::cores(2);
/// assert_eq!(load.len(), 2);
/// drop(load); // the spinners are gone
/// ```
#[derive(Debug)]
pub struct Busy(Vec<Child>);

impl Busy {
    /// `n` shell loops that spin, each at one core's full use; fewer if
    /// `sh` cannot be started (nothing to do then).
    pub fn cores(n: usize) -> Self {
        let spinners = (0..n)
            .filter_map(|_| {
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .ok()
            })
            .collect();
        Self(spinners)
    }

    /// How many spin.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none spins.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
