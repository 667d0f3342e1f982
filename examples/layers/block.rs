//! A transformer block: RMSNorm, sharded attention, RMSNorm, MLP or MoE,
//! with residual connections.

use safemlx::{Array, Stream};

use safemlx_dist::nn::{Moe, MoeConfig};

use super::{ShardedAttention, SwiGluMlp};
use safemlx_dist::checkpoint::Weights;
use safemlx_dist::typed::{Ragged, Replicated, Sharded, ShardedArray};
use safemlx_dist::Result;

/// The norms' epsilon of a block built by [`TransformerBlock::load`].
pub const DEFAULT_EPS: f32 = 1e-5;

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
    /// A mixture of experts (see [`Moe::forward`] and [`Moe::forward_rows`]).
    Moe(Moe),
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
    /// Builds this rank's part of a block from `w`, each rank reading
    /// only its part. Tensor names: `attention.qkv` `[D, 3D]`,
    /// `attention.out` `[D, D]`, `attention_norm` `[D]`,
    /// `feed_forward_norm` `[D]`, and either `mlp.gate`, `mlp.up` `[D, H]`,
    /// `mlp.down` `[H, D]` or `moe.router` `[D, E]`, `moe.gate`, `moe.up`
    /// `[E, D, H]`, `moe.down` `[E, H, D]` (an expert-parallel MoE block
    /// with renormalised softmax gates, routing `top_k` experts per
    /// token). `eps` is [`DEFAULT_EPS`].
    ///
    /// # Errors
    /// A missing tensor (the message lists what the file has), or the
    /// checks of the attention and the feed-forward layer.
    pub fn load(w: &Weights, heads: usize, top_k: usize, s: &Stream) -> Result<Self> {
        let attention = ShardedAttention::load(&w.pp("attention"), heads, s)?;
        let feed_forward = if w.contains("moe.router") {
            FeedForward::Moe(Moe::load(&w.pp("moe"), MoeConfig::new(top_k), s)?)
        } else {
            FeedForward::Mlp(SwiGluMlp::load_fields(&w.pp("mlp"), s)?)
        };
        let d = attention.dim();
        Ok(Self {
            attention,
            feed_forward,
            attention_norm: w.full("attention_norm", &[d], s)?,
            feed_forward_norm: w.full("feed_forward_norm", &[d], s)?,
            eps: DEFAULT_EPS,
        })
    }

    /// The block's full weights under the names
    /// [`load`](Self::load) reads, after `prefix`:
    /// what [`checkpoint::save`](safemlx_dist::checkpoint::save) writes. Cost: one
    /// `all_gather` per sharded weight.
    pub fn gather_full(&self, prefix: &str, s: &Stream) -> Result<Vec<(String, Array)>> {
        let named = |part: &'static str, weights: Vec<(&'static str, Array)>| {
            weights
                .into_iter()
                .map(move |(name, a)| (format!("{prefix}{part}.{name}"), a))
        };
        let mut all: Vec<(String, Array)> =
            named("attention", self.attention.gather_full(s)?).collect();
        match &self.feed_forward {
            FeedForward::Mlp(mlp) => all.extend(named("mlp", mlp.gather_full(s)?)),
            FeedForward::Moe(moe) => all.extend(named("moe", moe.gather_full(s)?)),
        }
        all.push((
            format!("{prefix}attention_norm"),
            self.attention_norm.clone(),
        ));
        all.push((
            format!("{prefix}feed_forward_norm"),
            self.feed_forward_norm.clone(),
        ));
        Ok(all)
    }

    /// The block on replicated tokens; returns the tokens and the MoE's
    /// load-balancing loss (0 for an MLP block).
    ///
    /// Collectives: the attention's `all_sum`; then the MLP's `all_sum`, or
    /// for an MoE one `all_sum` (every rank routes every token and computes
    /// its own experts' slots, so every slot is computed once).
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
                let out = moe.forward(&normed, s)?;
                (out.tokens, out.aux_loss)
            }
        };
        Ok((h.add(&ff, s)?, aux))
    }

    /// The block with sequence parallelism: tokens `[T, D]` arrive and
    /// leave split by rows (`Sharded<0>`, any `T`: rows follow the chunk
    /// rule, so 3 tokens over 2 ranks are 2 + 1 and a rank may hold none).
    /// The norms and residuals run on each rank's rows only; the attention
    /// gathers the rows (`all_gather`) before its column-parallel QKV and
    /// scatters after its row-parallel output (`sum_scatter`); the MLP does
    /// the same; an MoE routes each rank's rows as they are. The same bytes
    /// move as in [`forward`](Self::forward), but activations between
    /// layers take `1/n` of the memory and the element-wise work is split.
    ///
    /// Switch per block: a model can run some blocks with this forward and
    /// others with [`forward`](Self::forward), converting between them with
    /// `x.shard::<0>()` and `x.all_gather()`.
    pub fn forward_sequence_parallel(
        &self,
        x: &ShardedArray<Sharded<0>>,
        s: &Stream,
    ) -> Result<(ShardedArray<Sharded<0>>, f32)> {
        let comm = x.comm().clone();
        let rows = |local: Array, like: &ShardedArray<Sharded<0>>| {
            ShardedArray::<Sharded<0>>::from_local(local, &comm, like.global_shape())
        };
        let normed = rows(rms_norm(x.local(), &self.attention_norm, self.eps, s)?, x)?;
        let h = x.add(&self.attention.forward_sequence_parallel(normed, s)?, s)?;
        let normed = rows(
            rms_norm(h.local(), &self.feed_forward_norm, self.eps, s)?,
            &h,
        )?;
        let (ff, aux) = match &self.feed_forward {
            FeedForward::Mlp(mlp) => (mlp.forward_sequence_parallel(normed, s)?, 0.0),
            FeedForward::Moe(moe) => {
                let tokens = ShardedArray::<Ragged>::from_local(
                    normed.local().clone(),
                    &comm,
                    normed.local().shape(),
                )?;
                let out = moe.forward_rows(&tokens, s)?;
                (rows(out.tokens.local().clone(), &h)?, out.aux_loss)
            }
        };
        Ok((h.add(&ff, s)?, aux))
    }
}
