//! Experts stacked with gate and up interleaved and with biases, as
//! gpt-oss ships them: `gate_up` `[E, 2H, D]` whose even rows are the
//! gate's and odd rows the up projection's, `down` `[E, D, H]`, stored in
//! MXFP4 (`{name}_blocks` `uint8` `[E, out, in / 32, 16]`, two 4-bit
//! values a byte, the first in the low bits; `{name}_scales` `uint8` `[E,
//! out, in / 32]`, powers of two biased by 127) or, dequantized, as floats
//! in Transformers' layout (`gate_up_proj` `[E, D, 2H]`, `down_proj` `[E,
//! H, D]`); biases `{name}_bias` `[E, 2H]` (interleaved too) and `[E, D]`;
//! a router `{router}.weight` `[E, D]` with `{router}.bias` `[E]`.
//!
//! MXFP4 experts are dequantized to float32 as they are read (MLX's own
//! `dequantize` in `mxfp4` mode): the expert matmuls run on floats.

use safemlx::ops::{dequantize_with_mode, QuantizationMode};
use safemlx::{Array, Dtype, Stream};

use super::config::{ExpertPlacement, MoeConfig};
use super::{BiasPair, ExpertBiases, ExpertSlices, ExpertWeights, Experts, HiddenBiases, Moe};
use crate::checkpoint::Weights;
use crate::error::{Error, Result};
use crate::runtime::slice_axis;
use crate::typed::ShardedArray;

/// Where an interleaved MoE block's tensors are under its prefix (see the
/// module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterleavedNames {
    /// The router's stem: `router` (`.weight`, `.bias`).
    pub router: &'static str,
    /// The gate and up projections': `experts.gate_up_proj` (then
    /// `_blocks`, `_scales`, `_bias`).
    pub gate_up: &'static str,
    /// The down projection's: `experts.down_proj`.
    pub down: &'static str,
}

/// Which part of an `[E, rows, columns]` matrix a rank reads.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// Experts `(first, count)`, whole.
    Experts((usize, usize)),
    /// Rows `(first, count)` of every expert.
    Rows((usize, usize)),
    /// Columns `(first, count)` of every expert.
    Columns((usize, usize)),
}

/// `cut` of the `[E, rows, columns]` matrix `stem` as float32 `[E', rows',
/// columns']`: MXFP4 blocks and scales dequantized (columns that cut a
/// block of 32 are read whole and sliced), or the float `[E, columns,
/// rows]` tensor transposed.
fn read_matrix(
    w: &Weights,
    stem: &str,
    (e, rows, columns): (usize, usize, usize),
    cut: Cut,
    s: &Stream,
) -> Result<Array> {
    let blocks = format!("{stem}_blocks");
    if !w.contains(&blocks) {
        let (axis, range) = match cut {
            Cut::Experts(r) => (0, r),
            Cut::Rows(r) => (2, r),
            Cut::Columns(r) => (1, r),
        };
        let stored = w.along((stem, false), &[e, columns, rows], axis, &[range], s)?;
        return Ok(stored.swap_axes(1, 2, s)?.as_dtype(Dtype::Float32, s)?);
    }
    if columns % 32 != 0 {
        return Err(Error::Model {
            path: w.source().path().display().to_string(),
            message: format!(
                "tensor `{}` holds MXFP4 blocks of 32 values, but its rows have {columns}",
                w.name(&blocks)
            ),
        });
    }
    let groups = columns / 32;
    // Whole blocks of a column cut are read as such; a cut inside a block
    // reads every column and slices after dequantizing.
    let (axis, range, after) = match cut {
        Cut::Experts(r) => (0, r, None),
        Cut::Rows(r) => (1, r, None),
        Cut::Columns((first, count)) if first % 32 == 0 && count % 32 == 0 => {
            (2, (first / 32, count / 32), None)
        }
        Cut::Columns(r) => (0, (0, e), Some(r)),
    };
    let read = |name: String, shape: &[usize]| w.along((&name, true), shape, axis, &[range], s);
    let packed = read(blocks, &[e, rows, groups, 16])?;
    let scales = read(format!("{stem}_scales"), &[e, rows, groups])?;
    // 16 bytes a block are 4 uint32 words of MLX's packing.
    let shape = packed.shape().to_vec();
    let packed = packed
        .reshape(&[shape[0], shape[1], shape[2] * 16], s)?
        .view_dtype(Dtype::Uint32, s)?;
    let values = dequantize_with_mode(&packed, &scales, None, 32, 4, QuantizationMode::MxFp4, s)?
        .as_dtype(Dtype::Float32, s)?;
    match after {
        Some((first, count)) => Ok(slice_axis(&values, 2, first, count, s)?),
        None => Ok(values),
    }
}

/// `[E', 2k, ...]` interleaved along axis 1 into its even and odd rows,
/// `[E', k, ...]` each.
fn deinterleave(a: &Array, s: &Stream) -> Result<(Array, Array)> {
    let shape = a.shape();
    let mut pairs = vec![shape[0], shape[1] / 2, 2];
    pairs.extend_from_slice(&shape[2..]);
    let paired = a.reshape(&pairs, s)?;
    let take =
        |i: usize| -> Result<Array> { Ok(slice_axis(&paired, 2, i, 1, s)?.squeeze_axes(&[2], s)?) };
    Ok((take(0)?, take(1)?))
}

impl Moe {
    /// Reads this rank's part of an interleaved MoE block (`w` at e.g.
    /// `model.layers.3.mlp`, tensors named by `names`; see the module
    /// docs), each rank reading only its experts (expert parallel) or its
    /// hidden slice of every expert (expert tensor parallel; MXFP4 down
    /// projections whose slice cuts a block of 32 are read whole).
    ///
    /// # Errors
    /// A missing tensor, one whose shape or dtype disagrees with `(dim,
    /// hidden, experts)` (the message names it and the file), or a
    /// `top_k` outside `1..=E`.
    pub fn load_interleaved(
        w: &Weights,
        names: &InterleavedNames,
        (dim, hidden, experts): (usize, usize, usize),
        config: MoeConfig,
        s: &Stream,
    ) -> Result<Self> {
        config.check(experts)?;
        let group = w.comm();
        let (d, h, e) = (dim as i32, hidden as i32, experts as i32);
        // Expert parallel: this rank's experts. Expert tensor parallel:
        // its hidden slice of every expert, whose gate and up rows are
        // the contiguous rows 2a..2c of the interleaved matrix.
        let (gate_up_cut, down_cut) = match config.placement {
            ExpertPlacement::ExpertParallel => {
                let part = w.chunk(experts);
                (Cut::Experts(part), Cut::Experts(part))
            }
            ExpertPlacement::ExpertTensorParallel => {
                let (first, count) = w.chunk(hidden);
                (
                    Cut::Rows((2 * first, 2 * count)),
                    Cut::Columns((first, count)),
                )
            }
        };
        let router = w.full(&format!("{}.weight", names.router), &[experts, dim], s)?;
        let router_bias = w.full(&format!("{}.bias", names.router), &[experts], s)?;
        // [E', 2H', D] -> gate, up [E', H', D] -> [E', D, H']; down [E', D, H'] -> [E', H', D].
        let gate_up = read_matrix(w, names.gate_up, (experts, 2 * hidden, dim), gate_up_cut, s)?;
        let (gate, up) = deinterleave(&gate_up, s)?;
        let (gate, up) = (gate.swap_axes(1, 2, s)?, up.swap_axes(1, 2, s)?);
        let down = read_matrix(w, names.down, (experts, dim, hidden), down_cut, s)?;
        let down = down.swap_axes(1, 2, s)?;
        let (axis, range) = match gate_up_cut {
            Cut::Experts(r) => (0, r),
            Cut::Rows(r) | Cut::Columns(r) => (1, r),
        };
        let name = format!("{}_bias", names.gate_up);
        let gate_up_bias = w.along((&name, false), &[experts, 2 * hidden], axis, &[range], s)?;
        let (gate_bias, up_bias) = deinterleave(&gate_up_bias.as_dtype(Dtype::Float32, s)?, s)?;
        let down_bias = w.full(&format!("{}_bias", names.down), &[experts, dim], s)?;
        let (experts_part, hidden_biases) = match config.placement {
            ExpertPlacement::ExpertParallel => (
                Experts::Parallel(ExpertWeights {
                    gate: ShardedArray::from_local(gate, group, &[e, d, h])?,
                    up: ShardedArray::from_local(up, group, &[e, d, h])?,
                    down: ShardedArray::from_local(down, group, &[e, h, d])?,
                }),
                HiddenBiases::Parallel(BiasPair {
                    gate: ShardedArray::from_local(gate_bias, group, &[e, h])?,
                    up: ShardedArray::from_local(up_bias, group, &[e, h])?,
                }),
            ),
            ExpertPlacement::ExpertTensorParallel => (
                Experts::TensorParallel(ExpertSlices {
                    gate: ShardedArray::from_local(gate, group, &[e, d, h])?,
                    up: ShardedArray::from_local(up, group, &[e, d, h])?,
                    down: ShardedArray::from_local(down, group, &[e, h, d])?,
                }),
                HiddenBiases::TensorParallel(BiasPair {
                    gate: ShardedArray::from_local(gate_bias, group, &[e, h])?,
                    up: ShardedArray::from_local(up_bias, group, &[e, h])?,
                }),
            ),
        };
        Ok(Self {
            router: ShardedArray::replicated(router.transpose(s)?, group),
            router_bias: Some(ShardedArray::replicated(router_bias, group)),
            experts: Box::new(experts_part),
            biases: Some(Box::new(ExpertBiases {
                hidden: hidden_biases,
                down: ShardedArray::replicated(down_bias.as_dtype(Dtype::Float32, s)?, group),
            })),
            shared: None,
            score_bias: None,
            config,
            num_experts: experts,
        })
    }
}
