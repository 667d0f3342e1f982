//! One safetensors file, read in parts.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use safemlx::{Array, Dtype, Stream};

use super::bytes::from_bytes;
use super::{format, io_error, open_regular, TensorInfo};
use crate::error::{Error, Result};

/// An open safetensors file: its header parsed and checked, its tensors
/// read on demand.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    file: File,
    data_start: u64,
    tensors: BTreeMap<String, TensorInfo>,
    bytes_read: AtomicU64,
}

impl SafetensorsFile {
    /// Opens `path` and reads its header (nothing else).
    ///
    /// # Errors
    /// A file that cannot be read, or whose header is not a valid
    /// safetensors header for a dtype this crate reads; the message names
    /// the file, the tensor and what is wrong.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let fail = |message: String| Error::Checkpoint {
            path: path.display().to_string(),
            message,
        };
        let (mut file, len) = open_regular(&path, "safetensors")?;
        if len < 8 {
            return Err(fail(format!(
                "{len} bytes is too short for a safetensors file (it starts with an 8-byte header length)"
            )));
        }
        let mut size = [0u8; 8];
        file.read_exact(&mut size)
            .map_err(|e| io_error(&path, "cannot read the header length", &e))?;
        let header_len = u64::from_le_bytes(size);
        if header_len > format::MAX_HEADER || header_len > len - 8 {
            return Err(fail(format!(
                "the header length is {header_len} bytes but the file has {} bytes after it (and headers are at most {} bytes); this is not a safetensors file",
                len - 8,
                format::MAX_HEADER
            )));
        }
        let mut header = vec![0u8; header_len as usize];
        file.read_exact(&mut header)
            .map_err(|e| io_error(&path, "cannot read the header", &e))?;
        let data_start = 8 + header_len;
        let tensors = format::parse(&header, len - data_start).map_err(fail)?;
        Ok(Self {
            path,
            file,
            data_start,
            tensors,
            bytes_read: AtomicU64::new(0),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensors' names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Whether the checkpoint has a tensor `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The dtype, shape and size of tensor `name`.
    ///
    /// # Errors
    /// No such tensor: the message lists the names the file has.
    pub fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors.get(name).ok_or_else(|| {
            let mut names: Vec<&str> = self.names().take(12).collect();
            if self.tensors.len() > names.len() {
                names.push("...");
            }
            self.error(format!(
                "has no tensor `{name}`; it has: {}",
                names.join(", ")
            ))
        })
    }

    /// Tensor data bytes read so far (headers not counted): what
    /// [`read`](Self::read) and [`read_along`](Self::read_along) cost.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    fn error(&self, message: String) -> Error {
        Error::Checkpoint {
            path: self.path.display().to_string(),
            message,
        }
    }

    /// The whole tensor `name`.
    ///
    /// # Errors
    /// No such tensor, or a read that fails.
    pub fn read(&self, name: &str, s: &Stream) -> Result<Array> {
        let info = self.info(name)?;
        let bytes = self.read_ranges(name, &[(info.begin, info.nbytes())])?;
        self.array(bytes, info.dtype, &info.shape, s)
    }

    /// Ranges `ranges` (`(first, count)`, in order) along `axis` of
    /// tensor `name`, concatenated along it, reading only their bytes: for
    /// each index before the axis, one read per range (merged where they
    /// touch). A row split is one read per range, a column split one per
    /// row and range, a fused QKV's part one per segment and row.
    ///
    /// # Errors
    /// No such tensor, no such axis, a range past the axis's end, or a
    /// read that fails; the message names the tensor.
    pub fn read_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array> {
        let info = self.info(name)?;
        let Some(&dim) = info.shape.get(axis) else {
            return Err(self.error(format!(
                "tensor `{name}` has shape {:?}; it has no axis {axis}",
                info.shape
            )));
        };
        let dims: Vec<u64> = info.shape.iter().map(|&d| d as u64).collect();
        let dim = dim as usize;
        let what = match axis {
            0 => "rows".to_owned(),
            1 => "columns".to_owned(),
            _ => format!("elements along axis {axis}"),
        };
        for &(first, count) in ranges {
            if first.checked_add(count).is_none_or(|end| end > dim) {
                return Err(self.error(format!(
                    "tensor `{name}` has {dim} {what}; {what} {first}..{} were asked for",
                    first.saturating_add(count)
                )));
            }
        }
        let outer: u64 = dims[..axis].iter().product();
        let inner: u64 = dims[axis + 1..].iter().product::<u64>() * info.item_size() as u64;
        let mut reads: Vec<(u64, u64)> = Vec::new();
        for o in 0..outer {
            for &(first, count) in ranges {
                let start = info.begin + (o * dim as u64 + first as u64) * inner;
                let bytes = count as u64 * inner;
                match reads.last_mut() {
                    Some((s0, n0)) if *s0 + *n0 == start => *n0 += bytes,
                    _ if bytes > 0 => reads.push((start, bytes)),
                    _ => {}
                }
            }
        }
        let bytes = self.read_ranges(name, &reads)?;
        let mut shape = info.shape.clone();
        shape[axis] = ranges.iter().map(|r| r.1 as i32).sum();
        self.array(bytes, info.dtype, &shape, s)
    }

    /// Rows `ranges` (`(first, count)` along axis 0, in order) of tensor
    /// `name`, concatenated: one contiguous read per range. What a layer
    /// reads of a `[out, in]` weight whose output rows it splits (heads,
    /// vocabulary rows, MLP rows), in whatever grouping it needs.
    ///
    /// # Errors
    /// No such tensor, a scalar, a range past the last row, or a read that
    /// fails; the message names the tensor.
    pub fn read_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        self.read_along(name, 0, ranges, s)
    }

    /// Columns `ranges` (`(first, count)` along axis 1, in order) of the
    /// 2-D tensor `name`, concatenated: one read per row and range. What a
    /// row-parallel layer reads of a `[out, in]` weight whose input columns
    /// it splits.
    ///
    /// # Errors
    /// No such tensor, a tensor that is not 2-D, a range past the last
    /// column, or a read that fails; the message names the tensor.
    pub fn read_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        let info = self.info(name)?;
        if info.shape.len() != 2 {
            return Err(self.error(format!(
                "tensor `{name}` has shape {:?}; reading columns needs a 2-D tensor",
                info.shape
            )));
        }
        self.read_along(name, 1, ranges, s)
    }

    /// The two values of the `uint32` `[2]` tensor `name`, from the
    /// file's bytes (no MLX array).
    pub(super) fn read_u32_pair(&self, name: &str) -> Result<[u32; 2]> {
        let info = self.info(name)?;
        if info.dtype != Dtype::Uint32 || info.shape != [2] {
            return Err(self.error(format!(
                "tensor `{name}` is {:?} {:?}; it should be uint32 [2]",
                info.dtype, info.shape
            )));
        }
        let bytes = self.read_ranges(name, &[(info.begin, 8)])?;
        let value =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        Ok([value(0), value(4)])
    }

    fn read_ranges(&self, name: &str, ranges: &[(u64, u64)]) -> Result<Vec<u8>> {
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        let mut bytes = vec![0u8; total as usize];
        let mut at = 0usize;
        for &(start, len) in ranges {
            // Positioned reads: no shared cursor, so threads may share a checkpoint.
            self.file
                .read_exact_at(&mut bytes[at..at + len as usize], self.data_start + start)
                .map_err(|e| self.error(format!("cannot read tensor `{name}`: {e}")))?;
            at += len as usize;
        }
        self.bytes_read.fetch_add(total, Ordering::Relaxed);
        Ok(bytes)
    }

    fn array(&self, bytes: Vec<u8>, dtype: Dtype, shape: &[i32], s: &Stream) -> Result<Array> {
        from_bytes(&bytes, dtype, shape, i32::MAX as usize, s)
    }
}
