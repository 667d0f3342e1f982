//! Reductions as chunk exchanges through MLX's `all_to_all_v` (the
//! `all_to_all` lowering).
//!
//! An all-reduce is a reduce-scatter and an all-gather. With `n` ranks each
//! cuts its input into `n` equal chunks and sends chunk `j` to rank `j` (one
//! `all_to_all_v`); each rank reduces the `n` chunks it received, then
//! sends its reduced chunk to every rank (a second `all_to_all_v`). Each
//! rank sends and receives `2 (n-1)/n` of the input, as with a ring, but in
//! two of MLX's own operations instead of `2 (n-1)` steps, and lazily: the
//! second exchange depends on the first through the data, so MLX orders
//! them, and nothing is evaluated at the call.

use safemlx::{Array, Stream};

use super::composed::Combine;
use super::group::Group;
use super::native;
use crate::error::Result;

/// Counts of one row to and from every rank.
fn one_row_each(n: usize) -> Vec<i64> {
    vec![1; n]
}

/// The rows of `received` (`n` blocks along axis 0, one per source rank)
/// combined into one block.
pub(super) fn reduce_blocks(
    received: &Array,
    combine: Combine,
    n: usize,
    s: &Stream,
) -> Result<Array> {
    let blocks = received.split(i32::try_from(n).unwrap_or(i32::MAX), 0, s)?;
    let mut total = blocks[0].clone();
    for block in &blocks[1..] {
        total = combine.apply(&total, block, s)?;
    }
    Ok(total)
}

/// All-reduce of `input` with `combine`: the flattened input, padded with
/// zeros to `n` equal chunks (the padding is cut off again), exchanged and
/// reduced, then exchanged back.
pub(crate) fn all_reduce(
    input: &Array,
    combine: Combine,
    group: &Group,
    s: &Stream,
) -> Result<Array> {
    let n = group.size();
    let len = input.size();
    let width = len.div_ceil(n);
    let as_i32 = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
    let mut flat = input.reshape(&[-1], s)?;
    if width * n != len {
        let padding = safemlx::ops::zeros_dtype(&[as_i32(width * n - len)], input.dtype(), s)?;
        flat = safemlx::ops::concatenate_axis(&[&flat, &padding], 0, s)?;
    }
    let rows = flat.reshape(&[as_i32(n), as_i32(width)], s)?;
    let counts = one_row_each(n);
    let received = native::all_to_all_v(&rows, &counts, &counts, group.native()?, s)?;
    let mine = reduce_blocks(&received, combine, n, s)?; // [1, width]
    let copies: Vec<&Array> = (0..n).map(|_| &mine).collect();
    let outgoing = safemlx::ops::concatenate_axis(&copies, 0, s)?;
    let gathered = native::all_to_all_v(&outgoing, &counts, &counts, group.native()?, s)?;
    let flat = gathered.reshape(&[-1], s)?;
    let flat = if width * n == len {
        flat
    } else {
        flat.split_axis(&[as_i32(len)], 0, s)?.swap_remove(0)
    };
    Ok(flat.reshape(input.shape(), s)?)
}

/// Sum-scatter along axis 0 (whose length the group size divides): block
/// `j` of the rows goes to rank `j`, and each rank sums the `n` blocks it
/// received.
pub(crate) fn sum_scatter(input: &Array, group: &Group, s: &Stream) -> Result<Array> {
    let n = group.size();
    let rows = usize::try_from(input.shape()[0]).unwrap_or(0);
    let counts = vec![i64::try_from(rows / n).unwrap_or(i64::MAX); n];
    let received = native::all_to_all_v(input, &counts, &counts, group.native()?, s)?;
    reduce_blocks(&received, Combine::Sum, n, s)
}
