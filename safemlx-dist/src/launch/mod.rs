//! Starting N ranks of a program on one machine: the engine of the
//! `safemlx-launch` binary and of [`Ranks`], which lets a test re-run itself
//! as a real multi-process group.
//!
//! - **ring**: a JSON hostfile with free loopback ports (or a given one) and
//!   `MLX_RANK`, `MLX_HOSTFILE`, `MLX_WORLD_SIZE` per rank;
//! - **mpi**: the ranks run under `mpirun`.
//!
//! Every rank also gets `SAFEMLX_DIST_BACKEND` naming the backend. Output
//! lines are prefixed `[rank K] `; when a rank fails every other rank is
//! stopped (SIGTERM, then SIGKILL 2 s later) and the error names it; a timeout
//! stops all ranks and names those still running. A rank (ring or MPI) that
//! joined a group exits by itself when its launcher is gone (killed), so no
//! rank outlives the run.

pub mod agent;
mod busy;
mod bytes_text;
mod error;
mod explain;
mod hostfile;
mod hosts;
mod mpi;
mod mpi_run;
mod progress;
mod ranks;
mod remote;
mod ring;
mod supervise;

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

pub use crate::runtime::LAUNCHER_ENV;
use crate::runtime::{this_launcher, TOKEN_ENV};
pub use busy::Busy;
pub use error::LaunchError;
pub use hostfile::{RingHosts, TempHostfile};
pub use hosts::{parse_env, read_hostfile, Host, HostList, Hostfile, DEFAULT_STARTING_PORT};
pub use ranks::{Ranks, RANK_OF_ENV};

use crate::runtime::Backend;
use progress::ProgressDir;

/// The environment variable that tells a program which backend it was
/// started for (part of the launcher/rank contract, `runtime/contract.rs`).
pub use crate::runtime::BACKEND_ENV;

/// What a successful launch leaves to look at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaunchReport {
    /// Lines `mpirun` printed itself (not a rank's output), e.g. a report
    /// of a rank that did not finalize MPI. Empty for a clean MPI run.
    pub mpirun_messages: Vec<String>,
}

/// A program to start as `ranks` processes.
///
/// ```no_run
/// use std::time::Duration;
/// use safemlx_dist::launch::Launch;
/// use safemlx_dist::Backend;
///
/// Launch::new(4, "target/release/examples/collectives")
///     .backend(Backend::Ring)
///     .timeout(Duration::from_secs(60))
///     .run()?;
/// # Ok::<(), safemlx_dist::launch::LaunchError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Launch {
    ranks: usize,
    backend: Backend,
    hostfile: Option<PathBuf>,
    timeout: Option<Duration>,
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    forward_signals: bool,
    hosts: Option<HostList>,
    ssh: Vec<OsString>,
    starting_port: u16,
}

impl Launch {
    /// `ranks` copies of `program`, on the ring backend, without a timeout.
    pub fn new(ranks: usize, program: impl Into<OsString>) -> Self {
        Self {
            ranks,
            backend: Backend::Ring,
            hostfile: None,
            timeout: None,
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            forward_signals: false,
            hosts: None,
            ssh: vec!["ssh".into()],
            starting_port: DEFAULT_STARTING_PORT,
        }
    }

    /// Run the ranks on these hosts over ssh (`-n` ranks spread over them
    /// by the chunk rule), instead of on this machine. The program, this
    /// launcher and the working directory must be at the same paths there;
    /// that is checked on every host before anything runs.
    pub fn hosts(mut self, hosts: HostList) -> Self {
        self.hosts = Some(hosts);
        self
    }

    /// The ssh command and its options, e.g. `["ssh", "-F", "config"]`
    /// (default `ssh`).
    pub fn ssh_command<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, words: I) -> Self {
        let words: Vec<OsString> = words.into_iter().map(Into::into).collect();
        if !words.is_empty() {
            self.ssh = words;
        }
        self
    }

    /// The ring's first port on remote hosts, one more per rank (default
    /// [`DEFAULT_STARTING_PORT`], as `mlx.launch`).
    pub fn starting_port(mut self, port: u16) -> Self {
        self.starting_port = port;
        self
    }

    /// The backend: [`Backend::Ring`] (default) or [`Backend::Mpi`].
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Use this ring host list instead of free loopback ports.
    pub fn hostfile(mut self, path: impl Into<PathBuf>) -> Self {
        self.hostfile = Some(path.into());
        self
    }

    /// Stop every rank and fail after `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Adds program arguments.
    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// On SIGTERM or SIGINT to this process, stop every rank (SIGTERM, then
    /// SIGKILL after 2 s), remove the temporary hostfile and return
    /// [`LaunchError::Interrupted`]. This installs process-wide handlers
    /// for the two signals (what the `safemlx-launch` binary wants; a
    /// library user may not).
    pub fn forward_signals(mut self, yes: bool) -> Self {
        self.forward_signals = yes;
        self
    }

    /// Sets an environment variable for every rank.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Checks everything that can be checked before a process starts.
    fn validate(&self) -> Result<Plan, LaunchError> {
        if self.ranks == 0 {
            return Err(LaunchError::NoRanks);
        }
        if !matches!(self.backend, Backend::Ring | Backend::Mpi) {
            return Err(LaunchError::UnsupportedBackend {
                backend: self.backend,
            });
        }
        let program = find_program(&self.program).ok_or_else(|| LaunchError::ProgramNotFound {
            program: PathBuf::from(&self.program),
        })?;
        check_executable(&program)?;
        if let Some(list) = &self.hosts {
            if self.hostfile.is_some() {
                return Err(LaunchError::Hosts(
                    "a ring host list (--hostfile of [[\"ip:port\"], ...]) runs ranks on this machine; with --hosts or an mlx.launch hostfile give only that".to_owned(),
                ));
            }
            if matches!(self.backend, Backend::Mpi) && find_program(OsStr::new("mpirun")).is_none()
            {
                return Err(LaunchError::MpirunNotFound);
            }
            let ring = list
                .ring(self.ranks, self.starting_port)
                .map_err(LaunchError::Hosts)?;
            let absolute =
                |path: &Path| std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
            let cwd = std::env::current_dir()
                .map_err(|e| LaunchError::Io(format!("cannot read the working directory: {e}")))?;
            let remote = Remote {
                list: list.clone(),
                ring,
                program: absolute(&program),
                launcher: launcher_path()?,
                cwd,
            };
            let used: BTreeSet<usize> = list.placement(self.ranks).into_iter().collect();
            let hosts: Vec<&str> = used.iter().map(|&h| list.hosts[h].ssh.as_str()).collect();
            remote::probe(
                &self.ssh,
                &hosts,
                &remote.cwd,
                &remote.program,
                &remote.launcher,
            )?;
            return Ok(Plan::Remote(Box::new(remote)));
        }
        max_local_ranks(self.ranks)?;
        match self.backend {
            Backend::Mpi if self.hostfile.is_some() => Err(LaunchError::HostfileWithMpi),
            Backend::Mpi => {
                if find_program(OsStr::new("mpirun")).is_none() {
                    return Err(LaunchError::MpirunNotFound);
                }
                Ok(Plan::Mpi)
            }
            _ => match &self.hostfile {
                Some(path) => RingHosts::read(path, self.ranks).map(Plan::Ring),
                None => RingHosts::loopback(self.ranks).map(Plan::Ring),
            },
        }
    }

    /// Starts the ranks and waits for them; output goes to this process's
    /// stdout and stderr, each line prefixed `[rank K] `.
    ///
    /// On success the report holds what `mpirun` itself printed (nothing,
    /// for ranks that shut down cleanly; always nothing for ring).
    pub fn run(&self) -> Result<LaunchReport, LaunchError> {
        let plan = self.validate()?;
        let interrupt = Arc::new(AtomicUsize::new(0));
        if self.forward_signals {
            for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
                signal_hook::flag::register_usize(signal, Arc::clone(&interrupt), signal as usize)
                    .map_err(|e| LaunchError::Io(format!("cannot handle signal {signal}: {e}")))?;
            }
        }
        let mut env = self.env.clone();
        env.push((BACKEND_ENV.into(), self.backend.as_str().into()));
        // The run's secret (see `runtime/admission.rs`), unless `--env` gave one.
        if !env.iter().any(|(k, _)| k == TOKEN_ENV) {
            let token = crate::runtime::new_token()
                .map_err(|e| LaunchError::Io(format!("cannot make the run's secret: {e}")))?;
            env.push((TOKEN_ENV.into(), token.into()));
        }
        if matches!(self.backend, Backend::Mpi) && !matches!(plan, Plan::Remote(_)) {
            env.push((LAUNCHER_ENV.into(), this_launcher().into()));
        }
        progress::sweep_stale();
        let progress = ProgressDir::new()?;
        env.push((
            crate::runtime::PROGRESS_DIR_ENV.into(),
            progress.path().into(),
        ));
        // Where the ranks were when the first rank's collective timed out
        // (or, without one, when the run ended): taken at that moment, since
        // stopping the run can wake a stopped rank (mpirun sends SIGCONT
        // before SIGTERM), which may then move on.
        let mut snapshot = None;
        let mut frozen = false;
        let mut watch = |outcome: Option<&supervise::Outcome>| {
            if !frozen {
                frozen = progress.any_timed_out(self.ranks);
                snapshot = progress.diagnose(self.ranks);
            }
            // Before the ranks are signalled: why (a server tells its
            // clients, see `runtime::stop_reason`).
            if let Some(supervise::Outcome::Failed { label, status }) = outcome {
                progress.tell_stopping(&format!("rank {label} failed ({status})"));
            }
        };
        let result = match plan {
            Plan::Ring(hosts) => self.run_ring(&hosts, env, &interrupt, &mut watch),
            Plan::Mpi => self.run_mpi(env, None, &interrupt, &mut watch),
            Plan::Remote(remote) if matches!(self.backend, Backend::Mpi) => {
                self.run_mpi(env, Some(&remote), &interrupt, &mut watch)
            }
            Plan::Remote(remote) => self.run_remote_ring(&remote, env, &interrupt, &mut watch),
        };
        result.map_err(|e| self.with_progress(e, snapshot))
    }

    /// Adds what the ranks' progress files say to a collective timeout
    /// (a rank exiting with status 124) or the launcher's own timeout.
    fn with_progress(&self, error: LaunchError, snapshot: Option<String>) -> LaunchError {
        let timed_out = |status: &str| {
            status == format!("exit status: {}", crate::runtime::TIMEOUT_EXIT)
                || status == format!("exit code: {}", crate::runtime::TIMEOUT_EXIT)
        };
        match error {
            LaunchError::RankFailed { rank, status, .. } if timed_out(&status) => {
                let detail = snapshot.map_or_else(String::new, |d| {
                    format!(" after a collective timed out: {d}")
                });
                LaunchError::RankFailed {
                    rank,
                    status,
                    detail,
                }
            }
            LaunchError::TimedOut {
                seconds, running, ..
            } => {
                let detail = snapshot.map_or_else(String::new, |d| format!("; {d}"));
                LaunchError::TimedOut {
                    seconds,
                    running,
                    detail,
                }
            }
            other => other,
        }
    }

    fn timed_out(&self, running: &str) -> LaunchError {
        LaunchError::TimedOut {
            seconds: self.timeout.map_or(0.0, |t| t.as_secs_f64()),
            running: running.to_owned(),
            detail: String::new(),
        }
    }
}

/// What [`Launch::validate`] decided.
enum Plan {
    /// Ring ranks on this machine.
    Ring(RingHosts),
    /// MPI ranks on this machine.
    Mpi,
    /// Ranks on other hosts over ssh (ring or MPI).
    Remote(Box<Remote>),
}

/// A checked multi-host run.
struct Remote {
    list: HostList,
    ring: RingHosts,
    program: PathBuf,
    launcher: PathBuf,
    cwd: PathBuf,
}

/// Where `safemlx-launch` is (it runs as each remote rank's agent): this
/// program when it is safemlx-launch, else beside it (a test or example in
/// `target/*/`), else on `PATH`.
fn launcher_path() -> Result<PathBuf, LaunchError> {
    let me = std::env::current_exe().ok();
    let named = me
        .as_ref()
        .filter(|p| p.file_name() == Some(OsStr::new("safemlx-launch")))
        .cloned();
    let beside = me.as_ref().and_then(|p| {
        p.ancestors()
            .skip(1)
            .take(3)
            .map(|dir| dir.join("safemlx-launch"))
            .find(|c| check_executable(c).is_ok())
    });
    named
        .or(beside)
        .or_else(|| find_program(OsStr::new("safemlx-launch")))
        .and_then(|p| std::path::absolute(p).ok())
        .ok_or_else(|| {
            LaunchError::Io(
                "safemlx-launch was not found (beside this program or on PATH); remote ranks run under it: build it with `cargo build --bin safemlx-launch`".to_owned(),
            )
        })
}

fn interrupted(signal: i32) -> LaunchError {
    LaunchError::Interrupted {
        signal,
        name: nix::sys::signal::Signal::try_from(signal)
            .map_or_else(|_| format!("signal {signal}"), |s| s.to_string()),
    }
}

/// The most ranks one launch starts on this machine, whatever its limits.
pub const MAX_LOCAL_RANKS: usize = 256;

/// Checks `ranks` against [`MAX_LOCAL_RANKS`] and the open-file limit:
/// the launcher holds two pipes per rank (and, on ring, a reserved port).
fn max_local_ranks(ranks: usize) -> Result<(), LaunchError> {
    let too_many = |reason: String| Err(LaunchError::TooManyRanks { ranks, reason });
    if ranks > MAX_LOCAL_RANKS {
        return too_many(format!(
            "safemlx-launch starts at most {MAX_LOCAL_RANKS} local ranks (each is a process with its own MLX runtime)"
        ));
    }
    let files = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(usize::MAX, |(soft, _)| {
            usize::try_from(soft).unwrap_or(usize::MAX)
        });
    let needed = ranks.saturating_mul(4).saturating_add(16);
    if needed > files {
        return too_many(format!(
            "it needs about {needed} open files and the limit is {files} (raise it with `ulimit -n`)"
        ));
    }
    Ok(())
}

/// A directory or a file without execute permission is not a program.
fn check_executable(program: &Path) -> Result<(), LaunchError> {
    use std::os::unix::fs::PermissionsExt;
    let not = |reason: &str| {
        Err(LaunchError::ProgramNotExecutable {
            program: program.to_owned(),
            reason: reason.to_owned(),
        })
    };
    match std::fs::metadata(program) {
        Ok(m) if m.is_dir() => not("is a directory"),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => not("is not executable (no x permission)"),
        Ok(_) => Ok(()),
        Err(e) => not(&format!("cannot be read ({e})")),
    }
}

/// `program` itself if it is a path (to anything: a directory is reported
/// by [`check_executable`]), else the first executable match on `PATH`.
fn find_program(program: &OsStr) -> Option<PathBuf> {
    let path = PathBuf::from(program);
    if path.components().count() > 1 {
        return path.exists().then_some(path);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|candidate| check_executable(candidate).is_ok())
    })
}
