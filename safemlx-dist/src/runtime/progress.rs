//! Which collective each rank is in, and the collective timeout.
//!
//! Every collective a process enters is counted per group (`all_sum #38`).
//! The last one is kept, and when the launcher asks for it
//! (`SAFEMLX_DIST_PROGRESS_DIR`), written to `rank-R` in that directory, so
//! the launcher can say which rank is behind even when that rank is stopped
//! or dead and cannot speak for itself.
//!
//! A wait on peers (an evaluation once the process has entered a
//! collective of a group of several ranks, and joining a group) lasts at
//! most `SAFEMLX_DIST_TIMEOUT` seconds (10 minutes by default, as
//! PyTorch's collectives); past it, the rank prints what it waits in and
//! exits with status [`TIMEOUT_EXIT`] (see `deadline.rs`, which watches
//! from its own thread). That thread also writes a heartbeat, `alive-R`,
//! so that the launcher can tell a rank that waits from one that is
//! stopped.
//!
//! The state is the process's, not a thread's: the watching thread reads
//! what the computing thread entered.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use safemlx::Array;

use super::contract::{
    heartbeat_line, heartbeat_path, rank_from_env, record_path, Record, DEFAULT_TIMEOUT,
    JOIN_TIMEOUT_ENV, MIN_JOIN_TIMEOUT, PROGRESS_DIR_ENV, TIMEOUT_ENV, TIMEOUT_EXIT,
};
use crate::error::{Error, Result};

/// The name of the lowering agreement's `all_max` in progress records.
pub(crate) const AGREEMENT: &str = "lowering_agreement";

/// The bytes of one progress record (the file is rewritten in place).
const RECORD: usize = 160;

/// The last collective this process entered.
#[derive(Debug, Clone)]
struct Entered {
    op: &'static str,
    seq: u64,
    /// The record's group word (see `contract::Record`).
    group: std::sync::Arc<str>,
    group_size: usize,
    shape: Vec<i32>,
    dtype: safemlx::Dtype,
}

impl Entered {
    /// Its progress record (see `contract.rs`).
    fn record(&self, waits: bool) -> String {
        let record = Record {
            waits,
            op: self.op.to_owned(),
            seq: self.seq,
            group: self.group.to_string(),
        };
        record.line(&self.describe())
    }

    fn describe(&self) -> String {
        format!(
            "{} #{} (group of {}, {:?} {:?})",
            self.op, self.seq, self.group_size, self.shape, self.dtype
        )
    }
}

struct State {
    rank: Option<usize>,
    file: Option<File>,
    /// The heartbeat file, `alive-R`.
    alive: Option<File>,
    last: Option<Entered>,
}

static STATE: Mutex<State> = Mutex::new(State {
    rank: None,
    file: None,
    alive: None,
    last: None,
});

/// The state (a panic elsewhere leaves it valid: every write is whole).
fn state() -> MutexGuard<'static, State> {
    STATE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Opens the heartbeat file of `rank` (once) when the launcher asked for
/// progress files.
fn open_alive(state: &mut State, rank: usize) {
    if state.alive.is_some() {
        return;
    }
    if let Some(dir) = std::env::var_os(PROGRESS_DIR_ENV) {
        state.alive = File::create(heartbeat_path(&PathBuf::from(dir), rank)).ok();
    }
}

/// Before joining a group: the heartbeat and the progress record, under
/// the rank the launcher gave, so that a join that times out says so
/// (`waits joining`): the launcher takes its snapshot of the ranks' files
/// at that moment, before stopping the run wakes a stopped peer (mpirun
/// sends SIGCONT first), which would then start its own heartbeat.
pub(crate) fn starting() {
    if let Some(rank) = rank_from_env() {
        let mut state = state();
        open_alive(&mut state, rank);
        if state.file.is_none() {
            if let Some(dir) = std::env::var_os(PROGRESS_DIR_ENV) {
                state.file = File::create(record_path(&PathBuf::from(dir), rank)).ok();
            }
        }
    }
}

/// Writes the heartbeat: the time (Unix milliseconds), rewritten in place.
pub(crate) fn heartbeat() {
    let state = state();
    if let Some(file) = &state.alive {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let _ = file.write_at(heartbeat_line(now).as_bytes(), 0);
    }
}

/// The collective timeout of this process: `SAFEMLX_DIST_TIMEOUT`,
/// checked, or [`DEFAULT_TIMEOUT`]. A program that waits between
/// collectives (a server while idle) keeps its waits below it.
///
/// # Errors
/// A value that is not a positive number of seconds.
pub fn timeout_from_env() -> Result<Duration> {
    seconds_from_env(TIMEOUT_ENV, DEFAULT_TIMEOUT)
}

/// The bound on joining a group: `SAFEMLX_DIST_JOIN_TIMEOUT`, checked, or
/// the collective timeout but at least [`MIN_JOIN_TIMEOUT`].
///
/// # Errors
/// A value that is not a positive number of seconds.
pub(crate) fn join_timeout_from_env() -> Result<Duration> {
    let default = timeout_from_env()?.max(MIN_JOIN_TIMEOUT);
    seconds_from_env(JOIN_TIMEOUT_ENV, default)
}

fn seconds_from_env(key: &str, default: Duration) -> Result<Duration> {
    match std::env::var(key) {
        Err(_) => Ok(default),
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0)
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .ok_or_else(|| {
                Error::Setting(format!(
                    "{key}={v:?} is not a positive number of seconds (the default is {})",
                    default.as_secs()
                ))
            }),
    }
}

/// Records this process's rank in its first multi-rank group, and opens
/// the progress file the launcher asked for.
pub(crate) fn joined(rank: usize, size: usize) {
    if size < 2 {
        return;
    }
    {
        let mut state = state();
        if state.rank.is_some() {
            return;
        }
        state.rank = Some(rank);
        if let Some(dir) = std::env::var_os(PROGRESS_DIR_ENV) {
            state.file = File::create(record_path(&PathBuf::from(dir), rank)).ok();
        }
        open_alive(&mut state, rank);
    }
    heartbeat();
}

/// Counts a collective `op` of a group of `group_size` on `input`: its
/// sequence number in that group (named `group`, see `contract::Record`)
/// is `seq`.
pub(crate) fn enter(
    op: &'static str,
    seq: u64,
    group: &std::sync::Arc<str>,
    group_size: usize,
    input: &Array,
) {
    if group_size < 2 {
        return;
    }
    {
        let mut state = state();
        let entered = Entered {
            op,
            seq,
            group: group.clone(),
            group_size,
            shape: input.shape().to_vec(),
            dtype: input.dtype(),
        };
        write(&state, &entered.record(false));
        state.last = Some(entered);
    }
}

fn write(state: &State, line: &str) {
    if let Some(file) = &state.file {
        let mut record = format!("{line}\n").into_bytes();
        record.resize(RECORD.max(record.len()), b' ');
        let _ = file.write_at(&record, 0);
    }
}

/// Whether waits are bounded: a collective of several ranks was entered.
pub(crate) fn bounded() -> bool {
    state().last.is_some()
}

/// The wait passed the timeout: says which collective it was in (on
/// stderr and in the progress file) and ends the process.
pub(crate) fn expire(timeout: Duration) -> ! {
    let (rank, last) = {
        let state = state();
        if let Some(last) = &state.last {
            write(&state, &last.record(true));
        }
        (state.rank, state.last.clone())
    };
    let hint = match &last {
        Some(l) if l.op == AGREEMENT => format!(
            " (every rank checks at init that all read the same {}; ranks of another program, such as MLX Python, do not: set {}=native on every rank)",
            super::LOWERING_ENV,
            super::LOWERING_ENV
        ),
        _ => String::new(),
    };
    let what = last.map_or_else(|| "a collective".to_owned(), |l| l.describe()) + &hint;
    let reason = format!(
        "rank {} waited {:.0} s in {what} without it completing: a peer never joined it (stopped, deadlocked, or in another collective)",
        rank.map_or("?".to_owned(), |r| r.to_string()),
        timeout.as_secs_f64()
    );
    leave(&reason, TIMEOUT_ENV)
}

/// Joining the group passed the timeout: says so and ends the process.
pub(crate) fn expire_joining(timeout: Duration) -> ! {
    let rank = rank_from_env().map_or("?".to_owned(), |r| r.to_string());
    {
        let state = state();
        let joining = Record {
            waits: true,
            op: "joining".to_owned(),
            seq: 0,
            group: super::contract::OWN_COUNT.to_owned(),
        };
        write(&state, &joining.line("its group"));
    }
    let reason = format!(
        "rank {rank} waited {:.0} s to join its group without every rank connecting: a peer never started, is stopped, or does not answer as a rank of this run",
        timeout.as_secs_f64()
    );
    leave(&reason, JOIN_TIMEOUT_ENV)
}

/// What runs when this process's wait on a peer timed out, just before it
/// exits: an [`on_timeout`] function.
type Hook = Box<dyn Fn(&str) + Send + Sync>;

static HOOKS: Mutex<Vec<Hook>> = Mutex::new(Vec::new());

/// Registers `hook` to run when a wait on a peer passes its timeout, just
/// before the process exits with [`TIMEOUT_EXIT`]: it gets the reason
/// (`rank 0 waited 5 s in stage_recv #3 (...) without it completing: a
/// peer never joined it (...)`) and has about 200 ms for its work, on the
/// thread that found the timeout, while other threads still run. A server
/// tells its open requests why they end (`safemlx serve` does). Keep it
/// short and non-blocking: the process exits after it, whatever it does.
///
/// ```
/// safemlx_dist::on_timeout(|reason| eprintln!("ending: {reason}"));
/// ```
pub fn on_timeout(hook: impl Fn(&str) + Send + Sync + 'static) {
    HOOKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(Box::new(hook));
}

/// Prints `reason`, runs the [`on_timeout`] hooks and exits with
/// [`TIMEOUT_EXIT`]; once: a second thread that finds the same wait
/// expired waits for the first one's exit. `env` is the setting that
/// lengthens the wait.
fn leave(reason: &str, env: &str) -> ! {
    static LEAVING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if LEAVING.swap(true, std::sync::atomic::Ordering::AcqRel) {
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    // One write: under mpirun each write is tagged on its own.
    let line = format!(
        "safemlx-dist: {reason}. Exiting with status {TIMEOUT_EXIT}; set {env} (seconds) to wait longer\n"
    );
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Ok(hooks) = HOOKS.try_lock() {
        for hook in hooks.iter() {
            hook(reason);
        }
    }
    // The launcher reads every rank's progress when the first one times
    // out (it polls every 20 ms); give it that moment before the run is
    // torn down and a stopped peer possibly woken.
    std::thread::sleep(Duration::from_millis(200));
    // `_exit`: the native threads are blocked in the transport, and exit
    // handlers could wait on them.
    super::native::exit_immediately(TIMEOUT_EXIT)
}
