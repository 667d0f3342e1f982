//! Evaluating without spinning.

use std::time::{Duration, Instant};

use safemlx::{Array, ArrayElement};

use crate::error::{Error, Result};

/// Evaluates `arrays`, sleeping (not spinning) while MLX's streams work.
///
/// MLX's own host wait (`Array::evaluated`, `safemlx::transforms::eval`)
/// spins with `yield`. When every rank of a group shares a few cores, the
/// spinning threads take the cores that the stream threads need for the
/// compute and to move the bytes: measured on 2 cores with 2 ranks, a
/// tensor-parallel MLP step took twice as long under MLX's wait as under
/// this one. Prefer this wherever ranks may share cores.
///
/// ```
/// use safemlx::{Array, Device, DeviceType, Stream};
///
/// let s = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));
/// let y = Array::from_slice(&[1.0f32, 2.0], &[2]).multiply(Array::from_f32(3.0), &s)?;
/// safemlx_dist::eval(&[&y])?;
/// assert_eq!(y.evaluated()?.try_to_vec::<f32>().unwrap(), vec![3.0, 6.0]);
/// # Ok::<(), safemlx_dist::Error>(())
/// ```
///
/// Once this process has entered a collective of a group of several
/// ranks, the wait is bounded by `SAFEMLX_DIST_TIMEOUT` seconds (default
/// 600): past it, the rank prints the collective it waits in (`all_sum
/// #38 (group of 4, [1, 576] Float32)`) and exits with status 124, since a
/// peer that never joins would otherwise hold every rank forever. A thread
/// of its own enforces it, so it holds wherever this thread is blocked,
/// inside MLX included.
///
/// While `grad::value_and_grad` traces
/// (an MoE reads its routing counts then), MLX allows only its own
/// blocking evaluation, which this then uses: it waits with MLX's spin,
/// bounded by the same timeout.
///
/// # Errors
/// What the evaluation raised (e.g. a collective's transport error).
pub fn eval(arrays: &[&Array]) -> Result<()> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    crate::fmaf::keep_linked();
    let _waiting = super::deadline::waiting();
    if super::gradient_sum::is_tracing() {
        // MLX refuses an asynchronous evaluation inside a transformation.
        safemlx::transforms::eval(arrays.iter().copied())?;
        return Ok(());
    }
    let event = safemlx::transforms::async_eval_with_event(arrays.iter().copied())?;
    let started = Instant::now();
    let mut pause = Duration::from_micros(5);
    let limit = if super::progress::bounded() {
        Some(super::progress::timeout_from_env()?)
    } else {
        None
    };
    while !event.is_complete()? {
        if let Some(limit) = limit.filter(|l| started.elapsed() >= *l) {
            super::progress::expire(limit);
        }
        std::thread::sleep(pause);
        // Short waits (a collective step) are noticed within 50 us; long
        // ones (a step of compute) wake this thread only every millisecond.
        pause = if started.elapsed() < Duration::from_millis(5) {
            (pause * 2).min(Duration::from_micros(50))
        } else {
            Duration::from_millis(1)
        };
    }
    // Surfaces an error the streams recorded, if any.
    event.synchronize()?;
    Ok(())
}

/// `a` evaluated (bounded, as [`eval`]) and read back to the host: the
/// small results of an exchange (counts, proofs, an agreement), which
/// `operation` names in an error.
///
/// # Errors
/// What the evaluation raised, or values MLX cannot read as `T`.
pub(crate) fn read_back<T: ArrayElement + Copy>(
    a: &Array,
    operation: &'static str,
) -> Result<Vec<T>> {
    eval(&[a])?;
    a.clone()
        .into_evaluated()?
        .try_to_vec::<T>()
        .map_err(|e| Error::Native {
            operation,
            message: e.to_string(),
        })
}
