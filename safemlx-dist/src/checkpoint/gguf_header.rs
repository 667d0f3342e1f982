//! A GGUF file's header: its metadata values, its tensor entries (checked
//! against the data) and the reader of its primitives, which never reads
//! past the file and refuses counts that only a damaged file declares.

use std::io::Read;

use super::ggml::GgmlType;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Any of the integer types, widened.
    Int(i128),
    /// `f32` or `f64`.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    String(String),
    /// An array of values.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as a whole number, if it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Self::Int(v) => u64::try_from(*v).ok(),
            _ => None,
        }
    }

    /// The value as a number.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Self::Int(v) => Some(*v as f64),
            Self::Float(v) => Some(*v),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// The most tensors, metadata entries and array elements one file may
/// declare; more is a damaged file (a count read from garbage).
pub(super) const MAX_COUNT: u64 = 1 << 24;

/// Reads the header's primitives, counting bytes, never past `len`.
pub(super) struct Header<R: Read> {
    pub(super) reader: R,
    pub(super) at: u64,
    pub(super) len: u64,
}

impl<R: Read> Header<R> {
    pub(super) fn bytes(&mut self, n: u64, what: &str) -> std::result::Result<Vec<u8>, String> {
        if n > self.len.saturating_sub(self.at) {
            return Err(format!(
                "{what} at byte {} needs {n} bytes but the file ends at {}; the file is truncated or damaged",
                self.at, self.len
            ));
        }
        let mut buf = vec![0u8; n as usize];
        self.reader
            .read_exact(&mut buf)
            .map_err(|e| format!("cannot read {what} at byte {}: {e}", self.at))?;
        self.at += n;
        Ok(buf)
    }

    pub(super) fn array<const N: usize>(
        &mut self,
        what: &str,
    ) -> std::result::Result<[u8; N], String> {
        let bytes = self.bytes(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&bytes);
        Ok(out)
    }

    pub(super) fn u32(&mut self, what: &str) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(super) fn u64(&mut self, what: &str) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(super) fn count(&mut self, what: &str) -> std::result::Result<u64, String> {
        let n = self.u64(what)?;
        if n > MAX_COUNT {
            return Err(format!(
                "{what} is {n}, more than a GGUF file holds; the file is damaged"
            ));
        }
        Ok(n)
    }

    pub(super) fn string(&mut self, what: &str) -> std::result::Result<String, String> {
        let n = self.u64(what)?;
        let bytes = self.bytes(n, what)?;
        String::from_utf8(bytes).map_err(|_| format!("{what} is not UTF-8"))
    }

    pub(super) fn value(
        &mut self,
        kind: u32,
        what: &str,
        depth: u32,
    ) -> std::result::Result<GgufValue, String> {
        Ok(match kind {
            0 => GgufValue::Int(self.array::<1>(what)?[0].into()),
            1 => GgufValue::Int(i8::from_le_bytes(self.array(what)?).into()),
            2 => GgufValue::Int(u16::from_le_bytes(self.array(what)?).into()),
            3 => GgufValue::Int(i16::from_le_bytes(self.array(what)?).into()),
            4 => GgufValue::Int(self.u32(what)?.into()),
            5 => GgufValue::Int(i32::from_le_bytes(self.array(what)?).into()),
            6 => GgufValue::Float(f32::from_le_bytes(self.array(what)?).into()),
            7 => GgufValue::Bool(self.array::<1>(what)?[0] != 0),
            8 => GgufValue::String(self.string(what)?),
            9 if depth == 0 => {
                let inner = self.u32(what)?;
                let n = self.count(what)?;
                let values = (0..n)
                    .map(|_| self.value(inner, what, depth + 1))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                GgufValue::Array(values)
            }
            10 => GgufValue::Int(self.u64(what)?.into()),
            11 => GgufValue::Int(i64::from_le_bytes(self.array(what)?).into()),
            12 => GgufValue::Float(f64::from_le_bytes(self.array(what)?)),
            other => {
                return Err(format!(
                    "{what} has value type {other}, which GGUF does not define"
                ))
            }
        })
    }
}

/// Where a tensor is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensor {
    /// Its type.
    pub kind: GgmlType,
    /// Row-major shape (GGUF's dimensions reversed: `[out, in]` for a weight).
    pub shape: Vec<i32>,
    pub(super) offset: u64,
    pub(super) nbytes: u64,
}

impl GgufTensor {
    /// Bytes of the tensor in the file.
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }
}

/// A tensor entry of the header checked against the data: its rows are
/// whole blocks, its shape positive, its bytes aligned and within the data.
pub(super) fn tensor_info(
    kind: GgmlType,
    shape: &[u64],
    offset: u64,
    alignment: u64,
    data_len: u64,
) -> std::result::Result<GgufTensor, String> {
    let shape: Vec<i32> = shape
        .iter()
        .map(|&d| i32::try_from(d).ok().filter(|d| *d > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("has dimensions {shape:?}, which are not positive i32 sizes"))?;
    let (per_block, block_bytes) = kind.block();
    let inner = *shape.last().unwrap_or(&1) as u64;
    if inner % per_block as u64 != 0 {
        return Err(format!(
            "is {kind:?} with rows of {inner} values, not a whole number of {per_block}-value blocks"
        ));
    }
    let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64));
    let nbytes = elements
        .map(|e| e / per_block as u64 * block_bytes as u64)
        .ok_or("has a size that overflows")?;
    if offset % alignment != 0 {
        return Err(format!(
            "starts at offset {offset}, not a multiple of the alignment {alignment}"
        ));
    }
    if offset.checked_add(nbytes).is_none_or(|end| end > data_len) {
        return Err(format!(
            "holds bytes {offset}..{} of the data but the file has {data_len} bytes of data; the file is truncated or the offset is wrong",
            offset.saturating_add(nbytes)
        ));
    }
    Ok(GgufTensor {
        kind,
        shape,
        offset,
        nbytes,
    })
}
