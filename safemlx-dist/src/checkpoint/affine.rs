//! A quantized weight stored as MLX packs it, the packed `uint32` values,
//! the `scales` and (affine) the `biases`, read in parts: the layout of
//! mlx-community directories (`stem.weight`, `stem.scales`,
//! `stem.biases`; gpt-oss's stacked experts in `mxfp4` mode without
//! biases) and of quantized fields written by [`save`](super::save)
//! (`name`, `name.scales`, `name.biases`). Affine weights stay quantized;
//! MXFP4 ones stay packed in stacks of experts and are read as floats
//! elsewhere; a mode not read here is refused by name.

use std::path::Path;

use safemlx::ops::indexing::TryIndexOp;
use safemlx::ops::QuantizationMode;
use safemlx::{Array, Dtype, Stream};

use super::{PackedParts, TensorInfo};
use crate::affine::AffineWeight;
use crate::error::{Error, Result};
use crate::packing::PackedFormat;

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
    /// The quantized weight `name`, when it is one (in any mode).
    fn affine(&self, name: &str) -> Option<Affine>;
    /// [`affine`](Self::affine) for a read of quantized values: an error
    /// naming the tensor when it is not one.
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
                    // Stacked ([E, out, in]) ones read only packed; a mode
                    // not read here is refused by name at the first look.
                    Some(affine) if shape.len() >= 2 => {
                        affine.packed_only(self)?;
                        affine.shape(self)
                    }
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
                match self.affine(name) {
                    None => self.stored_rows(name, ranges, s),
                    Some(a) if a.is_in_another_mode(self)? => {
                        let source: &dyn $crate::checkpoint::TensorSource = self;
                        $crate::checkpoint::affine::floats_of(source, &a, self, (0, ranges), s)
                    }
                    Some(a) => a.affine_only(self)?.rows(self, ranges, s)?.dequantize(s),
                }
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
                match self.affine(name) {
                    None => self.stored_columns(name, ranges, s),
                    Some(a) if a.is_in_another_mode(self)? => {
                        let source: &dyn $crate::checkpoint::TensorSource = self;
                        $crate::checkpoint::affine::floats_of(source, &a, self, (1, ranges), s)
                    }
                    Some(a) => a.affine_only(self)?.float_columns(self, ranges, s),
                }
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
                    (Some(a), _) if a.is_in_another_mode(self)? => {
                        $crate::checkpoint::affine::floats_of(source, &a, self, (axis, ranges), s)
                    }
                    (Some(_), 0) => source.read_rows(name, ranges, s),
                    (Some(_), _) => source.read_columns(name, ranges, s),
                }
            }
            fn bytes_read(&self) -> u64 {
                self.stored_bytes_read()
            }
            fn quantization(&self, name: &str) -> Option<$crate::packing::PackedFormat> {
                // Another mode stays packed only in stacks of experts;
                // dense layers read it as floats.
                let affine = self.affine(name)?;
                let format = affine.format().ok()?;
                let stacked = self.stored_shape(&affine.scales).ok()?.len() > 2;
                (format.mode == safemlx::ops::QuantizationMode::Affine || stacked).then_some(format)
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
                self.affine_to_read(name)?
                    .affine_only(self)?
                    .rows(self, ranges, s)
            }
            fn read_quantized_groups(
                &self,
                name: &str,
                ranges: &[(usize, usize)],
                s: &safemlx::Stream,
            ) -> $crate::error::Result<$crate::affine::AffineWeight> {
                self.affine_to_read(name)?
                    .affine_only(self)?
                    .groups(self, ranges, s)
            }
            fn read_packed_along(
                &self,
                name: &str,
                axis: usize,
                ranges: &[(usize, usize)],
                s: &safemlx::Stream,
            ) -> $crate::error::Result<$crate::checkpoint::PackedParts> {
                self.affine_to_read(name)?.along(self, axis, ranges, s)
            }
        }
    };
}
pub(super) use affine_tensor_source;

/// Ranges along `axis` of the packed weight `a` in a mode other than
/// affine (gpt-oss's MXFP4 experts; a dense layer of an all-MXFP4
/// directory) as floats, side by side: what a float read of it gets (a
/// dense layer, `--weights float`, a dequantized fallback).
///
/// # Errors
/// A range past its end, or a failed read.
pub(super) fn floats_of(
    source: &dyn super::TensorSource,
    a: &Affine,
    stored: &dyn Stored,
    (axis, ranges): (usize, &[(usize, usize)]),
    s: &Stream,
) -> Result<Array> {
    let last = source.shape(&a.weight)?.len() == axis + 1;
    let format = a.packed_only(stored)?;
    let parts = ranges
        .iter()
        .map(|&r| super::stacked::dequantized_along(source, &a.weight, (format, last), axis, r, s))
        .collect::<Result<Vec<_>>>()?;
    match parts.as_slice() {
        [one] => Ok(one.clone()),
        _ => Ok(safemlx::ops::concatenate_axis(&parts, axis as i32, s)?),
    }
}

/// The tensors of one quantized weight, and its quantization.
#[derive(Debug)]
pub(super) struct Affine {
    /// The packed values `[out, in * bits / 32]`, `uint32`.
    pub weight: String,
    /// `[out, in / group_size]`.
    pub scales: String,
    /// `[out, in / group_size]`, for affine quantization.
    pub biases: Option<String>,
    pub group_size: usize,
    pub bits: usize,
    /// MLX's mode as the checkpoint names it (`affine` when it names
    /// none).
    pub mode: String,
}

impl Affine {
    /// How it is packed, when this crate reads that (see
    /// [`PackedFormat::from_mode`]).
    pub fn format(&self) -> std::result::Result<PackedFormat, String> {
        PackedFormat::from_mode(&self.mode, self.group_size, self.bits)
    }

    /// Itself, for a read that dequantizes or keeps an affine weight (a
    /// dense layer's): an error naming the tensor in another mode, or
    /// without its biases.
    pub fn affine_only(self, source: &dyn Stored) -> Result<Self> {
        let why = match self.format() {
            Ok(f) if f.mode == QuantizationMode::Affine && self.biases.is_some() => return Ok(self),
            Ok(f) if f.mode == QuantizationMode::Affine => return Err(self.affine_only_error(source)),
            Ok(_) => format!(
                "is quantized in mode `{}`, which a layer reads as floats or, in stacks of experts, packed; a quantized read takes `affine`",
                self.mode
            ),
            Err(why) => format!("is quantized in {why}"),
        };
        Err(Error::Checkpoint {
            path: source.location().display().to_string(),
            message: format!("tensor `{}` {why}", self.weight),
        })
    }

    /// Whether it is packed in a mode other than affine (read as floats
    /// through its packed parts: [`floats_of`]).
    ///
    /// # Errors
    /// A mode not read here, named.
    pub fn is_in_another_mode(&self, source: &dyn Stored) -> Result<bool> {
        Ok(self.packed_only(source)?.mode != QuantizationMode::Affine)
    }

    /// Itself, for a read of its packed parts: an error naming the
    /// tensor in a mode this crate does not read.
    pub fn packed_only(&self, source: &dyn Stored) -> Result<PackedFormat> {
        self.format().map_err(|why| Error::Checkpoint {
            path: source.location().display().to_string(),
            message: format!("tensor `{}` is quantized in {why}", self.weight),
        })
    }

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
    /// values, scales and (affine) biases. Along the last axis the ranges
    /// are in values, whole groups.
    pub fn along(
        &self,
        source: &dyn Stored,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<PackedParts> {
        let format = self.packed_only(source)?;
        let affine = format.mode == QuantizationMode::Affine;
        let biases = match (&self.biases, affine) {
            (Some(b), true) => Some(b),
            (None, false) => None,
            _ => return Err(self.affine_only_error(source)),
        };
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
        Ok((
            source.stored_along(&self.weight, axis, &values, s)?,
            source.stored_along(&self.scales, axis, &groups, s)?,
            biases
                .map(|b| source.stored_along(b, axis, &groups, s))
                .transpose()?,
        ))
    }

    /// Why an affine weight without biases, or another mode's with them,
    /// is not read.
    fn affine_only_error(&self, source: &dyn Stored) -> Error {
        let tensors = match &self.biases {
            Some(b) => format!("biases `{b}`, which mode `{}` has not", self.mode),
            None => format!("no biases, which mode `{}` needs", self.mode),
        };
        Error::Checkpoint {
            path: source.location().display().to_string(),
            message: format!("quantized weight `{}` has {tensors}", self.weight),
        }
    }

    /// The biases' name (an affine weight's, after [`affine_only`](Self::affine_only)).
    fn biases_name(&self) -> &str {
        self.biases.as_deref().unwrap_or_default()
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
        let biases = source.stored_rows(self.biases_name(), ranges, s)?;
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
        let biases = source.stored_columns(self.biases_name(), ranges, s)?;
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
