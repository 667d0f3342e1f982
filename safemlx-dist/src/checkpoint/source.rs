//! Where a model's tensors come from, under Hugging Face names: a Hugging
//! Face directory, or a GGUF file read through llama.cpp's names.

use std::path::Path;

use safemlx::{Array, Stream};

use super::{GgufFile, HfDirectory};
use crate::error::{Error, Result};

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
}

impl TensorSource for HfDirectory {
    fn path(&self) -> &Path {
        HfDirectory::path(self)
    }
    fn contains(&self, name: &str) -> bool {
        HfDirectory::contains(self, name)
    }
    fn shape(&self, name: &str) -> Result<Vec<i32>> {
        Ok(self.info(name)?.shape.clone())
    }
    fn read(&self, name: &str, s: &Stream) -> Result<Array> {
        HfDirectory::read(self, name, s)
    }
    fn read_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        HfDirectory::read_rows(self, name, ranges, s)
    }
    fn read_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        HfDirectory::read_columns(self, name, ranges, s)
    }
    fn bytes_read(&self) -> u64 {
        HfDirectory::bytes_read(self)
    }
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
        if ranges
            .iter()
            .any(|&(first, count)| first % head_dim != 0 || count % head_dim != 0)
        {
            return Err(Error::Checkpoint {
                path: self.file.path().display().to_string(),
                message: format!("tensor `{name}` is read by whole heads of {head_dim} rows; rows {ranges:?} were asked for"),
            });
        }
        let shape = rows.shape().to_vec();
        let heads = shape[0] / head_dim as i32;
        let half = head_dim as i32 / 2;
        // [heads, hd/2, 2, D] -> [heads, 2, hd/2, D]: rotate_half order again.
        Ok(rows
            .reshape(&[heads, half, 2, shape[1]], s)?
            .transpose_axes(&[0, 2, 1, 3], s)?
            .reshape(&shape, s)?)
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
