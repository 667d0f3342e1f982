//! GGUF (version 3) files, as llama.cpp writes them.
//!
//! Layout: `GGUF`, version `u32`, tensor count `u64`, metadata count `u64`;
//! the metadata (key string, type `u32`, value); the tensor table (name,
//! dimension count `u32`, dimensions `u64` innermost first, type `u32`,
//! offset `u64`); then, from the next multiple of `general.alignment` (32
//! by default), the tensors' data at their offsets. Strings are a `u64`
//! length and UTF-8 bytes; everything is little-endian.
//!
//! Tensors of type F32, F16, BF16, Q8_0, Q4_0, Q4_1, the K-quants Q2_K to
//! Q6_K and MXFP4 are read, quantized ones dequantized to `float32` on
//! load (Q8_0, Q4_0, Q4_1 blocks of 32 values: Q8_0 is an f16 scale and 32
//! `i8`; Q4_0 an f16 scale and 16 bytes of 4-bit values offset by 8; Q4_1
//! an f16 scale, an f16 minimum and 16 bytes; value `j` of a block is the
//! low nibble of byte `j`, value `j + 16` its high one; the K-quants'
//! super-blocks of 256 are in `kquants.rs`) or kept in MLX's affine form
//! (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K). Only the rows (or the blocks of the
//! columns) a rank asks for are read.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufReader;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use safemlx::{Array, Stream};

use super::ggml::{dequantize, to_affine, GgmlType};
use super::gguf_header::{tensor_info, GgufTensor, GgufValue, Header};
use crate::affine::AffineWeight;
use crate::error::{Error, Result};

/// An open GGUF file: metadata and tensor table parsed and checked, tensors
/// read on demand.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    file: File,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: BTreeMap<String, GgufTensor>,
    data_start: u64,
    bytes_read: AtomicU64,
}

impl GgufFile {
    /// Opens `path` and parses its metadata and tensor table.
    ///
    /// # Errors
    /// Not a GGUF file, a version other than 2 or 3, a truncated or damaged
    /// header, a tensor of a type not read here (named with its type), a
    /// tensor whose data lies outside the file or overlaps another; the
    /// message names the file and the tensor.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let fail = |message: String| Error::Checkpoint {
            path: path.display().to_string(),
            message,
        };
        let (file, len) = super::open_regular(&path, "GGUF")?;
        let mut h = Header {
            reader: BufReader::new(
                file.try_clone()
                    .map_err(|e| fail(format!("cannot open: {e}")))?,
            ),
            at: 0,
            len,
        };
        let magic = h.array::<4>("the magic number").map_err(&fail)?;
        if &magic != b"GGUF" {
            return Err(fail(
                "does not start with GGUF; this is not a GGUF file".to_owned(),
            ));
        }
        let version = h.u32("the version").map_err(&fail)?;
        if !(2..=3).contains(&version) {
            return Err(fail(format!(
                "is GGUF version {version}; versions 2 and 3 are read"
            )));
        }
        let tensor_count = h.count("the tensor count").map_err(&fail)?;
        let kv_count = h.count("the metadata count").map_err(&fail)?;
        let mut metadata = BTreeMap::new();
        for i in 0..kv_count {
            let key = h.string(&format!("metadata key {i}")).map_err(&fail)?;
            let kind = h.u32(&format!("the type of `{key}`")).map_err(&fail)?;
            let value = h
                .value(kind, &format!("metadata `{key}`"), 0)
                .map_err(&fail)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(fail(format!("metadata `{key}` appears twice")));
            }
        }
        let mut table = Vec::new();
        for i in 0..tensor_count {
            let name = h
                .string(&format!("the name of tensor {i}"))
                .map_err(&fail)?;
            let what = format!("tensor `{name}`");
            let dims = h.u32(&what).map_err(&fail)?;
            if dims == 0 || dims > 4 {
                return Err(fail(format!(
                    "{what} has {dims} dimensions; GGUF tensors have 1 to 4"
                )));
            }
            let mut shape = (0..dims)
                .map(|_| h.u64(&what))
                .collect::<std::result::Result<Vec<u64>, _>>()
                .map_err(&fail)?;
            shape.reverse();
            let code = h.u32(&what).map_err(&fail)?;
            let kind = GgmlType::from_code(code).map_err(|t| {
                fail(format!(
                    "{what} has type {t}, which safemlx-dist does not read; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4"
                ))
            })?;
            let offset = h.u64(&what).map_err(&fail)?;
            table.push((name, kind, shape, offset));
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => v
                .as_u64()
                .filter(|a| *a > 0 && a.is_power_of_two())
                .ok_or_else(|| fail(format!("general.alignment is {v:?}, not a power of two")))?,
        };
        let data_start = h.at.div_ceil(alignment) * alignment;
        let data_len = len.saturating_sub(data_start);
        let mut tensors = BTreeMap::new();
        for (name, kind, shape, offset) in table {
            let info = tensor_info(kind, &shape, offset, alignment, data_len)
                .map_err(|e| fail(format!("tensor `{name}` {e}")))?;
            if tensors.insert(name.clone(), info).is_some() {
                return Err(fail(format!(
                    "tensor `{name}` appears twice in the tensor table"
                )));
            }
        }
        let mut spans: Vec<(&String, &GgufTensor)> = tensors.iter().collect();
        spans.sort_by_key(|(_, t)| t.offset);
        for pair in spans.windows(2) {
            let ((a, ta), (b, tb)) = (pair[0], pair[1]);
            if ta.offset + ta.nbytes > tb.offset {
                return Err(fail(format!("tensors `{a}` and `{b}` overlap in the data")));
            }
        }
        Ok(Self {
            path,
            file,
            version,
            metadata,
            tensors,
            data_start,
            bytes_read: AtomicU64::new(0),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// The tensors, by name.
    pub fn tensors(&self) -> &BTreeMap<String, GgufTensor> {
        &self.tensors
    }

    /// Tensor data bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    pub(super) fn error(&self, message: String) -> Error {
        Error::Checkpoint {
            path: self.path.display().to_string(),
            message,
        }
    }

    /// Tensor `name`'s entry.
    ///
    /// # Errors
    /// No such tensor (some that exist are listed).
    pub fn tensor(&self, name: &str) -> Result<&GgufTensor> {
        self.tensors.get(name).ok_or_else(|| {
            let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).take(12).collect();
            if self.tensors.len() > names.len() {
                names.push("...");
            }
            self.error(format!(
                "has no tensor `{name}`; it has: {}",
                names.join(", ")
            ))
        })
    }

    pub(super) fn read_at(&self, name: &str, start: u64, len: u64) -> Result<Vec<u8>> {
        let mut bytes = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut bytes, self.data_start + start)
            .map_err(|e| self.error(format!("cannot read tensor `{name}`: {e}")))?;
        self.bytes_read.fetch_add(len, Ordering::Relaxed);
        Ok(bytes)
    }

    /// The whole tensor `name`, dequantized to `float32`.
    ///
    /// # Errors
    /// No such tensor, or a failed read.
    pub fn read(&self, name: &str, s: &Stream) -> Result<Array> {
        let t = self.tensor(name)?;
        let (rows, _) = rows_of(&t.shape, t.kind);
        self.read_rows(name, &[(0, rows)], s)
    }

    /// Rows `ranges` (`(first, count)` along the outermost axis) of tensor
    /// `name`, dequantized to `float32` and concatenated.
    ///
    /// # Errors
    /// No such tensor, rows past its end, or a failed read.
    pub fn read_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        let t = self.tensor(name)?;
        if let [len] = t.shape[..] {
            if t.kind.block().0 > 1 {
                return Err(self.error(format!(
                    "tensor `{name}` is {:?} but 1-D ({len} values): vectors (norms, biases) are stored as F32, F16 or BF16, as llama.cpp reads them; the file's header is wrong",
                    t.kind
                )));
            }
        }
        let (rows, row_len) = rows_of(&t.shape, t.kind);
        let values = self.row_values(name, t, (rows, row_len), ranges)?;
        let _ = s;
        let mut shape = t.shape.clone();
        let picked: usize = ranges.iter().map(|r| r.1).sum();
        shape[0] = (picked * if shape.len() == 1 { row_len } else { 1 }) as i32;
        Ok(Array::from_slice(&values, &shape))
    }

    /// Rows `ranges` of tensor `t` (`name`) taken as `rows` rows of
    /// `row_len` values, dequantized and concatenated.
    pub(super) fn row_values(
        &self,
        name: &str,
        t: &GgufTensor,
        (rows, row_len): (usize, usize),
        ranges: &[(usize, usize)],
    ) -> Result<Vec<f32>> {
        let (per_block, block_bytes) = t.kind.block();
        let row_bytes = (row_len / per_block * block_bytes) as u64;
        let mut values = Vec::new();
        for &(first, count) in ranges {
            if first.checked_add(count).is_none_or(|end| end > rows) {
                return Err(self.error(format!(
                    "tensor `{name}` has {rows} rows; rows {first}..{} were asked for",
                    first.saturating_add(count)
                )));
            }
            let bytes = self.read_at(
                name,
                t.offset + first as u64 * row_bytes,
                count as u64 * row_bytes,
            )?;
            values.extend(dequantize(t.kind, &bytes));
        }
        Ok(values)
    }

    /// Columns `ranges` (along the last axis) of the tensor `name` of 2 or
    /// more dimensions, dequantized, as `[rows, width]` (the other axes
    /// flattened into rows): per row, the blocks that hold the columns are
    /// read and the columns kept.
    ///
    /// # Errors
    /// No such tensor, a vector, columns past its end, or a failed read.
    pub fn read_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        let _ = s;
        let t = self.tensor(name)?;
        let [lead @ .., columns] = t.shape.as_slice() else {
            return Err(self.error(format!("tensor `{name}` has no dimensions")));
        };
        if lead.is_empty() {
            return Err(self.error(format!(
                "tensor `{name}` has shape {:?}; reading columns needs a 2-D tensor",
                t.shape
            )));
        }
        let rows: usize = lead.iter().map(|&d| d as usize).product();
        let columns = *columns as usize;
        let (per_block, block_bytes) = t.kind.block();
        let row_bytes = (columns / per_block * block_bytes) as u64;
        for &(first, count) in ranges {
            if first.checked_add(count).is_none_or(|end| end > columns) {
                return Err(self.error(format!(
                    "tensor `{name}` has {columns} columns; columns {first}..{} were asked for",
                    first.saturating_add(count)
                )));
            }
        }
        let width: usize = ranges.iter().map(|r| r.1).sum();
        let mut values = Vec::with_capacity(rows * width);
        for row in 0..rows {
            for &(first, count) in ranges.iter().filter(|r| r.1 > 0) {
                let (b0, b1) = (first / per_block, (first + count).div_ceil(per_block));
                let start = t.offset + row as u64 * row_bytes + (b0 * block_bytes) as u64;
                let bytes = self.read_at(name, start, ((b1 - b0) * block_bytes) as u64)?;
                let block_values = dequantize(t.kind, &bytes);
                let skip = first - b0 * per_block;
                values.extend_from_slice(&block_values[skip..skip + count]);
            }
        }
        Ok(Array::from_slice(&values, &[rows as i32, width as i32]))
    }
}

impl GgufFile {
    /// Rows `ranges` of the Q8_0, Q4_0, Q4_1, Q4_K or Q5_K tensor `name`
    /// (its axes but the last flattened into rows: a stack of experts'
    /// rows are expert by expert), kept quantized: the same values as
    /// [`GgufFile::read_rows`] in MLX's affine layout (see [`to_affine`]).
    ///
    /// # Errors
    /// No such tensor, a vector, another type, rows past its end, or a failed read.
    pub fn read_quantized_rows(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        let (t, rows, columns) = self.quantized_tensor(name)?;
        let (per_block, block_bytes) = t.kind.block();
        let row_bytes = (columns / per_block * block_bytes) as u64;
        let mut bytes = Vec::new();
        for &(first, count) in ranges {
            if first.checked_add(count).is_none_or(|end| end > rows) {
                return Err(self.error(format!(
                    "tensor `{name}` has {rows} rows; rows {first}..{} were asked for",
                    first.saturating_add(count)
                )));
            }
            let start = t.offset + first as u64 * row_bytes;
            bytes.extend(self.read_at(name, start, count as u64 * row_bytes)?);
        }
        let picked: usize = ranges.iter().map(|r| r.1).sum();
        self.affine(name, t.kind, &bytes, [picked, columns], s)
    }

    /// Groups (of 32 columns) `ranges` of every row (axes but the last
    /// flattened) of the tensor `name` of a type that stays quantized,
    /// kept quantized: the blocks that hold them are read (a K-quant's 256
    /// values are 8 groups).
    ///
    /// # Errors
    /// No such tensor, a vector, another type, groups past its end, or a failed read.
    pub fn read_quantized_groups(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        let (t, rows, columns) = self.quantized_tensor(name)?;
        let (per_block, block_bytes) = t.kind.block();
        let (groups, per) = (columns / 32, per_block / 32);
        for &(first, count) in ranges {
            if first.checked_add(count).is_none_or(|end| end > groups) {
                return Err(self.error(format!(
                    "tensor `{name}` has {groups} groups of 32 per row; groups {first}..{} were asked for",
                    first.saturating_add(count)
                )));
            }
        }
        let ranges: Vec<_> = ranges.iter().copied().filter(|r| r.1 > 0).collect();
        // The blocks that hold each range, and where the range starts in them.
        let blocks: Vec<_> = ranges
            .iter()
            .map(|&(first, count)| (first / per, (first + count).div_ceil(per) - first / per))
            .collect();
        let picked: usize = ranges.iter().map(|r| r.1).sum();
        let read: usize = blocks.iter().map(|b| b.1).sum();
        let mut bytes = Vec::with_capacity(rows * read * block_bytes);
        for row in 0..rows {
            for &(first, count) in &blocks {
                let start = t.offset + ((row * groups / per + first) * block_bytes) as u64;
                bytes.extend(self.read_at(name, start, (count * block_bytes) as u64)?);
            }
        }
        let whole = self.affine(name, t.kind, &bytes, [rows, read * per_block], s)?;
        if read * per == picked {
            return Ok(whole);
        }
        // Whole blocks read: keep each range's groups.
        let mut at = 0;
        let mut parts = Vec::with_capacity(ranges.len());
        for (&(first, count), &(b0, n)) in ranges.iter().zip(&blocks) {
            parts.push(whole.groups(at + first - b0 * per, count, s)?);
            at += n * per;
        }
        AffineWeight::concatenate_groups(&parts, s)
    }

    /// Tensor `name` of a type that stays quantized, with its rows (every
    /// axis but the last, flattened) and columns.
    fn quantized_tensor(&self, name: &str) -> Result<(&GgufTensor, usize, usize)> {
        let t = self.tensor(name)?;
        let [lead @ .., columns] = t.shape.as_slice() else {
            return Err(self.error(format!("tensor `{name}` has no dimensions")));
        };
        if lead.is_empty() {
            return Err(self.error(format!(
                "tensor `{name}` has shape {:?}; a quantized weight has rows",
                t.shape
            )));
        }
        let (rows, columns) = (lead.iter().product::<i32>(), *columns);
        if t.kind.affine_bits().is_none() {
            return Err(self.error(format!(
                "tensor `{name}` is {:?}; only Q8_0, Q4_0, Q4_1, Q4_K and Q5_K stay quantized (read it with `read_rows`)",
                t.kind
            )));
        }
        Ok((t, rows as usize, columns as usize))
    }

    fn affine(
        &self,
        name: &str,
        kind: GgmlType,
        bytes: &[u8],
        [rows, columns]: [usize; 2],
        s: &Stream,
    ) -> Result<AffineWeight> {
        let _ = s;
        let (words, scales, biases, bits) = to_affine(kind, bytes);
        let shape = |per_row: usize| [rows as i32, per_row as i32];
        AffineWeight::new(
            Array::from_slice(&words, &shape(columns * bits / 32)),
            Array::from_slice(&scales, &shape(columns / 32)),
            Array::from_slice(&biases, &shape(columns / 32)),
            32,
            bits,
        )
        .map_err(|e| self.error(format!("tensor `{name}`: {e}")))
    }
}

/// (rows, elements per row) of a row-major shape; a vector's rows are its
/// elements, or one row when it is quantized in blocks.
fn rows_of(shape: &[i32], kind: GgmlType) -> (usize, usize) {
    match shape {
        [n] if kind.block().0 == 1 => (*n as usize, 1),
        [n] => (1, *n as usize),
        [rows, rest @ ..] => (*rows as usize, rest.iter().map(|&d| d as usize).product()),
        [] => (1, 1),
    }
}
