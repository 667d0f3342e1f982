//! Floats of stacked tensors of any rank (experts `[E, out, in]`, per-head
//! matrices `[H, a, b]`) read in parts, quantized or not: what a layer
//! that holds such a tensor as floats reads.

use safemlx::ops::{dequantize_with_mode, QuantizationMode};
use safemlx::{Array, Stream};

use super::Weights;
use crate::error::Result;
use crate::typed::Collective;

impl<C: Collective> Weights<'_, C> {
    /// Range `(first, count)` along `axis` of tensor `name` of logical
    /// shape `shape` as floats: as stored (in the dtype the source gives,
    /// which a model's [`OneDtype`](super::OneDtype) makes its own), or,
    /// when it is affine quantized, its packed values dequantized in their
    /// scales' dtype (rounded out to whole groups along the last axis,
    /// then cut).
    ///
    /// # Errors
    /// Another shape, a quantization mode other than affine, a range past
    /// its end, or a failed read.
    pub fn floats_along(
        &self,
        name: &str,
        shape: &[usize],
        axis: usize,
        (first, count): (usize, usize),
        s: &Stream,
    ) -> Result<Array> {
        let Some((group_size, bits)) = self.quantization(name) else {
            return self.along((name, false), shape, axis, &[(first, count)], s);
        };
        let g = if axis + 1 == shape.len() {
            group_size
        } else {
            1
        };
        let (a, b) = (first / g * g, (first + count).div_ceil(g) * g);
        let [packed, scales, biases] = self.packed_along(name, shape, axis, &[(a, b - a)], s)?;
        let values = dequantize_with_mode(
            &packed,
            &scales,
            Some(&biases),
            group_size as i32,
            bits as i32,
            QuantizationMode::Affine,
            s,
        )?;
        crate::runtime::slice_axis(&values, axis, first - a, count, s)
    }
}
