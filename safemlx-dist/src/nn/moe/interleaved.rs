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
//! MXFP4 experts stay as stored ([`PackedExperts`]) where
//! [`packed::keep_on`] says: MLX multiplies that mode on the stream's
//! device and, under expert tensor parallelism, every rank gets a block
//! of 32 of the hidden dimension (which then splits by whole blocks);
//! otherwise they are dequantized to float32 as they are read (MLX's
//! `dequantize` in `mxfp4` mode), and the layer says why
//! ([`Moe::packed_storage`]). The same experts as mlx-lm saves them
//! (de-interleaved, `InterleavedNames::mlx_lm`) are read by
//! `biased_switch.rs`.

use safemlx::ops::{dequantize_with_mode, QuantizationMode};
use safemlx::{Array, Dtype, Stream};

use super::config::{ExpertPlacement, MoeConfig};
use super::packed::{
    self, Packed, PackedExperts, PackedFormat, PackedMatrices, Projection, Storage,
};
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
    /// The stack mlx-lm saves them as, de-interleaved (`experts`: its
    /// `gate_proj`, `up_proj` and `down_proj` with `.bias` each; see
    /// `biased_switch.rs`), read when present.
    pub mlx_lm: &'static str,
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
    // A column cut inside a block reads every column and slices after
    // dequantizing.
    let (read, after) = match cut {
        Cut::Columns((first, count)) if first % 32 != 0 || count % 32 != 0 => {
            (Cut::Experts((0, e)), Some((first, count)))
        }
        other => (other, None),
    };
    let (packed, scales) = read_packed(w, stem, (e, rows, columns), read, s)?;
    let values = dequantize_with_mode(&packed, &scales, None, 32, 4, QuantizationMode::MxFp4, s)?
        .as_dtype(Dtype::Float32, s)?;
    match after {
        Some((first, count)) => Ok(slice_axis(&values, 2, first, count, s)?),
        None => Ok(values),
    }
}

/// `cut` of the MXFP4 `[E, rows, columns]` matrix `stem` (its `_blocks`
/// and `_scales`) as MLX packs it: `uint32` `[E', rows', columns' / 8]`
/// and `uint8` `[E', rows', columns' / 32]`.
///
/// # Errors
/// Columns that are not whole blocks of 32 (a row's or the cut's), a
/// missing tensor, or one of another shape or dtype.
fn read_packed(
    w: &Weights,
    stem: &str,
    (e, rows, columns): (usize, usize, usize),
    cut: Cut,
    s: &Stream,
) -> Result<(Array, Array)> {
    let blocks = format!("{stem}_blocks");
    let unaligned = match cut {
        Cut::Columns((first, count)) => first % 32 != 0 || count % 32 != 0,
        _ => false,
    };
    if columns % 32 != 0 || unaligned {
        return Err(Error::Model {
            path: w.source().path().display().to_string(),
            message: format!(
                "tensor `{}` holds MXFP4 blocks of 32 values: its {columns} columns, or the {cut:?} read, are not whole blocks",
                w.name(&blocks)
            ),
        });
    }
    let groups = columns / 32;
    let (axis, range) = match cut {
        Cut::Experts(r) => (0, r),
        Cut::Rows(r) => (1, r),
        Cut::Columns((first, count)) => (2, (first / 32, count / 32)),
    };
    let read = |name: String, shape: &[usize]| w.along((&name, true), shape, axis, &[range], s);
    let packed = read(blocks, &[e, rows, groups, 16])?;
    let scales = read(format!("{stem}_scales"), &[e, rows, groups])?;
    // 16 bytes a block are 4 uint32 words of MLX's packing.
    let shape = packed.shape().to_vec();
    let packed = packed
        .reshape(&[shape[0], shape[1], shape[2] * 16], s)?
        .view_dtype(Dtype::Uint32, s)?;
    Ok((packed, scales))
}

/// `[E', 2k, ...]` interleaved along axis 1 into its even and odd rows,
/// `[E', k, ...]` each, contiguous: a strided view would be copied again
/// by every matmul that reads it (MXFP4's `quantized_matmul` takes rows
/// in order), on every step.
fn deinterleave(a: &Array, s: &Stream) -> Result<(Array, Array)> {
    let shape = a.shape();
    let mut pairs = vec![shape[0], shape[1] / 2, 2];
    pairs.extend_from_slice(&shape[2..]);
    let paired = a.reshape(&pairs, s)?;
    let take = |i: usize| -> Result<Array> {
        let half = slice_axis(&paired, 2, i, 1, s)?.squeeze_axes(&[2], s)?;
        let half = half.contiguous(false, s)?;
        crate::runtime::eval(&[&half])?;
        Ok(half)
    };
    Ok((take(0)?, take(1)?))
}

impl Moe {
    /// Reads this rank's part of an interleaved MoE block (`w` at e.g.
    /// `model.layers.3.mlp`, tensors named by `names`; see the module
    /// docs), each rank reading only its experts (expert parallel) or its
    /// hidden slice of every expert (expert tensor parallel: whole blocks
    /// of 32 for experts kept in MXFP4; a dequantized down projection
    /// whose slice cuts a block is read whole).
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
        if w.contains(&format!("{}.gate_proj.weight", names.mlx_lm)) {
            return Self::load_biased_switch(w, names, (dim, hidden, experts), config, s);
        }
        let group = w.comm();
        let rank = group.rank();
        let mxfp4 = w.contains(&format!("{}_blocks", names.gate_up)).then(|| {
            let blocks = w.lengths(hidden / 32);
            packed::keep_on(s, config.placement, hidden, PackedFormat::MXFP4, &blocks)
        });
        // Each rank's share of the hidden dimension: whole blocks of 32
        // for experts kept in MXFP4 (2880 over 4 ranks is 736 + 736 +
        // 704 + 704).
        let unit = if matches!(mxfp4, Some(Ok(()))) { 32 } else { 1 };
        let split = w.lengths_in(hidden, unit);
        // Expert parallel: this rank's experts. Expert tensor parallel:
        // its hidden slice of every expert, whose gate and up rows are
        // the contiguous rows 2a..2c of the interleaved matrix.
        let (gate_up_cut, down_cut) = match config.placement {
            ExpertPlacement::ExpertParallel => {
                let part = w.chunk(experts);
                (Cut::Experts(part), Cut::Experts(part))
            }
            ExpertPlacement::ExpertTensorParallel => {
                let (first, count) = (split[..rank].iter().sum::<usize>(), split[rank]);
                (
                    Cut::Rows((2 * first, 2 * count)),
                    Cut::Columns((first, count)),
                )
            }
        };
        let (axis, range) = match gate_up_cut {
            Cut::Experts(r) => (0, r),
            Cut::Rows(r) | Cut::Columns(r) => (1, r),
        };
        let name = format!("{}_bias", names.gate_up);
        let gate_up_bias = w.along((&name, false), &[experts, 2 * hidden], axis, &[range], s)?;
        let (gate_bias, up_bias) = deinterleave(&gate_up_bias.as_dtype(Dtype::Float32, s)?, s)?;
        let hidden_biases = HiddenBiases::placed(
            w,
            (gate_bias, up_bias),
            (experts, hidden),
            (config.placement, &split),
            s,
        )?;
        let cuts = (gate_up_cut, down_cut, &split[..]);
        let experts_part = match &mxfp4 {
            Some(Ok(())) => Experts::Packed(Box::new(read_mxfp4(
                w,
                names,
                (dim, hidden, experts),
                cuts,
                s,
            )?)),
            stored => {
                let float = read_float(
                    w,
                    names,
                    (dim, hidden, experts),
                    (cuts, config.placement),
                    s,
                )?;
                // Dequantized where the layout cannot keep MXFP4: as frozen
                // as the stored experts (not trained at any rank count).
                match stored {
                    Some(_) => Experts::Frozen(crate::grad::Frozen::new(float)),
                    None => float,
                }
            }
        };
        let packed = mxfp4.map(|kept| (PackedFormat::MXFP4, kept));
        let parts = (experts_part, hidden_biases, packed);
        Self::with_router(w, names, (dim, experts), config, parts, s)
    }

    /// The layer around this rank's experts and their gate and up biases:
    /// the router (`{router}.weight` `[E, D]` and `.bias`) and the down
    /// biases (`{down}_bias`, or mlx-lm's `{mlx_lm}.down_proj.bias`, `[E,
    /// D]`), read whole.
    pub(super) fn with_router(
        w: &Weights,
        names: &InterleavedNames,
        (dim, experts): (usize, usize),
        config: MoeConfig,
        (experts_part, hidden, packed): (Experts, HiddenBiases, Option<Storage>),
        s: &Stream,
    ) -> Result<Self> {
        let group = w.comm();
        let router = w.full(&format!("{}.weight", names.router), &[experts, dim], s)?;
        let router_bias = w.full(&format!("{}.bias", names.router), &[experts], s)?;
        let down = match w.contains(&format!("{}_bias", names.down)) {
            true => format!("{}_bias", names.down),
            false => format!("{}.down_proj.bias", names.mlx_lm),
        };
        let down_bias = w.full(&down, &[experts, dim], s)?;
        Ok(Self {
            router: ShardedArray::replicated(router.transpose(s)?, group),
            router_bias: Some(ShardedArray::replicated(router_bias, group)),
            experts: Box::new(experts_part),
            biases: Some(Box::new(ExpertBiases {
                hidden,
                down: ShardedArray::replicated(down_bias.as_dtype(Dtype::Float32, s)?, group),
            })),
            shared: None,
            score_bias: None,
            config,
            num_experts: experts,
            packed,
        })
    }
}

impl HiddenBiases {
    /// This rank's gate and up biases (`[E', H]` of its experts, or `[E,
    /// H']` of its hidden slice, as `(placement, split)` places them:
    /// `split` each rank's hidden lengths), placed.
    pub(super) fn placed(
        w: &Weights,
        (gate, up): (Array, Array),
        (experts, hidden): (usize, usize),
        (placement, split): (ExpertPlacement, &[usize]),
        s: &Stream,
    ) -> Result<Self> {
        let group = w.comm();
        let global = [experts as i32, hidden as i32];
        let (gate, up) = (
            gate.as_dtype(Dtype::Float32, s)?,
            up.as_dtype(Dtype::Float32, s)?,
        );
        Ok(match placement {
            ExpertPlacement::ExpertParallel => {
                let by_expert = w.lengths(experts);
                Self::Parallel(BiasPair {
                    gate: ShardedArray::from_local_split(gate, group, &global, &by_expert)?,
                    up: ShardedArray::from_local_split(up, group, &global, &by_expert)?,
                })
            }
            ExpertPlacement::ExpertTensorParallel => Self::TensorParallel(BiasPair {
                gate: ShardedArray::from_local_split(gate, group, &global, split)?,
                up: ShardedArray::from_local_split(up, group, &global, split)?,
            }),
        })
    }
}

/// This rank's float experts (MXFP4 ones dequantized): gate and up `[E',
/// D, H']`, down `[E', H', D]`, placed by `placement`.
fn read_float(
    w: &Weights,
    names: &InterleavedNames,
    (dim, hidden, experts): (usize, usize, usize),
    ((gate_up_cut, down_cut, split), placement): ((Cut, Cut, &[usize]), ExpertPlacement),
    s: &Stream,
) -> Result<Experts> {
    let group = w.comm();
    let (d, h, e) = (dim as i32, hidden as i32, experts as i32);
    // [E', 2H', D] -> gate, up [E', H', D] -> [E', D, H']; down [E', D, H'] -> [E', H', D].
    let gate_up = read_matrix(w, names.gate_up, (experts, 2 * hidden, dim), gate_up_cut, s)?;
    let (gate, up) = deinterleave(&gate_up, s)?;
    let (gate, up) = (gate.swap_axes(1, 2, s)?, up.swap_axes(1, 2, s)?);
    let down = read_matrix(w, names.down, (experts, dim, hidden), down_cut, s)?;
    let down = down.swap_axes(1, 2, s)?;
    Ok(match placement {
        ExpertPlacement::ExpertParallel => {
            let by_expert = w.lengths(experts);
            Experts::Parallel(ExpertWeights {
                gate: ShardedArray::from_local_split(gate, group, &[e, d, h], &by_expert)?,
                up: ShardedArray::from_local_split(up, group, &[e, d, h], &by_expert)?,
                down: ShardedArray::from_local_split(down, group, &[e, h, d], &by_expert)?,
            })
        }
        ExpertPlacement::ExpertTensorParallel => Experts::TensorParallel(ExpertSlices {
            gate: ShardedArray::from_local_split(gate, group, &[e, d, h], split)?,
            up: ShardedArray::from_local_split(up, group, &[e, d, h], split)?,
            down: ShardedArray::from_local_split(down, group, &[e, h, d], split)?,
        }),
    })
}

/// This rank's MXFP4 experts as stored (see [`keep_mxfp4`]): gate and up
/// `[E', H', D]`, down `[E', D, H']`, packed.
fn read_mxfp4(
    w: &Weights,
    names: &InterleavedNames,
    (dim, hidden, experts): (usize, usize, usize),
    (gate_up_cut, down_cut, split): (Cut, Cut, &[usize]),
    s: &Stream,
) -> Result<PackedExperts> {
    let group = w.comm();
    let (d, h, e) = (dim as i32, hidden as i32, experts as i32);
    let (packed, scales) =
        read_packed(w, names.gate_up, (experts, 2 * hidden, dim), gate_up_cut, s)?;
    let ((gate_p, up_p), (gate_s, up_s)) = (deinterleave(&packed, s)?, deinterleave(&scales, s)?);
    let (down_p, down_s) = read_packed(w, names.down, (experts, dim, hidden), down_cut, s)?;
    if let Cut::Experts(_) = down_cut {
        let by_expert = w.lengths(experts);
        let of = |packed: Array, scales: Array, (rows, columns): (i32, i32)| -> Result<_> {
            let part = |a: Array, global: [i32; 3]| {
                ShardedArray::from_local_split(a, group, &global, &by_expert)
            };
            let packed = Packed {
                packed: part(packed, [e, rows, columns / 8])?,
                scales: part(scales, [e, rows, columns / 32])?,
                biases: None,
            };
            Ok(Projection::Packed(Box::new(packed), PackedFormat::MXFP4))
        };
        return Ok(PackedExperts {
            format: PackedFormat::MXFP4,
            matrices: PackedMatrices::Parallel([
                of(gate_p, gate_s, (h, d))?,
                of(up_p, up_s, (h, d))?,
                of(down_p, down_s, (d, h))?,
            ]),
        });
    }
    let rows = |packed: Array, scales: Array| -> Result<_> {
        let packed = Packed {
            packed: ShardedArray::from_local_split(packed, group, &[e, h, d / 8], split)?,
            scales: ShardedArray::from_local_split(scales, group, &[e, h, d / 32], split)?,
            biases: None,
        };
        Ok(Projection::Packed(Box::new(packed), PackedFormat::MXFP4))
    };
    // The down projection's columns: each rank's hidden slice (whole
    // blocks), in words of 8 values and blocks of 32.
    let per = |n: usize| -> Vec<usize> { split.iter().map(|c| c / n).collect() };
    let down = Packed {
        packed: ShardedArray::from_local_split(down_p, group, &[e, d, h / 8], &per(8))?,
        scales: ShardedArray::from_local_split(down_s, group, &[e, d, h / 32], &per(32))?,
        biases: None,
    };
    Ok(PackedExperts {
        format: PackedFormat::MXFP4,
        matrices: PackedMatrices::TensorParallel(
            [rows(gate_p, gate_s)?, rows(up_p, up_s)?],
            Projection::Packed(Box::new(down), PackedFormat::MXFP4),
        ),
    })
}
