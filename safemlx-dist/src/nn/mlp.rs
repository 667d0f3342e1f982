//! The tensor-parallel SwiGLU MLP.

use safemlx::Stream;

use crate::typed::{Replicated, Sharded, ShardedArray};
use crate::{sharded, Result};

/// `down(silu(x gate) * (x up))` with `gate` and `up` `[D, H]` split by
/// columns and `down` `[H, D]` split by rows: one `all_sum` per forward
/// (`2 (n-1)/n` of `[T, D]` per rank), or one `sum_scatter` with the
/// sequence-parallel forward.
#[sharded]
#[derive(Debug)]
pub struct SwiGluMlp {
    /// `[D, H]`, column parallel.
    #[shard(Sharded<1>)]
    pub gate: ShardedArray<Sharded<1>>,
    /// `[D, H]`, column parallel.
    #[shard(Sharded<1>)]
    pub up: ShardedArray<Sharded<1>>,
    /// `[H, D]`, row parallel.
    #[shard(Sharded<0>)]
    pub down: ShardedArray<Sharded<0>>,
}

impl SwiGluMlp {
    /// The MLP on replicated tokens `[T, D]`; the output is replicated.
    #[sharded(x @ Replicated, return @ Replicated)]
    pub fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        let hidden = x
            .matmul(&self.gate, s)?
            .silu(s)?
            .mul(&x.matmul(&self.up, s)?, s)?;
        hidden.matmul(&self.down, s)
    }

    /// Sequence parallel: tokens arrive split by rows (`Sharded<0>`), are
    /// gathered for the column-parallel half, and leave split by rows
    /// again through a `sum_scatter` instead of an `all_sum`.
    #[sharded(x @ Replicated, return @ Sharded<0>)]
    pub fn forward_sequence_parallel(
        &self,
        x: ShardedArray<Sharded<0>>,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<0>>> {
        let hidden = x
            .matmul(&self.gate, s)?
            .silu(s)?
            .mul(&x.matmul(&self.up, s)?, s)?;
        hidden.matmul(&self.down, s)
    }
}
