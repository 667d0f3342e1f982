//! The safetensors layout: an 8-byte little-endian header length, a JSON
//! header `{"NAME": {"dtype", "shape", "data_offsets": [begin, end]}, ...}`
//! (plus an optional `"__metadata__"` map of strings), then the tensors'
//! bytes, row-major and little-endian, offsets relative to the data start.

use std::collections::BTreeMap;

use safemlx::Dtype;
use serde_json::{Map, Value};

/// The largest header accepted (the reference implementation's limit).
pub(super) const MAX_HEADER: u64 = 100 << 20;

/// Where one tensor is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Element type.
    pub dtype: Dtype,
    /// Shape (empty for a scalar).
    pub shape: Vec<i32>,
    /// Byte range in the data section, `[begin, end)`.
    pub(super) begin: u64,
    pub(super) end: u64,
}

impl TensorInfo {
    /// Bytes of one element.
    pub fn item_size(&self) -> usize {
        item_size(self.dtype)
    }

    /// Bytes of the whole tensor.
    pub fn nbytes(&self) -> u64 {
        self.end - self.begin
    }
}

/// The safetensors dtype names this crate reads and writes, and MLX's type.
const DTYPES: [(&str, Dtype); 12] = [
    ("BOOL", Dtype::Bool),
    ("U8", Dtype::Uint8),
    ("U16", Dtype::Uint16),
    ("U32", Dtype::Uint32),
    ("U64", Dtype::Uint64),
    ("I8", Dtype::Int8),
    ("I16", Dtype::Int16),
    ("I32", Dtype::Int32),
    ("I64", Dtype::Int64),
    ("F16", Dtype::Float16),
    ("BF16", Dtype::Bfloat16),
    ("F32", Dtype::Float32),
];

pub(super) fn dtype_name(dtype: Dtype) -> Option<&'static str> {
    DTYPES.iter().find(|(_, d)| *d == dtype).map(|(n, _)| *n)
}

fn supported() -> String {
    DTYPES.map(|(n, _)| n).join(", ")
}

pub(super) fn item_size(dtype: Dtype) -> usize {
    match dtype {
        Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
        Dtype::Uint16 | Dtype::Int16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
        Dtype::Uint32 | Dtype::Int32 | Dtype::Float32 => 4,
        _ => 8,
    }
}

/// The tensors of a header, checked against a data section of `data_len`
/// bytes; the error says what is wrong, naming the tensor.
pub(super) fn parse(header: &[u8], data_len: u64) -> Result<BTreeMap<String, TensorInfo>, String> {
    let json: Value = serde_json::from_slice(header)
        .map_err(|e| format!("the header is not valid JSON ({e})"))?;
    let Value::Object(entries) = json else {
        return Err("the header is not a JSON object".to_owned());
    };
    let mut tensors = BTreeMap::new();
    for (name, entry) in entries {
        if name == "__metadata__" {
            continue;
        }
        let info = tensor(&entry, data_len).map_err(|e| format!("tensor `{name}` {e}"))?;
        tensors.insert(name, info);
    }
    Ok(tensors)
}

fn tensor(entry: &Value, data_len: u64) -> Result<TensorInfo, String> {
    let field = |key: &str| {
        entry
            .get(key)
            .ok_or_else(|| format!("has no \"{key}\" in the header"))
    };
    let dtype_text = field("dtype")?
        .as_str()
        .ok_or("has a dtype that is not a string")?;
    let dtype = DTYPES
        .iter()
        .find(|(n, _)| *n == dtype_text)
        .map(|(_, d)| *d)
        .ok_or_else(|| {
            format!(
                "has dtype {dtype_text}, which safemlx-dist does not read; supported: {}",
                supported()
            )
        })?;
    let shape = field("shape")?
        .as_array()
        .ok_or("has a shape that is not a list")?
        .iter()
        .map(|d| d.as_u64().and_then(|d| i32::try_from(d).ok()))
        .collect::<Option<Vec<i32>>>()
        .ok_or("has a shape whose dimensions are not whole numbers that fit in i32")?;
    let offsets = field("data_offsets")?
        .as_array()
        .and_then(|o| match o.as_slice() {
            [b, e] => Some((b.as_u64()?, e.as_u64()?)),
            _ => None,
        })
        .ok_or("has data_offsets that are not [begin, end]")?;
    let (begin, end) = offsets;
    let elements = shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
        .ok_or("has a shape whose element count overflows")?;
    let want = elements
        .checked_mul(item_size(dtype) as u64)
        .ok_or("has a byte size that overflows")?;
    if end < begin || end - begin != want {
        return Err(format!(
            "is {dtype_text} {shape:?} ({want} bytes) but its data_offsets [{begin}, {end}] hold {} bytes",
            end.saturating_sub(begin)
        ));
    }
    if end > data_len {
        return Err(format!(
            "ends at byte {end} of the data but the file holds {data_len} bytes of data; the file may be truncated"
        ));
    }
    Ok(TensorInfo {
        dtype,
        shape,
        begin,
        end,
    })
}

/// The header for tensors of these names, dtypes, shapes and byte sizes,
/// laid out one after another in the given order, padded with spaces to a
/// multiple of 8 bytes.
pub(super) fn header(tensors: &[(&str, Dtype, &[i32], u64)]) -> Vec<u8> {
    let mut entries = Map::new();
    let mut offset = 0u64;
    for &(name, dtype, shape, nbytes) in tensors {
        entries.insert(
            name.to_owned(),
            serde_json::json!({
                "dtype": dtype_name(dtype).unwrap_or("?"),
                "shape": shape,
                "data_offsets": [offset, offset + nbytes],
            }),
        );
        offset += nbytes;
    }
    entries.insert(
        "__metadata__".to_owned(),
        serde_json::json!({ "format": "pt", "writer": "safemlx-dist" }),
    );
    let mut bytes = Value::Object(entries).to_string().into_bytes();
    while bytes.len() % 8 != 0 {
        bytes.push(b' ');
    }
    bytes
}
