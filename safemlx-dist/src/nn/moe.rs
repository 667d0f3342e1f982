//! Mixture of experts: a router choosing each token's top-k of `E` SwiGLU
//! experts, placed expert parallel (experts split across ranks, tokens
//! routed with `all_to_all_v`) or expert tensor parallel (every expert's
//! hidden dimension split, one `all_sum`), with optional shared experts.
//!
//! ```text
//! logits  = x R                                   [t, E], R replicated
//! chosen  = top_k(logits)                         on the device
//! gates   = softmax(logits)[chosen] (/ their sum) or softmax(logits[chosen])
//! y       = sum_j gates_j * down_e(silu(gate_e x) * up_e x),  e = chosen_j
//!         + sigmoid(x g) * shared(x)              when the model has them
//! ```
//!
//! Routing stays on the device: the top-k (`argpartition`), the counts per
//! expert and the order of the routed rows are MLX arrays; only the `E`
//! counts come to the host, to size the `all_to_all_v`. The local experts
//! run as three grouped matmuls (`gather_mm` on rows sorted by expert) on
//! GPU streams, and as one matmul per local expert on CPU streams, where
//! MLX's `gather_mm` multiplies row by row (see [`ExpertMatmul`]).

use safemlx::ops;
use safemlx::{Array, DeviceType, Dtype, Stream};

use super::SwiGluMlp;
use crate::checkpoint::Weights;
use crate::error::{Error, Result};
use crate::runtime::Group;
use crate::typed::collective::slice_axis;
use crate::typed::{
    chunk, Partial, Placement, Ragged, Replicated, RoutingPlan, Sharded, ShardedArray,
};
use safemlx_dist_macros::sharded;

/// How the router's logits become the gates of a token's `k` experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// A softmax over all experts, then the `k` largest; with `normalize`
    /// the `k` gates are rescaled to sum to 1 (Qwen3-MoE's
    /// `norm_topk_prob`; Qwen2-MoE ships without it).
    SoftmaxTopK {
        /// Rescale the chosen gates to sum to 1.
        normalize: bool,
    },
    /// The `k` largest logits, then a softmax over those `k` (Mixtral).
    TopKSoftmax,
}

/// Where the experts' weights live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExpertPlacement {
    /// Experts split across ranks by the chunk rule (`E` need not divide:
    /// 5 experts over 2 ranks are 3 + 2); each rank routes its tokens to
    /// the ranks of their experts with `all_to_all_v` and back.
    #[default]
    ExpertParallel,
    /// Every rank holds every expert's slice of the hidden dimension
    /// (`gate`/`up` columns, `down` rows, by the chunk rule); every rank
    /// routes all tokens and one `all_sum` adds the slices (mlx-lm's
    /// sharding of its `SwitchGLU`).
    ExpertTensorParallel,
}

impl ExpertPlacement {
    /// `"expert parallel"` or `"expert tensor parallel"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ExpertParallel => "expert parallel",
            Self::ExpertTensorParallel => "expert tensor parallel",
        }
    }
}

/// How the local experts multiply their rows (sorted by expert).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExpertMatmul {
    /// [`Grouped`](Self::Grouped) on GPU streams, [`PerExpert`](Self::PerExpert)
    /// on CPU streams: MLX's CPU `gather_mm` is one `sgemm` per row (and
    /// float32 only), 6-8x slower than the loop at 64 experts, top-8
    /// (measured: see the book's MoE chapter).
    #[default]
    Auto,
    /// Three `gather_mm` calls over all rows (one kernel each on a GPU).
    Grouped,
    /// One matmul per local expert on its run of rows (needs the rows per
    /// expert on the host).
    PerExpert,
}

/// The routing of an MoE layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    /// Experts per token, 1 to `E`.
    pub top_k: usize,
    /// How gates are computed.
    pub gating: Gating,
    /// A factor on every routed gate (DeepSeek's `routed_scaling_factor`;
    /// 1 for Mixtral and Qwen).
    pub routed_scaling: f32,
    /// With `Some(f)`, each expert takes at most `ceil(f * t * k / E)` of
    /// the `t * k` slots a rank routes (in token order); the rest are
    /// dropped and counted. `None`: dropless.
    pub capacity_factor: Option<f32>,
    /// Where the experts live.
    pub placement: ExpertPlacement,
    /// How the local experts multiply (automatic by default).
    pub expert_matmul: ExpertMatmul,
}

impl MoeConfig {
    /// Top-`k` routing with renormalised softmax gates, expert parallel,
    /// dropless, expert matmuls chosen by device.
    pub fn new(top_k: usize) -> Self {
        Self {
            top_k,
            gating: Gating::SoftmaxTopK { normalize: true },
            routed_scaling: 1.0,
            capacity_factor: None,
            placement: ExpertPlacement::ExpertParallel,
            expert_matmul: ExpertMatmul::Auto,
        }
    }

    /// With `gating`.
    pub fn with_gating(mut self, gating: Gating) -> Self {
        self.gating = gating;
        self
    }

    /// With `placement`.
    pub fn with_placement(mut self, placement: ExpertPlacement) -> Self {
        self.placement = placement;
        self
    }

    /// With a capacity factor (see [`capacity_factor`](Self::capacity_factor)).
    pub fn with_capacity_factor(mut self, factor: f32) -> Self {
        self.capacity_factor = Some(factor);
        self
    }

    /// With a routed scaling factor.
    pub fn with_routed_scaling(mut self, factor: f32) -> Self {
        self.routed_scaling = factor;
        self
    }

    /// With `matmul` for the local experts.
    pub fn with_expert_matmul(mut self, matmul: ExpertMatmul) -> Self {
        self.expert_matmul = matmul;
        self
    }

    fn check(&self, experts: usize) -> Result<()> {
        if self.top_k == 0 || self.top_k > experts {
            return Err(Error::Shape(format!(
                "top_k is {}; with {experts} experts it must be 1 to {experts}",
                self.top_k
            )));
        }
        if let Some(f) = self.capacity_factor {
            if !(f.is_finite() && f > 0.0) {
                return Err(Error::Shape(format!(
                    "capacity factor {f}: it must be a positive number"
                )));
            }
        }
        if !self.routed_scaling.is_finite() {
            return Err(Error::Shape(format!(
                "routed scaling factor {}: it must be a finite number",
                self.routed_scaling
            )));
        }
        Ok(())
    }
}

/// Experts split by experts: rank `r` holds its chunk of the `E` experts.
#[sharded]
#[derive(Debug)]
pub struct ExpertWeights {
    /// `[E, D, H]`, by expert.
    #[shard(Sharded<0>)]
    pub gate: ShardedArray<Sharded<0>>,
    /// `[E, D, H]`, by expert.
    #[shard(Sharded<0>)]
    pub up: ShardedArray<Sharded<0>>,
    /// `[E, H, D]`, by expert.
    #[shard(Sharded<0>)]
    pub down: ShardedArray<Sharded<0>>,
}

/// Every expert, its hidden dimension split: rank `r` holds its chunk of
/// `H` of each of the `E` experts.
#[sharded]
#[derive(Debug)]
pub struct ExpertSlices {
    /// `[E, D, H]`, by hidden column.
    #[shard(Sharded<2>)]
    pub gate: ShardedArray<Sharded<2>>,
    /// `[E, D, H]`, by hidden column.
    #[shard(Sharded<2>)]
    pub up: ShardedArray<Sharded<2>>,
    /// `[E, H, D]`, by hidden row.
    #[shard(Sharded<1>)]
    pub down: ShardedArray<Sharded<1>>,
}

/// This rank's experts, by placement.
#[derive(Debug)]
enum Experts {
    Parallel(ExpertWeights),
    TensorParallel(ExpertSlices),
}

/// Experts every token goes through, beside the routed ones (Qwen2-MoE's
/// `shared_expert`, DeepSeek's shared experts): a tensor-parallel SwiGLU
/// MLP, optionally scaled per token by `sigmoid(x g)` (Qwen2-MoE's
/// `shared_expert_gate`, `g` `[D, 1]`).
#[derive(Debug)]
pub struct SharedExperts {
    /// The MLP, hidden dimension split across ranks.
    pub mlp: SwiGluMlp,
    /// `[D, 1]`, on every rank.
    pub gate: Option<ShardedArray<Replicated>>,
}

/// What a forward returns besides the tokens.
#[derive(Debug)]
pub struct MoeOutput<P: Placement> {
    /// The tokens after the layer, `[t, D]`, in input order.
    pub tokens: ShardedArray<P>,
    /// The load-balancing loss `E * sum_e f_e * P_e` over all ranks' tokens
    /// (`f_e`: share of routed slots that chose expert `e`; `P_e`: mean
    /// router probability of `e`). 1.0 when perfectly balanced.
    pub aux_loss: f32,
    /// The router z-loss: the mean over tokens of `logsumexp(logits)^2`.
    pub z_loss: f32,
    /// Rows this rank sent to each rank (expert parallel; zeros otherwise).
    pub sent: Vec<usize>,
    /// Rows this rank's experts processed, from each rank (expert
    /// parallel; zeros otherwise).
    pub received: Vec<usize>,
    /// This rank's slots dropped by the capacity limit (0 when dropless).
    pub dropped: usize,
}

/// A mixture-of-experts layer on this rank (see the module docs).
#[derive(Debug)]
pub struct Moe {
    router: ShardedArray<Replicated>,
    experts: Box<Experts>,
    shared: Option<Box<SharedExperts>>,
    config: MoeConfig,
    num_experts: usize,
}

/// The router `[D, E]` and experts `gate`, `up` `[E, D, H]`, `down`
/// `[E, H, D]` must agree before anything is sliced; the message names the
/// tensors (`{prefix}router`, ...) and their shapes. Returns `(E, D, H)`.
fn check_shapes(
    prefix: &str,
    router: &[i32],
    gate: &[i32],
    up: &[i32],
    down: &[i32],
) -> Result<(usize, usize, usize)> {
    let shapes = || {
        format!(
            "{prefix}router is {router:?}, {prefix}gate is {gate:?}, {prefix}up is {up:?}, {prefix}down is {down:?}"
        )
    };
    let (&[d, e], &[e1, d1, h1], &[e3, h3, d3]) = (router, gate, down) else {
        return Err(Error::Shape(format!(
            "an MoE needs a router [D, E], gate and up [E, D, H] and down [E, H, D]: {}",
            shapes()
        )));
    };
    let disagree = [
        (
            e1 != e,
            "gate's expert count (axis 0) differs from the router's (axis 1)",
        ),
        (up != gate, "up's shape differs from gate's"),
        (
            e3 != e,
            "down's expert count (axis 0) differs from the router's (axis 1)",
        ),
        (
            d1 != d,
            "gate's model dimension (axis 1) differs from the router's (axis 0)",
        ),
        (
            d3 != d,
            "down's model dimension (axis 2) differs from the router's (axis 0)",
        ),
        (
            h3 != h1,
            "down's hidden dimension (axis 1) differs from gate's (axis 2)",
        ),
        (e <= 0, "the router has no experts"),
    ];
    match disagree.iter().find(|(bad, _)| *bad) {
        Some((_, what)) => Err(Error::Shape(format!("{what}: {}", shapes()))),
        None => Ok((e as usize, d as usize, h1 as usize)),
    }
}

fn int_array(values: &[i32]) -> Array {
    Array::from_slice(values, &[values.len() as i32])
}

fn host_f32(a: &Array, s: &Stream) -> Result<Vec<f32>> {
    let a = a.as_dtype(Dtype::Float32, s)?.contiguous(false, s)?;
    crate::runtime::eval(&[&a])?;
    a.into_evaluated()?
        .try_to_vec::<f32>()
        .map_err(|e| Error::Shape(format!("reading router statistics: {e}")))
}

/// `x * sigmoid(x)`.
fn silu(x: &Array, s: &Stream) -> Result<Array> {
    Ok(x.multiply(ops::sigmoid(x, s)?, s)?)
}

/// The rows `indices` (`[m]`) of `a` along axis 0; an empty result
/// without indexing when `m` is 0 (MLX's take from an empty axis divides
/// by its length).
fn take_rows(a: &Array, indices: &Array, s: &Stream) -> Result<Array> {
    if indices.shape().first().copied().unwrap_or(0) == 0 {
        let mut shape = a.shape().to_vec();
        shape[0] = 0;
        return Ok(ops::zeros_dtype(&shape, a.dtype(), s)?);
    }
    Ok(a.take_axis(indices, 0, s)?)
}

/// `0, 1, ..., len - 1` as int32.
fn arange(len: usize, s: &Stream) -> Result<Array> {
    Ok(ops::arange::<_, i32>(0, len as i32, None, s)?)
}

/// The routing of `t` tokens, decided on the device.
struct Routing {
    /// `[t * k]` gates, slot `token * k + j`, float32, scaled.
    gates: Array,
    /// `[t * k]` int32 expert of each slot.
    expert: Array,
    /// `[t * k]` int32 slots: the kept ones sorted by expert (token order
    /// within an expert), then the dropped ones.
    order: Array,
    /// `[3 E + 2]` float32: slots kept per expert, then the statistics:
    /// slots per expert (before capacity), summed router probabilities per
    /// expert, summed squared logsumexp, tokens. Gathered (expert
    /// parallel) or read (expert tensor parallel) in one go.
    summary: Array,
}

impl Moe {
    /// Builds this rank's part from the full weights: `router` `[D, E]`,
    /// `gate`, `up` `[E, D, H]`, `down` `[E, H, D]`, placed as
    /// `config.placement` says.
    ///
    /// # Errors
    /// Disagreeing shapes (named), or a `top_k` outside `1..=E`.
    pub fn from_full(
        group: &Group,
        config: MoeConfig,
        router: Array,
        gate: Array,
        up: Array,
        down: Array,
        s: &Stream,
    ) -> Result<Self> {
        let (e, ..) = check_shapes("", router.shape(), gate.shape(), up.shape(), down.shape())?;
        config.check(e)?;
        let experts = match config.placement {
            ExpertPlacement::ExpertParallel => {
                Experts::Parallel(ExpertWeights::from_full(group, gate, up, down, s)?)
            }
            ExpertPlacement::ExpertTensorParallel => {
                Experts::TensorParallel(ExpertSlices::from_full(group, gate, up, down, s)?)
            }
        };
        Ok(Self {
            router: ShardedArray::replicated(router, group),
            experts: Box::new(experts),
            shared: None,
            config,
            num_experts: e,
        })
    }

    /// Builds this rank's part from `router` `[D, E]`, `gate`, `up`
    /// `[E, D, H]` and `down` `[E, H, D]` of `w`, reading only this rank's
    /// experts (or slices).
    ///
    /// # Errors
    /// Those of [`from_full`](Self::from_full), and a missing tensor.
    pub fn load(w: &Weights, config: MoeConfig, s: &Stream) -> Result<Self> {
        let shape = |name: &str| -> Result<Vec<i32>> { w.source().shape(&w.name(name)) };
        let (e, ..) = check_shapes(
            w.prefix(),
            &shape("router")?,
            &shape("gate")?,
            &shape("up")?,
            &shape("down")?,
        )?;
        config.check(e)?;
        let experts = match config.placement {
            ExpertPlacement::ExpertParallel => Experts::Parallel(ExpertWeights::load_fields(w, s)?),
            ExpertPlacement::ExpertTensorParallel => {
                Experts::TensorParallel(ExpertSlices::load_fields(w, s)?)
            }
        };
        Ok(Self {
            router: w.get_fused("router", None, 1, s)?,
            experts: Box::new(experts),
            shared: None,
            config,
            num_experts: e,
        })
    }

    /// Reads this rank's part of a Hugging Face MoE block (`w` at e.g.
    /// `model.layers.3.mlp`): the router `gate.weight` `[E, D]` and
    /// per-expert tensors `experts.{e}.{gate,up,down}` named by `names`
    /// (`[H, D]`, `[H, D]`, `[D, H]`), or Transformers 5's stacked
    /// `experts.gate_up_proj` `[E, 2H, D]` and `experts.down_proj`
    /// `[E, D, H]`, each rank reading only its experts (expert parallel)
    /// or its rows/columns of every expert (expert tensor parallel); with
    /// `shared`, Qwen2-MoE's `shared_expert.*` and
    /// `shared_expert_gate.weight`.
    ///
    /// # Errors
    /// A missing tensor or one whose shape is not `(dim, hidden)`'s; the
    /// message names it and the file.
    pub fn load_hf(
        w: &Weights,
        names: &HfExpertNames,
        (dim, hidden, experts): (usize, usize, usize),
        shared_hidden: Option<usize>,
        config: MoeConfig,
        s: &Stream,
    ) -> Result<Self> {
        config.check(experts)?;
        let group = w.comm();
        let (d, h, e) = (dim as i32, hidden as i32, experts as i32);
        let router = w.full(names.router, &[experts, dim], s)?.transpose(s)?;
        let expert = |e: usize, which: &str| format!("experts.{e}.{which}.weight");
        // Stacks per-expert matrices into [E', a, b].
        let stack = |parts: Vec<Array>, inner: [i32; 2]| -> Result<Array> {
            if parts.is_empty() {
                return Ok(ops::zeros::<f32>(&[0, inner[0], inner[1]], s)?);
            }
            let parts: Vec<Array> = parts
                .iter()
                .map(|p| p.expand_dims(0, s))
                .collect::<std::result::Result<_, _>>()?;
            Ok(ops::concatenate_axis(&parts, 0, s)?)
        };
        let (gate, up, down) = if w.contains("experts.gate_up_proj") {
            // Transformers 5's stacked experts: `experts.gate_up_proj`
            // [E, 2H, D] (gate rows, then up rows) and `experts.down_proj`
            // [E, D, H].
            let part = match config.placement {
                ExpertPlacement::ExpertParallel => w.chunk(experts),
                // Every expert's slice: the rows of a slice are not
                // contiguous in the stacked tensor, so it is read whole.
                ExpertPlacement::ExpertTensorParallel => (0, experts),
            };
            let gate_up = w.rows(
                "experts.gate_up_proj",
                &[experts, 2 * hidden, dim],
                &[part],
                s,
            )?;
            let parts = gate_up.split(2, 1, s)?;
            // To [E', D, H] and [E', H, D].
            let down = w.rows("experts.down_proj", &[experts, dim, hidden], &[part], s)?;
            (
                parts[0].swap_axes(1, 2, s)?,
                parts[1].swap_axes(1, 2, s)?,
                down.swap_axes(1, 2, s)?,
            )
        } else {
            let (first, count, part) = match config.placement {
                ExpertPlacement::ExpertParallel => {
                    let (first, count) = w.chunk(experts);
                    (first, count, (0, hidden))
                }
                ExpertPlacement::ExpertTensorParallel => (0, experts, w.chunk(hidden)),
            };
            let (mut gate, mut up, mut down) = (Vec::new(), Vec::new(), Vec::new());
            for e in first..first + count {
                let rows = |which: &str| w.rows(&expert(e, which), &[hidden, dim], &[part], s);
                gate.push(rows(names.gate)?.transpose(s)?);
                up.push(rows(names.up)?.transpose(s)?);
                let columns = w.columns(&expert(e, names.down), &[dim, hidden], &[part], s)?;
                down.push(columns.transpose(s)?);
            }
            let width = part.1 as i32;
            (
                stack(gate, [d, width])?,
                stack(up, [d, width])?,
                stack(down, [width, d])?,
            )
        };
        let experts_part = match (config.placement, w.contains("experts.gate_up_proj")) {
            (ExpertPlacement::ExpertParallel, _) => Experts::Parallel(ExpertWeights {
                gate: ShardedArray::from_local(gate, group, &[e, d, h])?,
                up: ShardedArray::from_local(up, group, &[e, d, h])?,
                down: ShardedArray::from_local(down, group, &[e, h, d])?,
            }),
            // Read whole: sliced here.
            (ExpertPlacement::ExpertTensorParallel, true) => {
                Experts::TensorParallel(ExpertSlices::from_full(group, gate, up, down, s)?)
            }
            (ExpertPlacement::ExpertTensorParallel, false) => {
                Experts::TensorParallel(ExpertSlices {
                    gate: ShardedArray::from_local(gate, group, &[e, d, h])?,
                    up: ShardedArray::from_local(up, group, &[e, d, h])?,
                    down: ShardedArray::from_local(down, group, &[e, h, d])?,
                })
            }
        };
        let shared = match shared_hidden {
            None => None,
            Some(hidden) => {
                let mlp = SwiGluMlp::load(&w.pp("shared_expert"), (dim, hidden), s)?;
                let gate = if w.contains("shared_expert_gate.weight") {
                    let g = w.full("shared_expert_gate.weight", &[1, dim], s)?;
                    Some(ShardedArray::replicated(g.transpose(s)?, group))
                } else {
                    None
                };
                Some(Box::new(SharedExperts { mlp, gate }))
            }
        };
        Ok(Self {
            router: ShardedArray::replicated(router, group),
            experts: Box::new(experts_part),
            shared,
            config,
            num_experts: experts,
        })
    }

    /// With shared experts beside the routed ones.
    pub fn with_shared(mut self, shared: SharedExperts) -> Self {
        self.shared = Some(Box::new(shared));
        self
    }

    /// The routing configuration.
    pub fn config(&self) -> &MoeConfig {
        &self.config
    }

    /// Bytes of this rank's weights.
    pub fn nbytes(&self) -> usize {
        let experts: usize = match self.experts.as_ref() {
            Experts::Parallel(w) => [w.gate.local(), w.up.local(), w.down.local()]
                .iter()
                .map(|a| a.nbytes())
                .sum(),
            Experts::TensorParallel(w) => [w.gate.local(), w.up.local(), w.down.local()]
                .iter()
                .map(|a| a.nbytes())
                .sum(),
        };
        let shared = self.shared.as_ref().map_or(0, |sh| {
            [sh.mlp.gate.local(), sh.mlp.up.local(), sh.mlp.down.local()]
                .iter()
                .map(|a| a.nbytes())
                .sum::<usize>()
                + sh.gate.as_ref().map_or(0, |g| g.local().nbytes())
        });
        self.router.local().nbytes() + experts + shared
    }

    /// The full weights again: `router`, `gate`, `up`, `down` (one
    /// `all_gather` per expert tensor), as [`load`](Self::load) reads them.
    ///
    /// # Errors
    /// A failed collective.
    pub fn gather_full(&self, s: &Stream) -> Result<Vec<(&'static str, Array)>> {
        let mut all = vec![("router", self.router.local().clone())];
        all.extend(match self.experts.as_ref() {
            Experts::Parallel(w) => w.gather_full(s)?,
            Experts::TensorParallel(w) => w.gather_full(s)?,
        });
        Ok(all)
    }

    /// The routing of `x` `[t, D]` by `router` `[D, E]` (see [`Routing`]).
    fn route(&self, x: &Array, router: &Array, s: &Stream) -> Result<Routing> {
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
        let logits = x.matmul(router, s)?.as_dtype(Dtype::Float32, s)?;
        let probs = ops::softmax_axis(&logits, -1, None, s)?;
        let chosen = if k == e {
            ops::broadcast_to(
                arange(e, s)?.reshape(&[1, e as i32], s)?,
                &[t as i32, e as i32],
                s,
            )?
        } else {
            // The choice is discrete: no gradient flows through it.
            let fixed = safemlx::stop_gradient(&logits, s)?;
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

    /// The kept slots per expert of each rank (rows) and the statistics
    /// summed over the ranks, from `ranks` routing summaries laid end to
    /// end (an `all_gather` of them, or one).
    fn read_summaries(
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
    fn losses(&self, stats: &[f32]) -> (f32, f32) {
        let (e, k) = (self.num_experts, self.config.top_k as f32);
        let tokens = stats[2 * e + 1].max(1.0);
        let aux = (0..e)
            .map(|c| (stats[c] / (tokens * k)) * (stats[e + c] / tokens))
            .sum::<f32>()
            * e as f32;
        (aux, stats[2 * e] / tokens)
    }

    /// `rows` `[r, D]` through experts `ids` `[r]` (int32, indices into
    /// the local expert tensors `gate`, `up` `[E', D, H']`, `down`
    /// `[E', H', D]`; `per_expert` rows go to each), in the rows' order.
    fn run_experts(
        &self,
        rows: &Array,
        ids: &Array,
        per_expert: &[usize],
        (gate, up, down): (&Array, &Array, &Array),
        s: &Stream,
    ) -> Result<Array> {
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
            let mm = |a: &Array, w: &Array| ops::gather_mm(a, w, None, &ids, true, s);
            let hidden = silu(&mm(&x, gate)?, s)?.multiply(mm(&x, up)?, s)?;
            mm(&hidden, down)?.reshape(&[r as i32, d], s)?
        } else {
            // One matmul per local expert on its run of rows.
            let mut outputs = Vec::new();
            let mut start = 0;
            for (j, &count) in per_expert.iter().enumerate() {
                if count == 0 {
                    continue;
                }
                let x = slice_axis(&sorted_rows, 0, start, count, s)?;
                let pick = |w: &Array| -> Result<Array> {
                    Ok(slice_axis(w, 0, j, 1, s)?.squeeze_axes(&[0], s)?)
                };
                let hidden =
                    silu(&x.matmul(pick(gate)?, s)?, s)?.multiply(x.matmul(pick(up)?, s)?, s)?;
                outputs.push(hidden.matmul(pick(down)?, s)?);
                start += count;
            }
            ops::concatenate_axis(&outputs, 0, s)?
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
        let Experts::Parallel(weights) = self.experts.as_ref() else {
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
        let routing = self.route(x, self.router.local(), s)?;

        // Dispatch: the kept slots, by expert, so by destination rank. The
        // counts per expert go to every rank (one all_gather of E counts),
        // so each rank knows how the rows it receives split by expert.
        let owners: Vec<(usize, usize)> = (0..n).map(|r| chunk(e, r, n)).collect();
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
        let processed = self.run_experts(
            routed.local(),
            &int_array(&ids),
            &per_expert,
            (
                weights.gate.local(),
                weights.up.local(),
                weights.down.local(),
            ),
            s,
        )?;
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
        let comm = x.comm().clone();
        let n = comm.size();
        // Every rank holds every token: each routes all of them (the same
        // way) and computes the slots of its own experts (expert parallel)
        // or its slices of every expert (expert tensor parallel); one
        // all_sum adds the ranks' partial outputs and the shared experts'.
        // The routed part is this rank's share of the output: the gradients
        // of the tokens and the router through it are summed over ranks.
        let (routed_input, router) = routed_shares(x.local(), self.router.local(), &comm, s)?;
        let local = &routed_input;
        let t = usize::try_from(local.shape()[0]).unwrap_or(0);
        let d = local.shape()[1];
        let routing = self.route(local, &router, s)?;
        let (kept, stats) = self.read_summaries(&routing.summary, 1, s)?;
        let kept = &kept[0];
        let m: usize = kept.iter().sum();
        let k = self.config.top_k as i32;
        // The slots this rank computes: a run of `order` (sorted by
        // expert), their experts as indices into the local tensors.
        let (weights, first, experts) = match self.experts.as_ref() {
            Experts::Parallel(w) => {
                let (first, count) = chunk(self.num_experts, comm.rank(), n);
                let weights = (w.gate.local(), w.up.local(), w.down.local());
                (weights, first, first..first + count)
            }
            Experts::TensorParallel(w) => {
                let weights = (w.gate.local(), w.up.local(), w.down.local());
                (weights, 0, 0..self.num_experts)
            }
        };
        let before: usize = kept[..experts.start].iter().sum();
        let mine: usize = kept[experts.clone()].iter().sum();
        let order = slice_axis(&routing.order, 0, before, mine, s)?;
        let rows = take_rows(local, &order.floor_divide(Array::from_int(k), s)?, s)?;
        let ids =
            take_rows(&routing.expert, &order, s)?.subtract(Array::from_int(first as i32), s)?;
        let computed = self.run_experts(&rows, &ids, &kept[experts], weights, s)?;
        // The other ranks' slots are zeros here.
        let zeros = |count: usize| ops::zeros_dtype(&[count as i32, d], local.dtype(), s);
        let per_row =
            ops::concatenate_axis(&[zeros(before)?, computed, zeros(m - before - mine)?], 0, s)?;
        let routed = self.combine(&routing, &per_row, t, s)?;
        let mut partial = ShardedArray::<Partial>::from_local(routed, &comm, &[t as i32, d])?;
        if let Some(shared) = &self.shared {
            let y = shared.mlp.forward_partial(x, s)?;
            let y = match &shared.gate {
                Some(g) => y.mul(&x.matmul(g, s)?.sigmoid(s)?, s)?,
                None => y,
            };
            partial = partial.add(&y, s)?;
        }
        let (aux_loss, z_loss) = self.losses(&stats);
        Ok(MoeOutput {
            tokens: partial.all_sum(s)?,
            aux_loss,
            z_loss,
            sent: vec![0; n],
            received: vec![0; n],
            dropped: t * self.config.top_k - m,
        })
    }
}

/// The router (replicated), this rank's experts or slices (`gate`, `up`,
/// `down`), then the shared experts' MLP and gate when the layer has them.
/// Their gradients come from [`Moe::forward`]; the load-balancing and
/// z-losses are statistics (host numbers), not part of the traced loss.
impl crate::grad::Parameters for Moe {
    fn parameters(&self) -> Vec<crate::grad::Parameter> {
        let mut all = vec![crate::grad::Parameter::of(&self.router)];
        all.extend(match self.experts.as_ref() {
            Experts::Parallel(w) => w.parameters(),
            Experts::TensorParallel(w) => w.parameters(),
        });
        if let Some(shared) = &self.shared {
            all.extend(shared.mlp.parameters());
            all.extend(shared.gate.iter().map(crate::grad::Parameter::of));
        }
        all
    }

    fn with_parameters(&self, locals: &[Array]) -> Result<Self> {
        let shared = self.shared.as_deref();
        let counts = [
            1,
            3,
            shared.map_or(0, |sh| sh.mlp.parameters().len()),
            shared.map_or(0, |sh| usize::from(sh.gate.is_some())),
        ];
        let parts = crate::grad::split_locals(locals, &counts)?;
        let router = &parts[0][0];
        if router.shape() != self.router.local().shape() {
            return Err(Error::Shape(format!(
                "the MoE router is {:?} but an array of shape {:?} was given",
                self.router.local().shape(),
                router.shape()
            )));
        }
        let experts = match self.experts.as_ref() {
            Experts::Parallel(w) => Experts::Parallel(w.with_parameters(parts[1])?),
            Experts::TensorParallel(w) => Experts::TensorParallel(w.with_parameters(parts[1])?),
        };
        let shared = match shared {
            None => None,
            Some(sh) => {
                let gate = match &sh.gate {
                    Some(g) => Some(ShardedArray::<Replicated>::from_local(
                        parts[3][0].clone(),
                        g.comm(),
                        g.global_shape(),
                    )?),
                    None => None,
                };
                Some(Box::new(SharedExperts {
                    mlp: sh.mlp.with_parameters(parts[2])?,
                    gate,
                }))
            }
        };
        Ok(Self {
            router: ShardedArray::from_local(
                router.clone(),
                self.router.comm(),
                self.router.global_shape(),
            )?,
            experts: Box::new(experts),
            shared,
            config: self.config,
            num_experts: self.num_experts,
        })
    }
}

/// The tokens `x` `[T, D]` and the router `[D, E]` as the routed experts
/// of one rank use them: unchanged, except that while a gradient is traced
/// their gradients through this rank's slots (a share of the whole) are
/// summed over the ranks, in one `all_sum` for both: a rank whose experts
/// got no slots builds another graph than its peers, and two sums could
/// reach the backward pass in another order there.
fn routed_shares(x: &Array, router: &Array, comm: &Group, s: &Stream) -> Result<(Array, Array)> {
    let (mut whole, _) = crate::grad::sum_gradients_together(&[x, router], &[], (0, 1), comm, s)?;
    let router = whole.pop();
    match (whole.pop(), router) {
        (Some(x), Some(router)) => Ok((x, router)),
        _ => Err(Error::Shape("two arrays expected".to_owned())),
    }
}

/// The per-expert tensor names of a Hugging Face MoE block, after
/// `{prefix}experts.{e}.` and before `.weight`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HfExpertNames {
    /// The router, after the prefix: `gate.weight`.
    pub router: &'static str,
    /// The gate projection `[H, D]`.
    pub gate: &'static str,
    /// The up projection `[H, D]`.
    pub up: &'static str,
    /// The down projection `[D, H]`.
    pub down: &'static str,
}

impl HfExpertNames {
    /// Mixtral's `block_sparse_moe.experts.{e}.w1` (gate), `w3` (up), `w2`
    /// (down).
    pub const MIXTRAL: Self = Self {
        router: "gate.weight",
        gate: "w1",
        up: "w3",
        down: "w2",
    };
    /// Qwen2-MoE's and Qwen3-MoE's `mlp.experts.{e}.gate_proj`, `up_proj`,
    /// `down_proj`.
    pub const QWEN: Self = Self {
        router: "gate.weight",
        gate: "gate_proj",
        up: "up_proj",
        down: "down_proj",
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn disagreeing_expert_tensors_are_named() {
        assert_eq!(
            super::check_shapes("moe.", &[64, 8], &[6, 64, 128], &[6, 64, 128], &[8, 128, 64])
                .unwrap_err()
                .to_string(),
            "gate's expert count (axis 0) differs from the router's (axis 1): moe.router is [64, 8], moe.gate is [6, 64, 128], moe.up is [6, 64, 128], moe.down is [8, 128, 64]"
        );
        assert_eq!(
            super::check_shapes("", &[64, 8], &[8, 64, 128], &[8, 64, 96], &[8, 128, 64])
                .unwrap_err()
                .to_string(),
            "up's shape differs from gate's: router is [64, 8], gate is [8, 64, 128], up is [8, 64, 96], down is [8, 128, 64]"
        );
        assert_eq!(
            super::check_shapes("", &[64, 8], &[8, 64, 128], &[8, 64, 128], &[8, 128, 64]).unwrap(),
            (8, 64, 128)
        );
    }

    #[test]
    fn top_k_outside_the_experts_is_named() {
        assert_eq!(
            super::MoeConfig::new(9).check(8).unwrap_err().to_string(),
            "top_k is 9; with 8 experts it must be 1 to 8"
        );
        assert_eq!(
            super::MoeConfig::new(2)
                .with_capacity_factor(0.0)
                .check(8)
                .unwrap_err()
                .to_string(),
            "capacity factor 0: it must be a positive number"
        );
    }
}
