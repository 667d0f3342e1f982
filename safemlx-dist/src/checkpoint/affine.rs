//! An affine-quantized `[out, in]` weight stored as three tensors, the
//! packed `uint32` values, the `scales` and the `biases`, read in parts:
//! the layout of mlx-community directories (`stem.weight`, `stem.scales`,
//! `stem.biases`) and of quantized fields written by
//! [`save`](super::save) (`name`, `name.scales`, `name.biases`).

use std::path::Path;

use safemlx::ops::indexing::TryIndexOp;
use safemlx::{Array, Dtype, Stream};

use crate::error::{Error, Result};
use crate::quantized::AffineWeight;

/// Tensors read as they are stored, without dequantizing.
pub(super) trait Stored {
    /// The file or directory, for messages.
    fn location(&self) -> &Path;
    /// The stored shape of `name`.
    fn stored_shape(&self, name: &str) -> Result<Vec<i32>>;
    /// Rows of `name`, as stored.
    fn stored_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array>;
    /// Columns of the 2-D `name`, as stored.
    fn stored_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array>;
}

/// The three tensors of one quantized weight, and its quantization.
#[derive(Debug)]
pub(super) struct Affine {
    /// The packed values `[out, in * bits / 32]`, `uint32`.
    pub weight: String,
    /// `[out, in / group_size]`.
    pub scales: String,
    /// `[out, in / group_size]`.
    pub biases: String,
    pub group_size: usize,
    pub bits: usize,
}

impl Affine {
    /// The logical (float) shape `[out, groups * group_size]`, from the
    /// scales.
    pub fn shape(&self, source: &dyn Stored) -> Result<Vec<i32>> {
        let groups = source.stored_shape(&self.scales)?;
        match groups.as_slice() {
            &[rows, groups] => {
                let size = i32::try_from(self.group_size).unwrap_or(i32::MAX);
                Ok(vec![rows, groups.saturating_mul(size)])
            }
            other => Err(Error::Checkpoint {
                path: source.location().display().to_string(),
                message: format!(
                    "quantized weight `{}`: its scales `{}` have shape {other:?}, not [rows, groups]",
                    self.weight, self.scales
                ),
            }),
        }
    }

    /// Rows `ranges` (outputs), kept quantized.
    pub fn rows(
        &self,
        source: &dyn Stored,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        let weight = source.stored_rows(&self.weight, ranges, s)?;
        let scales = source.stored_rows(&self.scales, ranges, s)?;
        let biases = source.stored_rows(&self.biases, ranges, s)?;
        self.build(source, weight, scales, biases)
    }

    /// Groups `ranges` of every row (inputs, in whole groups), kept
    /// quantized.
    pub fn groups(
        &self,
        source: &dyn Stored,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        let words = self.group_size * self.bits / 32;
        let word_ranges: Vec<_> = ranges
            .iter()
            .map(|&(f, c)| (f * words, c * words))
            .collect();
        let weight = source.stored_columns(&self.weight, &word_ranges, s)?;
        let scales = source.stored_columns(&self.scales, ranges, s)?;
        let biases = source.stored_columns(&self.biases, ranges, s)?;
        self.build(source, weight, scales, biases)
    }

    /// Columns `ranges` (any, not only whole groups) as floats: the groups
    /// covering each range, dequantized, then its columns.
    pub fn float_columns(
        &self,
        source: &dyn Stored,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array> {
        let g = self.group_size;
        let mut pieces = Vec::with_capacity(ranges.len());
        for &(first, count) in ranges.iter().filter(|r| r.1 > 0) {
            let (a, b) = (first / g, (first + count).div_ceil(g));
            let values = self.groups(source, &[(a, b - a)], s)?.dequantize(s)?;
            let skip = (first - a * g) as i32;
            pieces.push(values.try_index_device((.., skip..skip + count as i32), s)?);
        }
        if pieces.is_empty() {
            let rows = self.shape(source)?.first().copied().unwrap_or(0);
            return Ok(safemlx::ops::zeros_dtype(&[rows, 0], Dtype::Float32, s)?);
        }
        Ok(safemlx::ops::concatenate_axis(&pieces, 1, s)?)
    }

    fn build(
        &self,
        source: &dyn Stored,
        weight: Array,
        scales: Array,
        biases: Array,
    ) -> Result<AffineWeight> {
        AffineWeight::new(weight, scales, biases, self.group_size, self.bits).map_err(|e| {
            Error::Checkpoint {
                path: source.location().display().to_string(),
                message: format!("quantized weight `{}`: {e}", self.weight),
            }
        })
    }
}
