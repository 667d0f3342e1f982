//! A safetensors file as a [`TensorSource`]: its tensors by name, and the
//! quantized fields [`save`](super::save) writes for `#[sharded]` layers
//! (`name`, `name.scales`, `name.biases`, `name.quantization`) as
//! quantized weights of their logical shape.

use std::path::Path;

use safemlx::{Array, Dtype, Stream};

use super::affine::{Affine, Stored};
use super::{Checkpoint, TensorSource};
use crate::error::{Error, Result};
use crate::quantized::AffineWeight;

impl Checkpoint {
    /// The quantized field `name`: its `.scales`, `.biases` and a `uint32`
    /// `[group_size, bits]` `.quantization` beside it.
    fn affine(&self, name: &str) -> Option<Affine> {
        let key = format!("{name}.quantization");
        let info = self.info(&key).ok()?;
        if info.dtype != Dtype::Uint32 || info.shape != [2] {
            return None;
        }
        let [group_size, bits] = self.read_u32_pair(&key).ok()?;
        let (scales, biases) = (format!("{name}.scales"), format!("{name}.biases"));
        (self.contains(&scales) && self.contains(&biases)).then(|| Affine {
            weight: name.to_owned(),
            scales,
            biases,
            group_size: group_size as usize,
            bits: bits as usize,
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

impl Stored for Checkpoint {
    fn location(&self) -> &Path {
        self.path()
    }
    fn stored_shape(&self, name: &str) -> Result<Vec<i32>> {
        Ok(self.info(name)?.shape.clone())
    }
    fn stored_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        self.read_rows(name, ranges, s)
    }
    fn stored_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        self.read_columns(name, ranges, s)
    }
}

impl TensorSource for Checkpoint {
    fn path(&self) -> &Path {
        Checkpoint::path(self)
    }
    fn contains(&self, name: &str) -> bool {
        Checkpoint::contains(self, name)
    }
    fn shape(&self, name: &str) -> Result<Vec<i32>> {
        match self.affine(name) {
            Some(affine) => affine.shape(self),
            None => Ok(self.info(name)?.shape.clone()),
        }
    }
    fn read(&self, name: &str, s: &Stream) -> Result<Array> {
        match self.affine(name) {
            Some(affine) => {
                let rows = affine.shape(self)?.first().copied().unwrap_or(0) as usize;
                affine.rows(self, &[(0, rows)], s)?.dequantize(s)
            }
            None => Checkpoint::read(self, name, s),
        }
    }
    fn read_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        match self.affine(name) {
            Some(affine) => affine.rows(self, ranges, s)?.dequantize(s),
            None => Checkpoint::read_rows(self, name, ranges, s),
        }
    }
    fn read_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        match self.affine(name) {
            Some(affine) => affine.float_columns(self, ranges, s),
            None => Checkpoint::read_columns(self, name, ranges, s),
        }
    }
    fn read_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array> {
        match (self.affine(name), axis) {
            (None, _) => Checkpoint::read_along(self, name, axis, ranges, s),
            (Some(_), 0) => TensorSource::read_rows(self, name, ranges, s),
            (Some(_), _) => TensorSource::read_columns(self, name, ranges, s),
        }
    }
    fn bytes_read(&self) -> u64 {
        Checkpoint::bytes_read(self)
    }
    fn quantization(&self, name: &str) -> Option<(usize, usize)> {
        self.affine(name).map(|a| (a.group_size, a.bits))
    }
    fn stored_dtype(&self, name: &str) -> Option<Dtype> {
        match self.affine(name) {
            Some(_) => None,
            None => self.info(name).ok().map(|i| i.dtype),
        }
    }
    fn read_quantized_rows(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        self.affine_to_read(name)?.rows(self, ranges, s)
    }
    fn read_quantized_groups(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        self.affine_to_read(name)?.groups(self, ranges, s)
    }
}
