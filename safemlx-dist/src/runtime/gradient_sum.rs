//! The gradient sums of tensor parallelism, and whether a gradient is
//! being traced.
//!
//! A `Replicated` value entering computation that differs by rank has, on
//! each rank, only this rank's share of its gradient; the sum of the shares
//! over the ranks is an identity whose backward pass is an `all_sum`
//! (Megatron's `f`, MLX Python's `sum_gradients`). It is a collective, so
//! it lives with the collectives; `grad` and the typed layer above use it
//! (see `grad.rs`). Outside of a traced gradient nothing is inserted.

use std::cell::Cell;

use safemlx::{Array, Stream};

use super::group::Group;
use crate::error::{Error, Result};

thread_local! {
    static TRACING: Cell<usize> = const { Cell::new(0) };
}

/// Whether this thread is tracing a gradient
/// (`grad::value_and_grad`).
pub fn is_tracing() -> bool {
    TRACING.with(Cell::get) > 0
}

/// Marks this thread as tracing a gradient while it lives.
pub(crate) struct Tracing;

impl Tracing {
    pub(crate) fn enter() -> Self {
        TRACING.with(|t| t.set(t.get() + 1));
        Self
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        TRACING.with(|t| t.set(t.get().saturating_sub(1)));
    }
}

/// `x` unchanged; while tracing a gradient on a group of several ranks, its
/// gradient is summed over the ranks (one `all_sum` in the backward pass).
///
/// The typed ops call this where a `Replicated` value meets rank-dependent
/// computation; call it yourself where you leave the typed layer (with
/// [`ShardedArray::local`]) and use a replicated array in computation that
/// differs by rank.
///
/// # Errors
/// An MLX error.
pub fn sum_gradients(x: &Array, group: &Group, s: &Stream) -> Result<Array> {
    if !is_tracing() || group.is_singleton() {
        return Ok(x.clone());
    }
    let (group, s) = (group.clone(), s.clone());
    super::native::identity_with_vjp(x, Box::new(move |g| super::all_sum(g, &group, &s)))
}

/// Where a rank's shared part lies in the gradient buffer of
/// [`sum_gradients_together`]: its `count` blocks from block `first` of
/// `slots` blocks of `len` values each (a rank's KV heads among every KV
/// head of a layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SharedSlots {
    pub(crate) first: usize,
    pub(crate) count: usize,
    pub(crate) slots: usize,
    pub(crate) len: usize,
}

impl SharedSlots {
    /// No shared part.
    pub(crate) const NONE: Self = Self {
        first: 0,
        count: 0,
        slots: 0,
        len: 0,
    };
}

/// `whole` and `shared` unchanged; while tracing a gradient on several
/// ranks, their gradients are summed in one `all_sum`: those of `whole`
/// over every rank, those of `shared` (`at.count` blocks of `at.len`
/// values) with the same blocks of the ranks that hold them (the ranks
/// holding one copy of a replicated head).
///
/// One sum for several arrays matters where ranks build different graphs
/// (a rank computing nothing for a layer, e.g. one whose experts got no
/// token): two independent sums could reach the backward pass in another
/// order there than on its peers and pair the wrong operands. Every rank
/// must call it alike (same shapes of `whole`, same `at.slots` and
/// `at.len`); a shared array's gradient travels as the whole buffer of
/// `at.slots` blocks.
///
/// # Errors
/// Blocks past `at.slots`, a shared part of another length than its
/// blocks, or an MLX error.
pub(crate) fn sum_gradients_together(
    whole: &[&Array],
    shared: &[&Array],
    at: SharedSlots,
    comm: &Group,
    s: &Stream,
) -> Result<(Vec<Array>, Vec<Array>)> {
    let clones = |a: &[&Array]| a.iter().map(|&a| a.clone()).collect::<Vec<_>>();
    if !is_tracing() || comm.size() == 1 {
        return Ok((clones(whole), clones(shared)));
    }
    let shared_len: usize = shared.iter().map(|a| a.size()).sum();
    if at.first + at.count > at.slots || shared_len != at.count * at.len {
        return Err(Error::Shape(format!(
            "gradient blocks {}..{} of {} blocks of {} values for a shared part of {shared_len} values: the blocks must lie within the count and hold the part",
            at.first,
            at.first + at.count,
            at.slots,
            at.len
        )));
    }
    let flat = |a: &&Array| -> Result<Array> {
        Ok(a.as_dtype(safemlx::Dtype::Float32, s)?.reshape(&[-1], s)?)
    };
    let pieces: Vec<Array> = whole
        .iter()
        .chain(shared)
        .map(flat)
        .collect::<Result<_>>()?;
    let whole_len: usize = whole.iter().map(|a| a.size()).sum();
    let joint = safemlx::ops::concatenate_axis(&pieces, 0, s)?;
    let (group, stream) = (comm.clone(), s.clone());
    let joint = super::native::identity_with_vjp(
        &joint,
        Box::new(move |g| {
            let s = &stream;
            let cut = |a: &Array, at: usize, len: usize| super::slice_axis(a, 0, at, len, s);
            let zeros =
                |len: usize| -> Result<Array> { Ok(safemlx::ops::zeros::<f32>(&[len as i32], s)?) };
            // The shared part in its blocks of a `slots`-block buffer.
            let before = at.first * at.len;
            let after = (at.slots - at.first - at.count) * at.len;
            let buffer = safemlx::ops::concatenate_axis(
                &[
                    cut(g, 0, whole_len)?,
                    zeros(before)?,
                    cut(g, whole_len, shared_len)?,
                    zeros(after)?,
                ],
                0,
                s,
            )?;
            let summed = super::all_sum(&buffer, &group, s)?;
            Ok(safemlx::ops::concatenate_axis(
                &[
                    cut(&summed, 0, whole_len)?,
                    cut(&summed, whole_len + before, shared_len)?,
                ],
                0,
                s,
            )?)
        }),
    )?;
    let mut offset = 0;
    let mut back = |like: &&Array| -> Result<Array> {
        let piece = super::slice_axis(&joint, 0, offset, like.size(), s)?;
        offset += like.size();
        Ok(piece.reshape(like.shape(), s)?.as_dtype(like.dtype(), s)?)
    };
    let whole = whole.iter().map(&mut back).collect::<Result<Vec<_>>>()?;
    let shared = shared.iter().map(&mut back).collect::<Result<Vec<_>>>()?;
    Ok((whole, shared))
}
