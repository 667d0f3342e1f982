//! An affine-quantized `[out, in]` weight stored as three tensors, the
//! packed `uint32` values, the `scales` and the `biases`, read in parts:
//! the layout of mlx-community directories (`stem.weight`, `stem.scales`,
//! `stem.biases`) and of quantized fields written by
//! [`save`](super::save) (`name`, `name.scales`, `name.biases`).

use std::path::Path;

use safemlx::ops::indexing::TryIndexOp;
use safemlx::{Array, Dtype, Stream};

use super::TensorInfo;
use crate::affine::AffineWeight;
use crate::error::{Error, Result};

/// Tensors read as they are stored, without dequantizing, and the
/// quantized weights among them: what [`affine_tensor_source!`] makes a
/// [`TensorSource`](super::TensorSource) of.
pub(super) trait Stored {
    /// The file or directory, for messages.
    fn location(&self) -> &Path;
    /// Whether `name` is stored.
    fn stored_contains(&self, name: &str) -> bool;
    /// The stored dtype and shape of `name`.
    fn stored_info(&self, name: &str) -> Result<&TensorInfo>;
    /// The whole of `name`, as stored.
    fn stored_read(&self, name: &str, s: &Stream) -> Result<Array>;
    /// Ranges along `axis` of `name`, as stored.
    fn stored_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array>;
    /// Columns of the 2-D `name`, as stored (an error naming it otherwise).
    fn stored_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array>;
    /// Tensor bytes read so far.
    fn stored_bytes_read(&self) -> u64;
    /// The quantized weight `name`, when it is one.
    fn affine(&self, name: &str) -> Option<Affine>;
    /// [`affine`](Self::affine) for a read of quantized values: an error
    /// naming the tensor when it is not one (or not readable as one).
    fn affine_to_read(&self, name: &str) -> Result<Affine>;

    /// Whether `name` is stored in a form read only as floats (FP8 with
    /// block scales).
    fn reads_as_floats(&self, name: &str) -> bool {
        let _ = name;
        false
    }
    /// Ranges along `axis` of such a tensor as floats; `None` for the
    /// others.
    fn floats_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Option<Result<Array>> {
        let _ = (name, axis, ranges, s);
        None
    }
    /// The stored shape of `name`.
    fn stored_shape(&self, name: &str) -> Result<Vec<i32>> {
        Ok(self.stored_info(name)?.shape.clone())
    }
    /// Rows of `name`, as stored.
    fn stored_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        self.stored_along(name, 0, ranges, s)
    }
}

/// `impl TensorSource for $t` where `$t: Stored`: a quantized weight
/// ([`Stored::affine`]) has its logical `[out, in]` shape, reads as floats
/// through `dequantize` and in quantized parts kept quantized; any other
/// tensor reads as stored.
macro_rules! affine_tensor_source {
    ($t:ty) => {
        impl $crate::checkpoint::TensorSource for $t {
            fn path(&self) -> &std::path::Path {
                $crate::checkpoint::affine::Stored::location(self)
            }
            fn contains(&self, name: &str) -> bool {
                self.stored_contains(name)
            }
            fn shape(&self, name: &str) -> $crate::error::Result<Vec<i32>> {
                let shape = self.stored_shape(name)?;
                match self.affine(name) {
                    // Stacked ([E, out, in]) ones read only packed.
                    Some(affine) if shape.len() >= 2 => affine.shape(self),
                    _ => Ok(shape),
                }
            }
            fn read(
                &self,
                name: &str,
                s: &safemlx::Stream,
            ) -> $crate::error::Result<safemlx::Array> {
                if self.reads_as_floats(name) {
                    let rows = self.stored_shape(name)?.first().copied().unwrap_or(0);
                    if let Some(read) = self.floats_along(name, 0, &[(0, rows as usize)], s) {
                        return read;
                    }
                }
                if self.affine(name).is_none() {
                    return self.stored_read(name, s);
                }
                // Through the trait: the types have raw reads of these names.
                let source: &dyn $crate::checkpoint::TensorSource = self;
                let rows = source.shape(name)?.first().copied().unwrap_or(0) as usize;
                source.read_rows(name, &[(0, rows)], s)
            }
            fn read_rows(
                &self,
                name: &str,
                ranges: &[(usize, usize)],
                s: &safemlx::Stream,
            ) -> $crate::error::Result<safemlx::Array> {
                if let Some(read) = self.floats_along(name, 0, ranges, s) {
                    return read;
                }
                if self.affine(name).is_none() {
                    return self.stored_rows(name, ranges, s);
                }
                self.affine_to_read(name)?
                    .rows(self, ranges, s)?
                    .dequantize(s)
            }
            fn read_columns(
                &self,
                name: &str,
                ranges: &[(usize, usize)],
                s: &safemlx::Stream,
            ) -> $crate::error::Result<safemlx::Array> {
                if let Some(read) = self.floats_along(name, 1, ranges, s) {
                    return read;
                }
                if self.affine(name).is_none() {
                    return self.stored_columns(name, ranges, s);
                }
                self.affine_to_read(name)?.float_columns(self, ranges, s)
            }
            fn read_along(
                &self,
                name: &str,
                axis: usize,
                ranges: &[(usize, usize)],
                s: &safemlx::Stream,
            ) -> $crate::error::Result<safemlx::Array> {
                let source: &dyn $crate::checkpoint::TensorSource = self;
                if let Some(read) = self.floats_along(name, axis, ranges, s) {
                    return read;
                }
                match (self.affine(name), axis) {
                    (None, _) => self.stored_along(name, axis, ranges, s),
                    (Some(_), 0) => source.read_rows(name, ranges, s),
                    (Some(_), _) => source.read_columns(name, ranges, s),
                }
            }
            fn bytes_read(&self) -> u64 {
                self.stored_bytes_read()
            }
            fn quantization(&self, name: &str) -> Option<(usize, usize)> {
                self.affine(name).map(|a| (a.group_size, a.bits))
            }
            fn stored_dtype(&self, name: &str) -> Option<safemlx::Dtype> {
                if self.reads_as_floats(name) {
                    return None;
                }
                match self.affine(name) {
                    Some(_) => None,
                    None => self.stored_info(name).ok().map(|i| i.dtype),
                }
            }
            fn read_quantized_rows(
                &self,
                name: &str,
                ranges: &[(usize, usize)],
                s: &safemlx::Stream,
            ) -> $crate::error::Result<$crate::affine::AffineWeight> {
                self.affine_to_read(name)?.rows(self, ranges, s)
            }
            fn read_quantized_groups(
                &self,
                name: &str,
                ranges: &[(usize, usize)],
                s: &safemlx::Stream,
            ) -> $crate::error::Result<$crate::affine::AffineWeight> {
                self.affine_to_read(name)?.groups(self, ranges, s)
            }
            fn read_packed_along(
                &self,
                name: &str,
                axis: usize,
                ranges: &[(usize, usize)],
                s: &safemlx::Stream,
            ) -> $crate::error::Result<[safemlx::Array; 3]> {
                self.affine_to_read(name)?.along(self, axis, ranges, s)
            }
        }
    };
}
pub(super) use affine_tensor_source;

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
    /// The logical (float) shape `[.., out, groups * group_size]`, from
    /// the scales.
    pub fn shape(&self, source: &dyn Stored) -> Result<Vec<i32>> {
        let mut shape = source.stored_shape(&self.scales)?;
        match shape.as_mut_slice() {
            [_, .., groups] => {
                let size = i32::try_from(self.group_size).unwrap_or(i32::MAX);
                *groups = groups.saturating_mul(size);
                Ok(shape)
            }
            other => Err(Error::Checkpoint {
                path: source.location().display().to_string(),
                message: format!(
                    "quantized weight `{}`: its scales `{}` have shape {other:?}, not [.., rows, groups]",
                    self.weight, self.scales
                ),
            }),
        }
    }

    /// Ranges along `axis` of a quantized tensor of any rank, kept packed:
    /// values, scales and biases. Along the last axis the ranges are in
    /// values, whole groups.
    pub fn along(
        &self,
        source: &dyn Stored,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<[Array; 3]> {
        let last = source.stored_shape(&self.scales)?.len().saturating_sub(1);
        let (g, words) = (self.group_size, self.group_size * self.bits / 32);
        let (values, groups): (Vec<_>, Vec<_>) = if axis < last {
            (ranges.to_vec(), ranges.to_vec())
        } else if let Some(&(first, count)) = ranges.iter().find(|(f, c)| f % g != 0 || c % g != 0)
        {
            return Err(Error::Checkpoint {
                path: source.location().display().to_string(),
                message: format!(
                    "quantized weight `{}`: values {first}..{} along its last axis are not whole groups of {g}",
                    self.weight,
                    first + count
                ),
            });
        } else {
            ranges
                .iter()
                .map(|&(f, c)| ((f / g * words, c / g * words), (f / g, c / g)))
                .unzip()
        };
        Ok([
            source.stored_along(&self.weight, axis, &values, s)?,
            source.stored_along(&self.scales, axis, &groups, s)?,
            source.stored_along(&self.biases, axis, &groups, s)?,
        ])
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
