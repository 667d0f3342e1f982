//! Column- and row-parallel linear layers.

use safemlx::Stream;

use crate::typed::{Partial, Replicated, Sharded, ShardedArray};
use crate::{sharded, Result};

/// `y = x W + b` with `W` `[D, H]` split by columns: rank `r` computes its
/// `H / n` output columns. No communication; the output is `Sharded<1>`,
/// ready for a nonlinearity and a [`RowParallelLinear`].
#[sharded]
#[derive(Debug)]
pub struct ColumnParallelLinear {
    /// `[D, H]`, split by columns.
    #[shard(Sharded<1>)]
    pub weight: ShardedArray<Sharded<1>>,
    /// `[H]`, split like the output columns.
    #[shard(Sharded<0>)]
    pub bias: ShardedArray<Sharded<0>>,
}

impl ColumnParallelLinear {
    /// `x W + b` for a replicated `x` `[T, D]`; this rank's `[T, H / n]`.
    ///
    /// The bias is added to this rank's columns only, so it is added once
    /// per output element. (The typed `add` needs equal placements; a 1-D
    /// bias broadcast over the rows is added on the local arrays.)
    pub fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<1>>> {
        let y = x.matmul(&self.weight, s)?;
        let local = y.local().add(self.bias.local(), s)?;
        ShardedArray::from_local(local, y.comm(), y.global_shape())
    }
}

/// `y = h W + b` with `W` `[H, D]` split by rows: each rank multiplies its
/// `H / n` input columns, giving a partial sum; one `all_sum` (or
/// `sum_scatter` for sequence parallelism) reduces it. The bias is added
/// after the reduction, exactly once.
#[sharded]
#[derive(Debug)]
pub struct RowParallelLinear {
    /// `[H, D]`, split by rows.
    #[shard(Sharded<0>)]
    pub weight: ShardedArray<Sharded<0>>,
    /// `[D]`, on every rank.
    #[shard(Replicated)]
    pub bias: ShardedArray<Replicated>,
}

impl RowParallelLinear {
    /// The unreduced product `h W` (no bias): what a fused layer reduces itself.
    pub fn partial(
        &self,
        h: &ShardedArray<Sharded<1>>,
        s: &Stream,
    ) -> Result<ShardedArray<Partial>> {
        h.matmul(&self.weight, s)
    }

    /// `h W + b` on every rank. Cost: one `all_sum` of `[T, D]`.
    pub fn forward(
        &self,
        h: &ShardedArray<Sharded<1>>,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        let y = self.partial(h, s)?.all_sum(s)?;
        let local = y.local().add(self.bias.local(), s)?;
        ShardedArray::from_local(local, y.comm(), y.global_shape())
    }

    /// `h W + b` with the rows (tokens) scattered: rank `r` gets its chunk
    /// of rows (sequence parallelism). Cost: one `sum_scatter` of `[T, D]`,
    /// half the bytes of the `all_sum`.
    pub fn forward_scattered(
        &self,
        h: &ShardedArray<Sharded<1>>,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<0>>> {
        let y = self.partial(h, s)?.sum_scatter::<0>(s)?;
        let local = y.local().add(self.bias.local(), s)?;
        ShardedArray::from_local(local, y.comm(), y.global_shape())
    }
}
