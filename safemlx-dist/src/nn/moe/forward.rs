//! The forward pass: routed rows through the local experts, combined
//! with their gates, exchanged with the other ranks (expert parallel) or
//! summed (expert tensor parallel), plus the shared experts.

use safemlx::ops;
use safemlx::{Array, DeviceType, Dtype, Stream};

use super::config::{ExpertActivation, ExpertMatmul, ExpertPlacement};
use super::routing::{arange, int_array, silu, take_rows, Routing};
use super::{Moe, MoeOutput};
use crate::error::{Error, Result};
use crate::runtime::slice_axis;
use crate::typed::{partial_map, wide_sum_of, Ragged, Replicated, RoutingPlan, ShardedArray};

impl Moe {
    /// The hidden values of the gate and up projections' outputs, by the
    /// layer's activation.
    fn activate(&self, gate: &Array, up: &Array, s: &Stream) -> Result<Array> {
        match self.config.activation {
            ExpertActivation::Swiglu => Ok(silu(gate, s)?.multiply(up, s)?),
            ExpertActivation::ClampedSwiglu { alpha, limit } => {
                let gate = ops::minimum(gate, Array::from_f32(limit), s)?;
                let up = ops::clip(up, (-limit, limit), s)?;
                let glu = gate.multiply(
                    ops::sigmoid(gate.multiply(Array::from_f32(alpha), s)?, s)?,
                    s,
                )?;
                Ok(up.add(Array::from_f32(1.0), s)?.multiply(&glu, s)?)
            }
        }
    }

    /// The local gate and up biases `[E', H']`, when the layer has them.
    fn hidden_biases(&self) -> Option<(&Array, &Array)> {
        self.biases.as_ref().map(|b| b.hidden.locals())
    }

    /// `out` `[r, D]` plus the down bias `[E, D]` of each row's expert
    /// (`ids` `[r]` local to the experts from `first`); `bias` is the
    /// caller's traced copy, `None` where the layer has none or this rank
    /// does not add it.
    fn add_down_bias(
        &self,
        out: Array,
        (ids, first): (&Array, usize),
        bias: Option<&Array>,
        s: &Stream,
    ) -> Result<Array> {
        match bias {
            Some(b) if out.shape()[0] > 0 => {
                let ids = ids.add(Array::from_int(first as i32), s)?;
                Ok(out.add(b.take_axis(&ids, 0, s)?, s)?)
            }
            _ => Ok(out),
        }
    }

    /// `rows` `[r, D]` through experts `ids` `[r]` (int32, indices into
    /// the local experts' matrices, float or MXFP4, with the layer's gate
    /// and up biases; `per_expert` rows go to each), in the rows' order.
    fn run_experts(
        &self,
        rows: &Array,
        ids: &Array,
        per_expert: &[usize],
        s: &Stream,
    ) -> Result<Array> {
        let mats = self.experts.matrices();
        let r = usize::try_from(rows.shape()[0]).unwrap_or(0);
        let d = rows.shape()[1];
        if r == 0 {
            return Ok(ops::zeros_dtype(&[0, d], rows.dtype(), s)?);
        }
        // Sort by expert (stable: the key is unique).
        let position = arange(r, s)?;
        let perm = ops::argsort(
            ids.multiply(Array::from_int(r as i32), s)?
                .add(&position, s)?,
            s,
        )?;
        let sorted_rows = rows.take_axis(&perm, 0, s)?;
        let sorted_ids = ids.take_axis(&perm, 0, s)?;
        let grouped = match self.config.expert_matmul {
            ExpertMatmul::Grouped => true,
            ExpertMatmul::PerExpert => false,
            ExpertMatmul::Auto => s.get_device()?.get_type()? != DeviceType::Cpu,
        };
        let out = if grouped {
            let ids = sorted_ids.as_dtype(Dtype::Uint32, s)?;
            let x = sorted_rows.expand_dims(1, s)?; // [r, 1, D]
            let (mut g, mut u) = (mats.grouped(0, &x, &ids, s)?, mats.grouped(1, &x, &ids, s)?);
            if let Some((gb, ub)) = self.hidden_biases() {
                // [r, 1, H'] each row's expert's biases.
                let of_rows = |b: &Array| b.take_axis(&sorted_ids, 0, s)?.expand_dims(1, s);
                g = g.add(of_rows(gb)?, s)?;
                u = u.add(of_rows(ub)?, s)?;
            }
            let hidden = self.activate(&g, &u, s)?;
            mats.grouped(2, &hidden, &ids, s)?
                .reshape(&[r as i32, d], s)?
        } else {
            // One matmul per local expert on its run of rows; the biases
            // and the activation once over all rows (few ops per step
            // matter when a decode step routes one token).
            let runs: Vec<(usize, usize, usize)> = per_expert
                .iter()
                .enumerate()
                .scan(0, |start, (j, &count)| {
                    let run = (j, *start, count);
                    *start += count;
                    Some(run)
                })
                .filter(|&(_, _, count)| count > 0)
                .collect();
            let project = |which: usize, x: &Array| -> Result<Array> {
                let parts = runs
                    .iter()
                    .map(|&(j, start, count)| {
                        mats.one(which, &slice_axis(x, 0, start, count, s)?, j, s)
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(ops::concatenate_axis(&parts, 0, s)?)
            };
            let (mut g, mut u) = (project(0, &sorted_rows)?, project(1, &sorted_rows)?);
            if let Some((gb, ub)) = self.hidden_biases() {
                g = g.add(gb.take_axis(&sorted_ids, 0, s)?, s)?;
                u = u.add(ub.take_axis(&sorted_ids, 0, s)?, s)?;
            }
            project(2, &self.activate(&g, &u, s)?)?
        };
        // Back to the rows' order.
        Ok(out.take_axis(ops::argsort(&perm, s)?, 0, s)?)
    }

    /// Weights `per_row` (`[m, D]`, the kept slots in `routing.order`) by
    /// their gates and sums each token's `k` slots: `[t, D]`.
    fn combine(&self, routing: &Routing, per_row: &Array, t: usize, s: &Stream) -> Result<Array> {
        let k = self.config.top_k;
        let m = usize::try_from(per_row.shape()[0]).unwrap_or(0);
        let d = per_row.shape()[1];
        if t == 0 {
            return Ok(ops::zeros_dtype(&[0, d], per_row.dtype(), s)?);
        }
        // Each slot's position in the order; dropped ones read a zero row.
        let position = ops::argsort(&routing.order, s)?;
        let position = ops::minimum(&position, Array::from_int(m as i32), s)?;
        let zero = ops::zeros_dtype(&[1, d], per_row.dtype(), s)?;
        let per_slot =
            ops::concatenate_axis(&[per_row, &zero], 0, s)?.take_axis(&position, 0, s)?;
        let gates = routing
            .gates
            .as_dtype(per_row.dtype(), s)?
            .reshape(&[(t * k) as i32, 1], s)?;
        Ok(per_slot
            .multiply(&gates, s)?
            .reshape(&[t as i32, k as i32, d], s)?
            .sum_axis(1, false, s)?)
    }

    /// Expert parallel on this rank's own tokens `[t, D]` (any number per
    /// rank, `Ragged`): route, dispatch with one `all_to_all_v`, run the
    /// local experts, return with the reverse `all_to_all_v`, combine.
    /// Shared experts are not run here (they need every rank's tokens:
    /// see [`forward`](Self::forward)).
    ///
    /// # Errors
    /// An expert-tensor-parallel layer (its experts need every token on
    /// every rank: call [`forward`](Self::forward)), or an MLX error.
    pub fn forward_rows(
        &self,
        tokens: &ShardedArray<Ragged>,
        s: &Stream,
    ) -> Result<MoeOutput<Ragged>> {
        if crate::grad::is_tracing() {
            return Err(Error::Shape(
                "gradients through `Moe::forward_rows` (tokens routed with all_to_all_v) are not supported yet; train with `Moe::forward` on replicated tokens, whose gradients are exact".to_owned(),
            ));
        }
        if self.experts.placement() != ExpertPlacement::ExpertParallel {
            return Err(Error::Shape(
                "an expert-tensor-parallel MoE runs every token on every rank: call `forward` with replicated tokens, not `forward_rows`".to_owned(),
            ));
        };
        let comm = tokens.comm().clone();
        let n = comm.size();
        let x = tokens.local();
        let t = usize::try_from(x.shape()[0]).unwrap_or(0);
        let e = self.num_experts;
        let k = self.config.top_k;
        let router_bias = self.router_bias.as_ref().map(ShardedArray::local);
        let routing = self.route(x, (self.router.local(), router_bias), s)?;

        // Dispatch: the kept slots, by expert, so by destination rank. The
        // counts per expert go to every rank (one all_gather of E counts),
        // so each rank knows how the rows it receives split by expert.
        let owners = self.experts.owners(e, n);
        // The counts travel with the statistics: one all_gather, one read.
        let gathered = crate::runtime::all_gather(&routing.summary, &comm, s)?;
        let (matrix, totals) = self.read_summaries(&gathered, n, s)?;
        let plan = RoutingPlan::from_bucket_matrix(&comm, &matrix, &owners)?;
        let sent = plan.send_counts().to_vec();
        let m: usize = sent.iter().sum();
        let order = slice_axis(&routing.order, 0, 0, m, s)?;
        let rows = take_rows(x, &order.floor_divide(Array::from_int(k as i32), s)?, s)?;
        let as_ragged = |a: Array| ShardedArray::<Ragged>::from_local(a.clone(), &comm, a.shape());
        let dispatched = as_ragged(rows)?;
        let routed = dispatched.route(&plan, s)?;
        // Every rank runs the exchange now and in the same order: a rank
        // whose experts got no rows would otherwise never evaluate its part.
        crate::runtime::eval(&[routed.local()])?;
        let received = plan.recv_counts().to_vec();
        // Rows arrive by source, each source's by expert: their local
        // expert ids, and the rows per local expert, from the counts.
        let (first, local) = owners[comm.rank()];
        let mut ids = Vec::with_capacity(received.iter().sum());
        let mut per_expert = vec![0usize; local];
        for row in &matrix {
            for (j, &count) in row[first..first + local].iter().enumerate() {
                ids.extend(std::iter::repeat_n(j as i32, count));
                per_expert[j] += count;
            }
        }
        let ids = int_array(&ids);
        let processed = self.run_experts(routed.local(), &ids, &per_expert, s)?;
        let down_bias = self.biases.as_ref().map(|b| b.down.local());
        let processed = self.add_down_bias(processed, (&ids, first), down_bias, s)?;
        let back = as_ragged(processed)?.route_back(&plan, &dispatched, s)?;
        crate::runtime::eval(&[back.local()])?;
        let combined = self.combine(&routing, back.local(), t, s)?;

        let (aux_loss, z_loss) = self.losses(&totals);
        Ok(MoeOutput {
            tokens: as_ragged(combined)?,
            aux_loss,
            z_loss,
            sent,
            received,
            dropped: t * k - m,
        })
    }

    /// Rank `rank` of `n`'s share of the routed experts' output on the
    /// replicated tokens `x` `[T, D]` with `router` `[D, E]` (and its
    /// bias `[E]`): the slots of its experts (expert parallel) or its
    /// slices of every expert (expert tensor parallel), other slots zero,
    /// with the down bias `[E, D]` of its slots (rank 0's: every slot's,
    /// under expert tensor parallelism); with the kept slots' count and
    /// the routing statistics.
    fn routed_share(
        &self,
        x: &Array,
        (router, router_bias, down_bias): (&Array, Option<&Array>, Option<&Array>),
        (rank, n): (usize, usize),
        s: &Stream,
    ) -> Result<(Array, usize, Vec<f32>)> {
        let t = usize::try_from(x.shape()[0]).unwrap_or(0);
        let d = x.shape()[1];
        let routing = self.route(x, (router, router_bias), s)?;
        let (kept, stats) = self.read_summaries(&routing.summary, 1, s)?;
        let kept = &kept[0];
        let m: usize = kept.iter().sum();
        let k = self.config.top_k as i32;
        // The slots this rank computes: a run of `order` (sorted by
        // expert), their experts as indices into the local tensors.
        let (first, experts, adds_bias) = match self.experts.placement() {
            ExpertPlacement::ExpertParallel => {
                let (first, count) = self.experts.owners(self.num_experts, n)[rank];
                (first, first..first + count, true)
            }
            ExpertPlacement::ExpertTensorParallel => (0, 0..self.num_experts, rank == 0),
        };
        let before: usize = kept[..experts.start].iter().sum();
        let mine: usize = kept[experts.clone()].iter().sum();
        let order = slice_axis(&routing.order, 0, before, mine, s)?;
        let rows = take_rows(x, &order.floor_divide(Array::from_int(k), s)?, s)?;
        let ids =
            take_rows(&routing.expert, &order, s)?.subtract(Array::from_int(first as i32), s)?;
        let computed = self.run_experts(&rows, &ids, &kept[experts], s)?;
        let down_bias = down_bias.filter(|_| adds_bias);
        let computed = self.add_down_bias(computed, (&ids, first), down_bias, s)?;
        // The other ranks' slots are zeros here.
        let zeros = |count: usize| ops::zeros_dtype(&[count as i32, d], x.dtype(), s);
        let per_row =
            ops::concatenate_axis(&[zeros(before)?, computed, zeros(m - before - mine)?], 0, s)?;
        // A share of 16-bit outputs is combined in float32 and rounded
        // after the ranks' sum, as one process rounds the whole (see
        // `wide_sum_of`).
        let per_row = match wide_sum_of(x.dtype(), n) {
            Some(_) => per_row.as_dtype(Dtype::Float32, s)?,
            None => per_row,
        };
        Ok((self.combine(&routing, &per_row, t, s)?, m, stats))
    }

    /// The layer on replicated tokens `[T, D]`; the output is replicated.
    /// Every rank routes every token (identically), computes the slots of
    /// its experts (expert parallel) or its slices of every expert (expert
    /// tensor parallel), and one `all_sum` of `[T, D]` adds the ranks'
    /// partial outputs together with the shared experts'. No rows are
    /// routed (`sent`, `received` are zeros), and a capacity limit applies
    /// over all `T` tokens. For tokens split across ranks, see
    /// [`forward_rows`](Self::forward_rows).
    ///
    /// # Errors
    /// An MLX or collective error.
    pub fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<MoeOutput<Replicated>> {
        let &[t, d] = x.global_shape() else {
            return Err(Error::Shape(format!(
                "the MoE layer takes tokens [T, D], got {:?}",
                x.global_shape()
            )));
        };
        // Every rank routes every token (the same way) and computes the
        // slots of its own experts or its slices of every expert: its
        // share of the output. The tokens' and the router's gradients
        // through it are shares too; `partial_map` sums them.
        let (rank, n) = (x.comm().rank(), x.comm().size());
        let mut kept = (0, Vec::new());
        // The replicated inputs: the tokens, the router, then its bias and
        // the down bias when the layer has them.
        let mut inputs = vec![x, &self.router];
        inputs.extend(&self.router_bias);
        inputs.extend(self.biases.as_ref().map(|b| &b.down));
        let mut partial = partial_map(
            &inputs,
            &[t, d],
            |inputs| {
                let [tokens, router, rest @ ..] = inputs.as_slice() else {
                    return Err(Error::Shape(
                        "the MoE has at least two replicated inputs".to_owned(),
                    ));
                };
                let mut rest = rest.iter();
                let router_bias = self.router_bias.as_ref().and_then(|_| rest.next());
                let down_bias = self.biases.as_ref().and_then(|_| rest.next());
                let weights = (router, router_bias, down_bias);
                let (routed, m, stats) = self.routed_share(tokens, weights, (rank, n), s)?;
                kept = (m, stats);
                Ok(routed)
            },
            s,
        )?
        .with_rounds_to(wide_sum_of(x.local().dtype(), n));
        if let Some(shared) = &self.shared {
            let y = shared.mlp.forward_partial(x, s)?;
            let y = match &shared.gate {
                Some(g) => y.mul(&x.matmul(g, s)?.sigmoid(s)?, s)?,
                None => y,
            };
            partial = partial.add(&y, s)?;
        }
        let (m, stats) = kept;
        let (aux_loss, z_loss) = self.losses(&stats);
        Ok(MoeOutput {
            tokens: partial.all_sum(s)?,
            aux_loss,
            z_loss,
            sent: vec![0; n],
            received: vec![0; n],
            dropped: t as usize * self.config.top_k - m,
        })
    }
}
