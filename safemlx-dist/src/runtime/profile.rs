//! Where a step's time goes: the wall time spent in collectives.
//!
//! Collectives are lazy graph nodes, so their cost normally hides inside
//! whatever evaluation runs them. While a [`CollectiveProfile`] is active,
//! every collective of this process first evaluates its input (counted as
//! the caller's compute), then evaluates its own result and adds that wall
//! time, waiting for peers included, to the profile. This synchronises
//! each collective with the compute around it, so measure a step's plain
//! time without the profile and its collective share with it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use safemlx::Array;

use crate::error::Result;

static ACTIVE: AtomicBool = AtomicBool::new(false);
static NANOS: AtomicU64 = AtomicU64::new(0);
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Time spent in collectives (`all_sum`, `all_max`, `all_min`,
/// `all_gather`, `sum_scatter`, `all_to_all_v`) between [`start`](Self::start)
/// and [`stop`](Self::stop), process-wide.
///
/// ```
/// use safemlx::{Array, Device, DeviceType, Stream};
/// use safemlx_dist::{all_sum, init, Backend, CollectiveProfile};
///
/// let s = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));
/// let group = init(false, Backend::Any)?;
/// let profile = CollectiveProfile::start();
/// all_sum(&Array::from_slice(&[1.0f32, 2.0], &[2]), &group, &s)?;
/// let spent = profile.stop();
/// assert_eq!(spent.calls, 1);
/// assert!(spent.seconds >= 0.0);
/// # Ok::<(), safemlx_dist::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "a profile measures until it is stopped"]
pub struct CollectiveProfile(());

/// What a [`CollectiveProfile`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CollectiveTime {
    /// Wall seconds inside collectives, waiting for peers included.
    pub seconds: f64,
    /// How many collectives ran.
    pub calls: u64,
}

impl CollectiveProfile {
    /// Starts measuring from zero.
    pub fn start() -> Self {
        NANOS.store(0, Ordering::SeqCst);
        CALLS.store(0, Ordering::SeqCst);
        ACTIVE.store(true, Ordering::SeqCst);
        Self(())
    }

    /// Stops measuring; what was spent since [`start`](Self::start).
    pub fn stop(self) -> CollectiveTime {
        ACTIVE.store(false, Ordering::SeqCst);
        CollectiveTime {
            seconds: NANOS.load(Ordering::SeqCst) as f64 * 1e-9,
            calls: CALLS.load(Ordering::SeqCst),
        }
    }
}

impl Drop for CollectiveProfile {
    fn drop(&mut self) {
        ACTIVE.store(false, Ordering::SeqCst);
    }
}

/// Runs one collective; while a profile is active, evaluated and timed.
pub(crate) fn timed(input: &Array, collective: impl FnOnce() -> Result<Array>) -> Result<Array> {
    if !ACTIVE.load(Ordering::Relaxed) {
        return collective();
    }
    super::eval(&[input])?;
    let started = Instant::now();
    let output = collective()?;
    super::eval(&[&output])?;
    let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    NANOS.fetch_add(nanos, Ordering::SeqCst);
    CALLS.fetch_add(1, Ordering::SeqCst);
    Ok(output)
}
