//! Re-running the current test as N real ranks.

use std::time::Duration;

use super::{Launch, LaunchError};
use crate::runtime::{Backend, Group};

/// The variable that marks a process as one rank of a [`Ranks`] run; its
/// value is `TEST#N#BACKEND`: the test that runs in the ranks, their number
/// and their backend.
pub const RANK_OF_ENV: &str = "SAFEMLX_DIST_RANK_OF";

/// A test body run by N real processes of the current test binary.
///
/// Called in a test, [`Ranks::run_test`] re-executes the test binary N times
/// through [`Launch`] (so with the same hostfile, prefixing, failure and
/// timeout handling as `safemlx-launch`), each filtered to the calling test
/// alone. In those processes the same call initialises the group strictly
/// and runs the body; a panicking rank fails the parent test with an error
/// naming it. The test's name is read from its thread, as libtest names it.
///
/// ```no_run
/// use safemlx_dist::launch::Ranks;
/// use safemlx_dist::Backend;
///
/// #[test]
/// fn sums_over_three_ranks() {
///     Ranks::new(3)
///         .backend(Backend::Ring)
///         .run_test(|group| assert_eq!(group.size(), 3))
///         .unwrap();
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Ranks {
    ranks: usize,
    backend: Backend,
    timeout: Duration,
}

impl Ranks {
    /// `ranks` processes on the ring backend with a 120 s timeout.
    pub fn new(ranks: usize) -> Self {
        Self {
            ranks,
            backend: Backend::Ring,
            timeout: Duration::from_secs(120),
        }
    }

    /// The backend the ranks use: ring (default) or MPI.
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// How long the whole run may take before every rank is stopped.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The value of [`RANK_OF_ENV`] for this launch: the test, the rank
    /// count and the backend, so a test that launches several
    /// configurations runs each body only in the ranks started for it.
    fn marker(&self, test: &str) -> String {
        format!("{test}#{}#{}", self.ranks, self.backend)
    }

    /// In the test: starts the ranks and waits for them. In a rank: joins the
    /// group (strict `init` of the backend; with one rank, the singleton)
    /// and runs `body`.
    ///
    /// # Errors
    /// In the test, the launch's error: a rank that failed (named), a
    /// timeout, a launch that could not start, or, under MPI, anything
    /// `mpirun` reported itself (ranks must shut down cleanly).
    ///
    /// # Panics
    /// In a rank, when the group cannot be initialised (the parent then
    /// reports that rank as failed, with this message in its output).
    pub fn run_test(self, body: impl FnOnce(&Group)) -> Result<(), LaunchError> {
        let thread = std::thread::current();
        let test = thread.name().unwrap_or("main").to_owned();
        let current = std::env::var(RANK_OF_ENV).ok();
        if current.as_deref().and_then(|m| m.split('#').next()) == Some(test.as_str()) {
            if current.as_deref() != Some(self.marker(&test).as_str()) {
                // A rank of this test, started for another rank count.
                return Ok(());
            }
            // One rank is the singleton group (MLX's ring does not form a
            // ring of one); more join strictly, so a broken set-up fails.
            let strict = self.ranks > 1;
            let group = Group::init(strict, self.backend).unwrap_or_else(|error| {
                panic!("rank could not join the {} group: {error}", self.backend)
            });
            body(&group);
            return Ok(());
        }
        let exe = std::env::current_exe()
            .map_err(|e| LaunchError::Io(format!("cannot find the running test binary: {e}")))?;
        let launch = Launch::new(self.ranks, exe)
            .backend(self.backend)
            .timeout(self.timeout)
            .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
            .env(RANK_OF_ENV, self.marker(&test));
        let run = || match launch.run() {
            Ok(report) if report.mpirun_messages.is_empty() => Ok(()),
            Ok(report) => Err(LaunchError::MpirunReported {
                lines: report.mpirun_messages,
            }),
            Err(e) => Err(e),
        };
        match run() {
            // Every rank passed but one exited without MPI being finalized
            // (MLX finalizes from a static's destructor; see the book's
            // launching chapter): the body ran and passed, so once more.
            Err(LaunchError::MpirunReported { lines }) if self.backend == Backend::Mpi => {
                eprintln!(
                    "safemlx-dist Ranks: every rank passed but mpirun reported: {}; running the ranks once more",
                    lines.join(" / ")
                );
                run()
            }
            other => other,
        }
    }
}
