//! Weights from files: safetensors files, Hugging Face directories and
//! GGUF files, each a [`TensorSource`], read through one prefix-scoped
//! [`Weights`].
//!
//! [`SafetensorsFile::open`] reads only a safetensors file's header; a read then
//! takes just the bytes of this rank's part of a tensor: a row split
//! (`Sharded<0>`) is one contiguous range, a column split one range per
//! row, a fused QKV one range per segment and row. Every layer loads with
//! `load(&Weights, ..)` (`#[sharded]` generates it for layer structs);
//! `gather_full` and [`save`] write a full checkpoint back.
//!
//! ```
//! use safemlx::{Array, Device, DeviceType, Stream};
//! use safemlx_dist::checkpoint::{save, SafetensorsFile, Weights};
//! use safemlx_dist::{init, Backend, Sharded};
//!
//! let s = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));
//! let path = std::env::temp_dir().join(format!("doc-{}.safetensors", std::process::id()));
//! let w = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
//! save(&path, &[("w", w)], &s)?;
//!
//! let group = init(false, Backend::Any)?; // one rank here: its part is all of it
//! let checkpoint = SafetensorsFile::open(&path)?;
//! assert_eq!(checkpoint.info("w")?.shape, [2, 3]);
//! let part = Weights::new(&checkpoint, &group).get::<Sharded<1>>("w", &[2, 3], &s)?;
//! assert_eq!(part.global_shape(), [2, 3]);
//! assert_eq!(checkpoint.bytes_read(), 24);
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), safemlx_dist::Error>(())
//! ```

mod affine;
mod bytes;
mod format;
mod fp8;
mod ggml;
mod gguf;
mod gguf_header;
mod gguf_mxfp4;
mod gguf_names;
mod gguf_stacked;
mod gguf_weights;
mod hf;
mod kquants;
mod one_dtype;
mod safetensors;
mod safetensors_source;
mod save;
mod source;
mod stacked;
mod weights;

use std::fs::File;
use std::path::Path;

pub use format::TensorInfo;
pub use ggml::{dequantize, to_affine, GgmlType};
pub use gguf::GgufFile;
pub use gguf_header::{GgufTensor, GgufValue};
pub use gguf_weights::GgufWeights;
pub use hf::HfDirectory;
pub use one_dtype::OneDtype;
pub use safetensors::SafetensorsFile;
pub use save::save;
pub use source::{whole_groups, Dequantized, PackedParts, TensorSource};
pub use weights::Weights;

use crate::error::{Error, Result};

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

/// The text of `path` if it is a regular file (a FIFO would block the
/// read forever; refused before it is opened). `format` names what was
/// expected, for the message.
///
/// # Errors
/// A missing file, one that is not regular (named: a FIFO, a directory,
/// ...), or a failed read.
pub(crate) fn read_text(path: &Path, format: &str) -> Result<String> {
    use std::io::Read;
    let (mut file, _) = open_regular(path, format)?;
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|e| io_error(path, "cannot read it", &e))?;
    Ok(text)
}
