//! Column- and row-parallel linear layers whose weights stay quantized
//! ([`AffineWeight`]): each rank multiplies its part with MLX's
//! `quantized_matmul` and never holds float weights.
//!
//! The weights are in the checkpoints' `[out, in]` layout. The column-
//! parallel layer splits the outputs (rows, any split, by the chunk rule);
//! the row-parallel layer splits the inputs, which must fall on
//! quantization-group boundaries: the chunk rule of the typed layer's
//! `Sharded<1>` input has to give every rank whole groups.

use safemlx::Stream;

use crate::checkpoint::GgufFile;
use crate::quantized::AffineWeight;
use crate::typed::{chunk, Partial, Replicated, Sharded, ShardedArray};
use crate::{Error, Group, Result};

/// `y = x Wᵀ` with a quantized `W` `[H, D]` split by rows (outputs): rank
/// `r` computes its chunk of the `H` outputs. No communication; the output
/// is `Sharded<1>`.
#[derive(Debug)]
pub struct QuantizedColumnParallelLinear {
    /// This rank's rows of `W`.
    pub weight: AffineWeight,
    outputs: usize,
}

impl QuantizedColumnParallelLinear {
    /// This rank's rows of the full quantized `weight` `[H, D]`.
    ///
    /// # Errors
    /// An MLX error.
    pub fn from_full(group: &Group, weight: &AffineWeight, s: &Stream) -> Result<Self> {
        let outputs = weight.shape()[0];
        let (first, count) = chunk(outputs, group.rank(), group.size());
        Ok(Self {
            weight: weight.rows(first, count, s)?,
            outputs,
        })
    }

    /// This rank's rows of the quantized tensor `name` of a GGUF file (only
    /// those bytes are read).
    ///
    /// # Errors
    /// See [`GgufFile::read_quantized_rows`].
    pub fn from_gguf(group: &Group, file: &GgufFile, name: &str, s: &Stream) -> Result<Self> {
        let outputs = file.tensor(name)?.shape[0] as usize;
        let range = chunk(outputs, group.rank(), group.size());
        Ok(Self {
            weight: file.read_quantized_rows(name, &[range], s)?,
            outputs,
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
        let local = self.weight.matmul_t(x.local(), s)?;
        let mut global = x.global_shape().to_vec();
        if let Some(last) = global.last_mut() {
            *last = self.outputs as i32;
        }
        ShardedArray::from_local(local, x.comm(), &global)
    }
}

/// `y = h Wᵀ` with a quantized `W` `[D, H]` split by columns (inputs), in
/// whole groups: each rank multiplies its chunk of `h`'s `H` columns, a
/// partial sum that one `all_sum` reduces.
#[derive(Debug)]
pub struct QuantizedRowParallelLinear {
    /// This rank's groups of every row of `W`.
    pub weight: AffineWeight,
    outputs: usize,
}

/// This rank's groups `(first, count)` of `inputs` columns in groups of
/// `group_size`, when the chunk rule gives every rank whole groups.
fn input_groups(group: &Group, inputs: usize, group_size: usize) -> Result<(usize, usize)> {
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
    let (first, count) = chunk(inputs, group.rank(), n);
    Ok((first / group_size, count / group_size))
}

impl QuantizedRowParallelLinear {
    /// This rank's groups of the full quantized `weight` `[D, H]`.
    ///
    /// # Errors
    /// A split that would cut a group (the message names the shapes and
    /// the group size), or an MLX error.
    pub fn from_full(group: &Group, weight: &AffineWeight, s: &Stream) -> Result<Self> {
        let [outputs, inputs] = weight.shape();
        let (first, count) = input_groups(group, inputs, weight.group_size)?;
        Ok(Self {
            weight: weight.groups(first, count, s)?,
            outputs,
        })
    }

    /// This rank's groups of the quantized tensor `name` of a GGUF file
    /// (only those blocks are read).
    ///
    /// # Errors
    /// A split that would cut a group, or see
    /// [`GgufFile::read_quantized_groups`].
    pub fn from_gguf(group: &Group, file: &GgufFile, name: &str, s: &Stream) -> Result<Self> {
        let shape = &file.tensor(name)?.shape;
        let (outputs, inputs) = (
            shape[0] as usize,
            shape.get(1).copied().unwrap_or(0) as usize,
        );
        let range = input_groups(group, inputs, 32)
            .map_err(|e| Error::Shape(format!("GGUF tensor `{name}`: {e}")))?;
        Ok(Self {
            weight: file.read_quantized_groups(name, &[range], s)?,
            outputs,
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
        let local = self.weight.matmul_t(h.local(), s)?;
        let mut global = h.global_shape().to_vec();
        if let Some(last) = global.last_mut() {
            *last = self.outputs as i32;
        }
        ShardedArray::from_local(local, h.comm(), &global)
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
