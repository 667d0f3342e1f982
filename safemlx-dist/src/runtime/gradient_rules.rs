//! MLX's gradient rules for collectives whose lowering has none: the
//! subgroups of a mesh axis composed of `send`/`recv` (ring, JACCL), and
//! `all_max` / `all_min`, whose MLX rule is right for a sum only.
//!
//! Each takes the collective's values from `collective` on the input with
//! its gradient stopped, and adds a term that is zero in value and carries
//! the gradient MLX gives its own ops (its `AllReduce` and `AllGather`
//! vjps), so a model trains the same on every backend:
//!
//! ```text
//! all_sum      y = sum(stop(x)) + (x - stop(x))         dx = dy
//! all_max/min  y = max(stop(x)) + (x - stop(x)) * share dx = dy where x is
//!              the maximum, split evenly between ranks that tie
//! all_gather   y = gather(stop(x)) + pad_r(x - stop(x))  dx = this rank's rows of dy
//! ```

use safemlx::{Array, Stream};

use super::composed::Combine;
use crate::error::Result;

/// `collective(stop(x))` (a sum, maximum or minimum over the ranks) with
/// MLX's gradient: the sum's passes through; the extremum's goes to the
/// elements equal to the result, split between the ranks that hold it
/// (`collective` of the hits, summed: `sum`).
pub(super) fn reduce(
    x: &Array,
    combine: Combine,
    collective: impl Fn(&Array, Combine) -> Result<Array>,
    s: &Stream,
) -> Result<Array> {
    let fixed = safemlx::stop_gradient(x, s)?;
    let result = collective(&fixed, combine)?;
    let zero = x.subtract(&fixed, s)?;
    if combine == Combine::Sum {
        return Ok(result.add(&zero, s)?);
    }
    let hit = fixed.eq(&result, s)?.as_dtype(x.dtype(), s)?;
    let ties = collective(&hit, Combine::Sum)?;
    let share = hit.divide(&ties, s)?;
    Ok(result.add(zero.multiply(&share, s)?, s)?)
}

/// `collective(stop(x))`, every rank's rows concatenated along axis 0
/// (rank `rank` of `size`), with MLX's gradient: this rank's rows of the
/// output's.
pub(super) fn all_gather(
    x: &Array,
    (rank, size): (usize, usize),
    collective: impl Fn(&Array) -> Result<Array>,
    s: &Stream,
) -> Result<Array> {
    let fixed = safemlx::stop_gradient(x, s)?;
    let gathered = collective(&fixed)?;
    // A scalar gathers into one row per rank.
    let zero = x.subtract(&fixed, s)?;
    let zero = match zero.ndim() {
        0 => zero.reshape(&[1], s)?,
        _ => zero,
    };
    let rows = zero.shape()[0];
    let block = |count: usize| -> Result<Array> {
        let mut shape = zero.shape().to_vec();
        shape[0] = rows * i32::try_from(count).unwrap_or(i32::MAX);
        Ok(safemlx::ops::zeros_dtype(&shape, x.dtype(), s)?)
    };
    let before = block(rank)?;
    let after = block(size - 1 - rank)?;
    let padded = safemlx::ops::concatenate_axis(&[before, zero, after], 0, s)?;
    Ok(gathered.add(&padded, s)?)
}
