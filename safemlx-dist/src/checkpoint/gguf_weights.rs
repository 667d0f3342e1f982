//! A GGUF file's tensors under Hugging Face names (llama.cpp's names
//! mapped, q/k rows put back in order): the [`TensorSource`] a GGUF model
//! loads through.

use std::path::Path;

use safemlx::{Array, Stream};

use super::{GgufFile, GgufValue, TensorSource};
use crate::affine::AffineWeight;
use crate::error::{Error, Result};
use crate::packing::PackedFormat;

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
    /// The file's tensors a model asked for, for [`check_all_read`](Self::check_all_read).
    asked: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// An architecture's own names of a layer's tensors (GLM's
    /// `post_attention_norm` for `ffn_norm`).
    renames: &'static [(&'static str, &'static str)],
}

impl GgufWeights {
    /// Wraps `file`; `permuted` gives (query heads, KV heads, head_dim)
    /// when its q/k rows are in llama.cpp's RoPE order (`llama` models).
    pub fn new(file: GgufFile, permuted: Option<(usize, usize, usize)>) -> Self {
        Self {
            file,
            permuted,
            asked: std::sync::Mutex::default(),
            renames: &[],
        }
    }

    /// The same, with an architecture's own names of a layer's tensors:
    /// `(usual, its own)` pairs of llama.cpp's names (`ffn_norm`,
    /// `post_attention_norm`).
    pub fn renamed(self, renames: &'static [(&'static str, &'static str)]) -> Self {
        Self { renames, ..self }
    }

    /// This file's name of the Hugging Face tensor `name`.
    fn file_name(&self, name: &str) -> Option<String> {
        let usual = Self::gguf_name(name)?;
        let renamed = self.renames.iter().find_map(|(from, to)| {
            let (layer, rest) = usual.strip_prefix("blk.")?.split_once('.')?;
            let (part, suffix) = rest.split_once('.')?;
            (part == *from).then(|| format!("blk.{layer}.{to}.{suffix}"))
        });
        Some(renamed.unwrap_or(usual))
    }

    /// The GGUF file.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// llama.cpp's name of the Hugging Face tensor `name`, as its
    /// converter writes it for every architecture read here.
    pub fn gguf_name(name: &str) -> Option<String> {
        super::gguf_names::gguf_name(name)
    }

    fn name(&self, name: &str) -> Result<String> {
        let gguf = self.file_name(name).ok_or_else(|| Error::Checkpoint {
            path: self.file.path().display().to_string(),
            message: format!("has no GGUF name for tensor `{name}`"),
        })?;
        self.asked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(gguf.clone());
        Ok(gguf)
    }

    /// Checks, once a model is loaded, that it asked for every tensor of
    /// the file (llama.cpp refuses a file with tensors its metadata does
    /// not describe: "wrong number of tensors"); RoPE's tensors are read
    /// with the configuration, and the tensors of the
    /// `nextn_predict_layers` layers from `layers` on (the
    /// multi-token-prediction layers llama.cpp counts in `block_count`)
    /// are left unread: their count is returned.
    ///
    /// # Errors
    /// The other tensors no one asked for, counted and the first three
    /// named.
    pub fn check_all_read(&self, layers: usize) -> Result<usize> {
        let asked = self
            .asked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let meta = self.file.metadata();
        let nextn = meta
            .get("general.architecture")
            .and_then(GgufValue::as_str)
            .and_then(|arch| meta.get(&format!("{arch}.nextn_predict_layers")))
            .and_then(GgufValue::as_u64)
            .map_or(0, |n| n as usize);
        let past = |n: &str| {
            n.strip_prefix("blk.")
                .and_then(|rest| rest.split('.').next())
                .and_then(|i| i.parse::<usize>().ok())
                .is_some_and(|i| (layers..layers.saturating_add(nextn)).contains(&i))
        };
        let unread: Vec<&str> = self
            .file
            .tensors()
            .keys()
            .filter(|n| !asked.contains(*n) && !ROPE_TENSORS.contains(&n.as_str()))
            .map(String::as_str)
            .collect();
        let skipped = unread.iter().filter(|n| past(n)).count();
        let unused: Vec<&str> = unread.into_iter().filter(|n| !past(n)).collect();
        if unused.is_empty() {
            return Ok(skipped);
        }
        let mut named: Vec<&str> = unused.iter().take(3).copied().collect();
        if unused.len() > named.len() {
            named.push("...");
        }
        Err(Error::Model {
            path: self.file.path().display().to_string(),
            message: format!(
                "has {} tensors the model does not read ({}): its metadata describes another model than its tensors",
                unused.len(),
                named.join(", ")
            ),
        })
    }

    /// One line on the matrices (and stacks of experts) a quantized load
    /// reads as `float32`:
    /// those whose type has no MLX affine form (Q2_K, Q3_K and Q6_K's
    /// 16-value sub-blocks, MXFP4's power-of-two scales outside stacks of
    /// experts, which stay MXFP4); `None` when every quantized tensor
    /// stays quantized.
    pub fn dequantized_note(&self) -> Option<String> {
        let mut by_type = std::collections::BTreeMap::<String, (usize, &str)>::new();
        for (name, t) in self.file.tensors() {
            let packed = TensorSource::quantization(&self.file, name).is_some();
            if t.shape.len() >= 2 && t.kind.block().0 > 1 && !packed {
                by_type
                    .entry(format!("{:?}", t.kind))
                    .or_insert((0, name))
                    .0 += 1;
            }
        }
        let listed: Vec<String> = by_type
            .iter()
            .map(|(kind, (count, first))| format!("{count} {kind} tensors (e.g. `{first}`)"))
            .collect();
        (!listed.is_empty()).then(|| {
            format!(
                "dequantizing {} to float32 as they are read: those types have no MLX affine form (groups of 32, 64 or 128 with one scale and bias); Q8_0, Q4_0, Q4_1, Q4_K and Q5_K stay quantized",
                listed.join(", ")
            )
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
        self.file_name(name)
            .is_some_and(|g| self.file.tensors().contains_key(&g))
    }
    fn shape(&self, name: &str) -> Result<Vec<i32>> {
        let shape = self.file.tensor(&self.name(name)?)?.shape.clone();
        Ok(match shape[..] {
            // llama.cpp keeps the shared expert's gate `[1, D]` as a vector.
            [d] if name.ends_with(SHARED_GATE) => vec![1, d],
            _ => shape,
        })
    }
    fn read(&self, name: &str, s: &Stream) -> Result<Array> {
        let shape = self.shape(name)?;
        if name.ends_with(SHARED_GATE) {
            let stored = self.file.read(&self.name(name)?, s)?;
            return Ok(stored.reshape(&shape, s)?);
        }
        let rows = shape.first().copied().unwrap_or(0) as usize;
        self.read_rows(name, &[(0, rows)], s)
    }
    fn read_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array> {
        // Rows and the columns of reordered q/k tensors through this
        // source (which puts heads back in order, or refuses); the rest
        // as the file reads them.
        if axis == 0 || self.permuted_heads(name).is_some() {
            return match axis {
                0 => self.read_rows(name, ranges, s),
                _ => self.read_columns(name, ranges, s),
            };
        }
        TensorSource::read_along(&self.file, &self.name(name)?, axis, ranges, s)
    }
    fn read_packed_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<super::PackedParts> {
        self.file
            .read_packed_stacked(&self.name(name)?, axis, ranges, s)
    }
    fn read_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        let rows = self.file.read_rows(&self.name(name)?, ranges, s)?;
        let Some((_, head_dim)) = self.permuted_heads(name) else {
            return Ok(rows);
        };
        self.whole_heads(name, ranges, head_dim)?;
        unpermute_rows(&rows, head_dim, s)
    }
    fn quantization(&self, name: &str) -> Option<PackedFormat> {
        TensorSource::quantization(&self.file, &self.file_name(name)?)
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
    fn stored_name(&self, name: &str) -> String {
        self.file_name(name).unwrap_or_else(|| name.to_owned())
    }
}

/// RoPE's tensors, read with the configuration (Llama 3's frequencies,
/// Phi-3's LongRoPE factors).
const ROPE_TENSORS: [&str; 3] = [
    "rope_freqs.weight",
    "rope_factors_long.weight",
    "rope_factors_short.weight",
];

/// The shared expert's gate, which llama.cpp stores as a vector.
const SHARED_GATE: &str = "mlp.shared_expert_gate.weight";

/// A GGUF file's tensors under the file's own names
/// (`blk.0.attn_q.weight`): `Q8_0`, `Q4_0`, `Q4_1`, `Q4_K` and `Q5_K`
/// tensors stay quantized (MLX affine, groups of 32), the others read as
/// `float32`.
impl TensorSource for GgufFile {
    fn path(&self) -> &Path {
        GgufFile::path(self)
    }
    fn contains(&self, name: &str) -> bool {
        self.tensors().contains_key(name)
    }
    fn shape(&self, name: &str) -> Result<Vec<i32>> {
        Ok(self.tensor(name)?.shape.clone())
    }
    fn read(&self, name: &str, s: &Stream) -> Result<Array> {
        GgufFile::read(self, name, s)
    }
    fn read_rows(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        GgufFile::read_rows(self, name, ranges, s)
    }
    fn read_columns(&self, name: &str, ranges: &[(usize, usize)], s: &Stream) -> Result<Array> {
        GgufFile::read_columns(self, name, ranges, s)
    }
    fn bytes_read(&self) -> u64 {
        GgufFile::bytes_read(self)
    }
    fn quantization(&self, name: &str) -> Option<PackedFormat> {
        let t = self.tensor(name).ok()?;
        // MXFP4 stays packed in stacks of experts (llama.cpp's only use).
        if t.kind == super::GgmlType::MXFP4 && t.shape.len() == 3 {
            return Some(PackedFormat::MXFP4);
        }
        let bits = t.kind.affine_bits()?;
        (t.shape.len() >= 2).then_some(PackedFormat::affine(32, bits))
    }
    fn read_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array> {
        match (axis, self.tensor(name)?.shape.len()) {
            (0, _) => GgufFile::read_rows(self, name, ranges, s),
            (1, 2) => GgufFile::read_columns(self, name, ranges, s),
            _ => self.read_stacked(name, axis, ranges, s),
        }
    }
    fn read_packed_along(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<super::PackedParts> {
        self.read_packed_stacked(name, axis, ranges, s)
    }
    fn read_quantized_rows(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        GgufFile::read_quantized_rows(self, name, ranges, s)
    }
    fn read_quantized_groups(
        &self,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<AffineWeight> {
        GgufFile::read_quantized_groups(self, name, ranges, s)
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
