//! One computation dtype for a model whose file mixes float widths.
//!
//! Checkpoints keep some small tensors in float32 beside bfloat16 or
//! float16 weights: gpt-oss's attention sinks, biases, norms, routing
//! correction biases. Computing with both fails in native code
//! (`[scaled_dot_product_attention] Type of sinks must promote to output
//! type bfloat16`) or promotes whole activations to float32. The model
//! computes in its embedding's dtype; [`OneDtype`] reads every float32
//! tensor of such a file in that dtype.

use std::path::Path;

use safemlx::{Array, Dtype, Stream};

use super::source::TensorSource;
use crate::affine::AffineWeight;
use crate::error::Result;

/// `source` with its float32 tensors read as `dtype`, a 16-bit float.
#[derive(Debug)]
pub struct OneDtype<'a> {
    source: &'a dyn TensorSource,
    dtype: Dtype,
}

/// The tensors that say a model's computation dtype, in order: the
/// embedding's weight (float), or its scales (quantized).
const SAYS_DTYPE: [&str; 2] = ["model.embed_tokens.weight", "model.embed_tokens.scales"];

impl<'a> OneDtype<'a> {
    /// `source` read in its embedding's 16-bit float dtype; `None` when
    /// the embedding is float32 or the file does not say (nothing to cast).
    pub fn of(source: &'a dyn TensorSource) -> Option<Self> {
        let dtype = SAYS_DTYPE
            .iter()
            .filter_map(|name| source.stored_dtype(name))
            .find(Dtype::is_float)?;
        matches!(dtype, Dtype::Bfloat16 | Dtype::Float16).then_some(Self { source, dtype })
    }

    /// `one` where there is one, else `source` as it is.
    pub fn or<'b>(one: &'b Option<Self>, source: &'b dyn TensorSource) -> &'b dyn TensorSource
    where
        'a: 'b,
    {
        match one {
            Some(one) => one,
            None => source,
        }
    }

    /// The dtype it reads float32 tensors in.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn cast(&self, array: Array, s: &Stream) -> Result<Array> {
        if array.dtype() == Dtype::Float32 {
            Ok(array.as_dtype(self.dtype, s)?)
        } else {
            Ok(array)
        }
    }
}

impl TensorSource for OneDtype<'_> {
    fn path(&self) -> &Path {
        self.source.path()
    }
    fn contains(&self, name: &str) -> bool {
        self.source.contains(name)
    }
    fn shape(&self, name: &str) -> Result<Vec<i32>> {
        self.source.shape(name)
    }
    fn read(&self, name: &str, s: &Stream) -> Result<Array> {
        self.cast(self.source.read(name, s)?, s)
    }
    fn read_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        self.cast(self.source.read_rows(name, ranges, s)?, s)
    }
    fn read_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        self.cast(self.source.read_columns(name, ranges, s)?, s)
    }
    fn read_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array> {
        self.cast(self.source.read_along(name, axis, ranges, s)?, s)
    }
    fn bytes_read(&self) -> u64 {
        self.source.bytes_read()
    }
    fn stored_dtype(&self, name: &str) -> Option<Dtype> {
        self.source.stored_dtype(name)
    }
    fn stored_name(&self, name: &str) -> String {
        self.source.stored_name(name)
    }
    fn quantization(&self, name: &str) -> Option<crate::packing::PackedFormat> {
        self.source.quantization(name)
    }
    fn read_quantized_rows(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        self.source.read_quantized_rows(name, ranges, s)
    }
    fn read_quantized_groups(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        self.source.read_quantized_groups(name, ranges, s)
    }
    // Packed values, scales and biases as stored: mlx-lm multiplies them so.
    fn read_packed_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<super::PackedParts> {
        self.source.read_packed_along(name, axis, ranges, s)
    }
}
