//! Expert-parallel mixture of experts.

use safemlx::{Array, Dtype, Stream};

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::typed::{Ragged, Replicated, RoutingPlan, Sharded, ShardedArray};
use crate::{sharded, Group};

/// The weights of an expert-parallel MoE: a replicated router `[D, E]` and
/// `E` expert MLPs (`w1 [E, D, H]`, `w2 [E, H, D]`) split by experts: rank
/// `r` holds experts `r E/n .. (r+1) E/n`.
#[sharded]
#[derive(Debug)]
pub struct MoeWeights {
    /// `[D, E]`, on every rank.
    #[shard(Replicated)]
    pub router: ShardedArray<Replicated>,
    /// `[E, D, H]`, split by experts.
    #[shard(Sharded<0>)]
    pub w1: ShardedArray<Sharded<0>>,
    /// `[E, H, D]`, split by experts.
    #[shard(Sharded<0>)]
    pub w2: ShardedArray<Sharded<0>>,
}

/// What a forward returns besides the tokens.
#[derive(Debug)]
pub struct MoeOutput {
    /// This rank's tokens after the experts, `[t, D]`, in input order.
    pub tokens: ShardedArray<Ragged>,
    /// The load-balancing loss `E * sum_e f_e * P_e` over all ranks' tokens
    /// (`f_e`: share of routed slots that chose expert `e`; `P_e`: mean
    /// router probability of `e`). 1.0 when perfectly balanced.
    pub aux_loss: f32,
    /// Rows this rank sent to each rank.
    pub sent: Vec<usize>,
    /// Rows this rank's experts processed, from each rank.
    pub received: Vec<usize>,
    /// This rank's slots dropped by the capacity limit (0 when dropless).
    pub dropped: usize,
}

/// Experts sharded across ranks, top-k routing with softmax gates,
/// dropless: every token reaches its `k` experts. A forward exchanges the
/// per-destination counts (one `all_gather` of `n` counts), dispatches the
/// routed rows with one `all_to_all_v`, runs the local experts, and combines
/// with the reverse `all_to_all_v`.
#[derive(Debug)]
pub struct ExpertParallelMoe {
    weights: MoeWeights,
    experts: usize,
    top_k: usize,
    capacity_factor: Option<f32>,
}

fn host_f32(a: &Array, s: &Stream) -> Result<Vec<f32>> {
    let a = a.as_dtype(Dtype::Float32, s)?.contiguous(false, s)?;
    crate::eval(&[&a])?;
    let a = a.into_evaluated()?;
    a.try_to_vec::<f32>()
        .map_err(|e| Error::Shape(format!("reading router output: {e}")))
}

/// The expert count of a router `[D, E]`, checked against the rank count
/// and `top_k`.
fn check_experts(router: &[i32], n: usize, top_k: usize) -> Result<usize> {
    let experts = usize::try_from(router.get(1).copied().unwrap_or(0)).unwrap_or(0);
    if experts == 0 || experts % n != 0 {
        return Err(Error::Shape(format!(
            "{experts} experts over {n} ranks: each rank holds the same number of experts, so the expert count must be a multiple of the rank count"
        )));
    }
    if !(1..=2).contains(&top_k) {
        return Err(Error::Shape(format!(
            "top_k is {top_k}; the router supports 1 or 2"
        )));
    }
    Ok(experts)
}

/// The router `[D, E]` and experts `w1` `[E, D, H]`, `w2` `[E, H, D]` must
/// agree before anything is sliced; the message names the tensors
/// (`{prefix}router`, ...) and their shapes.
fn check_shapes(prefix: &str, router: &[i32], w1: &[i32], w2: &[i32]) -> Result<()> {
    let shapes =
        || format!("{prefix}router is {router:?}, {prefix}w1 is {w1:?}, {prefix}w2 is {w2:?}");
    let (&[d, e], &[e1, d1, h1], &[e2, h2, d2]) = (router, w1, w2) else {
        return Err(Error::Shape(format!(
            "an MoE needs a router [D, E], w1 [E, D, H] and w2 [E, H, D]: {}",
            shapes()
        )));
    };
    let disagree = [
        (
            e1 != e,
            "w1's expert count (axis 0) differs from the router's (axis 1)",
        ),
        (
            e2 != e,
            "w2's expert count (axis 0) differs from the router's (axis 1)",
        ),
        (
            d1 != d,
            "w1's model dimension (axis 1) differs from the router's (axis 0)",
        ),
        (
            d2 != d,
            "w2's model dimension (axis 2) differs from the router's (axis 0)",
        ),
        (
            h2 != h1,
            "w2's hidden dimension (axis 1) differs from w1's (axis 2)",
        ),
    ];
    match disagree.iter().find(|(bad, _)| *bad) {
        Some((_, what)) => Err(Error::Shape(format!("{what}: {}", shapes()))),
        None => Ok(()),
    }
}

fn indices(values: &[usize]) -> Array {
    let values: Vec<i32> = values.iter().map(|&v| v as i32).collect();
    Array::from_slice(&values, &[values.len() as i32])
}

impl ExpertParallelMoe {
    /// Builds this rank's part: the router, and its `E / n` experts.
    ///
    /// # Errors
    /// When `E` is not a multiple of the rank count, or `top_k` is not 1 or 2.
    pub fn from_full(
        group: &Group,
        top_k: usize,
        router: Array,
        w1: Array,
        w2: Array,
        s: &Stream,
    ) -> Result<Self> {
        check_shapes("", router.shape(), w1.shape(), w2.shape())?;
        let experts = check_experts(router.shape(), group.size(), top_k)?;
        let weights = MoeWeights::from_full(group, router, w1, w2, s)?;
        Ok(Self {
            weights,
            experts,
            top_k,
            capacity_factor: None,
        })
    }

    /// Builds this rank's part from a checkpoint's `{prefix}router`,
    /// `{prefix}w1` and `{prefix}w2`, reading only this rank's experts.
    ///
    /// # Errors
    /// Those of [`from_full`](Self::from_full), and a missing tensor.
    pub fn from_checkpoint(
        group: &Group,
        top_k: usize,
        checkpoint: &Checkpoint,
        prefix: &str,
        s: &Stream,
    ) -> Result<Self> {
        let shape = |name: &str| -> Result<Vec<i32>> {
            Ok(checkpoint.info(&format!("{prefix}{name}"))?.shape.clone())
        };
        let router = shape("router")?;
        check_shapes(prefix, &router, &shape("w1")?, &shape("w2")?)?;
        let experts = check_experts(&router, group.size(), top_k)?;
        let weights = MoeWeights::from_checkpoint(group, checkpoint, prefix, s)?;
        Ok(Self {
            weights,
            experts,
            top_k,
            capacity_factor: None,
        })
    }

    /// The full weights again: `router`, `w1`, `w2` (one `all_gather` per
    /// expert tensor).
    pub fn gather_full(&self, s: &Stream) -> Result<Vec<(&'static str, Array)>> {
        self.weights.gather_full(s)
    }

    /// Limits how many routed slots each rank sends to each expert to
    /// `ceil(factor * t * k / E)` for its `t` tokens; the slots over the
    /// limit (in token order) are dropped: they contribute nothing and are
    /// counted in [`MoeOutput::dropped`]. Without it the layer is dropless.
    pub fn with_capacity_factor(mut self, factor: f32) -> Self {
        self.capacity_factor = Some(factor);
        self
    }

    /// Routes this rank's tokens `[t, D]` (any number per rank) through
    /// their top-k experts and combines the gated outputs.
    pub fn forward(&self, tokens: &ShardedArray<Ragged>, s: &Stream) -> Result<MoeOutput> {
        let comm = tokens.comm().clone();
        let n = comm.size();
        let x = tokens.local();
        let (t, d) = (x.shape()[0] as usize, x.shape()[1]);
        let e = self.experts;
        let per_rank = e / n;

        // Router: softmax over experts, top-k per token on the host.
        let logits = x.matmul(self.weights.router.local(), s)?;
        let probs = safemlx::ops::softmax_axis(&logits, -1, None, s)?;
        let p = host_f32(&probs, s)?;
        let mut slots = Vec::with_capacity(t * self.top_k); // (token, expert, gate)
        for token in 0..t {
            let row = &p[token * e..(token + 1) * e];
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|a, b| row[*b].total_cmp(&row[*a]).then(a.cmp(b)));
            let chosen = &order[..self.top_k];
            let norm: f32 = chosen.iter().map(|&c| row[c]).sum();
            for &c in chosen {
                slots.push((token, c, row[c] / norm));
            }
        }

        // Dispatch order: by destination rank, then expert.
        // Capacity: the first `cap` slots (in token order) per expert stay.
        let mut kept = vec![true; slots.len()];
        if let Some(factor) = self.capacity_factor {
            let cap = (factor * (t * self.top_k) as f32 / e as f32)
                .ceil()
                .max(0.0) as usize;
            let mut used = vec![0usize; e];
            for (slot, &(_, expert, _)) in slots.iter().enumerate() {
                kept[slot] = used[expert] < cap;
                used[expert] += usize::from(kept[slot]);
            }
        }
        let dropped = kept.iter().filter(|k| !**k).count();
        let mut order: Vec<usize> = (0..slots.len()).filter(|&i| kept[i]).collect();
        order.sort_by_key(|&i| (slots[i].1 / per_rank, slots[i].1, i));
        let mut sent = vec![0usize; n];
        for &i in &order {
            sent[slots[i].1 / per_rank] += 1;
        }
        let rows = x.take_axis(
            indices(&order.iter().map(|&i| slots[i].0).collect::<Vec<_>>()),
            0,
            s,
        )?;
        let ids: Vec<f32> = order
            .iter()
            .map(|&i| (slots[i].1 % per_rank) as f32)
            .collect();
        let ids = Array::from_slice(&ids, &[ids.len() as i32, 1]);

        let plan = RoutingPlan::exchange(&comm, sent.as_slice(), s)?;
        let as_ragged = |a: Array| ShardedArray::<Ragged>::from_local(a.clone(), &comm, a.shape());
        let dispatched = as_ragged(rows)?;
        let routed = dispatched.route(&plan, s)?;
        let routed_ids = as_ragged(ids)?.route(&plan, s)?;
        // Every rank runs the exchanges now and in the same order: a rank
        // whose experts got no rows would otherwise never evaluate its part.
        crate::eval(&[routed_ids.local()])?;
        crate::eval(&[routed.local()])?;

        // Local experts on the rows they received (grouped on the host).
        let local_ids: Vec<usize> = host_f32(routed_ids.local(), s)?
            .into_iter()
            .map(|v| v as usize)
            .collect();
        let got = routed.local();
        let mut outputs = Vec::new();
        let mut placed = Vec::new();
        for j in 0..per_rank {
            let mine: Vec<usize> = (0..local_ids.len())
                .filter(|&i| local_ids[i] == j)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let inputs = got.take_axis(indices(&mine), 0, s)?;
            let pick = |w: &ShardedArray<Sharded<0>>| -> Result<Array> {
                let mut parts = w.local().split(per_rank as i32, 0, s)?;
                let shape = parts[j].shape()[1..].to_vec();
                Ok(parts.swap_remove(j).reshape(&shape, s)?)
            };
            let hidden = inputs.matmul(pick(&self.weights.w1)?, s)?;
            let hidden = hidden.multiply(safemlx::ops::sigmoid(&hidden, s)?, s)?;
            outputs.push(hidden.matmul(pick(&self.weights.w2)?, s)?);
            placed.extend(mine);
        }
        let processed = if outputs.is_empty() {
            safemlx::ops::zeros_dtype(&[0, d], x.dtype(), s)?
        } else {
            let all = safemlx::ops::concatenate_axis(&outputs, 0, s)?;
            // Back to arrival order.
            let mut inverse = vec![0usize; placed.len()];
            for (position, &row) in placed.iter().enumerate() {
                inverse[row] = position;
            }
            all.take_axis(indices(&inverse), 0, s)?
        };
        let back = as_ragged(processed)?.route_back(&plan, &dispatched, s)?;
        crate::eval(&[back.local()])?;

        // Combine: undo the dispatch order, weight by the gates, sum the k slots.
        // Dropped slots read an appended zero row.
        let zero_row = order.len();
        let mut inverse = vec![zero_row; slots.len()];
        for (position, &slot) in order.iter().enumerate() {
            inverse[slot] = position;
        }
        let zero = safemlx::ops::zeros_dtype(&[1, d], x.dtype(), s)?;
        let with_zero = safemlx::ops::concatenate_axis(&[back.local(), &zero], 0, s)?;
        let per_slot = with_zero.take_axis(indices(&inverse), 0, s)?;
        let gates: Vec<f32> = slots.iter().map(|s| s.2).collect();
        let gates = Array::from_slice(&gates, &[gates.len() as i32, 1]).as_dtype(x.dtype(), s)?;
        let combined = per_slot
            .multiply(&gates, s)?
            .reshape(&[t as i32, self.top_k as i32, d], s)?
            .sum_axis(1, None, s)?;

        // Load-balancing loss over all ranks' tokens.
        let mut stats = vec![0f32; 2 * e + 1];
        for &(_, c, _) in &slots {
            stats[c] += 1.0;
        }
        for token in 0..t {
            for c in 0..e {
                stats[e + c] += p[token * e + c];
            }
        }
        stats[2 * e] = t as f32;
        let totals = host_f32(
            &crate::all_sum(&Array::from_slice(&stats, &[stats.len() as i32]), &comm, s)?,
            s,
        )?;
        let all_tokens = totals[2 * e].max(1.0);
        let aux_loss = (0..e)
            .map(|c| (totals[c] / (all_tokens * self.top_k as f32)) * (totals[e + c] / all_tokens))
            .sum::<f32>()
            * e as f32;

        let tokens = as_ragged(combined)?;
        Ok(MoeOutput {
            tokens,
            aux_loss,
            sent,
            received: plan.recv_counts().to_vec(),
            dropped,
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn disagreeing_expert_tensors_are_named() {
        // Before: "Array split does not result in sub arrays with equal size".
        assert_eq!(
            super::check_shapes("moe.", &[64, 8], &[6, 64, 128], &[8, 128, 64])
                .unwrap_err()
                .to_string(),
            "w1's expert count (axis 0) differs from the router's (axis 1): moe.router is [64, 8], moe.w1 is [6, 64, 128], moe.w2 is [8, 128, 64]"
        );
        assert_eq!(
            super::check_shapes("", &[8, 64], &[8, 64, 128], &[8, 128, 64])
                .unwrap_err()
                .to_string(),
            "w1's expert count (axis 0) differs from the router's (axis 1): router is [8, 64], w1 is [8, 64, 128], w2 is [8, 128, 64]"
        );
        assert!(super::check_shapes("", &[64, 8], &[8, 64, 128], &[8, 128, 64]).is_ok());
    }
}
