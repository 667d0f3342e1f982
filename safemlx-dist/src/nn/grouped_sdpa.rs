//! MLX's fused attention over a rank's heads when its query heads read
//! their KV heads unequally (a balanced head split; see `head_split.rs`):
//! one call per run of even grouping, the outputs joined along the heads;
//! a head shared with a neighbour by rows (`shared_head.rs`) on its own.

use safemlx::fast::ScaledDotProductAttentionMask;
use safemlx::{Array, Stream};

use super::head_split::{HeadSegment, HeadSplit};
use super::shared_head::SharedHead;
use crate::error::Result;
use crate::runtime::slice_axis;

/// A rank's heads as its attention runs them, made once at load: the runs
/// of all its heads (see [`HeadSplit::segments`](super::HeadSplit::segments)),
/// the runs of the heads it attends whole when it shares one, and that
/// shared head (its first or its last).
#[derive(Debug, Clone)]
pub(super) struct Runs {
    all: Vec<HeadSegment>,
    whole: Vec<HeadSegment>,
    shared: Option<SharedHead>,
}

impl Runs {
    /// The runs of `split`'s heads, `group` query heads per KV head.
    pub(super) fn of(split: &HeadSplit, group: usize) -> Self {
        Self {
            all: split.segments(group),
            whole: split.whole().segments(group),
            shared: split.shared,
        }
    }
}

/// Attention of `q` `[B, heads, T, hd]` over `keys` and `values` `[B, kv,
/// L, hd]` (heads on axis 1) with `sinks` `[heads]`: the whole heads per
/// run, a shared head over this rank's rows (zeros in the other rank's),
/// the outputs `[B, heads, T, hd]` joined in head order. A rank that
/// attends all of a shared head's rows (its owner in a decode step) runs
/// it with the others.
pub(super) fn attention(
    runs: &Runs,
    [q, keys, values]: [&Array; 3],
    scale: f32,
    mask: Option<&ScaledDotProductAttentionMask<'_>>,
    sinks: Option<&Array>,
    s: &Stream,
) -> Result<Array> {
    let t = usize::try_from(q.shape()[2]).unwrap_or(0);
    let rows = runs.shared.map(|h| (h, h.rows_of(t, keys)));
    let Some((shared, rows)) = rows.filter(|&(_, rows)| rows != (0, t)) else {
        return whole(&runs.all, [q, keys, values], scale, mask, sinks, s);
    };
    let heads = usize::try_from(q.shape()[1]).unwrap_or(0);
    let rest = if shared.owner { 0 } else { 1 };
    let at = |a: &Array, axis, first, count| slice_axis(a, axis, first, count, s);
    let sink = |first, count| sinks.map(|a| at(a, 0, first, count)).transpose();
    let one = shared.attend(
        [
            &at(q, 1, shared.local, 1)?,
            &at(keys, 1, shared.kv, 1)?,
            &at(values, 1, shared.kv, 1)?,
        ],
        rows,
        scale,
        mask,
        sink(shared.local, 1)?.as_ref(),
        s,
    )?;
    let others = whole(
        &runs.whole,
        [&at(q, 1, rest, heads - 1)?, keys, values],
        scale,
        mask,
        sink(rest, heads - 1)?.as_ref(),
        s,
    )?;
    let parts = if shared.owner {
        [others, one]
    } else {
        [one, others]
    };
    Ok(safemlx::ops::concatenate_axis(&parts, 1, s)?)
}

/// Attention of `q` `[B, heads, T, hd]` over `keys` and `values` `[B, kv,
/// L, hd]` (heads on axis 1) with `sinks` `[heads]`, run per segment of
/// `segments` (see [`HeadSplit::segments`](super::HeadSplit::segments)),
/// the outputs `[B, heads, T, hd]` joined in head order. With one segment
/// it is one call of MLX's `scaled_dot_product_attention`, as without a
/// split; with none (no query head) an empty output.
fn whole(
    segments: &[HeadSegment],
    [q, keys, values]: [&Array; 3],
    scale: f32,
    mask: Option<&ScaledDotProductAttentionMask<'_>>,
    sinks: Option<&Array>,
    s: &Stream,
) -> Result<Array> {
    let call = |q: &Array, k: &Array, v: &Array, sinks: Option<&Array>| -> Result<Array> {
        let mask = mask.map(|m| match m {
            ScaledDotProductAttentionMask::Array(a) => ScaledDotProductAttentionMask::Array(a),
            ScaledDotProductAttentionMask::Causal => ScaledDotProductAttentionMask::Causal,
        });
        Ok(safemlx::fast::scaled_dot_product_attention(
            q, k, v, scale, mask, sinks, s,
        )?)
    };
    match segments {
        [_] => return call(q, keys, values, sinks),
        [] => {
            // No query head (a rank holding none, while a gradient is
            // traced): an empty output that reads q, the keys and the
            // values in the fused call's order, so the backward reaches
            // their gradient sums as its peers' does.
            let mut out = q.clone();
            for a in [keys, values] {
                let none = a.sum(None, s)?.multiply(Array::from_f32(0.0), s)?;
                out = out.add(none.as_dtype(q.dtype(), s)?, s)?;
            }
            return Ok(out);
        }
        _ => {}
    }
    let outputs = segments
        .iter()
        .map(|seg| {
            let heads =
                |a: &Array, (first, count): (usize, usize)| slice_axis(a, 1, first, count, s);
            let sinks = sinks
                .map(|a| slice_axis(a, 0, seg.query.0, seg.query.1, s))
                .transpose()?;
            call(
                &heads(q, seg.query)?,
                &heads(keys, seg.kv)?,
                &heads(values, seg.kv)?,
                sinks.as_ref(),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(safemlx::ops::concatenate_axis(&outputs, 1, s)?)
}
