//! The tensor-parallel SwiGLU MLP.

use safemlx::Stream;

use crate::checkpoint::TensorSource;
use crate::error::Error;
use crate::typed::{chunk, Partial, Replicated, Sharded, ShardedArray};
use crate::{sharded, Group, Result};

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
    /// Reads this rank's part of the Hugging Face tensors
    /// `{prefix}gate_proj.weight`, `{prefix}up_proj.weight` (`[H, D]`: its
    /// rows of `H`) and `{prefix}down_proj.weight` (`[D, H]`: its columns),
    /// for `D` = `dim` and `H` = `hidden`.
    ///
    /// # Errors
    /// A missing tensor, or one whose shape is not the configuration's.
    pub fn from_hf(
        group: &Group,
        dir: &dyn TensorSource,
        prefix: &str,
        (dim, hidden): (usize, usize),
        s: &Stream,
    ) -> Result<Self> {
        let part = chunk(hidden, group.rank(), group.size());
        let (d, h) = (dim as i32, hidden as i32);
        let check = |name: &str, want: [i32; 2]| -> Result<String> {
            let name = format!("{prefix}{name}");
            let shape = &dir.shape(&name)?;
            if shape.as_slice() != want {
                return Err(Error::Model {
                    path: dir.path().display().to_string(),
                    message: format!(
                        "tensor `{name}` has shape {shape:?} but the configuration gives {want:?}"
                    ),
                });
            }
            Ok(name)
        };
        let column = |name: &str| -> Result<ShardedArray<Sharded<1>>> {
            let name = check(name, [h, d])?;
            let rows = dir.read_rows(&name, &[part], s)?.transpose(s)?;
            ShardedArray::from_local(rows, group, &[d, h])
        };
        let gate = column("gate_proj.weight")?;
        let up = column("up_proj.weight")?;
        let name = check("down_proj.weight", [d, h])?;
        let down = dir.read_columns(&name, &[part], s)?.transpose(s)?;
        Ok(Self {
            gate,
            up,
            down: ShardedArray::from_local(down, group, &[h, d])?,
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
