//! The tensor-parallel SwiGLU MLP, one layer for float and quantized
//! weights.

use safemlx::{Array, Stream};

use super::load_linear::{load_columns, load_row_block, load_rows};
use crate::checkpoint::Weights;
use crate::error::{Error, Result};
use crate::grad::Parameters;
use crate::typed::{split_part, LinearWeight, Partial, Replicated, Sharded, ShardedArray};

/// Where an MLP's tensors are under its prefix: stems, read as
/// `{stem}.weight`. Each model family names its own (`models/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlpNames {
    /// Gate and up.
    pub gate_up: GateUp,
    /// Down `[D, H]`.
    pub down: &'static str,
}

/// How a checkpoint stores an MLP's gate and up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateUp {
    /// Two tensors `[H, D]`: gate, up.
    Separate([&'static str; 2]),
    /// One tensor `[2 H, D]`, gate's rows then up's (Phi-3's
    /// `gate_up_proj`). Each rank reads only its rows of each half.
    Fused(&'static str),
}

/// `down(silu(x gateᵀ) * (x upᵀ))` with the weights `[out, in]` as
/// checkpoints store them, float or quantized ([`LinearWeight`]): `gate`
/// and `up` `[H, D]` split by rows (column parallel), `down` `[D, H]` by
/// columns (row parallel), so the forward goes `Replicated` -> `Sharded<1>`
/// -> `Partial` by the types and ends in one `all_sum` of `[T, D]` (or one
/// `sum_scatter` in the sequence-parallel forward).
///
/// The hidden dimension `H` is split by the chunk rule applied to `down`'s
/// quantization groups (to elements when `down` is float), so each rank's
/// columns of `down` are whole groups and uneven splits are allowed. A
/// rank with no hidden columns (more ranks than groups) adds zeros.
/// Float weights are trainable; quantized ones stay frozen.
#[derive(Debug, Parameters)]
pub struct Mlp {
    /// This rank's rows of `gate` `[H, D]`.
    pub gate: LinearWeight<Sharded<0>>,
    /// This rank's rows of `up` `[H, D]`.
    pub up: LinearWeight<Sharded<0>>,
    /// This rank's columns of `down` `[D, H]`.
    pub down: LinearWeight<Sharded<1>>,
}

impl Mlp {
    /// Reads this rank's part of the tensors `names` gives: gate and up
    /// (`[H, D]` each, or one fused `[2 H, D]`) and down (`[D, H]`), for
    /// `D` = `dim` and `H` = `hidden`: only its rows of gate and up (of
    /// each half of a fused tensor) and its columns of down. Tensors the
    /// checkpoint stores quantized stay quantized.
    ///
    /// # Errors
    /// A missing tensor, one whose shape is not the configuration's, or a
    /// failed read.
    pub fn load(
        w: &Weights,
        names: &MlpNames,
        (dim, hidden): (usize, usize),
        s: &Stream,
    ) -> Result<Self> {
        let down = format!("{}.weight", names.down);
        let split = Self::hidden_split(w, &down, hidden);
        let (first, count) = split_part(&split, w.comm().rank());
        let (gate, up) = match names.gate_up {
            GateUp::Separate([gate, up]) => {
                let rows =
                    |stem: &str| load_rows(w, &format!("{stem}.weight"), [hidden, dim], &split, s);
                (rows(gate)?, rows(up)?)
            }
            GateUp::Fused(stem) => {
                let name = format!("{stem}.weight");
                let half = |offset: usize| {
                    let rows = (offset + first, count);
                    load_row_block(w, &name, [2 * hidden, dim], rows, &split, s)
                };
                (half(0)?, half(hidden)?)
            }
        };
        Ok(Self {
            gate,
            up,
            down: load_columns(w, &down, [dim, hidden], &split, s)?,
        })
    }

    /// Every rank's hidden columns: the chunk rule (or the weights'
    /// shares, `Weights::with_shares`) applied to `down`'s quantization
    /// groups (to elements when it is float).
    fn hidden_split(w: &Weights, down: &str, hidden: usize) -> Vec<usize> {
        let unit = w.quantization(down).map_or(1, |f| f.group_size);
        w.lengths(hidden / unit).iter().map(|c| c * unit).collect()
    }

    /// This rank's part of full float weights `gate`, `up` `[H, D]` and
    /// `down` `[D, H]` (the same on every rank), split by the chunk rule
    /// over `H`. No communication.
    ///
    /// # Errors
    /// Weights that are not 2-D or whose shapes do not meet (named).
    pub fn from_full(
        comm: &crate::runtime::Group,
        gate: Array,
        up: Array,
        down: Array,
        s: &Stream,
    ) -> Result<Self> {
        let meet = match gate.shape() {
            &[h, d] => up.shape() == [h, d] && down.shape() == [d, h],
            _ => false,
        };
        if !meet {
            return Err(Error::Shape(format!(
                "an MLP takes gate and up [H, D] and down [D, H]; got gate {:?}, up {:?}, down {:?}",
                gate.shape(),
                up.shape(),
                down.shape()
            )));
        }
        let rows = |a: Array| -> Result<LinearWeight<Sharded<0>>> {
            Ok(LinearWeight::Float(
                ShardedArray::replicated(a, comm).shard::<0>(s)?,
            ))
        };
        Ok(Self {
            gate: rows(gate)?,
            up: rows(up)?,
            down: LinearWeight::Float(ShardedArray::replicated(down, comm).shard::<1>(s)?),
        })
    }

    /// The MLP on replicated tokens `[T, D]`; the output is replicated.
    /// Cost: one `all_sum` of `[T, D]`.
    ///
    /// # Errors
    /// `x` is not `[T, D]`, or an MLX error.
    pub fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        self.forward_partial(x, s)?.all_sum(s)
    }

    /// The MLP on replicated tokens before its reduction: this rank's
    /// partial sum, for a caller that adds other partial sums before one
    /// `all_sum` (the shared experts of an MoE).
    ///
    /// # Errors
    /// `x` is not `[T, D]`, a rank without hidden columns while a gradient
    /// is traced, or an MLX error.
    pub fn forward_partial(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Partial>> {
        let &[t, d] = x.global_shape() else {
            return Err(Error::Shape(format!(
                "the MLP takes tokens [T, D], got {:?}",
                x.global_shape()
            )));
        };
        let [_, dim] = self.gate.global_shape();
        if d as usize != dim {
            return Err(Error::Shape(format!(
                "the MLP takes tokens [T, {dim}], got {:?}",
                x.global_shape()
            )));
        }
        if self.hidden().1 > 0 {
            let hidden = x
                .linear(&self.gate, s)?
                .silu(s)?
                .mul(&x.linear(&self.up, s)?, s)?;
            return hidden.linear(&self.down, s);
        }
        if crate::grad::is_tracing() {
            // Its peers' backward passes would wait for this rank's
            // gradient sum of `x`, which a constant share never runs.
            let [_, h] = self.down.global_shape();
            return Err(Error::Shape(format!(
                "rank {} holds none of the MLP's {h} hidden columns, so it cannot take part in a gradient; train on fewer ranks",
                x.comm().rank()
            )));
        }
        ShardedArray::<Partial>::zeros(x.comm(), &[t, d], x.local().dtype(), s)
    }

    /// Sequence parallel: tokens arrive split by rows (`Sharded<0>`), are
    /// gathered for the column-parallel half (one `all_gather`), and leave
    /// split by rows again through a `sum_scatter` instead of an `all_sum`.
    ///
    /// # Errors
    /// See [`forward_partial`](Self::forward_partial).
    pub fn forward_sequence_parallel(
        &self,
        x: ShardedArray<Sharded<0>>,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<0>>> {
        self.forward_partial(&x.all_gather(s)?, s)?
            .sum_scatter::<0>(s)
    }

    /// This rank's hidden columns `(first, count)`: its columns of `down`.
    pub fn hidden(&self) -> (usize, usize) {
        let split = self.down.axis_split().unwrap_or_default();
        split_part(&split, self.down.comm().rank())
    }

    /// Whether any of the three weights stays quantized.
    pub fn is_quantized(&self) -> bool {
        self.gate.is_quantized() || self.up.is_quantized() || self.down.is_quantized()
    }

    /// Bytes of this rank's weights.
    pub fn nbytes(&self) -> usize {
        self.gate.nbytes() + self.up.nbytes() + self.down.nbytes()
    }
}
