//! The `#[sharded]` SwiGLU MLP of the book's tensor-parallel chapter: the
//! demonstration of the attribute on a layer (weights `[in, out]`, read
//! under the field names). The models use [`Mlp`](super::Mlp).

use safemlx::Stream;

use safemlx_dist::checkpoint::Weights;
use safemlx_dist::sharded;
use safemlx_dist::typed::{Partial, Replicated, Sharded, ShardedArray};
use safemlx_dist::Result;

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
    /// Reads this rank's part of `gate_proj.weight`, `up_proj.weight`
    /// (`[H, D]`, `[out, in]` as checkpoints store them: its rows of `H`)
    /// and `down_proj.weight` (`[D, H]`: its columns), for `D` = `dim` and
    /// `H` = `hidden`.
    ///
    /// # Errors
    /// A missing tensor, or one whose shape is not the configuration's.
    pub fn load(w: &Weights, (dim, hidden): (usize, usize), s: &Stream) -> Result<Self> {
        let column = |name: &str| -> Result<ShardedArray<Sharded<1>>> {
            w.get::<Sharded<0>>(name, &[hidden, dim], s)?.transpose(s)
        };
        Ok(Self {
            gate: column("gate_proj.weight")?,
            up: column("up_proj.weight")?,
            down: w
                .get::<Sharded<1>>("down_proj.weight", &[dim, hidden], s)?
                .transpose(s)?,
        })
    }

    /// The MLP on replicated tokens `[T, D]`; the output is replicated.
    #[sharded(x @ Replicated, return @ Replicated)]
    pub fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        self.forward_partial(x, s)
    }

    /// The MLP on replicated tokens before its reduction: this rank's
    /// partial sum, for a caller that adds other partial sums before one
    /// `all_sum` (the shared experts of an MoE).
    pub fn forward_partial(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Partial>> {
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
