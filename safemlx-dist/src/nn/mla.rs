//! Multi-head latent attention (DeepSeek-V2/V3), heads split across
//! ranks, with a latent KV cache.
//!
//! ```text
//! q          = q_b(RMSNorm(q_a x))      or q_proj x      [T, H (nope + rope)]
//! c, k_rope  = kv_a x                                     [T, r], [T, rope]
//! latent     = RMSNorm(c)                                 cached with k_rope
//! k_h, v_h   = latent kv_b_hᵀ                             [S, nope], [S, v]
//! scores_h   = scale (q_nope_h k_hᵀ + RoPE(q_rope_h) RoPE(k_rope)ᵀ)
//! out        = o (softmax(scores_h) v_h for each head h)
//! ```
//!
//! Every rank computes the latents (`q_a`, `kv_a` and their norms are
//! replicated) and keeps the same latent cache: `r + rope` values per
//! position and layer, instead of every head's key and value. Heads split
//! by the chunk rule: a rank's rows of `q_b` (or `q_proj`) and of `kv_b`
//! are its heads', its columns of `o` too, so the output is a `Partial`
//! sum reduced with one `all_sum` of `[T, D]`, as in grouped-query
//! attention.
//!
//! A prompt (several rows) expands the cached latents to each head's keys
//! and values (`latent kv_bᵀ`); a decode step (one row) does not expand
//! the cache: it absorbs `kv_b` into the query (`q_nope_h W_k,h`, a query
//! in latent space) and into the output (`W_v,h` after attending over the
//! latents), as mlx-lm's `deepseek_v3.py` does. Both are the same sum.

use safemlx::fast::ScaledDotProductAttentionMask;
use safemlx::{Array, Stream};

use super::gqa::{check_tokens, Rope};
use super::head_split::HeadSplit;
use super::kv_cache::LayerKv;
use super::load_linear::{load_columns, load_replicated, load_rows};
use super::norm::RmsNorm;
use crate::checkpoint::Weights;
use crate::error::{Error, Result};
use crate::grad::Parameters;
use crate::runtime::slice_axis;
use crate::typed::{shard_map, LinearWeight, Replicated, Sharded, ShardedArray};

/// The shape of one latent-attention layer.
#[derive(Debug, Clone)]
pub struct MlaConfig {
    /// The model dimension `D`.
    pub dim: usize,
    /// Query heads (each with its own key and value head).
    pub heads: usize,
    /// The queries' latent; `None`: one projection `q_proj`.
    pub q_lora_rank: Option<usize>,
    /// The keys' and values' latent `r`.
    pub kv_lora_rank: usize,
    /// Per-head query and key dimensions without rotation.
    pub nope_dim: usize,
    /// Rotated dimensions (the key's are shared by all heads).
    pub rope_dim: usize,
    /// Per-head value dimensions.
    pub v_dim: usize,
    /// The softmax scale (`1 / sqrt(nope + rope)`, times YaRN's factor).
    pub scale: f32,
    /// Epsilon of the latents' norms.
    pub norm_eps: f32,
    /// The rotation of the `rope_dim` dimensions.
    pub rope: Rope,
}

/// Where a latent-attention layer's tensors are under its prefix (stems,
/// read as `{stem}.weight`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaNames {
    /// The query projection without a latent `[H (nope + rope), D]`.
    pub q: &'static str,
    /// The query latent's down projection `[q_lora_rank, D]`.
    pub q_a: &'static str,
    /// Its norm.
    pub q_a_norm: &'static str,
    /// Its up projection `[H (nope + rope), q_lora_rank]`.
    pub q_b: &'static str,
    /// The KV latent and the RoPE key `[r + rope, D]`.
    pub kv_a: &'static str,
    /// The KV latent's norm.
    pub kv_a_norm: &'static str,
    /// The KV latent's up projection `[H (nope + v), r]`: each head's key
    /// rows, then its value rows.
    pub kv_b: &'static str,
    /// mlx-lm's split of `kv_b` (see `mla_kv_b.rs`): each head's key rows
    /// transposed, `[H, r, nope]`.
    pub embed_q: &'static str,
    /// ... and its value rows, `[H, v, r]`.
    pub unembed_out: &'static str,
    /// The output projection `[D, H v]`.
    pub o: &'static str,
}

/// One rank's part of a latent-attention layer: the latent projections
/// and norms (replicated), its heads' rows of the query and `kv_b`
/// projections, and its heads' columns of the output projection.
#[derive(Debug, Parameters)]
pub struct MlaAttention {
    #[parameters(skip)]
    config: MlaConfig,
    #[parameters(skip)]
    split: HeadSplit,
    q_a: Option<LinearWeight<Replicated>>,
    q_a_norm: Option<RmsNorm>,
    q: LinearWeight<Sharded<0>>,
    kv_a: LinearWeight<Replicated>,
    kv_a_norm: ShardedArray<Replicated>,
    kv_b: ShardedArray<Sharded<0>>,
    o: LinearWeight<Sharded<1>>,
}

impl MlaAttention {
    /// Reads this rank's part of the layer's tensors (`names` under `w`'s
    /// prefix): the latent projections whole, its heads' rows of the query
    /// projection and of `kv_b`, its heads' columns of `o`.
    ///
    /// # Errors
    /// A missing tensor, one whose shape disagrees with the configuration
    /// (named), or a quantized `kv_b_proj` (absorbed into the query and
    /// the output, it is read as floats; mlx-lm's quantized split is read
    /// dequantized).
    pub fn load(w: &Weights, names: &MlaNames, config: &MlaConfig, s: &Stream) -> Result<Self> {
        let comm = w.comm();
        let c = config;
        let heads = w.lengths(c.heads);
        let split = HeadSplit::of_counts(c.heads, c.heads, &heads)?[comm.rank()];
        let rows_of = |per_head: usize| heads.iter().map(|h| h * per_head).collect::<Vec<_>>();
        let qk = c.nope_dim + c.rope_dim;
        let weight = |stem: &str| format!("{stem}.weight");
        let (q_a, q_a_norm, q) = match c.q_lora_rank {
            Some(rank) => (
                Some(load_replicated(w, &weight(names.q_a), [rank, c.dim], s)?),
                Some(RmsNorm::load(&w.pp(names.q_a_norm), rank, c.norm_eps, s)?),
                load_rows(w, &weight(names.q_b), [c.heads * qk, rank], &rows_of(qk), s)?,
            ),
            None => (
                None,
                None,
                load_rows(w, &weight(names.q), [c.heads * qk, c.dim], &rows_of(qk), s)?,
            ),
        };
        let kv_rows = c.nope_dim + c.v_dim;
        let kv_b_shape = [c.heads * kv_rows, c.kv_lora_rank];
        let dims = super::mla_kv_b::Dims {
            heads: c.heads,
            nope: c.nope_dim,
            v: c.v_dim,
            rank: c.kv_lora_rank,
        };
        let stems = [names.kv_b, names.embed_q, names.unembed_out];
        let local = super::mla_kv_b::read(w, stems, dims, split.query, s)?;
        let global = kv_b_shape.map(|d| d as i32);
        let kv_b = ShardedArray::from_local_split(local, comm, &global, &rows_of(kv_rows))?;
        let kv_a_norm = w.full(&weight(names.kv_a_norm), &[c.kv_lora_rank], s)?;
        Ok(Self {
            config: config.clone(),
            split,
            q_a,
            q_a_norm,
            q,
            kv_a: load_replicated(
                w,
                &weight(names.kv_a),
                [c.kv_lora_rank + c.rope_dim, c.dim],
                s,
            )?,
            kv_a_norm: ShardedArray::replicated(kv_a_norm, comm),
            kv_b,
            o: load_columns(
                w,
                &weight(names.o),
                [c.dim, c.heads * c.v_dim],
                &rows_of(c.v_dim),
                s,
            )?,
        })
    }

    /// The heads this rank holds (its `kv` field repeats them: each query
    /// head has its own key and value head).
    pub fn split(&self) -> HeadSplit {
        self.split
    }

    /// The layer's shape.
    pub fn config(&self) -> &MlaConfig {
        &self.config
    }

    /// Whether any projection stays quantized.
    pub fn is_quantized(&self) -> bool {
        self.q.is_quantized()
            || self.o.is_quantized()
            || self.kv_a.is_quantized()
            || self.q_a.as_ref().is_some_and(LinearWeight::is_quantized)
    }

    /// Bytes of this rank's weights.
    pub fn nbytes(&self) -> usize {
        let q_a = self.q_a.as_ref().map_or(0, LinearWeight::nbytes);
        let q_a_norm = self
            .q_a_norm
            .as_ref()
            .map_or(0, |n| n.weight.local().nbytes());
        q_a + q_a_norm
            + self.q.nbytes()
            + self.kv_a.nbytes()
            + self.kv_a_norm.local().nbytes()
            + self.kv_b.local().nbytes()
            + self.o.nbytes()
    }

    /// Causal self-attention of the replicated tokens `x` `[T, D]`, the
    /// rows of a batch of sequences (`batch` pairs each one's row count
    /// with its cache of this layer, where its latents are appended). The
    /// output is replicated. Cost: one `all_sum` of `[T, D]`.
    ///
    /// # Errors
    /// `x` is not `[T, D]`, or an MLX error.
    pub fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        batch: &mut [(usize, &mut dyn LayerKv)],
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        let rows: usize = batch.iter().map(|(len, _)| len).sum();
        self.around_heads(x, rows, s, |q, kv, norm, kv_b| {
            let mut start = 0;
            let mut outputs = Vec::with_capacity(batch.len());
            for (len, cache) in batch.iter_mut() {
                let rows = |a: &Array| slice_axis(a, 0, start, *len, s);
                let latent = self.latent(&rows(kv)?, norm, s)?;
                outputs.push(self.attend(&rows(q)?, latent, kv_b, *cache, s)?);
                start += *len;
            }
            match outputs.len() {
                1 => Ok(outputs.swap_remove(0)),
                _ => Ok(safemlx::ops::concatenate_axis(&outputs, 0, s)?),
            }
        })
    }

    /// The projections around the heads of `x` `[rows, D]`: `heads` gets
    /// this rank's queries `[rows, heads (nope + rope)]`, the replicated
    /// `kv_a x` `[rows, r + rope]` and the latent's norm, and this rank's
    /// `kv_b` rows `[heads (nope + v), r]`, and returns the heads' output
    /// `[rows, heads v]`; then the output projection and its `all_sum`.
    pub(super) fn around_heads(
        &self,
        x: &ShardedArray<Replicated>,
        rows: usize,
        s: &Stream,
        mut heads: impl FnMut(&Array, &Array, &Array, &Array) -> Result<Array>,
    ) -> Result<ShardedArray<Replicated>> {
        check_tokens(x, rows, self.config.dim)?;
        let q = match (&self.q_a, &self.q_a_norm) {
            (Some(a), Some(norm)) => norm.forward(&x.linear(a, s)?, s)?.linear(&self.q, s)?,
            _ => x.linear(&self.q, s)?,
        };
        let kv = x.linear(&self.kv_a, s)?;
        // kv_b's rows are heads: transposed, it splits like q's columns.
        let kv_b = self.kv_b.transpose(s)?;
        let v_dim = self.config.v_dim;
        let split: Vec<usize> = match self.o.axis_split() {
            Some(split) => split,
            None => vec![self.config.heads * v_dim],
        };
        let global = [rows as i32, (self.config.heads * v_dim) as i32];
        let out = shard_map(
            [&q, &kv_b],
            &[&kv, &self.kv_a_norm],
            (&global, Some(split.as_slice())),
            |[q, kv_b], replicated| {
                let [kv, norm] = replicated.as_slice() else {
                    return Err(Error::Shape("latent attention lost an input".to_owned()));
                };
                heads(&q, kv, norm, &kv_b.transpose(s)?)
            },
            s,
        )?;
        out.linear(&self.o, s)?.all_sum(s)
    }

    /// A sequence's `[T, r + rope]` rows of `kv_a x` as the normed latent
    /// `[1, 1, T, r]` and the (not yet rotated) RoPE key `[1, 1, T, rope]`.
    pub(super) fn latent(&self, kv: &Array, norm: &Array, s: &Stream) -> Result<[Array; 2]> {
        let t = kv.shape()[0];
        let (r, rope) = (self.config.kv_lora_rank, self.config.rope_dim);
        let c = slice_axis(kv, 1, 0, r, s)?;
        let c = safemlx::fast::rms_norm(&c, norm, self.config.norm_eps, s)?;
        let k_rope = slice_axis(kv, 1, r, rope, s)?;
        Ok([
            c.reshape(&[1, 1, t, r as i32], s)?,
            k_rope.reshape(&[1, 1, t, rope as i32], s)?,
        ])
    }

    /// One sequence's heads on this rank: q `[T, heads (nope + rope)]`, its
    /// latent and RoPE key, this rank's `kv_b` rows `[heads (nope + v), r]`
    /// to the attention output `[T, heads v]`, the latent and the rotated
    /// key appended to `cache`.
    fn attend(
        &self,
        q: &Array,
        [latent, k_rope]: [Array; 2],
        kv_b: &Array,
        cache: &mut dyn LayerKv,
        s: &Stream,
    ) -> Result<Array> {
        let c = &self.config;
        let t = q.shape()[0];
        let heads = self.split.query.1 as i32;
        if heads == 0 && !crate::grad::is_tracing() {
            // More ranks than heads: nothing reads this rank's latents.
            cache.skip(t as usize);
            return Ok(safemlx::ops::zeros_dtype(&[t, 0], q.dtype(), s)?);
        }
        let [nope, rope, v_dim] = [c.nope_dim, c.rope_dim, c.v_dim];
        // [T, heads (nope + rope)] -> [1, heads, T, nope + rope]
        let q = q
            .reshape(&[1, t, heads, (nope + rope) as i32], s)?
            .transpose_axes(&[0, 2, 1, 3], s)?;
        let q_nope = slice_axis(&q, 3, 0, nope, s)?;
        let offset = cache.len();
        let q_rope = c
            .rope
            .apply(&slice_axis(&q, 3, nope, rope, s)?, offset, s)?;
        let k_rope = c.rope.apply(&k_rope, offset, s)?;
        // [1, 1, S, r] and [1, 1, S, rope]
        let (latents, k_ropes) = cache.append(&latent, &k_rope, s)?;
        let allowed = (t > 1)
            .then(|| causal(t as usize, latents.shape()[2] as usize, offset))
            .transpose()?;
        let out =
            self.attend_latents([&q_nope, &q_rope], [&latents, &k_ropes], allowed, kv_b, s)?;
        // [1, heads, T, v] -> [T, heads v]
        Ok(out
            .transpose_axes(&[0, 2, 1, 3], s)?
            .reshape(&[t, heads * v_dim as i32], s)?)
    }

    /// Attention of `N` groups of rows over their latents: `q_nope` `[N,
    /// heads, T, nope]` and the rotated `q_rope` `[N, heads, T, rope]`,
    /// `latents` `[N, 1, S, r]` and rotated `k_ropes` `[N, 1, S, rope]`;
    /// `allowed` (broadcast to `[N, heads, T, S]`) the positions each row
    /// sees, all when `None`; `kv_b` this rank's rows `[heads (nope + v),
    /// r]`. One row per group (`T = 1`) absorbs `kv_b` into the query and
    /// the output; several expand the latents to keys and values. Returns
    /// `[N, heads, T, v]`.
    pub(super) fn attend_latents(
        &self,
        [q_nope, q_rope]: [&Array; 2],
        [latents, k_ropes]: [&Array; 2],
        allowed: Option<Array>,
        kv_b: &Array,
        s: &Stream,
    ) -> Result<Array> {
        let c = &self.config;
        let (heads, t) = (q_nope.shape()[1], q_nope.shape()[2]);
        let [nope, v_dim, r] = [c.nope_dim, c.v_dim, c.kv_lora_rank];
        let scale = Array::from_f32(c.scale).as_dtype(q_nope.dtype(), s)?;
        let mut rope_scores = q_rope
            .multiply(&scale, s)?
            .matmul(&k_ropes.swap_axes(2, 3, s)?, s)?;
        if let Some(allowed) = allowed {
            let lowest = Array::from_f32(f32::MIN).as_dtype(rope_scores.dtype(), s)?;
            rope_scores = safemlx::ops::r#where(&allowed, &rope_scores, &lowest, s)?;
        }
        let mask = Some(ScaledDotProductAttentionMask::Array(&rope_scores));
        // [heads (nope + v), r] -> the keys' [heads, nope, r] and the
        // values' [heads, v, r]
        let kv_b = kv_b.reshape(&[heads, (nope + v_dim) as i32, r as i32], s)?;
        let w_k = slice_axis(&kv_b, 1, 0, nope, s)?;
        let w_v = slice_axis(&kv_b, 1, nope, v_dim, s)?;
        let w_v_t = w_v.swap_axes(1, 2, s)?;
        let sdpa = safemlx::fast::scaled_dot_product_attention;
        Ok(if t == 1 {
            // Absorbed: a latent-space query attends over the latents.
            let q_latent = q_nope.matmul(&w_k, s)?;
            let out = sdpa(&q_latent, latents, latents, c.scale, mask, None, s)?;
            out.matmul(&w_v_t, s)?
        } else {
            let keys = latents.matmul(&w_k.swap_axes(1, 2, s)?, s)?;
            let values = latents.matmul(&w_v_t, s)?;
            sdpa(q_nope, &keys, &values, c.scale, mask, None, s)?
        })
    }
}

/// Which of `total` positions rows at positions `offset..offset + t` see
/// (each its own and those before), `[t, total]`.
pub(super) fn causal(t: usize, total: usize, offset: usize) -> Result<Array> {
    let allowed: Vec<bool> = (0..t)
        .flat_map(|i| (0..total).map(move |j| j <= offset + i))
        .collect();
    let dim = |v: usize| i32::try_from(v).map_err(|_| Error::ShapeOverflow { value: v });
    Ok(Array::from_slice(&allowed, &[dim(t)?, dim(total)?]))
}
