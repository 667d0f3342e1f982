//! Hugging Face model directories: `config.json` beside `model.safetensors`,
//! or beside `model.safetensors.index.json` and the shards it names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safemlx::ops::QuantizationMode;
use safemlx::{Array, Stream};
use serde_json::Value;

use super::affine::{affine_tensor_source, Affine, Stored};
use super::{read_text, SafetensorsFile, TensorInfo};
use crate::error::{Error, Result};

/// A Hugging Face model directory opened for reading: its `config.json`
/// parsed, every safetensors file's header checked, each tensor found in
/// the file the index names. Tensors are read on demand, only the rows a
/// rank asks for.
#[derive(Debug)]
pub struct HfDirectory {
    dir: PathBuf,
    config: Value,
    files: Vec<SafetensorsFile>,
    /// Tensor name -> index into `files`.
    tensors: BTreeMap<String, usize>,
}

impl HfDirectory {
    /// Opens the directory `dir`: reads `config.json` and the headers of
    /// `model.safetensors`, or of every shard `model.safetensors.index.json`
    /// names.
    ///
    /// # Errors
    /// A missing or invalid `config.json`, no weights file, an index that is
    /// not `{"weight_map": {NAME: FILE}}`, a shard that is missing or bad,
    /// or a tensor the index places in a file that does not hold it; the
    /// message names the file and the tensor.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let fail = |path: &Path, message: String| Error::Checkpoint {
            path: path.display().to_string(),
            message,
        };
        let config_path = dir.join("config.json");
        if let Err(e) = std::fs::metadata(&config_path) {
            return Err(fail(
                &config_path,
                format!("cannot read it ({e}); a Hugging Face model directory has a config.json"),
            ));
        }
        let text = read_text(&config_path, "JSON")?;
        let config: Value = serde_json::from_str(&text)
            .map_err(|e| fail(&config_path, format!("is not valid JSON ({e})")))?;
        if !config.is_object() {
            return Err(fail(&config_path, "is not a JSON object".to_owned()));
        }
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let mut files = Vec::new();
        let mut tensors = BTreeMap::new();
        if index_path.exists() {
            let text = read_text(&index_path, "JSON")?;
            let index: Value = serde_json::from_str(&text)
                .map_err(|e| fail(&index_path, format!("is not valid JSON ({e})")))?;
            let map = index
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    fail(
                        &index_path,
                        "has no \"weight_map\" object of tensor name to file".to_owned(),
                    )
                })?;
            let mut by_file: BTreeMap<&str, usize> = BTreeMap::new();
            for (name, file) in map {
                let file = file.as_str().filter(|f| is_plain_file_name(f)).ok_or_else(|| {
                    fail(&index_path, format!("places tensor `{name}` in {file}, which is not a file name in this directory"))
                })?;
                let at = match by_file.get(file) {
                    Some(&at) => at,
                    None => {
                        files.push(SafetensorsFile::open(dir.join(file))?);
                        by_file.insert(file, files.len() - 1);
                        files.len() - 1
                    }
                };
                if !files[at].contains(name) {
                    return Err(fail(
                        files[at].path(),
                        format!(
                            "has no tensor `{name}`, which {} places in it",
                            index_path.display()
                        ),
                    ));
                }
                tensors.insert(name.clone(), at);
            }
        } else if single.exists() {
            let file = SafetensorsFile::open(&single)?;
            tensors = file.names().map(|n| (n.to_owned(), 0)).collect();
            files.push(file);
        } else {
            return Err(fail(
                &dir,
                "has neither model.safetensors nor model.safetensors.index.json".to_owned(),
            ));
        }
        Ok(Self {
            dir,
            config,
            files,
            tensors,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// `config.json`, parsed.
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// Whether the model has a tensor `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The tensors' names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// One line on the dense weights a quantized load reads as `float32`:
    /// those packed in a mode other than affine (an all-MXFP4 directory's
    /// attention, embedding and head; its stacks of experts stay packed);
    /// `None` when there are none.
    pub fn dequantized_note(&self) -> Option<String> {
        let dense: Vec<(&str, String)> = self
            .names()
            .filter_map(|name| {
                let a = self.affine(name)?;
                let format = a.format().ok()?;
                let two_d = self.stored_shape(&a.scales).ok()?.len() == 2;
                (two_d && format.mode != QuantizationMode::Affine).then_some((name, a.mode))
            })
            .collect();
        let (first, mode) = dense.first()?;
        Some(format!(
            "dequantizing {} {mode} tensors (e.g. `{first}`) to float32 as they are read: dense layers hold affine weights only (stacks of experts stay {mode})",
            dense.len()
        ))
    }

    fn file(&self, name: &str) -> Result<&SafetensorsFile> {
        match self.tensors.get(name) {
            Some(&at) => Ok(&self.files[at]),
            None => {
                let mut names: Vec<&str> = self.names().take(12).collect();
                if self.tensors.len() > names.len() {
                    names.push("...");
                }
                Err(Error::Checkpoint {
                    path: self.dir.display().to_string(),
                    message: format!("has no tensor `{name}`; it has: {}", names.join(", ")),
                })
            }
        }
    }

    /// The dtype and shape of tensor `name`.
    ///
    /// # Errors
    /// No such tensor (the message lists some that exist).
    pub fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.file(name)?.info(name)
    }

    /// The whole tensor `name`.
    ///
    /// # Errors
    /// No such tensor, or a read that fails.
    pub fn read(&self, name: &str, s: &Stream) -> Result<Array> {
        self.file(name)?.read(name, s)
    }

    /// Rows of tensor `name` (see [`SafetensorsFile::read_rows`]).
    ///
    /// # Errors
    /// No such tensor, rows past its end, or a read that fails.
    pub fn read_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        self.file(name)?.read_rows(name, ranges, s)
    }

    /// Columns of the 2-D tensor `name` (see [`SafetensorsFile::read_columns`]).
    ///
    /// # Errors
    /// No such tensor, not 2-D, columns past its end, or a failed read.
    pub fn read_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        self.file(name)?.read_columns(name, ranges, s)
    }

    /// Tensor bytes read so far, over every file.
    pub fn bytes_read(&self) -> u64 {
        self.files.iter().map(SafetensorsFile::bytes_read).sum()
    }
}

impl HfDirectory {
    /// An FP8 weight (`F8_E4M3`) with its `_scale_inv` beside it, in the
    /// tiles of `quantization_config`'s `weight_block_size` ([128, 128]
    /// when absent).
    fn block_scaled(&self, name: &str) -> Option<super::fp8::BlockScaled> {
        if !self.info(name).ok()?.float8 {
            return None;
        }
        let scales = format!("{name}_scale_inv");
        if !self.contains(&scales) {
            return None;
        }
        let block = self.config()["quantization_config"]["weight_block_size"]
            .as_array()
            .and_then(|b| match b.as_slice() {
                [r, c] => Some([r.as_u64()? as usize, c.as_u64()? as usize]),
                _ => None,
            })
            .filter(|b| b[0] > 0 && b[1] > 0)
            .unwrap_or([128, 128]);
        Some(super::fp8::BlockScaled {
            weight: name.to_owned(),
            scales,
            block,
        })
    }
}

/// A name without directory parts: the index may not point outside.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && name != "." && name != ".."
}

impl Stored for HfDirectory {
    fn location(&self) -> &Path {
        &self.dir
    }
    fn stored_contains(&self, name: &str) -> bool {
        HfDirectory::contains(self, name)
    }
    fn stored_info(&self, name: &str) -> Result<&TensorInfo> {
        self.info(name)
    }
    fn stored_read(&self, name: &str, s: &Stream) -> Result<Array> {
        HfDirectory::read(self, name, s)
    }
    fn stored_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array> {
        self.file(name)?.read_along(name, axis, ranges, s)
    }
    fn stored_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        HfDirectory::read_columns(self, name, ranges, s)
    }
    fn stored_bytes_read(&self) -> u64 {
        HfDirectory::bytes_read(self)
    }

    /// The quantized weight `name` (`stem.weight`) of an mlx-community
    /// directory: the tensors `stem.scales` and (affine) `stem.biases`,
    /// and how `config.json`'s `"quantization"` packs it, as mlx-lm reads
    /// it: a per-module entry keyed by `stem` (`{group_size, bits[,
    /// mode]}`, mode `affine` when it names none), else the top-level
    /// settings (a weight with biases is affine whatever the top-level
    /// mode says: mlx-lm infers affine from its float scales).
    fn affine(&self, name: &str) -> Option<Affine> {
        let stem = name.strip_suffix(".weight")?;
        let scales = format!("{stem}.scales");
        if !self.contains(&scales) {
            return None;
        }
        let biases = Some(format!("{stem}.biases")).filter(|b| self.contains(b));
        let q = self.config().get("quantization")?;
        let entry = q.get(stem).filter(|l| l.is_object());
        let mode = match (entry, &biases) {
            (Some(entry), _) => entry.get("mode"),
            (None, Some(_)) => None,
            (None, None) => q.get("mode"),
        };
        let q = entry.unwrap_or(q);
        let get = |key: &str| q.get(key)?.as_u64().map(|v| v as usize);
        Some(Affine {
            weight: name.to_owned(),
            scales,
            biases,
            group_size: get("group_size")?,
            bits: get("bits")?,
            mode: mode.and_then(Value::as_str).unwrap_or("affine").to_owned(),
        })
    }

    fn reads_as_floats(&self, name: &str) -> bool {
        self.block_scaled(name).is_some()
    }
    fn floats_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Option<Result<Array>> {
        Some(self.block_scaled(name)?.along(self, axis, ranges, s))
    }

    /// An error for a float tensor.
    fn affine_to_read(&self, name: &str) -> Result<Affine> {
        self.affine(name).ok_or_else(|| Error::Checkpoint {
            path: self.dir.display().to_string(),
            message: format!("tensor `{name}` is not stored quantized; read it as floats"),
        })
    }
}

// An mlx-community quantized tensor has the logical `[out, in]` shape of
// its float original and reads as floats through `dequantize`.
affine_tensor_source!(HfDirectory);
