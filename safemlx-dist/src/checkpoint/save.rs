//! Writing safetensors files.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use safemlx::{Array, Dtype, Stream};

use super::bytes::to_bytes;
use super::{format, io_error};
use crate::error::{Error, Result};

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
