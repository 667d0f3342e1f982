//! Experts kept in MXFP4 as stored (gpt-oss): each projection's packed
//! values and scales as MLX's `mxfp4` mode packs them, `[E, out, in / 8]`
//! `uint32` (eight 4-bit values a word) and `[E, out, in / 32]` `uint8`
//! (one power-of-two scale per 32 values), multiplied by MLX's
//! `quantized_matmul` (one expert) and `gather_qmm` (grouped) in that mode
//! without dequantizing. They are frozen: no parameters.

use safemlx::ops::{gather_qmm_with_mode, quantized_matmul_with_mode, QuantizationMode};
use safemlx::{Array, Stream};

use crate::error::{Error, Result};
use crate::grad::{check_count, Parameter, Parameters};
use crate::runtime::slice_axis;
use crate::typed::{Placement, Sharded, ShardedArray};

/// One projection of the local experts: packed values and scales,
/// placed as `P` (by expert, by output row, or by whole blocks of 32
/// input columns).
#[derive(Debug, Clone)]
pub struct Mxfp4<P: Placement> {
    /// `uint32` `[E, out, in / 8]`.
    pub packed: ShardedArray<P>,
    /// `uint8` `[E, out, in / 32]`.
    pub scales: ShardedArray<P>,
}

impl<P: Placement> Mxfp4<P> {
    fn locals(&self) -> (&Array, &Array) {
        (self.packed.local(), self.scales.local())
    }
}

/// MXFP4 experts on this rank: gate and up `[E, H, D]` and down `[E, D,
/// H]` as stored (output rows by input columns), split by expert (expert
/// parallel) or by the hidden dimension (expert tensor parallel: the gate
/// and up rows, the down projection's blocks of 32 columns).
#[derive(Debug, Clone)]
pub enum Mxfp4Experts {
    /// Gate, up and down of this rank's experts.
    Parallel([Mxfp4<Sharded<0>>; 3]),
    /// Every expert's gate and up rows and down columns of this rank's
    /// hidden slice.
    TensorParallel([Mxfp4<Sharded<1>>; 2], Mxfp4<Sharded<2>>),
}

impl Mxfp4Experts {
    /// Gate, up and down: packed values and scales.
    pub(super) fn locals(&self) -> [(&Array, &Array); 3] {
        match self {
            Self::Parallel([g, u, d]) => [g.locals(), u.locals(), d.locals()],
            Self::TensorParallel([g, u], d) => [g.locals(), u.locals(), d.locals()],
        }
    }
}

/// Frozen weights: no parameters.
impl Parameters for Mxfp4Experts {
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
    /// MXFP4 gate and up `[E', H', D]`, down `[E', D, H']` (output rows),
    /// packed values and scales.
    Mxfp4([(&'a Array, &'a Array); 3]),
}

impl ExpertMatrices<'_> {
    /// `x` `[r, in]` times matrix `which` (0 gate, 1 up, 2 down) of local
    /// expert `e`: `[r, out]`.
    pub(super) fn one(&self, which: usize, x: &Array, e: usize, s: &Stream) -> Result<Array> {
        let pick =
            |a: &Array| -> Result<Array> { Ok(slice_axis(a, 0, e, 1, s)?.squeeze_axes(&[0], s)?) };
        match self {
            Self::Float(m) => Ok(x.matmul(pick(m[which])?, s)?),
            Self::Mxfp4(m) => {
                let (packed, scales) = m[which];
                Ok(quantized_matmul_with_mode(
                    x,
                    pick(packed)?,
                    pick(scales)?,
                    None,
                    true,
                    32,
                    4,
                    QuantizationMode::MxFp4,
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
            Self::Mxfp4(m) => {
                let (packed, scales) = m[which];
                Ok(gather_qmm_with_mode(
                    x,
                    packed,
                    scales,
                    None,
                    None,
                    Some(ids),
                    true,
                    32,
                    4,
                    true,
                    QuantizationMode::MxFp4,
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
