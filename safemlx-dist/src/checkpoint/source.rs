//! Where a model's tensors come from: a safetensors file, a Hugging Face
//! directory, or a GGUF file read through llama.cpp's names, all behind
//! one trait that [`Weights`](super::Weights) reads through.

use std::path::Path;

use safemlx::{Array, Dtype, Stream};

use crate::affine::AffineWeight;
use crate::error::{Error, Result};
use crate::packing::PackedFormat;
use crate::runtime::slice_axis;

/// Tensors by name (Hugging Face names for models:
/// `model.layers.0.self_attn.q_proj.weight`, `[out, in]`), read in parts:
/// what [`Weights`](super::Weights) reads, so one model loads from every
/// format.
pub trait TensorSource: std::fmt::Debug {
    /// The file or directory, for messages.
    fn path(&self) -> &Path;
    /// Whether tensor `name` exists.
    fn contains(&self, name: &str) -> bool;
    /// The row-major shape of tensor `name`.
    ///
    /// # Errors
    /// No such tensor.
    fn shape(&self, name: &str) -> Result<Vec<i32>>;
    /// The whole tensor.
    ///
    /// # Errors
    /// No such tensor, or a failed read.
    fn read(&self, name: &str, s: &Stream) -> Result<Array>;
    /// Rows `(first, count)` along axis 0, concatenated (elements of a vector).
    ///
    /// # Errors
    /// No such tensor, rows past its end, or a failed read.
    fn read_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array>;
    /// Columns `(first, count)` of a 2-D tensor, concatenated.
    ///
    /// # Errors
    /// No such tensor, not 2-D, columns past its end, or a failed read.
    fn read_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array>;
    /// Ranges `(first, count)` along `axis`, concatenated along it: a
    /// sharded weight's part. The default reads rows and columns with
    /// [`read_rows`](Self::read_rows) and
    /// [`read_columns`](Self::read_columns), and other axes by reading the
    /// whole tensor.
    ///
    /// # Errors
    /// No such tensor, no such axis, ranges past its end, or a failed read.
    fn read_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array> {
        let rank = self.shape(name)?.len();
        match axis {
            0 => self.read_rows(name, ranges, s),
            1 if rank == 2 => self.read_columns(name, ranges, s),
            _ if axis >= rank => Err(Error::Checkpoint {
                path: self.path().display().to_string(),
                message: format!("tensor `{name}` has {rank} dimensions; it has no axis {axis}"),
            }),
            _ => {
                let full = self.read(name, s)?;
                let parts = ranges
                    .iter()
                    .map(|&(first, count)| slice_axis(&full, axis, first, count, s))
                    .collect::<Result<Vec<_>>>()?;
                Ok(safemlx::ops::concatenate_axis(&parts, axis as i32, s)?)
            }
        }
    }
    /// Tensor bytes read so far.
    fn bytes_read(&self) -> u64;
    /// The dtype the file says tensor `name` holds (a safetensors header's
    /// label), so that a float read can refuse bytes labelled as integers;
    /// `None` where the reads themselves give floats (a quantized tensor,
    /// GGUF's types).
    fn stored_dtype(&self, name: &str) -> Option<Dtype> {
        let _ = name;
        None
    }
    /// The name the file itself gives tensor `name` (GGUF's
    /// `blk.0.attn_q.weight` for `model.layers.0.self_attn.q_proj.weight`),
    /// for messages.
    fn stored_name(&self, name: &str) -> String {
        name.to_owned()
    }
    /// How tensor `name` is packed when it is stored quantized in a form
    /// that can stay quantized (MLX affine; GGUF `Q8_0`, `Q4_0`, `Q4_1`,
    /// `Q4_K`, `Q5_K`; MXFP4 stacked experts of an mlx-community gpt-oss);
    /// `None` for float tensors. [`read`](Self::read) and the other float
    /// reads dequantize an affine one.
    fn quantization(&self, name: &str) -> Option<PackedFormat> {
        let _ = name;
        None
    }
    /// Rows `(first, count)` (outputs) of the quantized `[out, in]` tensor
    /// `name`, kept quantized.
    ///
    /// # Errors
    /// No such tensor, one not stored quantized, rows past its end, or a
    /// failed read.
    fn read_quantized_rows(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        let _ = (ranges, s);
        Err(not_quantized(self.path(), name))
    }
    /// Groups `(first, count)` of every row (inputs, in whole groups) of
    /// the quantized `[out, in]` tensor `name`, kept quantized.
    ///
    /// # Errors
    /// No such tensor, one not stored quantized, groups past its end, or a
    /// failed read.
    fn read_quantized_groups(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        let _ = (ranges, s);
        Err(not_quantized(self.path(), name))
    }
    /// Ranges `(first, count)` along `axis` of the quantized tensor `name`
    /// of any rank (stacked experts `[E, out, in]`), kept packed: its
    /// `uint32` values, scales and (affine) biases, concatenated along
    /// `axis`.
    /// Ranges along the last axis are in values and must be whole groups.
    ///
    /// # Errors
    /// No such tensor, one not stored quantized, ranges past its end or
    /// cutting a group, or a failed read.
    fn read_packed_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<PackedParts> {
        let _ = (axis, ranges, s);
        Err(not_quantized(self.path(), name))
    }
}

/// A packed tensor's parts: `uint32` values, scales and, for affine
/// quantization, biases.
pub type PackedParts = (Array, Array, Option<Array>);

fn not_quantized(path: &Path, name: &str) -> Error {
    Error::Checkpoint {
        path: path.display().to_string(),
        message: format!("tensor `{name}` is not stored quantized; read it as floats"),
    }
}

/// A source whose quantized tensors are read as floats: what
/// `--dequantize` loads, to compare with the quantized model.
#[derive(Debug)]
pub struct Dequantized<'a>(pub &'a dyn TensorSource);

impl TensorSource for Dequantized<'_> {
    fn path(&self) -> &Path {
        self.0.path()
    }
    fn contains(&self, name: &str) -> bool {
        self.0.contains(name)
    }
    fn shape(&self, name: &str) -> Result<Vec<i32>> {
        self.0.shape(name)
    }
    fn read(&self, name: &str, s: &Stream) -> Result<Array> {
        self.0.read(name, s)
    }
    fn read_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        self.0.read_rows(name, ranges, s)
    }
    fn read_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        self.0.read_columns(name, ranges, s)
    }
    fn read_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array> {
        self.0.read_along(name, axis, ranges, s)
    }
    fn bytes_read(&self) -> u64 {
        self.0.bytes_read()
    }
    fn stored_name(&self, name: &str) -> String {
        self.0.stored_name(name)
    }
    fn stored_dtype(&self, name: &str) -> Option<Dtype> {
        self.0.stored_dtype(name)
    }
}

/// Column ranges of a tensor quantized in groups of `group_size` as group
/// ranges.
///
/// # Errors
/// A range that cuts a group, named with the tensor and the group size.
pub fn whole_groups(
    path: &Path,
    name: &str,
    ranges: &[(usize, usize)],
    group_size: usize,
) -> Result<Vec<(usize, usize)>> {
    ranges
        .iter()
        .map(|&(first, count)| {
            if first % group_size == 0 && count % group_size == 0 {
                Ok((first / group_size, count / group_size))
            } else {
                Err(Error::Checkpoint {
                    path: path.display().to_string(),
                    message: format!(
                        "tensor `{name}` is quantized in groups of {group_size} columns; columns {first}..{} cut a group (split it over ranks whose parts are whole groups: fewer ranks or another --tensor-split; or load it as floats: --weights float)",
                        first + count
                    ),
                })
            }
        })
        .collect()
}
