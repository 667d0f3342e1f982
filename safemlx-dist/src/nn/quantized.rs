//! Parallel layers whose weights stay quantized ([`AffineWeight`]): each
//! rank multiplies its part with MLX's `quantized_matmul` and never holds
//! float weights.
//!
//! The weights are in the checkpoints' `[out, in]` layout. Splitting the
//! outputs (rows) is free, by the chunk rule; splitting the inputs must fall
//! on quantization-group boundaries:
//!
//! - [`QuantizedColumnParallelLinear`] and [`QuantizedRowParallelLinear`]
//!   are `#[sharded]` structs of one [`QuantizedArray`] each, composing
//!   through the typed layer's `Sharded<1>`, whose chunk rule counts
//!   elements: it has to give every rank whole groups, or the row-parallel
//!   layer is an error naming the shapes and the group size;
//! - [`QuantizedSwiGluMlp`] splits its hidden dimension by the chunk rule
//!   applied to groups (3 groups over 2 ranks are 2 + 1), which always
//!   gives whole groups;
//! - [`QuantizedVocabParallelEmbedding`] splits vocabulary rows.

use safemlx::{Array, Dtype, Stream};

use super::embedding::local_lookup;
use super::Projection;
use crate::checkpoint::{GgufFile, TensorSource};
use crate::quantized::AffineWeight;
use crate::typed::{chunk, Partial, QuantizedArray, Replicated, Sharded, ShardedArray};
use crate::{sharded, Error, Group, Result};

/// `y = x Wᵀ` with a quantized `W` `[H, D]` split by rows (outputs): rank
/// `r` computes its chunk of the `H` outputs. No communication; the output
/// is `Sharded<1>`.
#[sharded]
#[derive(Debug)]
pub struct QuantizedColumnParallelLinear {
    /// This rank's rows of `W`.
    #[shard(Sharded<0>)]
    pub weight: QuantizedArray<Sharded<0>>,
}

impl QuantizedColumnParallelLinear {
    /// This rank's rows of the quantized tensor `name` of a GGUF file (only
    /// those bytes are read).
    ///
    /// # Errors
    /// See [`GgufFile::read_quantized_rows`].
    pub fn from_gguf(group: &Group, file: &GgufFile, name: &str, s: &Stream) -> Result<Self> {
        let shape = gguf_shape(file, name)?;
        let range = chunk(shape[0], group.rank(), group.size());
        let local = file.read_quantized_rows(name, &[range], s)?;
        Ok(Self {
            weight: QuantizedArray::from_local(local, group, shape)?,
        })
    }

    /// `x Wᵀ` for a replicated `x` `[T, D]`: this rank's `[T, H / n]`.
    ///
    /// # Errors
    /// `x` without `D` columns, or an MLX error.
    pub fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<1>>> {
        x.quantized_matmul(&self.weight, s)
    }
}

/// `y = h Wᵀ` with a quantized `W` `[D, H]` split by columns (inputs), in
/// whole groups: each rank multiplies its chunk of `h`'s `H` columns, a
/// partial sum that one `all_sum` reduces.
#[sharded]
#[derive(Debug)]
pub struct QuantizedRowParallelLinear {
    /// This rank's groups of every row of `W`.
    #[shard(Sharded<1>)]
    pub weight: QuantizedArray<Sharded<1>>,
}

/// `[rows, columns]` of GGUF tensor `name` (a 2-D weight).
fn gguf_shape(file: &GgufFile, name: &str) -> Result<[usize; 2]> {
    match file.tensor(name)?.shape.as_slice() {
        &[rows, columns] => Ok([rows as usize, columns as usize]),
        other => Err(Error::Shape(format!(
            "GGUF tensor `{name}` has shape {other:?}; a linear layer's weight is 2-D"
        ))),
    }
}

/// Checks that `h`'s chunks of `inputs` columns (the chunk rule over
/// elements) are whole groups of `group_size` on every rank, so that they
/// meet the weight's chunk of groups.
fn check_whole_groups(group: &Group, inputs: usize, group_size: usize) -> Result<()> {
    let n = group.size();
    for rank in 0..n {
        let (first, count) = chunk(inputs, rank, n);
        if first % group_size != 0 || count % group_size != 0 {
            return Err(Error::Shape(format!(
                "a row-parallel quantized weight with {inputs} inputs in groups of {group_size} over {n} ranks: rank {rank} would hold inputs {first}..{}, which cuts a group of {group_size}; these inputs split only over rank counts that give every rank whole groups ({} groups)",
                first + count,
                inputs / group_size
            )));
        }
    }
    Ok(())
}

impl QuantizedRowParallelLinear {
    /// This rank's groups of the full quantized `weight` `[D, H]`, checked
    /// to meet the `Sharded<1>` input `h` (whose columns are chunked by
    /// elements) on every rank.
    ///
    /// # Errors
    /// A split that would cut a group (the message names the shapes and
    /// the group size), or an MLX error.
    pub fn from_weight(group: &Group, weight: &AffineWeight, s: &Stream) -> Result<Self> {
        check_whole_groups(group, weight.shape()[1], weight.group_size)?;
        Self::from_full(group, weight.clone(), s)
    }

    /// This rank's groups of the quantized tensor `name` of a GGUF file
    /// (only those blocks are read).
    ///
    /// # Errors
    /// A split that would cut a group, or see
    /// [`GgufFile::read_quantized_groups`].
    pub fn from_gguf(group: &Group, file: &GgufFile, name: &str, s: &Stream) -> Result<Self> {
        let shape = gguf_shape(file, name)?;
        check_whole_groups(group, shape[1], 32)
            .map_err(|e| Error::Shape(format!("GGUF tensor `{name}`: {e}")))?;
        let range = chunk(shape[1] / 32, group.rank(), group.size());
        let local = file.read_quantized_groups(name, &[range], s)?;
        Ok(Self {
            weight: QuantizedArray::from_local(local, group, shape)?,
        })
    }

    /// The unreduced product `h Wᵀ`.
    ///
    /// # Errors
    /// `h`'s columns not this rank's inputs, or an MLX error.
    pub fn partial(
        &self,
        h: &ShardedArray<Sharded<1>>,
        s: &Stream,
    ) -> Result<ShardedArray<Partial>> {
        h.quantized_matmul(&self.weight, s)
    }

    /// `h Wᵀ` on every rank. Cost: one `all_sum` of `[T, D]`.
    ///
    /// # Errors
    /// See [`QuantizedRowParallelLinear::partial`].
    pub fn forward(
        &self,
        h: &ShardedArray<Sharded<1>>,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        self.partial(h, s)?.all_sum(s)
    }
}

/// The SwiGLU MLP `down(silu(x gateᵀ) * (x upᵀ))` with the checkpoint's
/// weights as stored: quantized ones stay quantized (a float one beside
/// them is allowed). The hidden dimension `H` is split by the chunk rule
/// applied to `down`'s quantization groups (elements when `down` is
/// float), so each rank's columns of `down` are whole groups and uneven
/// splits are allowed; `gate` and `up` take the same rows. A rank with no
/// hidden columns (more ranks than groups) adds zeros. Cost: one `all_sum`
/// of `[T, D]`, as [`SwiGluMlp`](super::SwiGluMlp).
#[derive(Debug)]
pub struct QuantizedSwiGluMlp {
    /// This rank's rows of `gate` and `up` `[H, D]`.
    pub gate: Projection,
    /// See `gate`.
    pub up: Projection,
    /// This rank's columns of `down` `[D, H]`.
    pub down: Projection,
    /// This rank's hidden columns `(first, count)`.
    pub hidden: (usize, usize),
    dim: usize,
}

impl QuantizedSwiGluMlp {
    /// Reads this rank's part of `{prefix}gate_proj.weight`,
    /// `{prefix}up_proj.weight` (`[H, D]`) and `{prefix}down_proj.weight`
    /// (`[D, H]`), for `D` = `dim` and `H` = `hidden`.
    ///
    /// # Errors
    /// A missing tensor, one whose shape is not the configuration's, or a
    /// failed read.
    pub fn from_hf(
        group: &Group,
        dir: &dyn TensorSource,
        prefix: &str,
        (dim, hidden): (usize, usize),
        s: &Stream,
    ) -> Result<Self> {
        let name = |part: &str| format!("{prefix}{part}");
        for (part, want) in [
            ("gate_proj.weight", [hidden, dim]),
            ("up_proj.weight", [hidden, dim]),
            ("down_proj.weight", [dim, hidden]),
        ] {
            let shape = dir.shape(&name(part))?;
            if shape != [want[0] as i32, want[1] as i32] {
                return Err(Error::Model {
                    path: dir.path().display().to_string(),
                    message: format!(
                        "tensor `{}` has shape {shape:?} but the configuration gives {want:?}",
                        name(part)
                    ),
                });
            }
        }
        let unit = dir
            .quantization(&name("down_proj.weight"))
            .map_or(1, |(group_size, _)| group_size);
        let (first, count) = chunk(hidden / unit, group.rank(), group.size());
        let part = [(first * unit, count * unit)];
        Ok(Self {
            gate: Projection::rows(dir, &name("gate_proj.weight"), &part, s)?,
            up: Projection::rows(dir, &name("up_proj.weight"), &part, s)?,
            down: Projection::columns(dir, &name("down_proj.weight"), &part, s)?,
            hidden: part[0],
            dim,
        })
    }

    /// The MLP on replicated tokens `[T, D]`; the output is replicated.
    ///
    /// # Errors
    /// `x` is not `[T, D]`, or an MLX error.
    pub fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        let &[t, d] = x.global_shape() else {
            return Err(Error::Shape(format!(
                "the MLP takes tokens [T, D], got {:?}",
                x.global_shape()
            )));
        };
        if d as usize != self.dim {
            return Err(Error::Shape(format!(
                "the MLP takes tokens [T, {}], got {:?}",
                self.dim,
                x.global_shape()
            )));
        }
        let partial = if self.hidden.1 == 0 {
            safemlx::ops::zeros_dtype(&[t, d], x.local().dtype(), s)?
        } else {
            let x = x.local();
            let gate = self.gate.apply(x, s)?;
            let hidden = gate
                .multiply(safemlx::ops::sigmoid(&gate, s)?, s)?
                .multiply(self.up.apply(x, s)?, s)?;
            self.down.apply(&hidden, s)?
        };
        ShardedArray::<Partial>::from_local(partial, x.comm(), &[t, d])?.all_sum(s)
    }

    /// Bytes of this rank's weights.
    pub fn nbytes(&self) -> usize {
        [&self.gate, &self.up, &self.down]
            .iter()
            .map(|p| p.nbytes())
            .sum()
    }
}

/// A quantized `[V, D]` table split by vocabulary rows, as
/// [`VocabParallelEmbedding`](super::VocabParallelEmbedding): as an
/// embedding each rank dequantizes the rows of its tokens and one `all_sum`
/// completes the lookup; as an LM head `h Eᵀ` (`quantized_matmul`) gives
/// each rank its vocabulary columns of the logits.
#[derive(Debug)]
pub struct QuantizedVocabParallelEmbedding {
    /// This rank's rows.
    pub weight: AffineWeight,
    comm: Group,
    vocab: usize,
    first: usize,
}

impl QuantizedVocabParallelEmbedding {
    /// Reads this rank's rows of the quantized `[V, D]` tensor `name`.
    ///
    /// # Errors
    /// A missing tensor, one not stored quantized, or a failed read.
    pub fn from_hf(group: &Group, dir: &dyn TensorSource, name: &str, s: &Stream) -> Result<Self> {
        let vocab = dir.shape(name)?.first().copied().unwrap_or(0) as usize;
        let (first, count) = chunk(vocab, group.rank(), group.size());
        Ok(Self {
            weight: dir.read_quantized_rows(name, &[(first, count)], s)?,
            comm: group.clone(),
            vocab,
            first,
        })
    }

    /// The vocabulary size `V`.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The (dequantized) rows of `tokens` on every rank, `[T, D]`. Cost:
    /// one `all_sum` of `[T, D]`.
    ///
    /// # Errors
    /// A token id outside the vocabulary (named with its position).
    pub fn forward(&self, tokens: &[u32], s: &Stream) -> Result<ShardedArray<Replicated>> {
        let [count, d] = self.weight.shape();
        let (rows, keep, t) = local_lookup(tokens, self.vocab, (self.first, count))?;
        let d = d as i32;
        let local = if count == 0 {
            safemlx::ops::zeros_dtype(&[t, d], self.weight.scales.dtype(), s)?
        } else {
            let take = |a: &Array| a.take_axis(&rows, 0, s);
            let picked = AffineWeight {
                weight: take(&self.weight.weight)?,
                scales: take(&self.weight.scales)?,
                biases: take(&self.weight.biases)?,
                ..self.weight
            };
            let values = picked.dequantize(s)?;
            let keep = keep.as_dtype(values.dtype(), s)?;
            values.multiply(&keep, s)?
        };
        ShardedArray::<Partial>::from_local(local, &self.comm, &[t, d])?.all_sum(s)
    }

    /// The logits `h Eᵀ` of the replicated hidden states `h` `[T, D]`:
    /// this rank's vocabulary columns, `[T, V]` split by columns. No
    /// communication.
    ///
    /// # Errors
    /// `h` is not `[T, D]`, or an MLX error.
    pub fn logits(
        &self,
        h: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<1>>> {
        let &[t, _] = h.global_shape() else {
            return Err(Error::Shape(format!(
                "logits take hidden states [T, D], got {:?}",
                h.global_shape()
            )));
        };
        let local = if self.weight.shape()[0] == 0 {
            safemlx::ops::zeros_dtype(&[t, 0], Dtype::Float32, s)?
        } else {
            self.weight.matmul_t(h.local(), s)?
        };
        ShardedArray::from_local(local, h.comm(), &[t, self.vocab as i32])
    }
}
