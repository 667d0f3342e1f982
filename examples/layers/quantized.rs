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
//! - [`Mlp`](super::Mlp), the models' MLP, splits its hidden dimension by
//!   the chunk rule applied to groups (3 groups over 2 ranks are 2 + 1),
//!   which always gives whole groups.
//!
//! A quantized vocabulary table is an [`Embedding`](super::Embedding)
//! like a float one.

use safemlx::Stream;

use safemlx_dist::affine::AffineWeight;
use safemlx_dist::checkpoint::Weights;
use safemlx_dist::sharded;
use safemlx_dist::typed::{chunk, Partial, QuantizedArray, Replicated, Sharded, ShardedArray};
use safemlx_dist::Group;
use safemlx_dist::{Error, Result};

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
    /// This rank's rows of the quantized `[H, D]` tensor `name` of `w`
    /// (only those bytes are read).
    ///
    /// # Errors
    /// A missing tensor, one that is not 2-D or not stored quantized, or a
    /// failed read.
    pub fn load(w: &Weights, name: &str, s: &Stream) -> Result<Self> {
        Ok(Self {
            weight: w.quantized(name, None, s)?,
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

    /// This rank's groups of the quantized `[D, H]` tensor `name` of `w`
    /// (only those blocks are read), checked to meet the `Sharded<1>` input
    /// `h` on every rank.
    ///
    /// # Errors
    /// A split that would cut a group (the message names the tensor, the
    /// shapes and the group size), a tensor that is not 2-D or not stored
    /// quantized, or a failed read.
    pub fn load(w: &Weights, name: &str, s: &Stream) -> Result<Self> {
        if let (&[_, inputs], Some(safemlx_dist::packing::PackedFormat { group_size, .. })) =
            (w.shape(name)?.as_slice(), w.quantization(name))
        {
            check_whole_groups(w.comm(), inputs, group_size).map_err(|e| {
                let stored = w.source().stored_name(&w.name(name));
                Error::Shape(format!("tensor `{stored}`: {e}"))
            })?;
        }
        Ok(Self {
            weight: w.quantized(name, None, s)?,
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
