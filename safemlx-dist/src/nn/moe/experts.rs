//! The experts' weights: split by expert or by hidden slice, built from
//! the full weights or read from a checkpoint (Hugging Face names too).

use safemlx::ops;
use safemlx::{Array, Stream};

use super::config::{ExpertPlacement, MoeConfig};
use super::{Experts, Moe, SharedExperts};
use crate::checkpoint::Weights;
use crate::error::{Error, Result};
use crate::nn::{Mlp, MlpNames};
use crate::runtime::Group;
use crate::typed::{Sharded, ShardedArray};
use safemlx_dist_macros::sharded;

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

/// The router `[D, E]` and experts `gate`, `up` `[E, D, H]`, `down`
/// `[E, H, D]` must agree before anything is sliced; the message names the
/// tensors (`{prefix}router`, ...) and their shapes. Returns `(E, D, H)`.
pub(super) fn check_shapes(
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
            router_bias: None,
            experts: Box::new(experts),
            biases: None,
            shared: None,
            score_bias: None,
            config,
            num_experts: e,
            packed: None,
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
            router_bias: None,
            experts: Box::new(experts),
            biases: None,
            shared: None,
            score_bias: None,
            config,
            num_experts: e,
            packed: None,
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
        names: &ExpertNames,
        (dim, hidden, experts): (usize, usize, usize),
        shared_hidden: Option<usize>,
        config: MoeConfig,
        s: &Stream,
    ) -> Result<Self> {
        config.check(experts)?;
        let group = w.comm();
        let router = w.full(names.router, &[experts, dim], s)?.transpose(s)?;
        let score_bias = match w.contains(names.router_bias) {
            true => Some(w.full(names.router_bias, &[experts], s)?),
            false => None,
        };
        let (experts_part, packed) = match super::switch::read(
            w,
            names.switch,
            (dim, hidden, experts),
            config.placement,
            s,
        )? {
            Some(read) => read,
            None => {
                refuse_quantized(w, names)?;
                let dims = (dim, hidden, experts);
                (read_per_expert(w, names, dims, config.placement, s)?, None)
            }
        };
        let shared = match shared_hidden {
            None => None,
            Some(hidden) => {
                let (prefix, mlp_names) = names.shared;
                let mlp = Mlp::load(&w.pp(prefix), &mlp_names, (dim, hidden), s)?;
                let gate_name = format!("{}.weight", names.shared_gate);
                let gate = if w.contains(&gate_name) {
                    let g = w.full(&gate_name, &[1, dim], s)?;
                    Some(ShardedArray::replicated(g.transpose(s)?, group))
                } else {
                    None
                };
                Some(Box::new(SharedExperts { mlp, gate }))
            }
        };
        Ok(Self {
            router: ShardedArray::replicated(router, group),
            router_bias: None,
            biases: None,
            experts: Box::new(experts_part),
            shared,
            score_bias,
            config,
            num_experts: experts,
            packed,
        })
    }
}

/// Quantized experts under Hugging Face's names are refused: mlx-lm
/// stacks them (`switch_mlp`) before it quantizes, and that is what is
/// read quantized.
fn refuse_quantized(w: &Weights, names: &ExpertNames) -> Result<()> {
    let probe = [
        format!("{}.0.{}.weight", names.experts, names.gate),
        names.stacked.0.to_owned(),
    ]
    .into_iter()
    .find(|name| w.quantization(name).is_some());
    match probe {
        None => Ok(()),
        Some(probe) => Err(Error::Model {
            path: w.source().path().display().to_string(),
            message: format!(
                "tensor `{}` is quantized under Hugging Face's expert names; quantized experts are read in mlx-lm's stacked layout (`{}.gate_proj`, what `mlx_lm.convert -q` writes): convert the float model with mlx-lm, or load the float model",
                w.name(&probe),
                names.switch
            ),
        }),
    }
}

/// This rank's float experts of a Hugging Face block: per-expert tensors,
/// or Transformers 5's stacked ones (see [`Moe::load_hf`]).
fn read_per_expert(
    w: &Weights,
    names: &ExpertNames,
    (dim, hidden, experts): (usize, usize, usize),
    placement: ExpertPlacement,
    s: &Stream,
) -> Result<Experts> {
    let group = w.comm();
    let (d, h, e) = (dim as i32, hidden as i32, experts as i32);
    let expert = |e: usize, which: &str| format!("{}.{e}.{which}.weight", names.experts);
    let (stacked_gate_up, stacked_down) = names.stacked;
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
    let stacked = w.contains(stacked_gate_up);
    let (gate, up, down) = if stacked {
        // Transformers 5's stacked experts: `experts.gate_up_proj`
        // [E, 2H, D] (gate rows, then up rows) and `experts.down_proj`
        // [E, D, H].
        let part = match placement {
            ExpertPlacement::ExpertParallel => w.chunk(experts),
            // Every expert's slice: the rows of a slice are not
            // contiguous in the stacked tensor, so it is read whole.
            ExpertPlacement::ExpertTensorParallel => (0, experts),
        };
        let gate_up = w.rows(stacked_gate_up, &[experts, 2 * hidden, dim], &[part], s)?;
        let parts = gate_up.split(2, 1, s)?;
        // To [E', D, H] and [E', H, D].
        let down = w.rows(stacked_down, &[experts, dim, hidden], &[part], s)?;
        (
            parts[0].swap_axes(1, 2, s)?,
            parts[1].swap_axes(1, 2, s)?,
            down.swap_axes(1, 2, s)?,
        )
    } else {
        let (first, count, part) = match placement {
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
    // Each rank's experts, or hidden columns of every expert, as `w`
    // divides them (the chunk rule, or in proportion to its shares).
    let experts_part = match placement {
        ExpertPlacement::ExpertParallel => {
            let split = w.lengths(experts);
            let part = |a: Array, global: [i32; 3]| {
                ShardedArray::from_local_split(a, group, &global, &split)
            };
            Experts::Parallel(ExpertWeights {
                gate: part(gate, [e, d, h])?,
                up: part(up, [e, d, h])?,
                down: part(down, [e, h, d])?,
            })
        }
        ExpertPlacement::ExpertTensorParallel => {
            let split = w.lengths(hidden);
            // Read whole when stacked: this rank's columns cut here.
            let (first, count) = crate::typed::split_part(&split, group.rank());
            let cut = |a: Array, axis: usize| match stacked {
                true => crate::runtime::slice_axis(&a, axis, first, count, s),
                false => Ok(a),
            };
            Experts::TensorParallel(ExpertSlices {
                gate: ShardedArray::from_local_split(cut(gate, 2)?, group, &[e, d, h], &split)?,
                up: ShardedArray::from_local_split(cut(up, 2)?, group, &[e, d, h], &split)?,
                down: ShardedArray::from_local_split(cut(down, 1)?, group, &[e, h, d], &split)?,
            })
        }
    };
    Ok(experts_part)
}

/// Where an MoE block's tensors are under its prefix: the router, the
/// per-expert tensors (`{experts}.{e}.{gate}.weight`, ...) or the stacked
/// ones, and the shared expert. Each model family names its own
/// (`models/`); `nn` knows only the layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertNames {
    /// The router, after the prefix: `gate.weight`.
    pub router: &'static str,
    /// mlx-lm's stack of the experts (`switch_mlp`: then `.gate_proj`,
    /// `.up_proj`, `.down_proj`), as mlx-community directories store them,
    /// read instead when the checkpoint has it.
    pub switch: &'static str,
    /// The router's score correction bias `[E]` (DeepSeek-V3's and
    /// GLM-4-MoE's `gate.e_score_correction_bias`), read when present.
    pub router_bias: &'static str,
    /// The per-expert tensors' prefix: `experts` (then `.{e}.{gate}`, ...).
    pub experts: &'static str,
    /// The stacked layout's tensors (Transformers 5), gate and up `[E, 2H,
    /// D]` and down `[E, D, H]`, read instead when the checkpoint has them.
    pub stacked: (&'static str, &'static str),
    /// The gate projection `[H, D]`.
    pub gate: &'static str,
    /// The up projection `[H, D]`.
    pub up: &'static str,
    /// The down projection `[D, H]`.
    pub down: &'static str,
    /// The shared expert's MLP (Qwen2-MoE's `shared_expert`), under the
    /// block's prefix.
    pub shared: (&'static str, MlpNames),
    /// The shared expert's gate `[1, D]`, when the block has one.
    pub shared_gate: &'static str,
}
