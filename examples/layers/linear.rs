//! Column- and row-parallel linear layers, with or without a bias (Llama's
//! projections have none).

use safemlx::{Array, Stream};

use safemlx_dist::typed::{
    gather_weight, shard_weight, Partial, Replicated, Sharded, ShardedArray,
};
use safemlx_dist::Group;
use safemlx_dist::Result;

/// `y = x W (+ b)` with `W` `[D, H]` split by columns: rank `r` computes its
/// `H / n` output columns. No communication; the output is `Sharded<1>`,
/// ready for a nonlinearity and a [`RowParallelLinear`].
#[derive(Debug)]
pub struct ColumnParallelLinear {
    /// `[D, H]`, split by columns.
    pub weight: ShardedArray<Sharded<1>>,
    /// `[H]`, split like the output columns, when the layer has one.
    pub bias: Option<ShardedArray<Sharded<0>>>,
}

impl ColumnParallelLinear {
    /// This rank's columns of the full `weight` `[D, H]` and `bias` `[H]`.
    ///
    /// # Errors
    /// A weight without axis 1, or an MLX error.
    pub fn from_full(
        group: &Group,
        weight: Array,
        bias: Option<Array>,
        s: &Stream,
    ) -> Result<Self> {
        Ok(Self {
            weight: shard_weight(weight, group, 1, "weight", s)?,
            bias: bias
                .map(|b| shard_weight(b, group, 1, "bias", s))
                .transpose()?,
        })
    }

    /// The full weight and bias again (one `all_gather` each).
    ///
    /// # Errors
    /// An MLX error.
    pub fn gather_full(&self, s: &Stream) -> Result<(Array, Option<Array>)> {
        let bias = self
            .bias
            .as_ref()
            .map(|b| gather_weight(b, 1, s))
            .transpose()?;
        Ok((gather_weight(&self.weight, 1, s)?, bias))
    }

    /// `x W (+ b)` for a replicated `x` `[T, D]`; this rank's `[T, H / n]`.
    ///
    /// The bias is added to this rank's columns only, so it is added once
    /// per output element. (The typed `add` needs equal placements; a 1-D
    /// bias broadcast over the rows is added on the local arrays.)
    ///
    /// # Errors
    /// Shapes that do not multiply, or an MLX error.
    pub fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<1>>> {
        let y = x.matmul(&self.weight, s)?;
        let Some(bias) = &self.bias else {
            return Ok(y);
        };
        let local = y.local().add(bias.local(), s)?;
        ShardedArray::from_local(local, y.comm(), y.global_shape())
    }
}

/// `y = h W (+ b)` with `W` `[H, D]` split by rows: each rank multiplies
/// its `H / n` input columns, giving a partial sum; one `all_sum` (or
/// `sum_scatter` for sequence parallelism) reduces it. The bias is added
/// after the reduction, exactly once.
#[derive(Debug)]
pub struct RowParallelLinear {
    /// `[H, D]`, split by rows.
    pub weight: ShardedArray<Sharded<0>>,
    /// `[D]`, on every rank, when the layer has one.
    pub bias: Option<ShardedArray<Replicated>>,
}

impl RowParallelLinear {
    /// This rank's rows of the full `weight` `[H, D]`, and the `bias` `[D]`.
    ///
    /// # Errors
    /// A weight without axis 0, or an MLX error.
    pub fn from_full(
        group: &Group,
        weight: Array,
        bias: Option<Array>,
        s: &Stream,
    ) -> Result<Self> {
        Ok(Self {
            weight: shard_weight(weight, group, 1, "weight", s)?,
            bias: bias.map(|b| ShardedArray::replicated(b, group)),
        })
    }

    /// The full weight (one `all_gather`) and bias again.
    ///
    /// # Errors
    /// An MLX error.
    pub fn gather_full(&self, s: &Stream) -> Result<(Array, Option<Array>)> {
        let bias = self.bias.as_ref().map(|b| b.local().clone());
        Ok((gather_weight(&self.weight, 1, s)?, bias))
    }

    /// The unreduced product `h W` (no bias): what a fused layer reduces itself.
    ///
    /// # Errors
    /// Shapes that do not multiply, or an MLX error.
    pub fn partial(
        &self,
        h: &ShardedArray<Sharded<1>>,
        s: &Stream,
    ) -> Result<ShardedArray<Partial>> {
        h.matmul(&self.weight, s)
    }

    fn add_bias<P: safemlx_dist::typed::Placement>(
        &self,
        y: ShardedArray<P>,
        s: &Stream,
    ) -> Result<ShardedArray<P>> {
        let Some(bias) = &self.bias else {
            return Ok(y);
        };
        let local = y.local().add(bias.local(), s)?;
        ShardedArray::from_local(local, y.comm(), y.global_shape())
    }

    /// `h W (+ b)` on every rank. Cost: one `all_sum` of `[T, D]`.
    ///
    /// # Errors
    /// Shapes that do not multiply, or an MLX error.
    pub fn forward(
        &self,
        h: &ShardedArray<Sharded<1>>,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        self.add_bias(self.partial(h, s)?.all_sum(s)?, s)
    }

    /// `h W (+ b)` with the rows (tokens) scattered: rank `r` gets its chunk
    /// of rows (sequence parallelism). Cost: one `sum_scatter` of `[T, D]`,
    /// half the bytes of the `all_sum`.
    ///
    /// # Errors
    /// Shapes that do not multiply, or an MLX error.
    pub fn forward_scattered(
        &self,
        h: &ShardedArray<Sharded<1>>,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<0>>> {
        self.add_bias(self.partial(h, s)?.sum_scatter::<0>(s)?, s)
    }
}
