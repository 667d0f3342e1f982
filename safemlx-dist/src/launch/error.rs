//! Why a launch did not run or did not succeed.

use std::path::PathBuf;

use crate::runtime::Backend;

/// Why a launch did not run or did not succeed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// `-n 0`.
    #[error("the number of ranks must be at least 1, got 0")]
    NoRanks,
    /// A backend the launcher cannot start.
    #[error("safemlx-launch starts ring or mpi ranks, not {backend}")]
    UnsupportedBackend {
        /// The backend asked for.
        backend: Backend,
    },
    /// The program to run does not exist.
    #[error("program {program:?} was not found (give a path or a name on PATH)")]
    ProgramNotFound {
        /// The program as given.
        program: PathBuf,
    },
    /// The program exists but cannot be run.
    #[error("program {program:?} {reason}; give an executable file")]
    ProgramNotExecutable {
        /// The program as found.
        program: PathBuf,
        /// Why it cannot run (a directory, no execute permission).
        reason: String,
    },
    /// More ranks than this machine can hold.
    #[error("-n {ranks} asks for more ranks than one machine can hold here: {reason}")]
    TooManyRanks {
        /// The ranks asked for.
        ranks: usize,
        /// The limit and where it comes from.
        reason: String,
    },
    /// A hostfile given for the MPI backend, which does not read it.
    #[error("this --hostfile is a ring host list ([[\"ip:port\"], ...]), which MPI does not read; under mpi give hosts with --hosts or an mlx.launch hostfile, or use --backend ring")]
    HostfileWithMpi,
    /// `mpirun` is not installed.
    #[error("mpirun was not found on PATH; install Open MPI (`cargo xtask setup` does)")]
    MpirunNotFound,
    /// A bad ring hostfile.
    #[error("bad hostfile {path:?}: {reason}")]
    Hostfile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A rank could not be started.
    #[error("could not start rank {rank}: {reason}")]
    Spawn {
        /// The rank.
        rank: usize,
        /// The operating system's error.
        reason: String,
    },
    /// A rank exited unsuccessfully or was killed; the others were stopped.
    #[error("rank {rank} failed ({status}); the other ranks were stopped{detail}")]
    RankFailed {
        /// The first rank seen failing.
        rank: usize,
        /// Its exit status or signal.
        status: String,
        /// After a collective timeout (status 124), which rank was behind,
        /// from the ranks' progress files: `: rank 2 never entered ...`.
        detail: String,
    },
    /// `mpirun` failed without naming a rank.
    #[error("mpirun failed ({status}); see its output above")]
    MpirunFailed {
        /// mpirun's exit status.
        status: String,
    },
    /// Every rank succeeded but `mpirun` reported a problem (for example
    /// an abnormal termination); the lines are in the message.
    #[error("mpirun reported a problem although every rank exited 0: {}", .lines.join(" / "))]
    MpirunReported {
        /// What mpirun printed.
        lines: Vec<String>,
    },
    /// The timeout passed; every rank was stopped.
    #[error("timed out after {seconds} s; ranks still running: {running}{detail}")]
    TimedOut {
        /// The timeout.
        seconds: f64,
        /// The ranks still running, e.g. `0, 2` (under MPI: those whose wrapper did not report an exit).
        running: String,
        /// Which rank was behind in the collectives, when one was: `; rank 2 never entered ...`.
        detail: String,
    },
    /// The launcher got SIGTERM or SIGINT and stopped every rank.
    #[error("got signal {signal} ({name}); every rank was stopped")]
    Interrupted {
        /// The signal number.
        signal: i32,
        /// Its name, e.g. `SIGTERM`.
        name: String,
    },
    /// A host that ssh could not reach before anything ran.
    #[error("host {host} is not reachable over ssh, so nothing was started: {reason}")]
    HostUnreachable {
        /// The ssh destination.
        host: String,
        /// What ssh said.
        reason: String,
    },
    /// A host lacks what its ranks need; nothing was started.
    #[error("host {host} has no {what}, so nothing was started")]
    MissingOnHost {
        /// The ssh destination.
        host: String,
        /// What is missing.
        what: String,
    },
    /// The ssh connection of a remote rank failed mid-run (exit 255); the
    /// other ranks were stopped.
    #[error("rank {rank} on host {host}: lost the ssh connection to {host} (ssh {status}: the host went unreachable or closed the connection); the other ranks were stopped")]
    HostLost {
        /// The rank.
        rank: usize,
        /// Its host.
        host: String,
        /// ssh's exit status.
        status: String,
    },
    /// Both `--hosts` and an `mlx.launch` hostfile, or a hostfile of one
    /// kind where the other is needed.
    #[error("{0}")]
    Hosts(String),
    /// A file could not be written or a port reserved.
    #[error("{0}")]
    Io(String),
}
