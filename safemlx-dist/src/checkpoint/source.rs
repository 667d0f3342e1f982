//! Where a model's tensors come from, under Hugging Face names: a Hugging
//! Face directory, or a GGUF file read through llama.cpp's names.

use std::path::Path;

use safemlx::ops::indexing::TryIndexOp;
use safemlx::{Array, Dtype, Stream};

use super::{GgmlType, GgufFile, HfDirectory};
use crate::error::{Error, Result};
use crate::quantized::AffineWeight;

/// Tensors by Hugging Face name (`model.layers.0.self_attn.q_proj.weight`,
/// `[out, in]`), read in parts: what the layers' `from_hf` constructors
/// take, so one model loads from every format.
pub trait TensorSource: std::fmt::Debug {
    /// The file or directory, for messages.
    fn path(&self) -> &Path;
    /// Whether tensor `name` exists.
    fn contains(&self, name: &str) -> bool;
    /// The row-major shape of tensor `name`.
    ///
    /// # Errors
    /// No such tensor.
    fn shape(&self, name: &str) -> Result<Vec<i32>>;
    /// The whole tensor.
    ///
    /// # Errors
    /// No such tensor, or a failed read.
    fn read(&self, name: &str, s: &Stream) -> Result<Array>;
    /// Rows `(first, count)` along axis 0, concatenated (elements of a vector).
    ///
    /// # Errors
    /// No such tensor, rows past its end, or a failed read.
    fn read_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array>;
    /// Columns `(first, count)` of a 2-D tensor, concatenated.
    ///
    /// # Errors
    /// No such tensor, not 2-D, columns past its end, or a failed read.
    fn read_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array>;
    /// Tensor bytes read so far.
    fn bytes_read(&self) -> u64;
    /// `(group_size, bits)` when tensor `name` is stored quantized in a
    /// form that can stay quantized (MLX affine; GGUF `Q8_0`, `Q4_0`,
    /// `Q4_1`); `None` for float tensors. [`read`](Self::read) and the
    /// other float reads dequantize such a tensor.
    fn quantization(&self, name: &str) -> Option<(usize, usize)> {
        let _ = name;
        None
    }
    /// Rows `(first, count)` (outputs) of the quantized `[out, in]` tensor
    /// `name`, kept quantized.
    ///
    /// # Errors
    /// No such tensor, one not stored quantized, rows past its end, or a
    /// failed read.
    fn read_quantized_rows(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        let _ = (ranges, s);
        Err(not_quantized(self.path(), name))
    }
    /// Groups `(first, count)` of every row (inputs, in whole groups) of
    /// the quantized `[out, in]` tensor `name`, kept quantized.
    ///
    /// # Errors
    /// No such tensor, one not stored quantized, groups past its end, or a
    /// failed read.
    fn read_quantized_groups(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        let _ = (ranges, s);
        Err(not_quantized(self.path(), name))
    }
}

fn not_quantized(path: &Path, name: &str) -> Error {
    Error::Checkpoint {
        path: path.display().to_string(),
        message: format!("tensor `{name}` is not stored quantized; read it as floats"),
    }
}

/// A source whose quantized tensors are read as floats: what
/// `--dequantize` loads, to compare with the quantized model.
#[derive(Debug)]
pub struct Dequantized<'a>(pub &'a dyn TensorSource);

impl TensorSource for Dequantized<'_> {
    fn path(&self) -> &Path {
        self.0.path()
    }
    fn contains(&self, name: &str) -> bool {
        self.0.contains(name)
    }
    fn shape(&self, name: &str) -> Result<Vec<i32>> {
        self.0.shape(name)
    }
    fn read(&self, name: &str, s: &Stream) -> Result<Array> {
        self.0.read(name, s)
    }
    fn read_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        self.0.read_rows(name, ranges, s)
    }
    fn read_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        self.0.read_columns(name, ranges, s)
    }
    fn bytes_read(&self) -> u64 {
        self.0.bytes_read()
    }
}

/// The parts of an mlx-community quantized tensor `stem.weight`: its
/// `stem.scales` and `stem.biases` names.
fn parts(name: &str) -> Option<(String, String)> {
    let stem = name.strip_suffix(".weight")?;
    Some((format!("{stem}.scales"), format!("{stem}.biases")))
}

impl HfDirectory {
    /// `(group_size, bits)` of tensor `name` in an mlx-community quantized
    /// directory: `config.json`'s `"quantization"` (or a per-layer entry
    /// in it), a `uint32` weight and its `scales` and `biases`.
    fn quantized(&self, name: &str) -> Option<(usize, usize)> {
        let (scales, biases) = parts(name)?;
        if !(self.contains(&scales) && self.contains(&biases)) {
            return None;
        }
        let q = self.config().get("quantization")?;
        let layer = name.strip_suffix(".weight").and_then(|stem| q.get(stem));
        let q = layer.filter(|l| l.is_object()).unwrap_or(q);
        let get = |key: &str| q.get(key)?.as_u64().map(|v| v as usize);
        Some((get("group_size")?, get("bits")?))
    }

    fn quantized_rows(
        &self,
        name: &str,
        (group_size, bits): (usize, usize),
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        let (scales, biases) = parts(name).unwrap_or_default();
        let weight = HfDirectory::read_rows(self, name, ranges, s)?;
        let scales = HfDirectory::read_rows(self, &scales, ranges, s)?;
        let biases = HfDirectory::read_rows(self, &biases, ranges, s)?;
        self.affine(name, weight, scales, biases, (group_size, bits))
    }

    fn quantized_groups(
        &self,
        name: &str,
        (group_size, bits): (usize, usize),
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        let (scales, biases) = parts(name).unwrap_or_default();
        let words = group_size * bits / 32;
        let word_ranges: Vec<_> = ranges
            .iter()
            .map(|&(f, c)| (f * words, c * words))
            .collect();
        let weight = HfDirectory::read_columns(self, name, &word_ranges, s)?;
        let scales = HfDirectory::read_columns(self, &scales, ranges, s)?;
        let biases = HfDirectory::read_columns(self, &biases, ranges, s)?;
        self.affine(name, weight, scales, biases, (group_size, bits))
    }

    fn affine(
        &self,
        name: &str,
        weight: Array,
        scales: Array,
        biases: Array,
        (group_size, bits): (usize, usize),
    ) -> Result<AffineWeight> {
        if let Some(mode) = self.config()["quantization"]
            .get("mode")
            .and_then(|m| m.as_str())
        {
            if mode != "affine" {
                return Err(Error::Checkpoint {
                    path: self.path().display().to_string(),
                    message: format!(
                        "tensor `{name}` is quantized in mode `{mode}`; only `affine` is supported"
                    ),
                });
            }
        }
        AffineWeight::new(weight, scales, biases, group_size, bits).map_err(|e| Error::Checkpoint {
            path: self.path().display().to_string(),
            message: format!("tensor `{name}` (config.json `quantization`): {e}"),
        })
    }
}

/// An mlx-community quantized tensor has the logical `[out, in]` shape of
/// its float original and reads as floats through `dequantize`.
impl TensorSource for HfDirectory {
    fn path(&self) -> &Path {
        HfDirectory::path(self)
    }
    fn contains(&self, name: &str) -> bool {
        HfDirectory::contains(self, name)
    }
    fn shape(&self, name: &str) -> Result<Vec<i32>> {
        let shape = self.info(name)?.shape.clone();
        let Some((group_size, _)) = self.quantized(name).filter(|_| shape.len() == 2) else {
            // Not quantized, or not 2-D (then reading it is a clear error).
            return Ok(shape);
        };
        let (scales, _) = parts(name).unwrap_or_default();
        let groups = &self.info(&scales)?.shape;
        Ok(vec![
            shape[0],
            groups
                .get(1)
                .copied()
                .unwrap_or(0)
                .saturating_mul(i32::try_from(group_size).unwrap_or(i32::MAX)),
        ])
    }
    fn read(&self, name: &str, s: &Stream) -> Result<Array> {
        let rows = self.shape(name)?.first().copied().unwrap_or(0) as usize;
        match self.quantized(name) {
            Some(_) => TensorSource::read_rows(self, name, &[(0, rows)], s),
            None => HfDirectory::read(self, name, s),
        }
    }
    fn read_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        match self.quantized(name) {
            Some(q) => self.quantized_rows(name, q, ranges, s)?.dequantize(s),
            None => HfDirectory::read_rows(self, name, ranges, s),
        }
    }
    fn read_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        let Some((group_size, bits)) = self.quantized(name) else {
            return HfDirectory::read_columns(self, name, ranges, s);
        };
        // The groups that cover each range, dequantized, then its columns.
        let mut pieces = Vec::with_capacity(ranges.len());
        for &(first, count) in ranges.iter().filter(|r| r.1 > 0) {
            let (a, b) = (first / group_size, (first + count).div_ceil(group_size));
            let values = self
                .quantized_groups(name, (group_size, bits), &[(a, b - a)], s)?
                .dequantize(s)?;
            let skip = (first - a * group_size) as i32;
            pieces.push(values.try_index_device((.., skip..skip + count as i32), s)?);
        }
        if pieces.is_empty() {
            let rows = self.shape(name)?.first().copied().unwrap_or(0);
            return Ok(safemlx::ops::zeros_dtype(&[rows, 0], Dtype::Float32, s)?);
        }
        Ok(safemlx::ops::concatenate_axis(&pieces, 1, s)?)
    }
    fn bytes_read(&self) -> u64 {
        HfDirectory::bytes_read(self)
    }
    fn quantization(&self, name: &str) -> Option<(usize, usize)> {
        self.quantized(name)
    }
    fn read_quantized_rows(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        let q = self
            .quantized(name)
            .ok_or_else(|| not_quantized(self.path(), name))?;
        self.quantized_rows(name, q, ranges, s)
    }
    fn read_quantized_groups(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        let q = self
            .quantized(name)
            .ok_or_else(|| not_quantized(self.path(), name))?;
        self.quantized_groups(name, q, ranges, s)
    }
}

/// Column ranges of a tensor quantized in groups of `group_size` as group
/// ranges.
///
/// # Errors
/// A range that cuts a group, named with the tensor and the group size.
pub fn whole_groups(
    path: &Path,
    name: &str,
    ranges: &[(usize, usize)],
    group_size: usize,
) -> Result<Vec<(usize, usize)>> {
    ranges
        .iter()
        .map(|&(first, count)| {
            if first % group_size == 0 && count % group_size == 0 {
                Ok((first / group_size, count / group_size))
            } else {
                Err(Error::Checkpoint {
                    path: path.display().to_string(),
                    message: format!(
                        "tensor `{name}` is quantized in groups of {group_size} columns; columns {first}..{} cut a group",
                        first + count
                    ),
                })
            }
        })
        .collect()
}

/// A GGUF file's tensors under Hugging Face names, dequantized to
/// `float32`.
///
/// llama.cpp stores the q and k projections of `llama` models with each
/// head's rows reordered for its interleaved RoPE (row `2j + i` of a head
/// is row `i * head_dim / 2 + j` of the original); they are put back on
/// read, so the weights equal the original model's and the same
/// `rotate_half` RoPE applies.
#[derive(Debug)]
pub struct GgufWeights {
    file: GgufFile,
    /// (query heads, KV heads, head_dim) when q and k rows are reordered.
    permuted: Option<(usize, usize, usize)>,
}

impl GgufWeights {
    /// Wraps `file`; `permuted` gives (query heads, KV heads, head_dim)
    /// when its q/k rows are in llama.cpp's RoPE order (`llama` models).
    pub fn new(file: GgufFile, permuted: Option<(usize, usize, usize)>) -> Self {
        Self { file, permuted }
    }

    /// The GGUF file.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// llama.cpp's name of the Hugging Face tensor `name`.
    pub fn gguf_name(name: &str) -> Option<String> {
        const TOP: [(&str, &str); 3] = [
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("model.norm.weight", "output_norm.weight"),
            ("lm_head.weight", "output.weight"),
        ];
        const LAYER: [(&str, &str); 11] = [
            ("input_layernorm", "attn_norm"),
            ("post_attention_layernorm", "ffn_norm"),
            ("self_attn.q_proj", "attn_q"),
            ("self_attn.k_proj", "attn_k"),
            ("self_attn.v_proj", "attn_v"),
            ("self_attn.o_proj", "attn_output"),
            ("self_attn.q_norm", "attn_q_norm"),
            ("self_attn.k_norm", "attn_k_norm"),
            ("mlp.gate_proj", "ffn_gate"),
            ("mlp.up_proj", "ffn_up"),
            ("mlp.down_proj", "ffn_down"),
        ];
        if let Some((_, g)) = TOP.iter().find(|(h, _)| *h == name) {
            return Some((*g).to_owned());
        }
        let rest = name.strip_prefix("model.layers.")?;
        let (layer, rest) = rest.split_once('.')?;
        layer.parse::<usize>().ok()?;
        let (module, suffix) = rest.rsplit_once('.')?;
        let (_, g) = LAYER.iter().find(|(h, _)| *h == module)?;
        Some(format!("blk.{layer}.{g}.{suffix}"))
    }

    fn name(&self, name: &str) -> Result<String> {
        Self::gguf_name(name).ok_or_else(|| Error::Checkpoint {
            path: self.file.path().display().to_string(),
            message: format!("has no GGUF name for tensor `{name}`"),
        })
    }

    /// Checks that `ranges` of a reordered q/k tensor are whole heads.
    fn whole_heads(&self, name: &str, ranges: &[(usize, usize)], head_dim: usize) -> Result<()> {
        if ranges
            .iter()
            .any(|&(first, count)| first % head_dim != 0 || count % head_dim != 0)
        {
            return Err(Error::Checkpoint {
                path: self.file.path().display().to_string(),
                message: format!("tensor `{name}` is read by whole heads of {head_dim} rows; rows {ranges:?} were asked for"),
            });
        }
        Ok(())
    }

    /// Heads of the q or k tensor `name` whose rows are reordered.
    fn permuted_heads(&self, name: &str) -> Option<(usize, usize)> {
        let (heads, kv_heads, head_dim) = self.permuted?;
        if name.ends_with("self_attn.q_proj.weight") {
            Some((heads, head_dim))
        } else if name.ends_with("self_attn.k_proj.weight") {
            Some((kv_heads, head_dim))
        } else {
            None
        }
    }
}

impl TensorSource for GgufWeights {
    fn path(&self) -> &Path {
        self.file.path()
    }
    fn contains(&self, name: &str) -> bool {
        Self::gguf_name(name).is_some_and(|g| self.file.tensors().contains_key(&g))
    }
    fn shape(&self, name: &str) -> Result<Vec<i32>> {
        Ok(self.file.tensor(&self.name(name)?)?.shape.clone())
    }
    fn read(&self, name: &str, s: &Stream) -> Result<Array> {
        let rows = self.shape(name)?.first().copied().unwrap_or(0) as usize;
        self.read_rows(name, &[(0, rows)], s)
    }
    fn read_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        let rows = self.file.read_rows(&self.name(name)?, ranges, s)?;
        let Some((_, head_dim)) = self.permuted_heads(name) else {
            return Ok(rows);
        };
        self.whole_heads(name, ranges, head_dim)?;
        unpermute_rows(&rows, head_dim, s)
    }
    fn quantization(&self, name: &str) -> Option<(usize, usize)> {
        let t = self.file.tensor(&Self::gguf_name(name)?).ok()?;
        let bits = match t.kind {
            GgmlType::Q8_0 => 8,
            GgmlType::Q4_0 | GgmlType::Q4_1 => 4,
            _ => return None,
        };
        (t.shape.len() == 2).then_some((32, bits))
    }
    fn read_quantized_rows(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        let rows = self
            .file
            .read_quantized_rows(&self.name(name)?, ranges, s)?;
        let Some((_, head_dim)) = self.permuted_heads(name) else {
            return Ok(rows);
        };
        self.whole_heads(name, ranges, head_dim)?;
        // Every array is row-wise: put each head's rows back in order.
        let unpermute = |a: &Array| -> Result<Array> { unpermute_rows(a, head_dim, s) };
        Ok(AffineWeight {
            weight: unpermute(&rows.weight)?,
            scales: unpermute(&rows.scales)?,
            biases: unpermute(&rows.biases)?,
            ..rows
        })
    }
    fn read_quantized_groups(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        if self.permuted_heads(name).is_some() {
            return Err(Error::Checkpoint {
                path: self.file.path().display().to_string(),
                message: format!("tensor `{name}` is read by rows (heads), not groups"),
            });
        }
        self.file
            .read_quantized_groups(&self.name(name)?, ranges, s)
    }
    fn read_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        if self.permuted_heads(name).is_some() {
            return Err(Error::Checkpoint {
                path: self.file.path().display().to_string(),
                message: format!("tensor `{name}` is read by rows (heads), not columns"),
            });
        }
        self.file.read_columns(&self.name(name)?, ranges, s)
    }
    fn bytes_read(&self) -> u64 {
        self.file.bytes_read()
    }
}

/// The rows of whole heads of `head_dim` rows in `rotate_half` order again:
/// `[heads, hd/2, 2, W] -> [heads, 2, hd/2, W]`.
fn unpermute_rows(rows: &Array, head_dim: usize, s: &Stream) -> Result<Array> {
    let shape = rows.shape().to_vec();
    let heads = shape[0] / head_dim as i32;
    let half = head_dim as i32 / 2;
    Ok(rows
        .reshape(&[heads, half, 2, shape[1]], s)?
        .transpose_axes(&[0, 2, 1, 3], s)?
        .reshape(&shape, s)?)
}

#[cfg(test)]
mod tests {
    use super::GgufWeights;

    #[test]
    fn hugging_face_names_map_to_llama_cpp_names() {
        let g = |n| GgufWeights::gguf_name(n);
        assert_eq!(
            g("model.embed_tokens.weight").as_deref(),
            Some("token_embd.weight")
        );
        assert_eq!(
            g("model.layers.12.self_attn.o_proj.weight").as_deref(),
            Some("blk.12.attn_output.weight")
        );
        assert_eq!(
            g("model.layers.0.self_attn.q_proj.bias").as_deref(),
            Some("blk.0.attn_q.bias")
        );
        assert_eq!(
            g("model.layers.3.post_attention_layernorm.weight").as_deref(),
            Some("blk.3.ffn_norm.weight")
        );
        assert_eq!(g("model.layers.x.mlp.up_proj.weight"), None);
        assert_eq!(g("something.else"), None);
    }
}
