//! A safetensors file as a [`TensorSource`]: its tensors by name, and the
//! quantized fields [`save`](super::save) writes for `#[sharded]` layers
//! (`name`, `name.scales`, `name.biases`, `name.quantization`) as
//! quantized weights of their logical shape.

use std::path::Path;

use safemlx::{Array, Stream};

use super::affine::{affine_tensor_source, Affine, Stored};
use super::{SafetensorsFile, TensorInfo};
use crate::error::{Error, Result};

impl Stored for SafetensorsFile {
    fn location(&self) -> &Path {
        self.path()
    }
    fn stored_contains(&self, name: &str) -> bool {
        SafetensorsFile::contains(self, name)
    }
    fn stored_info(&self, name: &str) -> Result<&TensorInfo> {
        self.info(name)
    }
    fn stored_read(&self, name: &str, s: &Stream) -> Result<Array> {
        SafetensorsFile::read(self, name, s)
    }
    fn stored_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array> {
        SafetensorsFile::read_along(self, name, axis, ranges, s)
    }
    fn stored_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        SafetensorsFile::read_columns(self, name, ranges, s)
    }
    fn stored_bytes_read(&self) -> u64 {
        SafetensorsFile::bytes_read(self)
    }

    /// The quantized field `name`: its `.scales`, `.biases` and a `uint32`
    /// `[group_size, bits]` `.quantization` beside it.
    fn affine(&self, name: &str) -> Option<Affine> {
        let [group_size, bits] = self.read_u32_pair(&format!("{name}.quantization")).ok()?;
        let (scales, biases) = (format!("{name}.scales"), format!("{name}.biases"));
        (self.contains(&scales) && self.contains(&biases)).then(|| Affine {
            weight: name.to_owned(),
            scales,
            biases: Some(biases),
            group_size: group_size as usize,
            bits: bits as usize,
            mode: "affine".to_owned(),
        })
    }

    fn affine_to_read(&self, name: &str) -> Result<Affine> {
        self.affine(name).ok_or_else(|| Error::Checkpoint {
            path: self.path().display().to_string(),
            message: format!(
                "tensor `{name}` is not stored quantized (no uint32 [group_size, bits] `{name}.quantization` with `{name}.scales` and `{name}.biases` beside it); read it as floats"
            ),
        })
    }
}

affine_tensor_source!(SafetensorsFile);
