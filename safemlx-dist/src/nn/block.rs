//! A transformer block: RMSNorm, sharded attention, RMSNorm, MLP or MoE,
//! with residual connections.

use safemlx::{Array, Stream};

use super::{ExpertParallelMoe, ShardedAttention, SwiGluMlp};
use crate::error::Result;
use crate::typed::{Ragged, Replicated, ShardedArray};

/// `x / sqrt(mean(x^2) + eps) * weight` over the last axis.
pub fn rms_norm(x: &Array, weight: &Array, eps: f32, s: &Stream) -> Result<Array> {
    let mean = x.multiply(x, s)?.mean_axis(-1, true, s)?;
    let inv = mean.add(Array::from_f32(eps), s)?.rsqrt(s)?;
    Ok(x.multiply(&inv, s)?.multiply(weight, s)?)
}

/// The feed-forward half of a block.
#[derive(Debug)]
pub enum FeedForward {
    /// Tensor-parallel SwiGLU MLP on replicated tokens.
    Mlp(SwiGluMlp),
    /// Expert-parallel MoE: each rank routes its chunk of the tokens.
    Moe(ExpertParallelMoe),
}

/// `h = x + attention(norm(x))`, `y = h + ffn(norm(h))`, on replicated
/// tokens `[T, D]`. The norms' weights `[D]` are replicated.
#[derive(Debug)]
pub struct TransformerBlock {
    /// Sharded causal attention.
    pub attention: ShardedAttention,
    /// MLP or MoE.
    pub feed_forward: FeedForward,
    /// `[D]`, the attention norm's weight.
    pub attention_norm: Array,
    /// `[D]`, the feed-forward norm's weight.
    pub feed_forward_norm: Array,
    /// The norms' epsilon.
    pub eps: f32,
}

impl TransformerBlock {
    /// The block on replicated tokens; returns the tokens and the MoE's
    /// load-balancing loss (0 for an MLP block).
    ///
    /// Collectives: the attention's `all_sum`; then the MLP's `all_sum`, or
    /// for an MoE the count exchange, two `all_to_all_v` and an
    /// `all_gather` of the rows (each rank routes only its chunk of the
    /// tokens, so every token goes through its experts once).
    pub fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<(ShardedArray<Replicated>, f32)> {
        let comm = x.comm().clone();
        let normed = ShardedArray::replicated(
            rms_norm(x.local(), &self.attention_norm, self.eps, s)?,
            &comm,
        );
        let h = x.add(&self.attention.forward(&normed, s)?, s)?;
        let normed = ShardedArray::replicated(
            rms_norm(h.local(), &self.feed_forward_norm, self.eps, s)?,
            &comm,
        );
        let (ff, aux) = match &self.feed_forward {
            FeedForward::Mlp(mlp) => (mlp.forward(&normed, s)?, 0.0),
            FeedForward::Moe(moe) => {
                let chunk = normed.shard::<0>(s)?;
                let rows = ShardedArray::<Ragged>::from_local(
                    chunk.local().clone(),
                    &comm,
                    chunk.global_shape(),
                )?;
                let out = moe.forward(&rows, s)?;
                (out.tokens.gather_rows(s)?, out.aux_loss)
            }
        };
        Ok((h.add(&ff, s)?, aux))
    }
}
