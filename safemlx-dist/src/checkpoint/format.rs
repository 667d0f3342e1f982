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
    /// Stored as `F8_E4M3` (FP8 with 4 exponent and 3 mantissa bits), whose
    /// bytes read as `uint8` (`dtype`); see `checkpoint/fp8.rs`.
    pub float8: bool,
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
    DTYPES.map(|(n, _)| n).join(", ") + ", F8_E4M3"
}

pub(super) fn item_size(dtype: Dtype) -> usize {
    match dtype {
        Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
        Dtype::Uint16 | Dtype::Int16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
        Dtype::Uint32 | Dtype::Int32 | Dtype::Float32 => 4,
        _ => 8,
    }
}

/// A JSON object's entries in file order, duplicates kept (serde_json's
/// `Map` keeps only the last of repeated keys, which would hide them).
struct Entries(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, Value>()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

/// The tensors of a header, checked against a data section of `data_len`
/// bytes by the format's rules: every entry well formed, names unique, a
/// `__metadata__` (if any) a map of strings, and the tensors' byte ranges
/// covering the data section exactly, without holes, overlaps or trailing
/// bytes. The error says what is wrong, naming the tensor.
pub(super) fn parse(header: &[u8], data_len: u64) -> Result<BTreeMap<String, TensorInfo>, String> {
    let Entries(entries) = serde_json::from_slice(header)
        .map_err(|e| format!("the header is not a valid JSON object ({e})"))?;
    let mut tensors = BTreeMap::new();
    for (name, entry) in entries {
        if name == "__metadata__" {
            // `null` is "no metadata" (MLX writes it; the reference reader
            // takes it as an absent map).
            let strings = entry.is_null()
                || entry
                    .as_object()
                    .is_some_and(|m| m.values().all(Value::is_string));
            if !strings {
                return Err(format!(
                    "its __metadata__ is {entry}, not a map of strings to strings"
                ));
            }
            continue;
        }
        let info = tensor(&entry, data_len).map_err(|e| format!("tensor `{name}` {e}"))?;
        if tensors.insert(name.clone(), info).is_some() {
            return Err(format!("tensor `{name}` appears twice in the header"));
        }
    }
    check_coverage(&tensors, data_len)?;
    Ok(tensors)
}

/// The data section must be the tensors' bytes one after another: sorted
/// by offset, each starts where the previous ends, the first at 0 and the
/// last at the end of the file. A header one byte short, for instance,
/// leaves one byte more of data than the offsets cover, and every tensor
/// would otherwise be read shifted by that byte.
fn check_coverage(tensors: &BTreeMap<String, TensorInfo>, data_len: u64) -> Result<(), String> {
    let mut by_offset: Vec<(&String, &TensorInfo)> = tensors.iter().collect();
    by_offset.sort_by_key(|(_, t)| (t.begin, t.end));
    let mut at = 0u64;
    let mut previous: Option<&String> = None;
    for (name, info) in by_offset {
        if info.begin < at {
            let other = previous.map_or(String::new(), |p| format!("`{p}`"));
            return Err(format!(
                "tensor `{name}` starts at byte {} of the data, inside {other} (which ends at {at}): tensors must not overlap",
                info.begin
            ));
        }
        if info.begin > at {
            let after = previous.map_or("the start of the data".to_owned(), |p| {
                format!("tensor `{p}`")
            });
            return Err(format!(
                "tensor `{name}` starts at byte {} of the data, leaving bytes {at}..{} after {after} unused: the tensors must cover the data without holes",
                info.begin, info.begin
            ));
        }
        at = info.end;
        previous = Some(name);
    }
    if at != data_len {
        return Err(format!(
            "the tensors cover {at} bytes of data but the file holds {data_len} after the header: {} trailing bytes (a wrong header length shifts every tensor)",
            data_len - at
        ));
    }
    Ok(())
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
    // FP8 bytes read as uint8 (MLX has no FP8 type): see `fp8.rs`.
    let float8 = dtype_text == "F8_E4M3";
    let dtype = DTYPES
        .iter()
        .find(|(n, _)| *n == dtype_text)
        .map(|(_, d)| *d)
        .or(float8.then_some(Dtype::Uint8))
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
        float8,
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
