//! Floats of stacked tensors of any rank (experts `[E, out, in]`, per-head
//! matrices `[H, a, b]`) read in parts, quantized or not: what a layer
//! that holds such a tensor as floats reads.

use safemlx::ops::{dequantize_with_mode, QuantizationMode};
use safemlx::{Array, Dtype, Stream};

use super::{TensorSource, Weights};
use crate::error::Result;
use crate::packing::PackedFormat;
use crate::typed::Collective;

impl<C: Collective> Weights<'_, C> {
    /// Range `(first, count)` along `axis` of tensor `name` of logical
    /// shape `shape` as floats: as stored (in the dtype the source gives,
    /// which a model's [`OneDtype`](super::OneDtype) makes its own), or,
    /// when it is stored packed, dequantized (affine ones in their scales'
    /// dtype, MXFP4's as float32; rounded out to whole groups along the
    /// last axis, then cut).
    ///
    /// # Errors
    /// Another shape, a quantization mode not read here, a range past its
    /// end, or a failed read.
    pub fn floats_along(
        &self,
        name: &str,
        shape: &[usize],
        axis: usize,
        range: (usize, usize),
        s: &Stream,
    ) -> Result<Array> {
        let Some(format) = self.quantization(name) else {
            return self.along((name, false), shape, axis, &[range], s);
        };
        self.check(name, shape)?;
        let last = axis + 1 == shape.len();
        let parts = (format, last);
        dequantized_along(self.source(), &self.name(name), parts, axis, range, s)
    }
}

/// Range `(first, count)` along `axis` of the packed tensor `name` (stored
/// in `format`; `last`: `axis` is its last) as floats: its packed values
/// read rounded out to whole groups along the last axis, dequantized
/// (affine ones in their scales' dtype, MXFP4's as float32, which holds
/// them exactly), then cut.
///
/// # Errors
/// A range past its end, or a failed read.
pub(super) fn dequantized_along(
    source: &dyn TensorSource,
    name: &str,
    (format, last): (PackedFormat, bool),
    axis: usize,
    (first, count): (usize, usize),
    s: &Stream,
) -> Result<Array> {
    let g = if last { format.group_size } else { 1 };
    let (a, b) = (first / g * g, (first + count).div_ceil(g) * g);
    let (packed, scales, biases) = source.read_packed_along(name, axis, &[(a, b - a)], s)?;
    let (group_size, bits) = format.ints();
    let values = dequantize_with_mode(
        &packed,
        &scales,
        biases.as_ref(),
        group_size,
        bits,
        format.mode,
        s,
    )?;
    let values = match format.mode {
        QuantizationMode::Affine => values,
        _ => values.as_dtype(Dtype::Float32, s)?,
    };
    crate::runtime::slice_axis(&values, axis, first - a, count, s)
}
