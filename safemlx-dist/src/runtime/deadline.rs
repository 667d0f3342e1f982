//! Every wait on a peer is bounded, by a thread that is not the waiting one.
//!
//! A rank waiting on a stopped peer may be blocked anywhere: in this
//! crate's polling loop, but also inside MLX (its scheduler blocks the
//! submitting thread once many tasks are in flight, as a decode step's
//! graph has) or in the backend's connection setup while the group is
//! joined. So the waiting thread only marks when its wait began
//! ([`waiting`], [`joining`]); a watch thread, started once per process
//! when it becomes a rank of several, checks the mark every 125 ms against
//! `SAFEMLX_DIST_TIMEOUT` (joining: `SAFEMLX_DIST_JOIN_TIMEOUT`, by default
//! the same but at least a minute, since joining also waits for the
//! slowest rank to start) and ends the process past it, saying what it
//! waited in. The same thread writes the rank's heartbeat for the
//! launcher four times a second.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

use super::{contract, progress};

/// When the current wait began (milliseconds since [`epoch`], at least 1);
/// 0 when the process waits on nothing.
static SINCE_MS: AtomicU64 = AtomicU64::new(0);
/// Whether the current wait is joining a group.
static JOINING: AtomicBool = AtomicBool::new(false);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A wait in progress; it ends when this is dropped.
pub(crate) struct Waiting(());

impl Drop for Waiting {
    fn drop(&mut self) {
        SINCE_MS.store(0, Ordering::Release);
        JOINING.store(false, Ordering::Release);
    }
}

/// Marks the start of an evaluation that may wait on peers. It is bounded
/// once the process has entered a collective of several ranks.
pub(crate) fn waiting() -> Waiting {
    SINCE_MS.store(now_ms().max(1), Ordering::Release);
    Waiting(())
}

/// Marks the start of joining a group: bounded always.
pub(crate) fn joining() -> Waiting {
    JOINING.store(true, Ordering::Release);
    waiting()
}

/// Starts the watch thread, once per process.
pub(crate) fn watch() {
    static START: Once = Once::new();
    START.call_once(|| {
        epoch();
        // Validated by `init` already; the defaults if they were not.
        let limit = progress::timeout_from_env().unwrap_or(contract::DEFAULT_TIMEOUT);
        let join = progress::join_timeout_from_env()
            .unwrap_or_else(|_| limit.max(contract::MIN_JOIN_TIMEOUT));
        let spawned = std::thread::Builder::new()
            .name("safemlx-dist-deadline".to_owned())
            .spawn(move || watch_loop(limit, join));
        if let Err(e) = spawned {
            eprintln!("safemlx-dist: cannot start the collective timeout's thread: {e}");
        }
    });
}

fn watch_loop(limit: Duration, join: Duration) {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let (limit_ms, join_ms) = (ms(limit), ms(join));
    let mut tick = 0u64;
    loop {
        if tick % 2 == 0 {
            progress::heartbeat();
        }
        tick = tick.wrapping_add(1);
        std::thread::sleep(contract::HEARTBEAT / 2);
        let since = SINCE_MS.load(Ordering::Acquire);
        if since == 0 {
            continue;
        }
        let waited = now_ms().saturating_sub(since);
        if JOINING.load(Ordering::Acquire) {
            if waited >= join_ms {
                progress::expire_joining(join);
            }
        } else if waited >= limit_ms && progress::bounded() {
            progress::expire(limit);
        }
    }
}
