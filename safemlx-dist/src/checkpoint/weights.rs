//! One way to read a layer's weights: a [`TensorSource`] scoped by prefix,
//! for one rank of a group.
//!
//! Every layer loads through [`Weights`]: `w.pp("self_attn")` scopes it,
//! `w.get::<Sharded<0>>("q_proj.weight", &[rows, cols], s)` checks the
//! tensor's shape against the configuration (the one shape check, for
//! every format) and reads only this rank's part. Safetensors files,
//! Hugging Face directories and GGUF files are all sources; a model family
//! maps its checkpoint's names in its own file.
//!
//! ```
//! use safemlx::{Array, Device, DeviceType, Stream};
//! use safemlx_dist::checkpoint::{save, SafetensorsFile, Weights};
//! use safemlx_dist::{init, Backend, Sharded};
//!
//! let s = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));
//! let path = std::env::temp_dir().join(format!("doc-weights-{}.safetensors", std::process::id()));
//! let w = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
//! save(&path, &[("mlp.up.weight", w)], &s)?;
//!
//! let group = init(false, Backend::Any)?; // one rank here: its part is all of it
//! let checkpoint = SafetensorsFile::open(&path)?;
//! let weights = Weights::new(&checkpoint, &group);
//! let up = weights.pp("mlp").get::<Sharded<1>>("up.weight", &[2, 3], &s)?;
//! assert_eq!(up.global_shape(), [2, 3]);
//! let wrong = weights.pp("mlp").get::<Sharded<1>>("up.weight", &[3, 3], &s).unwrap_err();
//! assert!(wrong.to_string().ends_with(
//!     "tensor `mlp.up.weight` has shape [2, 3] but the configuration gives [3, 3]"
//! ));
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), safemlx_dist::Error>(())
//! ```

use safemlx::{Array, Stream};

use super::TensorSource;
use crate::affine::AffineWeight;
use crate::error::{Error, Result};
use crate::runtime::Group;
use crate::typed::weights::{shard_ranges, sharded_axis};
use crate::typed::{
    quantized_part, Collective, Placement, QuantizedArray, QuantizedPlacement, ShardedArray,
};

/// A tensor source seen from one rank of `C`, under a name prefix.
#[derive(Clone)]
pub struct Weights<'a, C: Collective = Group> {
    source: &'a dyn TensorSource,
    comm: C,
    prefix: String,
    /// Each rank's weight for the heads and hidden columns it takes
    /// ([`with_shares`](Self::with_shares)); `None`: the chunk rule.
    shares: Option<std::sync::Arc<[u32]>>,
}

impl<C: Collective> std::fmt::Debug for Weights<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weights")
            .field("source", &self.source.path())
            .field("prefix", &self.prefix)
            .field("rank", &self.comm.rank())
            .field("size", &self.comm.size())
            .finish()
    }
}

impl<'a, C: Collective> Weights<'a, C> {
    /// The tensors of `source` as rank `comm.rank()` of `comm.size()`
    /// reads them, with no prefix.
    pub fn new(source: &'a dyn TensorSource, comm: &C) -> Self {
        Self {
            source,
            comm: comm.clone(),
            prefix: String::new(),
            shares: None,
        }
    }

    /// The same weights, the ranks taking attention heads, hidden columns
    /// and experts (or, with every expert sliced, their hidden columns) in
    /// proportion to `shares` (one positive weight per rank of the group,
    /// `--tensor-split 3:1`) instead of by the chunk rule. The vocabulary
    /// keeps the chunk rule, and so do layers loaded through
    /// `#[sharded]`'s `load_fields`.
    ///
    /// # Errors
    /// Another number of weights than ranks, or a zero weight, named with
    /// the fix.
    pub fn with_shares(mut self, shares: &[u32]) -> Result<Self> {
        let text: Vec<String> = shares.iter().map(u32::to_string).collect();
        let text = text.join(":");
        let n = self.comm.size();
        if shares.len() != n {
            return Err(Error::Setting(format!(
                "--tensor-split {text} has {} parts for {n} tensor-parallel ranks; give one weight per rank",
                shares.len()
            )));
        }
        if let Some(k) = shares.iter().position(|w| *w == 0) {
            return Err(Error::Setting(format!(
                "--tensor-split {text}: part {} is 0; every rank needs a positive weight",
                k + 1
            )));
        }
        self.shares = Some(shares.into());
        Ok(self)
    }

    /// Every rank's length of a dimension of `len` heads, columns or
    /// experts: in proportion to the shares when given, else by the chunk
    /// rule.
    pub fn lengths(&self, len: usize) -> Vec<usize> {
        match &self.shares {
            Some(shares) => crate::typed::weighted_lengths(len, shares),
            None => crate::typed::chunk_lengths(len, self.comm.size()),
        }
    }

    /// Every rank's length of a dimension of `len` values split in whole
    /// `unit`s (quantization groups, MXFP4 blocks; `len` a multiple of
    /// `unit`), as [`lengths`](Self::lengths) splits the units.
    pub fn lengths_in(&self, len: usize, unit: usize) -> Vec<usize> {
        self.lengths(len / unit).iter().map(|u| u * unit).collect()
    }

    /// The same source under `prefix` + `part` + `.` (a trailing `.` on
    /// `part` is ignored; an empty `part` changes nothing).
    pub fn pp(&self, part: &str) -> Self {
        let part = part.strip_suffix('.').unwrap_or(part);
        let prefix = if part.is_empty() {
            self.prefix.clone()
        } else {
            format!("{}{part}.", self.prefix)
        };
        Self {
            source: self.source,
            comm: self.comm.clone(),
            prefix,
            shares: self.shares.clone(),
        }
    }

    /// The prefix, with its trailing `.` (empty at the top).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The full name of `name` under the prefix.
    pub fn name(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The group the weights are laid out over.
    pub fn comm(&self) -> &C {
        &self.comm
    }

    /// The source.
    pub fn source(&self) -> &'a dyn TensorSource {
        self.source
    }

    /// Whether tensor `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        self.source.contains(&self.name(name))
    }

    /// The logical shape of tensor `name` as the source stores it (a
    /// quantized `[out, in]` weight: its float shape).
    ///
    /// # Errors
    /// No such tensor.
    pub fn shape(&self, name: &str) -> Result<Vec<usize>> {
        let shape = self.source.shape(&self.name(name))?;
        Ok(shape
            .iter()
            .map(|&d| usize::try_from(d).unwrap_or(0))
            .collect())
    }

    /// Checks that tensor `name` has the shape the configuration gives:
    /// the one shape check every layer's loading goes through.
    ///
    /// # Errors
    /// No such tensor, or another shape; the message names the tensor as
    /// the file names it, its shape and the expected one.
    pub fn check(&self, name: &str, want: &[usize]) -> Result<()> {
        let full = self.name(name);
        let shape = self.source.shape(&full)?;
        let same = shape.len() == want.len()
            && shape
                .iter()
                .zip(want)
                .all(|(&got, &w)| usize::try_from(got).ok() == Some(w));
        if same {
            return Ok(());
        }
        Err(Error::Model {
            path: self.source.path().display().to_string(),
            message: format!(
                "tensor {} has shape {shape:?} but the configuration gives {want:?}",
                self.named(&full)
            ),
        })
    }

    /// The tensor `full` as its file names it, with its model name beside
    /// it when they differ.
    pub(crate) fn named(&self, full: &str) -> String {
        let stored = self.source.stored_name(full);
        if stored == full {
            format!("`{full}`")
        } else {
            format!("`{stored}` ({full})")
        }
    }

    /// Checks that tensor `name`, read as float weights, is stored as
    /// floats: a header that labels float bytes `I32` would otherwise turn
    /// them into other numbers.
    ///
    /// # Errors
    /// An integer or boolean dtype, named with the tensor.
    fn float(&self, name: &str) -> Result<()> {
        let full = self.name(name);
        match self.source.stored_dtype(&full) {
            Some(dtype) if !dtype.is_float() => Err(Error::Model {
                path: self.source.path().display().to_string(),
                message: format!(
                    "tensor {} is stored as {} but is read as float weights: a weight is F32, F16 or BF16 (U32 only for a quantized weight beside its scales and biases)",
                    self.named(&full),
                    super::format::dtype_name(dtype).unwrap_or("an integer type")
                ),
            }),
            _ => Ok(()),
        }
    }

    /// This rank's part of tensor `name` of shape `shape`, laid out as `P`
    /// by the chunk rule: only that part is read.
    ///
    /// # Errors
    /// Another shape (see [`check`](Self::check)), a tensor without `P`'s
    /// axis, or a failed read.
    pub fn get<P: Placement>(
        &self,
        name: &str,
        shape: &[usize],
        s: &Stream,
    ) -> Result<ShardedArray<P, C>> {
        self.get_fused(name, Some(shape), 1, s)
    }

    /// As [`get`](Self::get), for a weight holding `segments` fused blocks
    /// along `P`'s axis (a fused QKV: 3), each split over the ranks; with
    /// `shape` `None` the stored shape is taken as it is.
    ///
    /// # Errors
    /// Those of [`get`](Self::get), and segments that do not divide evenly
    /// over the ranks.
    pub fn get_fused<P: Placement>(
        &self,
        name: &str,
        shape: Option<&[usize]>,
        segments: usize,
        s: &Stream,
    ) -> Result<ShardedArray<P, C>> {
        if let Some(shape) = shape {
            self.check(name, shape)?;
        }
        self.float(name)?;
        let full = self.name(name);
        let global = self.source.shape(&full)?;
        let Some(axis) = sharded_axis::<P>(&full, &global)? else {
            let local = self.source.read(&full, s)?;
            return ShardedArray::from_local(local, &self.comm, &global);
        };
        let dim = usize::try_from(global[axis]).unwrap_or(0);
        let (rank, n) = (self.comm.rank(), self.comm.size());
        let ranges = shard_ranges(&full, axis, dim, segments, (rank, n))?;
        let local = self.source.read_along(&full, axis, &ranges, s)?;
        ShardedArray::from_local(local, &self.comm, &global)
    }

    /// The whole tensor `name` of shape `shape`, on every rank.
    ///
    /// # Errors
    /// Another shape, or a failed read.
    pub fn full(&self, name: &str, shape: &[usize], s: &Stream) -> Result<Array> {
        self.check(name, shape)?;
        self.float(name)?;
        self.source.read(&self.name(name), s)
    }

    /// Rows `ranges` (`(first, count)` along axis 0) of tensor `name` of
    /// shape `shape`, concatenated: a split the chunk rule does not give
    /// (heads that follow their KV head, whole quantization groups).
    ///
    /// # Errors
    /// Another shape, rows past the end, or a failed read.
    pub fn rows(
        &self,
        name: &str,
        shape: &[usize],
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array> {
        self.check(name, shape)?;
        self.float(name)?;
        self.source.read_rows(&self.name(name), ranges, s)
    }

    /// Ranges `ranges` along `axis` of tensor `name` of shape `shape`,
    /// concatenated: floats, or with `bytes`, a `uint8` tensor read as
    /// stored (packed values such as MXFP4's blocks and scales).
    ///
    /// # Errors
    /// Another shape or dtype (named), ranges past the end, or a failed
    /// read.
    pub fn along(
        &self,
        (name, bytes): (&str, bool),
        shape: &[usize],
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array> {
        self.check(name, shape)?;
        let full = self.name(name);
        if !bytes {
            self.float(name)?;
            return self.source.read_along(&full, axis, ranges, s);
        }
        let dtype = self.source.stored_dtype(&full);
        if dtype != Some(safemlx::Dtype::Uint8) {
            return Err(Error::Model {
                path: self.source.path().display().to_string(),
                message: format!(
                    "tensor {} is stored as {}; packed values are U8",
                    self.named(&full),
                    dtype
                        .and_then(super::format::dtype_name)
                        .unwrap_or("another type")
                ),
            });
        }
        self.source.read_along(&full, axis, ranges, s)
    }

    /// Columns `ranges` of the 2-D tensor `name` of shape `shape`.
    ///
    /// # Errors
    /// Another shape, columns past the end, or a failed read.
    pub fn columns(
        &self,
        name: &str,
        shape: &[usize],
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array> {
        self.check(name, shape)?;
        self.float(name)?;
        self.source.read_columns(&self.name(name), ranges, s)
    }

    /// `(group_size, bits)` when tensor `name` is stored quantized in a
    /// form that stays quantized; `None` for floats (see
    /// [`TensorSource::quantization`]).
    pub fn quantization(&self, name: &str) -> Option<crate::packing::PackedFormat> {
        self.source.quantization(&self.name(name))
    }

    /// Rows `ranges` of the quantized `[out, in]` tensor `name`, kept
    /// quantized.
    ///
    /// # Errors
    /// Another shape, a tensor not stored quantized, or a failed read.
    pub fn quantized_rows(
        &self,
        name: &str,
        shape: [usize; 2],
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        self.check(name, &shape)?;
        self.source.read_quantized_rows(&self.name(name), ranges, s)
    }

    /// Groups `ranges` of every row of the quantized `[out, in]` tensor
    /// `name`, kept quantized.
    ///
    /// # Errors
    /// Another shape, a tensor not stored quantized, or a failed read.
    pub fn quantized_groups(
        &self,
        name: &str,
        shape: [usize; 2],
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        self.check(name, &shape)?;
        self.source
            .read_quantized_groups(&self.name(name), ranges, s)
    }

    /// This rank's part of the quantized `[out, in]` tensor `name` laid
    /// out as `Q` (rows by the chunk rule, or every row's groups by the
    /// chunk rule over groups); with `shape` `None` the stored shape is
    /// taken as it is.
    ///
    /// # Errors
    /// Another shape, a tensor that is not 2-D or not stored quantized, or
    /// a failed read.
    pub fn quantized<Q: QuantizedPlacement>(
        &self,
        name: &str,
        shape: Option<[usize; 2]>,
        s: &Stream,
    ) -> Result<QuantizedArray<Q, C>> {
        let full = self.name(name);
        let Some(crate::packing::PackedFormat { group_size, .. }) = self.source.quantization(&full)
        else {
            return Err(Error::Checkpoint {
                path: self.source.path().display().to_string(),
                message: format!("tensor `{full}` is not stored quantized; read it as floats"),
            });
        };
        let global = match (shape, self.shape(name)?.as_slice()) {
            (Some(want), _) => {
                self.check(name, &want)?;
                want
            }
            (None, &[rows, columns]) => [rows, columns],
            (None, other) => {
                return Err(Error::Checkpoint {
                    path: self.source.path().display().to_string(),
                    message: format!(
                        "tensor `{full}` has shape {other:?}; a quantized weight is 2-D"
                    ),
                })
            }
        };
        let (rank, n) = (self.comm.rank(), self.comm.size());
        let local = match quantized_part::<Q>(global, group_size, (rank, n)) {
            Some(range) if Q::AXIS == Some(0) => {
                self.source.read_quantized_rows(&full, &[range], s)?
            }
            Some(range) => self.source.read_quantized_groups(&full, &[range], s)?,
            None => self
                .source
                .read_quantized_rows(&full, &[(0, global[0])], s)?,
        };
        QuantizedArray::from_local(local, &self.comm, global)
    }

    /// Ranges along `axis` of the quantized tensor `name` of logical
    /// shape `shape` (stacked experts `[E, out, in]`), kept packed: values,
    /// scales and biases (see [`TensorSource::read_packed_along`]).
    ///
    /// # Errors
    /// Another shape, a tensor not stored quantized, ranges that cut a
    /// group, or a failed read.
    pub fn packed_along(
        &self,
        name: &str,
        shape: &[usize],
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<super::PackedParts> {
        self.check(name, shape)?;
        self.source
            .read_packed_along(&self.name(name), axis, ranges, s)
    }

    /// This rank's part of `len` experts, heads or columns: `(first,
    /// count)` of [`lengths`](Self::lengths).
    pub fn chunk(&self, len: usize) -> (usize, usize) {
        crate::typed::split_part(&self.lengths(len), self.comm.rank())
    }
}
