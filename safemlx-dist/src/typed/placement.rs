//! Placements: how a rank's local array relates to the logical array.
//!
//! | placement | local array on rank `r` | logical array |
//! |---|---|---|
//! | [`Replicated`] | the whole array, identical on every rank | any rank's local |
//! | [`Sharded<AXIS>`] | the `r`-th chunk along `AXIS` | the chunks concatenated in rank order |
//! | [`Partial`] | a partial sum | the element-wise sum over ranks |
//! | [`Ragged`] | a variable number of leading rows | the rows concatenated in rank order |

use std::fmt::Debug;

mod sealed {
    pub trait Sealed {}
}

/// A layout of a logical array across the ranks of a group. Sealed: the four
/// placements below are all there is, and the transition and op tables are
/// written for exactly them.
pub trait Placement: sealed::Sealed + Copy + Default + Debug + 'static {
    /// The sharded axis, for `Sharded<AXIS>`.
    const AXIS: Option<usize>;
    /// Whether ranks hold run-time numbers of leading rows (`Ragged`).
    const RAGGED: bool = false;
    /// Whether every rank holds the whole array (`Replicated`).
    const REPLICATED: bool = false;
    /// The placement's name in messages, e.g. `Sharded<1>`.
    fn name() -> String;
}

/// The whole array on every rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replicated;

/// Rank `r` holds the `r`-th contiguous chunk along `AXIS`.
///
/// Chunk sizes follow one rule everywhere: a dimension `d` over `n` ranks
/// gives the first `d % n` ranks `d / n + 1` elements and the others `d / n`
/// (10 rows over 3 ranks: 4, 3, 3), as `numpy.array_split` does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sharded<const AXIS: usize>;

/// Each rank holds a partial sum; the logical array is their sum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Partial;

/// Each rank holds a run-time number of leading rows (e.g. routed tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ragged;

impl sealed::Sealed for Replicated {}
impl<const AXIS: usize> sealed::Sealed for Sharded<AXIS> {}
impl sealed::Sealed for Partial {}
impl sealed::Sealed for Ragged {}

impl Placement for Replicated {
    const AXIS: Option<usize> = None;
    const REPLICATED: bool = true;
    fn name() -> String {
        "Replicated".into()
    }
}

impl<const AXIS: usize> Placement for Sharded<AXIS> {
    const AXIS: Option<usize> = Some(AXIS);
    fn name() -> String {
        format!("Sharded<{AXIS}>")
    }
}

impl Placement for Partial {
    const AXIS: Option<usize> = None;
    fn name() -> String {
        "Partial".into()
    }
}

impl Placement for Ragged {
    const AXIS: Option<usize> = None;
    const RAGGED: bool = true;
    fn name() -> String {
        "Ragged".into()
    }
}

/// Placements a nonlinear function may be applied to: every one but
/// [`Partial`], since `f(a) + f(b) != f(a + b)` for a nonlinear `f`.
#[diagnostic::on_unimplemented(
    message = "a nonlinear function cannot be applied to `{Self}`: the ranks hold unreduced partial sums",
    label = "this array is `{Self}`",
    note = "reduce first: `.all_sum()` gives `Replicated`, `.sum_scatter::<AXIS>()` gives `Sharded<AXIS>`"
)]
pub trait Nonlinear: Placement {}

impl Nonlinear for Replicated {}
impl<const AXIS: usize> Nonlinear for Sharded<AXIS> {}
impl Nonlinear for Ragged {}

/// The chunk of a dimension of `dim` elements that rank `rank` of `size`
/// holds: `(offset, length)`, by the rule documented on [`Sharded`].
pub fn chunk(dim: usize, rank: usize, size: usize) -> (usize, usize) {
    let (base, extra) = (dim / size, dim % size);
    let len = base + usize::from(rank < extra);
    let offset = rank * base + rank.min(extra);
    (offset, len)
}

/// The part `(offset, length)` rank `rank` holds of a dimension divided
/// as `split` says (every rank's length, in rank order; see
/// `ShardedArray::from_local_split`), the explicit counterpart of
/// [`chunk`].
pub fn split_part(split: &[usize], rank: usize) -> (usize, usize) {
    let offset = split.iter().take(rank).sum();
    (offset, split.get(rank).copied().unwrap_or(0))
}

/// Every rank's chunk length of a dimension of `dim` elements.
pub fn chunk_lengths(dim: usize, size: usize) -> Vec<usize> {
    (0..size).map(|r| chunk(dim, r, size).1).collect()
}

/// Every rank's length of a dimension of `dim` elements divided in
/// proportion to `weights` (one per rank): the floors of the exact
/// shares, then one more for the largest remainders (earlier ranks on
/// ties). A small weight may get nothing.
///
/// ```
/// use safemlx_dist::typed::weighted_lengths;
///
/// assert_eq!(weighted_lengths(9, &[3, 1]), [7, 2]);
/// assert_eq!(weighted_lengths(10, &[1, 1, 1]), [4, 3, 3]);
/// ```
pub fn weighted_lengths(dim: usize, weights: &[u32]) -> Vec<usize> {
    let total: u64 = weights.iter().map(|w| u64::from(*w)).sum::<u64>().max(1);
    let dim64 = dim as u64;
    let mut lengths: Vec<usize> = weights
        .iter()
        .map(|w| (dim64 * u64::from(*w) / total) as usize)
        .collect();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    // Remainders compared as numerators over the common `total` (a stable
    // sort keeps earlier ranks first on ties).
    order.sort_by_key(|&k| std::cmp::Reverse(dim64 * u64::from(weights[k]) % total));
    let left = dim.saturating_sub(lengths.iter().sum::<usize>());
    for &k in order.iter().take(left) {
        lengths[k] += 1;
    }
    lengths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_follow_array_split() {
        assert_eq!(chunk_lengths(10, 3), [4, 3, 3]);
        assert_eq!(chunk_lengths(8, 4), [2, 2, 2, 2]);
        assert_eq!(chunk_lengths(2, 4), [1, 1, 0, 0]);
        assert_eq!(chunk(10, 2, 3), (7, 3));
        assert_eq!(Sharded::<1>::name(), "Sharded<1>");
    }
}
