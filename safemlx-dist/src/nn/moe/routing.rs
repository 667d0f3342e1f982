//! Routing on the device: top-k, gates, the order of the routed rows,
//! and the router statistics.

use safemlx::ops;
use safemlx::{Array, Dtype, Stream};

use super::config::Gating;
use super::Moe;
use crate::error::{Error, Result};
use crate::runtime::slice_axis;

pub(super) fn int_array(values: &[i32]) -> Array {
    Array::from_slice(values, &[values.len() as i32])
}

pub(super) fn host_f32(a: &Array, s: &Stream) -> Result<Vec<f32>> {
    let a = a.as_dtype(Dtype::Float32, s)?.contiguous(false, s)?;
    crate::runtime::eval(&[&a])?;
    a.into_evaluated()?
        .try_to_vec::<f32>()
        .map_err(|e| Error::Shape(format!("reading router statistics: {e}")))
}

/// `x * sigmoid(x)`.
pub(super) fn silu(x: &Array, s: &Stream) -> Result<Array> {
    Ok(x.multiply(ops::sigmoid(x, s)?, s)?)
}

/// The rows `indices` (`[m]`) of `a` along axis 0; an empty result
/// without indexing when `m` is 0 (MLX's take from an empty axis divides
/// by its length).
pub(super) fn take_rows(a: &Array, indices: &Array, s: &Stream) -> Result<Array> {
    if indices.shape().first().copied().unwrap_or(0) == 0 {
        let mut shape = a.shape().to_vec();
        shape[0] = 0;
        return Ok(ops::zeros_dtype(&shape, a.dtype(), s)?);
    }
    Ok(a.take_axis(indices, 0, s)?)
}

/// `0, 1, ..., len - 1` as int32.
pub(super) fn arange(len: usize, s: &Stream) -> Result<Array> {
    Ok(ops::arange::<_, i32>(0, len as i32, None, s)?)
}

/// The routing of `t` tokens, decided on the device.
pub(super) struct Routing {
    /// `[t * k]` gates, slot `token * k + j`, float32, scaled.
    pub(super) gates: Array,
    /// `[t * k]` int32 expert of each slot.
    pub(super) expert: Array,
    /// `[t * k]` int32 slots: the kept ones sorted by expert (token order
    /// within an expert), then the dropped ones.
    pub(super) order: Array,
    /// `[3 E + 2]` float32: slots kept per expert, then the statistics:
    /// slots per expert (before capacity), summed router probabilities per
    /// expert, summed squared logsumexp, tokens. Gathered (expert
    /// parallel) or read (expert tensor parallel) in one go.
    pub(super) summary: Array,
}

impl Moe {
    /// The routing of `x` `[t, D]` by `router` `[D, E]` and its bias `[E]`
    /// when it has one (see [`Routing`]).
    pub(super) fn route(
        &self,
        x: &Array,
        (router, bias): (&Array, Option<&Array>),
        s: &Stream,
    ) -> Result<Routing> {
        let (e, k) = (self.num_experts, self.config.top_k);
        let t = usize::try_from(x.shape()[0]).unwrap_or(0);
        let slots = t * k;
        if t == 0 {
            // No tokens on this rank (MLX rejects some reductions of empty
            // arrays): nothing routed, zero statistics.
            let empty = || ops::zeros::<i32>(&[0], s);
            return Ok(Routing {
                gates: ops::zeros::<f32>(&[0], s)?,
                expert: empty()?,
                order: empty()?,
                summary: ops::zeros::<f32>(&[3 * e as i32 + 2], s)?,
            });
        }
        let logits = match bias {
            Some(b) => ops::addmm(b, x, router, None, None, s)?,
            None => x.matmul(router, s)?,
        };
        let logits = logits.as_dtype(Dtype::Float32, s)?;
        let probs = match self.config.gating {
            Gating::SigmoidGroups { .. } => ops::sigmoid(&logits, s)?,
            _ => ops::softmax_axis(&logits, -1, None, s)?,
        };
        let chosen = if k == e {
            ops::broadcast_to(
                arange(e, s)?.reshape(&[1, e as i32], s)?,
                &[t as i32, e as i32],
                s,
            )?
        } else {
            // The choice is discrete: no gradient flows through it.
            let fixed = match self.config.gating {
                Gating::SigmoidGroups {
                    groups, topk_group, ..
                } => {
                    let scores = safemlx::stop_gradient(&probs, s)?;
                    self.group_limited(&scores, (groups, topk_group), s)?
                }
                _ => safemlx::stop_gradient(&logits, s)?,
            };
            let top = ops::argpartition_axis(fixed.negative(s)?, (k - 1) as i32, -1, s)?;
            slice_axis(&top, 1, 0, k, s)?
        };
        let chosen = chosen.as_dtype(Dtype::Int32, s)?;
        let gates = match self.config.gating {
            Gating::SoftmaxTopK { normalize } => {
                let g = probs.take_along_axis(&chosen, -1, s)?;
                if normalize {
                    g.divide(g.sum_axis(-1, true, s)?, s)?
                } else {
                    g
                }
            }
            Gating::TopKSoftmax => {
                ops::softmax_axis(logits.take_along_axis(&chosen, -1, s)?, -1, None, s)?
            }
            Gating::SigmoidGroups { normalize, .. } => {
                let g = probs.take_along_axis(&chosen, -1, s)?;
                if normalize && k > 1 {
                    g.divide(g.sum_axis(-1, true, s)?, s)?
                } else {
                    g
                }
            }
        };
        let gates = gates
            .multiply(Array::from_f32(self.config.routed_scaling), s)?
            .reshape(&[slots as i32], s)?;
        let expert = chosen.reshape(&[slots as i32], s)?;
        // Slots per expert, by a one-hot sum (no host loop over tokens).
        let one_hot = expert
            .reshape(&[slots as i32, 1], s)?
            .eq(arange(e, s)?.reshape(&[1, e as i32], s)?, s)?
            .as_dtype(Dtype::Int32, s)?;
        let counts = one_hot.sum_axis(0, false, s)?;
        // Slots by expert, token order within an expert (unique keys).
        let position = arange(slots, s)?;
        let by_expert = ops::argsort(
            expert
                .multiply(Array::from_int(slots as i32), s)?
                .add(&position, s)?,
            s,
        )?;
        let (order, kept) = match self.config.capacity_factor {
            None => (by_expert, counts.clone()),
            Some(factor) => {
                let cap = (factor * slots as f32 / e as f32).ceil().max(0.0) as i32;
                // Position of each sorted slot within its expert's run.
                let starts = ops::cumsum(&counts, 0, None, None, s)?.subtract(&counts, s)?;
                let sorted_expert = expert.take_axis(&by_expert, 0, s)?;
                let within = position.subtract(starts.take_axis(&sorted_expert, 0, s)?, s)?;
                let keep = within.lt(Array::from_int(cap), s)?;
                // Kept slots first, each group in its sorted order.
                let key = ops::r#where(
                    &keep,
                    &position,
                    position.add(Array::from_int(slots as i32), s)?,
                    s,
                )?;
                let order = by_expert.take_axis(ops::argsort(&key, s)?, 0, s)?;
                let kept = ops::minimum(&counts, Array::from_int(cap), s)?;
                (order, kept)
            }
        };
        let lse = ops::logsumexp_axis(&logits, -1, false, s)?;
        let summary = ops::concatenate_axis(
            &[
                kept.as_dtype(Dtype::Float32, s)?,
                counts.as_dtype(Dtype::Float32, s)?,
                probs.sum_axis(0, false, s)?,
                lse.square(s)?.sum(false, s)?.reshape(&[1], s)?,
                Array::from_slice(&[t as f32], &[1]),
            ],
            0,
            s,
        )?;
        Ok(Routing {
            gates,
            expert,
            order,
            summary,
        })
    }

    /// The scores experts are chosen on under [`Gating::SigmoidGroups`]:
    /// `scores` `[t, E]` plus the correction bias, zero outside the
    /// `topk_group` groups whose two best biased scores sum highest (as
    /// mlx-lm's and Transformers' `noaux_tc` routing sets them).
    fn group_limited(
        &self,
        scores: &Array,
        (groups, topk_group): (usize, usize),
        s: &Stream,
    ) -> Result<Array> {
        let scores = match &self.score_bias {
            Some(bias) => scores.add(bias, s)?,
            None => scores.clone(),
        };
        if groups <= 1 || topk_group >= groups {
            return Ok(scores);
        }
        let (t, per) = (scores.shape()[0], (self.num_experts / groups) as i32);
        let grouped = scores.reshape(&[t, groups as i32, per], s)?;
        let best = per.min(2);
        let sorted = ops::sort_axis(&grouped, -1, s)?;
        let group_score = slice_axis(&sorted, 2, (per - best) as usize, best as usize, s)?
            .sum_axis(-1, false, s)?;
        // The topk_group-th highest group score: groups at or above it stay.
        let ranked = ops::sort_axis(&group_score, -1, s)?;
        let floor = slice_axis(&ranked, 1, groups - topk_group, 1, s)?;
        let keep = group_score.ge(&floor, s)?.expand_dims(-1, s)?;
        let kept = ops::r#where(&keep, &grouped, Array::from_f32(0.0), s)?;
        Ok(kept.reshape(&[t, self.num_experts as i32], s)?)
    }

    /// The kept slots per expert of each rank (rows) and the statistics
    /// summed over the ranks, from `ranks` routing summaries laid end to
    /// end (an `all_gather` of them, or one).
    pub(super) fn read_summaries(
        &self,
        all: &Array,
        ranks: usize,
        s: &Stream,
    ) -> Result<(Vec<Vec<usize>>, Vec<f32>)> {
        let e = self.num_experts;
        let width = 3 * e + 2;
        let flat = host_f32(all, s)?;
        if flat.len() != ranks * width {
            return Err(Error::Native {
                operation: "MoE routing summary",
                message: format!("got {} numbers, expected {}", flat.len(), ranks * width),
            });
        }
        let mut stats = vec![0f32; 2 * e + 2];
        let kept = flat
            .chunks(width)
            .map(|row| {
                for (total, v) in stats.iter_mut().zip(&row[e..]) {
                    *total += v;
                }
                row[..e].iter().map(|&c| c.max(0.0) as usize).collect()
            })
            .collect();
        Ok((kept, stats))
    }

    /// The balancing and z losses from the summed statistics.
    pub(super) fn losses(&self, stats: &[f32]) -> (f32, f32) {
        let (e, k) = (self.num_experts, self.config.top_k as f32);
        let tokens = stats[2 * e + 1].max(1.0);
        let aux = (0..e)
            .map(|c| (stats[c] / (tokens * k)) * (stats[e + c] / tokens))
            .sum::<f32>()
            * e as f32;
        (aux, stats[2 * e] / tokens)
    }
}
