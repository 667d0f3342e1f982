//! Experts kept packed as stored: each projection's packed values and
//! scales (and biases) as MLX packs them, multiplied by MLX's
//! `quantized_matmul` (one expert) and `gather_qmm` (grouped) in their
//! mode without dequantizing (one affine expert's product of many rows
//! on a CPU dequantizes it in blocks, as a dense quantized layer does:
//! `AffineWeight::matmul_t`). MXFP4 (gpt-oss): `[E, out, in / 8]`
//! `uint32` (eight 4-bit values a word) and `[E, out, in / 32]` `uint8`
//! (one power-of-two scale per 32 values). Affine (mlx-community's
//! `switch_mlp`): `[E, out, in * bits / 32]` `uint32`, scales and biases
//! `[E, out, in / group_size]`. A projection whose stored type has no
//! packed form beside packed ones (llama.cpp's Q4_K_M keeps some `down`
//! stacks in Q6_K) is held dequantized, `[E, out, in]` floats placed the
//! same way, and the others stay packed. They are frozen: no parameters.

use safemlx::ops::{gather_qmm_with_mode, quantized_matmul_with_mode, QuantizationMode};

pub use crate::packing::PackedFormat;
use safemlx::{Array, Stream};

use crate::affine::AffineWeight;
use crate::error::{Error, Result};
use crate::grad::{check_count, Parameter, Parameters};
use crate::runtime::slice_axis;
use crate::typed::{Placement, Sharded, ShardedArray};

/// Whether experts packed in `format` stay packed under `placement`:
/// under expert tensor parallelism every rank needs a whole group of the
/// hidden dimension `hidden` (`groups`: each rank's count; a rank with
/// none would multiply an empty quantized matrix, which MLX's CPU kernel
/// answers with a division by zero). The reason when not.
pub(super) fn keep(
    placement: super::ExpertPlacement,
    hidden: usize,
    format: PackedFormat,
    groups: &[usize],
) -> std::result::Result<(), String> {
    let empty = groups.iter().position(|&g| g == 0);
    let Some(rank) = empty.filter(|_| placement == super::ExpertPlacement::ExpertTensorParallel)
    else {
        return Ok(());
    };
    let (unit, word) = match format.mode {
        QuantizationMode::MxFp4 => ("MXFP4's blocks of 32".to_owned(), "blocks"),
        QuantizationMode::Affine => (
            format!("whole quantization groups of {}", format.group_size),
            "groups",
        ),
    };
    let per_rank: Vec<String> = groups.iter().map(ToString::to_string).collect();
    Err(format!(
        "expert tensor parallel over {} ranks splits the hidden dimension {hidden} by {unit} ({} of them) and leaves rank {rank} none ({} {word} per rank)",
        groups.len(),
        hidden / format.group_size,
        per_rank.join(" + ")
    ))
}

/// [`keep`], when MLX also multiplies `format` on `s`'s device (for
/// MXFP4, one small product is tried: [`supported`]).
pub(super) fn keep_on(
    s: &Stream,
    placement: super::ExpertPlacement,
    hidden: usize,
    format: PackedFormat,
    groups: &[usize],
) -> std::result::Result<(), String> {
    if format.mode == QuantizationMode::MxFp4 {
        if let Err(e) = supported(s) {
            return Err(format!(
                "MLX does not multiply MXFP4 weights on this device ({e})"
            ));
        }
    }
    keep(placement, hidden, format, groups)
}

/// One projection of the local experts: packed values, scales and (affine)
/// biases, placed as `P` (by expert, by output row, or by whole groups of
/// input columns).
#[derive(Debug, Clone)]
pub struct Packed<P: Placement> {
    /// `uint32` `[E, out, in * bits / 32]`.
    pub packed: ShardedArray<P>,
    /// `[E, out, in / group_size]`.
    pub scales: ShardedArray<P>,
    /// `[E, out, in / group_size]`, for affine quantization.
    pub biases: Option<ShardedArray<P>>,
}

impl<P: Placement> Packed<P> {
    fn locals(&self) -> PackedLocals<'_> {
        (
            self.packed.local(),
            self.scales.local(),
            self.biases.as_ref().map(ShardedArray::local),
        )
    }
}

/// One projection of packed experts: packed as stored (in its format), or
/// dequantized `[E, out, in]` floats placed the same way (a stored type
/// without a packed form, beside packed projections).
#[derive(Debug, Clone)]
pub enum Projection<P: Placement> {
    /// Packed values, scales and biases.
    Packed(Box<Packed<P>>, PackedFormat),
    /// Floats, output rows by input columns.
    Float(ShardedArray<P>),
}

impl<P: Placement> Projection<P> {
    fn locals(&self) -> ProjectionLocals<'_> {
        match self {
            Self::Packed(p, format) => ProjectionLocals::Packed(p.locals(), *format),
            Self::Float(a) => ProjectionLocals::Float(a.local()),
        }
    }

    /// Every rank's length along `axis` (of the packed values or floats).
    pub fn axis_lengths(&self, axis: usize) -> Vec<usize> {
        match self {
            Self::Packed(p, _) => p.packed.axis_lengths(axis),
            Self::Float(a) => a.axis_lengths(axis),
        }
    }
}

/// A projection's local parts as a forward multiplies them.
#[derive(Clone, Copy)]
pub(super) enum ProjectionLocals<'a> {
    /// Packed values, scales and biases, and their format.
    Packed(PackedLocals<'a>, PackedFormat),
    /// Floats `[E', out, in]`.
    Float(&'a Array),
}

impl ProjectionLocals<'_> {
    pub(super) fn nbytes(&self) -> usize {
        match self {
            Self::Packed((p, s, b), _) => p.nbytes() + s.nbytes() + b.map_or(0, |b| b.nbytes()),
            Self::Float(a) => a.nbytes(),
        }
    }
}

/// How a layer's experts are held when they were stored packed: kept, or
/// dequantized and why.
pub(super) type Storage = (PackedFormat, std::result::Result<(), String>);

/// A projection's local packed values, scales and biases.
pub(super) type PackedLocals<'a> = (&'a Array, &'a Array, Option<&'a Array>);

/// Packed experts on this rank: gate and up `[E, H, D]` and down `[E, D,
/// H]` as stored (output rows by input columns), split by expert (expert
/// parallel) or by the hidden dimension (expert tensor parallel: the gate
/// and up rows, the down projection's whole groups of columns).
#[derive(Debug, Clone)]
pub struct PackedExperts {
    /// How the packed projections are packed (the first's, when they
    /// differ).
    pub format: PackedFormat,
    /// The matrices, by placement.
    pub matrices: PackedMatrices,
}

/// [`PackedExperts`]' matrices, by placement.
#[derive(Debug, Clone)]
pub enum PackedMatrices {
    /// Gate, up and down of this rank's experts.
    Parallel([Projection<Sharded<0>>; 3]),
    /// Every expert's gate and up rows and down columns of this rank's
    /// hidden slice.
    TensorParallel([Projection<Sharded<1>>; 2], Projection<Sharded<2>>),
}

impl PackedExperts {
    /// Gate, up and down: packed parts, or floats.
    pub(super) fn locals(&self) -> [ProjectionLocals<'_>; 3] {
        match &self.matrices {
            PackedMatrices::Parallel([g, u, d]) => [g.locals(), u.locals(), d.locals()],
            PackedMatrices::TensorParallel([g, u], d) => [g.locals(), u.locals(), d.locals()],
        }
    }

    /// How many of the three projections are held as floats.
    pub fn float_projections(&self) -> usize {
        let locals = self.locals();
        locals
            .iter()
            .filter(|l| matches!(l, ProjectionLocals::Float(_)))
            .count()
    }
}

/// Frozen weights: no parameters.
impl Parameters for PackedExperts {
    fn parameters(&self) -> Vec<Parameter> {
        Vec::new()
    }

    fn with_parameters(&self, locals: &[Array]) -> Result<Self> {
        check_count(0, locals.len())?;
        Ok(self.clone())
    }
}

/// The local experts' three matrices as a forward multiplies them.
pub(super) enum ExpertMatrices<'a> {
    /// Float gate and up `[E', D, H']`, down `[E', H', D]` (input rows).
    Float([&'a Array; 3]),
    /// Packed gate and up `[E', H', D]`, down `[E', D, H']` (output rows):
    /// packed parts, or floats in the same orientation.
    Packed([ProjectionLocals<'a>; 3]),
}

impl ExpertMatrices<'_> {
    /// `x` `[r, in]` times matrix `which` (0 gate, 1 up, 2 down) of local
    /// expert `e`: `[r, out]`.
    pub(super) fn one(&self, which: usize, x: &Array, e: usize, s: &Stream) -> Result<Array> {
        let pick =
            |a: &Array| -> Result<Array> { Ok(slice_axis(a, 0, e, 1, s)?.squeeze_axes(&[0], s)?) };
        match self {
            Self::Float(m) => Ok(x.matmul(pick(m[which])?, s)?),
            Self::Packed(m) => {
                let ((packed, scales, biases), format) = match m[which] {
                    ProjectionLocals::Packed(parts, format) => (parts, format),
                    ProjectionLocals::Float(a) => return Ok(x.matmul(pick(a)?.transpose(s)?, s)?),
                };
                let biases = biases.map(pick).transpose()?;
                if let (QuantizationMode::Affine, Some(b)) = (format.mode, &biases) {
                    // As a dense quantized layer multiplies: dequantized
                    // in blocks for many rows on a CPU (a prompt's rows of
                    // this expert), MLX's kernel otherwise.
                    let (g, bits) = (format.group_size, format.bits);
                    let w = AffineWeight::new(pick(packed)?, pick(scales)?, b.clone(), g, bits)?;
                    return w.matmul_t(x, s);
                }
                let (group_size, bits) = format.ints();
                Ok(quantized_matmul_with_mode(
                    x,
                    pick(packed)?,
                    pick(scales)?,
                    biases.as_ref(),
                    true,
                    group_size,
                    bits,
                    format.mode,
                    s,
                )?)
            }
        }
    }

    /// `x` `[r, 1, in]`, rows sorted by their local expert `ids` (`[r]`
    /// `uint32`), times matrix `which` of each row's expert: `[r, 1, out]`.
    pub(super) fn grouped(
        &self,
        which: usize,
        x: &Array,
        ids: &Array,
        s: &Stream,
    ) -> Result<Array> {
        match self {
            Self::Float(m) => Ok(safemlx::ops::gather_mm(x, m[which], None, ids, true, s)?),
            Self::Packed(m) => {
                let ((packed, scales, biases), format) = match m[which] {
                    ProjectionLocals::Packed(parts, format) => (parts, format),
                    ProjectionLocals::Float(a) => {
                        let rows_in = a.swap_axes(1, 2, s)?;
                        return Ok(safemlx::ops::gather_mm(x, &rows_in, None, ids, true, s)?);
                    }
                };
                let (group_size, bits) = format.ints();
                Ok(gather_qmm_with_mode(
                    x,
                    packed,
                    scales,
                    biases,
                    None,
                    Some(ids),
                    true,
                    group_size,
                    bits,
                    true,
                    format.mode,
                    s,
                )?)
            }
        }
    }
}

/// Whether MLX multiplies MXFP4 weights on `s`'s device: one small
/// `quantized_matmul` in that mode, run; the error when it does not.
///
/// # Errors
/// MLX's refusal, as its message.
pub(super) fn supported(s: &Stream) -> Result<()> {
    let x = safemlx::ops::ones::<f32>(&[1, 32], s)?;
    let packed = Array::from_slice(&[0u32; 4], &[1, 4]);
    let scales = Array::from_slice(&[127u8], &[1, 1]);
    let y = quantized_matmul_with_mode(
        &x,
        &packed,
        &scales,
        None,
        true,
        32,
        4,
        QuantizationMode::MxFp4,
        s,
    )?;
    crate::runtime::eval(&[&y]).map_err(|e| Error::Setting(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::{keep, PackedFormat};
    use crate::nn::ExpertPlacement::{ExpertParallel, ExpertTensorParallel};

    #[test]
    fn packed_experts_stay_packed_unless_a_sliced_rank_gets_no_group() {
        let affine = PackedFormat::affine(64, 4);
        assert_eq!(keep(ExpertParallel, 64, affine, &[1, 0]), Ok(()));
        assert_eq!(keep(ExpertTensorParallel, 128, affine, &[1, 1]), Ok(()));
        assert_eq!(
            keep(ExpertTensorParallel, 64, affine, &[1, 0]),
            Err("expert tensor parallel over 2 ranks splits the hidden dimension 64 by whole quantization groups of 64 (1 of them) and leaves rank 1 none (1 + 0 groups per rank)".to_owned())
        );
        assert_eq!(
            keep(ExpertTensorParallel, 96, PackedFormat::MXFP4, &[3, 0]),
            Err("expert tensor parallel over 2 ranks splits the hidden dimension 96 by MXFP4's blocks of 32 (3 of them) and leaves rank 1 none (3 + 0 blocks per rank)".to_owned())
        );
    }
}
