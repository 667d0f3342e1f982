//! Sharded checkpoints in the safetensors format.
//!
//! [`Checkpoint::open`] reads only the header. [`Checkpoint::read_shard`]
//! then reads, for one tensor, just the bytes of this rank's part: a row
//! split (`Sharded<0>`) is one contiguous range, a column split one range
//! per row, a fused QKV one range per segment and row. Every layer built
//! with `#[sharded]` gets a `from_checkpoint` that does this for each of
//! its fields; `gather_full` and [`save`] write a full checkpoint back.
//!
//! ```
//! use safemlx::{Array, Device, DeviceType, Stream};
//! use safemlx_dist::checkpoint::{save, Checkpoint};
//! use safemlx_dist::{init, Backend, Sharded};
//!
//! let s = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));
//! let path = std::env::temp_dir().join(format!("doc-{}.safetensors", std::process::id()));
//! let w = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
//! save(&path, &[("w", w)], &s)?;
//!
//! let group = init(false, Backend::Any)?; // one rank here: its part is all of it
//! let checkpoint = Checkpoint::open(&path)?;
//! assert_eq!(checkpoint.info("w")?.shape, [2, 3]);
//! let part = checkpoint.read_shard::<Sharded<1>, _>("w", &group, 1, &s)?;
//! assert_eq!(part.global_shape(), [2, 3]);
//! assert_eq!(checkpoint.bytes_read(), 24);
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), safemlx_dist::Error>(())
//! ```

mod format;
mod gguf;
mod hf;
mod source;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use safemlx::{Array, Dtype, Stream};

pub use format::TensorInfo;
pub use gguf::{dequantize, to_affine, GgmlType, GgufFile, GgufTensor, GgufValue};
pub use hf::HfDirectory;
pub use source::{whole_groups, Dequantized, GgufWeights, TensorSource};

use crate::error::{Error, Result};
use crate::typed::collective::slice_axis;
use crate::typed::weights::{shard_ranges, sharded_axis};
use crate::typed::{Collective, Placement, ShardedArray};

/// An open safetensors file: its header parsed and checked, its tensors
/// read on demand.
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    file: File,
    data_start: u64,
    tensors: BTreeMap<String, TensorInfo>,
    bytes_read: AtomicU64,
}

fn io_error(path: &Path, what: &str, e: &std::io::Error) -> Error {
    Error::Checkpoint {
        path: path.display().to_string(),
        message: format!("{what}: {e}"),
    }
}

/// What a non-regular file is, for the message.
fn file_kind(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "directory"
    } else if kind.is_fifo() {
        "FIFO"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_char_device() || kind.is_block_device() {
        "device"
    } else {
        "special file"
    }
}

/// Opens `path` for reading if it is a regular file (checked before
/// `open`: opening a FIFO blocks until a writer comes); returns the file
/// and its length. `format` names what was expected, for the message.
pub(crate) fn open_regular(path: &Path, format: &str) -> Result<(File, u64)> {
    let kind = std::fs::metadata(path).map_err(|e| io_error(path, "cannot open", &e))?;
    if !kind.is_file() {
        return Err(Error::Checkpoint {
            path: path.display().to_string(),
            message: format!(
                "is not a regular file (it is a {}); give a {format} file",
                file_kind(&kind.file_type())
            ),
        });
    }
    let file = File::open(path).map_err(|e| io_error(path, "cannot open", &e))?;
    let len = file
        .metadata()
        .map_err(|e| io_error(path, "cannot read its size", &e))?
        .len();
    Ok((file, len))
}

impl Checkpoint {
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
    /// [`read`](Self::read) and [`read_shard`](Self::read_shard) cost.
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

    /// This rank's part of tensor `name` laid out as placement `P` (with
    /// `segments` fused blocks along its sharded axis, 1 for a plain
    /// weight), reading only that part's bytes: the same array as
    /// [`shard_weight`](crate::typed::shard_weight) of the full tensor.
    ///
    /// # Errors
    /// No such tensor, a tensor without `P`'s axis, segments that do not
    /// divide evenly over the ranks, or a read that fails.
    pub fn read_shard<P: Placement, C: Collective>(
        &self,
        name: &str,
        comm: &C,
        segments: usize,
        s: &Stream,
    ) -> Result<ShardedArray<P, C>> {
        let info = self.info(name)?;
        let global = info.shape.clone();
        let Some(axis) = sharded_axis::<P>(name, &global)? else {
            let full = self.read(name, s)?;
            return ShardedArray::from_local(full, comm, &global);
        };
        let dims: Vec<u64> = global.iter().map(|&d| d as u64).collect();
        let outer: u64 = dims[..axis].iter().product();
        let inner: u64 = dims[axis + 1..].iter().product::<u64>() * info.item_size() as u64;
        let dim = dims[axis];
        let ranges = shard_ranges(
            name,
            axis,
            dim as usize,
            segments,
            (comm.rank(), comm.size()),
        )?;
        // For each index before the axis, each kept range along it.
        let mut reads: Vec<(u64, u64)> = Vec::new();
        for o in 0..outer {
            for &(offset, len) in &ranges {
                let start = info.begin + (o * dim + offset as u64) * inner;
                let bytes = len as u64 * inner;
                match reads.last_mut() {
                    Some((s0, n0)) if *s0 + *n0 == start => *n0 += bytes,
                    _ if bytes > 0 => reads.push((start, bytes)),
                    _ => {}
                }
            }
        }
        let bytes = self.read_ranges(name, &reads)?;
        let mut local = global.clone();
        local[axis] = ranges.iter().map(|r| r.1 as i32).sum();
        let array = self.array(bytes, info.dtype, &local, s)?;
        ShardedArray::from_local(array, comm, &global)
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
        let info = self.info(name)?;
        let Some(&rows) = info.shape.first() else {
            return Err(self.error(format!(
                "tensor `{name}` is a scalar; it has no rows to read"
            )));
        };
        let rows = rows as usize;
        let row_bytes =
            info.shape[1..].iter().map(|&d| d as u64).product::<u64>() * info.item_size() as u64;
        let mut reads = Vec::with_capacity(ranges.len());
        for &(first, count) in ranges {
            if first.checked_add(count).is_none_or(|end| end > rows) {
                return Err(self.error(format!(
                    "tensor `{name}` has {rows} rows; rows {first}..{} were asked for",
                    first.saturating_add(count)
                )));
            }
            if count > 0 {
                reads.push((
                    info.begin + first as u64 * row_bytes,
                    count as u64 * row_bytes,
                ));
            }
        }
        let bytes = self.read_ranges(name, &reads)?;
        let mut shape = info.shape.clone();
        shape[0] = ranges.iter().map(|r| r.1 as i32).sum();
        self.array(bytes, info.dtype, &shape, s)
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
        let &[rows, columns] = info.shape.as_slice() else {
            return Err(self.error(format!(
                "tensor `{name}` has shape {:?}; reading columns needs a 2-D tensor",
                info.shape
            )));
        };
        let (rows, columns) = (rows as u64, columns as usize);
        let item = info.item_size() as u64;
        for &(first, count) in ranges {
            if first.checked_add(count).is_none_or(|end| end > columns) {
                return Err(self.error(format!(
                    "tensor `{name}` has {columns} columns; columns {first}..{} were asked for",
                    first.saturating_add(count)
                )));
            }
        }
        let mut reads: Vec<(u64, u64)> = Vec::new();
        for row in 0..rows {
            for &(first, count) in ranges.iter().filter(|r| r.1 > 0) {
                let start = info.begin + (row * columns as u64 + first as u64) * item;
                let bytes = count as u64 * item;
                match reads.last_mut() {
                    Some((s0, n0)) if *s0 + *n0 == start => *n0 += bytes,
                    _ => reads.push((start, bytes)),
                }
            }
        }
        let bytes = self.read_ranges(name, &reads)?;
        let width: i32 = ranges.iter().map(|r| r.1 as i32).sum();
        self.array(bytes, info.dtype, &[rows as i32, width], s)
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

/// The array of `shape` and `dtype` whose row-major bytes are `bytes`.
///
/// The bytes travel as MLX arrays of `u8` viewed as `dtype`; an MLX
/// dimension is an `i32`, so a part larger than `max_piece` bytes is built
/// from pieces of whole rows (along axis 0), concatenated.
fn from_bytes(
    bytes: &[u8],
    dtype: Dtype,
    shape: &[i32],
    max_piece: usize,
    s: &Stream,
) -> Result<Array> {
    let piece = |bytes: &[u8], shape: &[i32]| -> Result<Array> {
        let len =
            i32::try_from(bytes.len()).map_err(|_| Error::ShapeOverflow { value: bytes.len() })?;
        Ok(Array::from_slice(bytes, &[len])
            .view_dtype(dtype, s)?
            .reshape(shape, s)?)
    };
    if bytes.len() <= max_piece || shape.is_empty() {
        return piece(bytes, shape);
    }
    let row_bytes =
        shape[1..].iter().map(|&d| d as usize).product::<usize>() * format::item_size(dtype);
    if row_bytes == 0 || row_bytes > max_piece {
        return Err(Error::ShapeOverflow { value: row_bytes });
    }
    let rows_per_piece = max_piece / row_bytes;
    let pieces = bytes
        .chunks(rows_per_piece * row_bytes)
        .map(|chunk| {
            let mut piece_shape = shape.to_vec();
            piece_shape[0] = (chunk.len() / row_bytes) as i32;
            piece(chunk, &piece_shape)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(safemlx::ops::concatenate_axis(&pieces, 0, s)?)
}

/// The row-major bytes of `array`, read back through MLX arrays of `u8` of
/// at most `max_piece` bytes each (an MLX dimension is an `i32`).
fn to_bytes(array: &Array, max_piece: usize, s: &Stream) -> Result<Vec<u8>> {
    let flat = array.contiguous(false, s)?.reshape(&[-1], s)?;
    let item = format::item_size(array.dtype());
    let per_piece = (max_piece / item).max(1);
    let len = flat.size();
    let mut bytes = Vec::with_capacity(len * item);
    // One piece at least, so that an empty array is read (as nothing) too.
    for start in (0..len.max(1)).step_by(per_piece) {
        let count = per_piece.min(len - start);
        let raw = slice_axis(&flat, 0, start, count, s)?.view_dtype(Dtype::Uint8, s)?;
        crate::eval(&[&raw])?;
        let read = raw
            .into_evaluated()?
            .try_to_vec::<u8>()
            .map_err(|e| Error::Shape(e.to_string()))?;
        bytes.extend_from_slice(&read);
    }
    Ok(bytes)
}

/// Writes `tensors` (name, array) to `path` as a safetensors file: to a
/// temporary file beside it first, then renamed, so a reader never sees a
/// half-written checkpoint. Call it on one rank (e.g. rank 0) with the
/// full weights from `gather_full`.
///
/// # Errors
/// An empty or repeated name, a dtype the format has no name for here
/// (the supported ones are listed), or a failed write.
pub fn save<N: AsRef<str>>(
    path: impl AsRef<Path>,
    tensors: &[(N, Array)],
    s: &Stream,
) -> Result<()> {
    let path = path.as_ref();
    let fail = |message: String| Error::Checkpoint {
        path: path.display().to_string(),
        message,
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut data = Vec::with_capacity(tensors.len());
    for (name, array) in tensors {
        let name = name.as_ref();
        if name.is_empty() || name == "__metadata__" || !seen.insert(name) {
            return Err(fail(format!(
                "cannot save a tensor named {name:?}: names must be non-empty, unique and not __metadata__"
            )));
        }
        if format::dtype_name(array.dtype()).is_none() {
            return Err(fail(format!(
                "cannot save tensor `{name}` of dtype {:?}; supported: BOOL, U8, U16, U32, U64, I8, I16, I32, I64, F16, BF16, F32",
                array.dtype()
            )));
        }
        let bytes = to_bytes(array, i32::MAX as usize, s).map_err(|e| match e {
            Error::Shape(message) => fail(message),
            other => other,
        })?;
        data.push((name, array.dtype(), array.shape().to_vec(), bytes));
    }
    let entries: Vec<(&str, Dtype, &[i32], u64)> = data
        .iter()
        .map(|(n, d, shape, b)| (*n, *d, shape.as_slice(), b.len() as u64))
        .collect();
    let header = format::header(&entries);
    let temporary = path.with_extension(format!("{}.partial", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut file = std::io::BufWriter::new(File::create(&temporary)?);
        file.write_all(&(header.len() as u64).to_le_bytes())?;
        file.write_all(&header)?;
        for (.., bytes) in &data {
            file.write_all(bytes)?;
        }
        file.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&temporary, path)
    };
    write().map_err(|e| {
        std::fs::remove_file(&temporary).ok();
        io_error(path, "cannot write", &e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use safemlx::{Device, DeviceType};

    #[test]
    fn large_tensors_are_read_and_written_in_pieces() {
        let s = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));
        let values: Vec<f32> = (0..15).map(|v| v as f32).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        // Rows of 3 floats (12 bytes); pieces of at most 25 bytes: 2 rows each.
        let array = from_bytes(&bytes, Dtype::Float32, &[5, 3], 25, &s).unwrap();
        assert_eq!(array.shape(), [5, 3]);
        let read = array.evaluated().unwrap().try_to_vec::<f32>().unwrap();
        assert_eq!(read, values);
        // And back, in pieces of at most 16 bytes (4 floats).
        let array = Array::from_slice(&values, &[5, 3]);
        assert_eq!(to_bytes(&array, 16, &s).unwrap(), bytes);
        assert_eq!(to_bytes(&array, 1 << 20, &s).unwrap(), bytes);
        // A row larger than a piece cannot be split.
        assert_eq!(
            from_bytes(&bytes, Dtype::Float32, &[5, 3], 8, &s).unwrap_err(),
            Error::ShapeOverflow { value: 12 }
        );
    }
}
