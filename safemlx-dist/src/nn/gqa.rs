//! Grouped-query attention with rotary positions and a KV cache, heads
//! split across ranks.
//!
//! Query heads are split by the chunk rule (9 over 2 ranks: 5 + 4) and
//! each rank holds every KV head its query heads read, so a KV head whose
//! query heads fall on several ranks is held by each of them (SmolLM2's 3
//! KV heads over 2 ranks: heads 0-1 and 1-2). A rank may hold no query
//! head at all (more ranks than query heads); it adds nothing. One head
//! more than the next rank's is shared with it by query rows
//! (`shared_head.rs`), so that the attention's work evens out.
//!
//! The forward goes by the types: the replicated tokens times q, k and v
//! split by rows (heads) are `Sharded<1>` by heads; each rank attends over
//! its own heads ([`shard_map`]), in one call of MLX's fused attention per
//! run of query heads that read their KV heads evenly (two for a rank
//! holding 3 + 2 query heads of two KV heads); the heads times the output
//! projection split by columns are a `Partial` sum, reduced with one
//! `all_sum` of `[T, D]`. The KV heads held by several ranks are declared
//! blocks of copies ([`LinearWeight::blocks_of`]): while a gradient is
//! traced, each block's gradient is summed over the ranks holding it where
//! it enters computation, like every sum the typed layer inserts.

use safemlx::fast::ScaledDotProductAttentionMask;
use safemlx::{Array, Stream};

use super::grouped_sdpa;
use super::head_rows::HeadRows;
use super::head_split::HeadSplit;
use super::kv_cache::LayerKv;
use super::load_linear::load_column_block;
use super::window_cache::window_mask;
use crate::checkpoint::Weights;
use crate::error::{Error, Result};
use crate::grad::Parameters;
use crate::runtime::slice_axis;
use crate::typed::{shard_map, LinearWeight, Replicated, Sharded, ShardedArray};

/// Checks that the tokens `x` an attention layer got are the batch's
/// `[rows, dim]`.
///
/// # Errors
/// Another shape, named beside the expected one.
pub(super) fn check_tokens(x: &ShardedArray<Replicated>, rows: usize, dim: usize) -> Result<()> {
    let (rows, d) = (rows as i32, dim as i32);
    if x.global_shape() != [rows, d] {
        return Err(Error::Shape(format!(
            "attention takes the batch's tokens [{rows}, {d}], got {:?}",
            x.global_shape()
        )));
    }
    Ok(())
}

/// Rotary position embedding, as MLX's fused `fast::rope` applies it.
#[derive(Debug, Clone)]
pub struct Rope {
    /// Feature dimensions rotated: the head dimension, or its leading part
    /// (GLM-4-MoE's `partial_rotary_factor`).
    pub dims: i32,
    /// `rotate_half` pairs (Hugging Face Llama) when false; interleaved when true.
    pub traditional: bool,
    /// The frequency base (`rope_theta`); `None` when `freqs` are given.
    pub base: Option<f32>,
    /// Position scale (`1 / factor` for linear scaling).
    pub scale: f32,
    /// Per-pair wavelengths (Llama 3's and YaRN's scaled frequencies).
    pub freqs: Option<Array>,
    /// A factor on the rotated dimensions of q and k (YaRN's mscale; 1).
    pub mscale: f32,
}

impl Rope {
    /// `x` `[..., head_dim]` with its first `dims` dimensions times
    /// `mscale` (as is when it is 1).
    pub(crate) fn prescale(&self, x: &Array, s: &Stream) -> Result<Array> {
        if self.mscale == 1.0 {
            return Ok(x.clone());
        }
        let width = x.shape().last().copied().unwrap_or(0);
        let factor = if width == self.dims {
            Array::from_f32(self.mscale)
        } else {
            let rotated = usize::try_from(self.dims).unwrap_or(0);
            let passed = usize::try_from(width - self.dims).unwrap_or(0);
            let mut values = vec![self.mscale; rotated];
            values.resize(rotated + passed, 1.0);
            Array::from_slice(&values, &[width])
        };
        Ok(x.multiply(factor.as_dtype(x.dtype(), s)?, s)?)
    }

    /// `x` `[1, heads, T, head_dim]` rotated for positions `offset..offset + T`.
    pub(super) fn apply(&self, x: &Array, offset: usize, s: &Stream) -> Result<Array> {
        let offset = i32::try_from(offset).map_err(|_| Error::ShapeOverflow { value: offset })?;
        let x = self.prescale(x, s)?;
        Ok(safemlx::fast::rope(
            &x,
            self.dims,
            self.traditional,
            self.base,
            self.scale,
            offset,
            self.freqs.as_ref(),
            s,
        )?)
    }
}

/// The shape of one attention layer, from the model's configuration.
#[derive(Debug, Clone)]
pub struct GqaConfig {
    /// The model dimension `D` (the tokens' width).
    pub dim: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Dimensions per head.
    pub head_dim: usize,
    /// Biases on the q, k and v projections (Qwen2).
    pub qkv_bias: bool,
    /// A bias on the output projection (gpt-oss; Llama's
    /// `attention_bias`), added once, after the `all_sum`.
    pub o_bias: bool,
    /// A learned logit per query head that joins each query's softmax as
    /// one more key with no value (gpt-oss's attention sinks).
    pub sinks: bool,
    /// RMSNorm of each query and key head before the rotation (Qwen3).
    pub qk_norm: bool,
    /// Epsilon of the q/k norms.
    pub norm_eps: f32,
    /// The rotation.
    pub rope: Rope,
    /// A sliding window: each query sees its last `window` positions
    /// (itself included); `None`: every position before it.
    pub window: Option<usize>,
}

/// Where an attention layer's tensors are under its prefix: stems, read
/// as `{stem}.weight` (and `{stem}.bias`). Each model family names its
/// own (`models/`); `nn` knows only the layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionNames {
    /// q, k and v.
    pub qkv: Qkv,
    /// The output projection `[D, H hd]`.
    pub o: &'static str,
    /// The per-head query norm `[hd]`, when the configuration has q/k norms.
    pub q_norm: &'static str,
    /// The per-head key norm `[hd]`.
    pub k_norm: &'static str,
    /// The sinks `[H]` (a tensor, not a stem), when the configuration has them.
    pub sinks: &'static str,
}

/// How a checkpoint stores q, k and v.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qkv {
    /// Three tensors `[H hd, D]`, `[H_kv hd, D]`, `[H_kv hd, D]`.
    Separate([&'static str; 3]),
    /// One tensor `[(H + 2 H_kv) hd, D]`: the query heads' rows, then the
    /// keys', then the values' (Phi-3's `qkv_proj`). Each rank reads only
    /// its heads' rows of each third.
    Fused(&'static str),
}

/// One rank's part of a grouped-query attention layer: its heads' rows of
/// q, k and v (`[out, D]`, float or quantized), their biases, and its
/// heads' columns of the output projection; the q/k norm weights on every
/// rank. Float weights are trainable, quantized ones frozen.
#[derive(Debug, Parameters)]
pub struct GqaAttention {
    #[parameters(skip)]
    config: GqaConfig,
    #[parameters(skip)]
    split: HeadSplit,
    /// This rank's query heads in runs of even grouping (one fused
    /// attention call each; see [`HeadSplit::segments`]), and the head it
    /// shares by rows.
    #[parameters(skip)]
    runs: grouped_sdpa::Runs,
    q: LinearWeight<Sharded<0>>,
    k: LinearWeight<Sharded<0>>,
    v: LinearWeight<Sharded<0>>,
    o: LinearWeight<Sharded<1>>,
    q_bias: Option<ShardedArray<Sharded<0>>>,
    k_bias: Option<ShardedArray<Sharded<0>>>,
    v_bias: Option<ShardedArray<Sharded<0>>>,
    q_norm: Option<ShardedArray<Replicated>>,
    k_norm: Option<ShardedArray<Replicated>>,
    /// `[D]`, on every rank: added after the sum.
    o_bias: Option<ShardedArray<Replicated>>,
    /// `[1, H]`, this rank's query heads' sinks.
    sinks: Option<ShardedArray<Sharded<1>>>,
}

impl GqaAttention {
    /// Reads this rank's heads of the tensors `names` gives (`[out, in]`,
    /// `.weight`, and `.bias` when the configuration has biases), and the
    /// q/k norm weights when it has them: only this rank's rows of q, k,
    /// v (of each third of a fused tensor) and its columns of o. Tensors
    /// the checkpoint stores quantized stay quantized.
    ///
    /// # Errors
    /// A head split that cannot be (see [`HeadSplit::new`]), a missing
    /// tensor, a tensor whose shape disagrees with the configuration (the
    /// message names it), or a quantized output projection whose heads
    /// cut its quantization groups.
    pub fn load(
        w: &Weights,
        names: &AttentionNames,
        config: &GqaConfig,
        s: &Stream,
    ) -> Result<Self> {
        let comm = w.comm();
        let group = config.heads / config.kv_heads.max(1);
        let counts = w.lengths(config.heads);
        let all = HeadSplit::of_counts(config.heads, config.kv_heads, &counts)?;
        let all = HeadSplit::balance(all, group);
        let split = all[comm.rank()];
        let shape = (config.heads, config.kv_heads, config.head_dim);
        let [query, kv] = HeadRows::of(shape, &all, comm.rank())?;
        let (hd, d) = (config.head_dim, config.dim);
        let (q_out, kv_out) = (config.heads * hd, config.kv_heads * hd);
        // Each part's weight and bias tensors, its first row there, and
        // the tensors' rows.
        let (stems, offsets, rows) = match names.qkv {
            Qkv::Separate(stems) => (stems, [0; 3], [q_out, kv_out, kv_out]),
            Qkv::Fused(stem) => (
                [stem; 3],
                [0, q_out, q_out + kv_out],
                [q_out + 2 * kv_out; 3],
            ),
        };
        let part = |i: usize, suffix: &str| (format!("{}.{suffix}", stems[i]), offsets[i]);
        let weight = |rows_of: &HeadRows, i: usize| {
            let (name, offset) = part(i, "weight");
            rows_of.weight(w, (&name, offset), [rows[i], d], s)
        };
        let bias = |rows_of: &HeadRows, i: usize| {
            let (name, offset) = part(i, "bias");
            config
                .qkv_bias
                .then(|| rows_of.bias(w, (&name, offset), rows[i], s))
                .transpose()
        };
        let norm = |name: &str| -> Result<Option<ShardedArray<Replicated>>> {
            Ok(config
                .qk_norm
                .then(|| w.full(name, &[hd], s))
                .transpose()?
                .map(|a| ShardedArray::replicated(a, comm)))
        };
        Ok(Self {
            config: config.clone(),
            split,
            runs: grouped_sdpa::Runs::of(&split, group),
            q: weight(&query, 0)?,
            k: weight(&kv, 1)?,
            v: weight(&kv, 2)?,
            o: query.columns(
                load_column_block(
                    w,
                    &format!("{}.weight", names.o),
                    [d, q_out],
                    query.mine,
                    &query.split,
                    s,
                )?,
                hd,
            )?,
            q_bias: bias(&query, 0)?,
            k_bias: bias(&kv, 1)?,
            v_bias: bias(&kv, 2)?,
            q_norm: norm(&format!("{}.weight", names.q_norm))?,
            k_norm: norm(&format!("{}.weight", names.k_norm))?,
            o_bias: config
                .o_bias
                .then(|| w.full(&format!("{}.bias", names.o), &[d], s))
                .transpose()?
                .map(|b| ShardedArray::replicated(b, comm)),
            sinks: config
                .sinks
                .then(|| {
                    let (first, count) = split.query;
                    let per_rank: Vec<usize> = query.split.iter().map(|rows| rows / hd).collect();
                    let local = w.rows(names.sinks, &[config.heads], &[(first, count)], s)?;
                    let local = local.reshape(&[1, count as i32], s)?;
                    let global = [1, per_rank.iter().sum::<usize>() as i32];
                    let sinks = ShardedArray::from_local_split(local, comm, &global, &per_rank)?;
                    query.entries(sinks, 1)
                })
                .transpose()?,
        })
    }

    /// Whether any projection stays quantized.
    pub fn is_quantized(&self) -> bool {
        self.q.is_quantized()
            || self.k.is_quantized()
            || self.v.is_quantized()
            || self.o.is_quantized()
    }

    /// This rank's query heads as its attention runs them.
    pub(super) fn runs(&self) -> &grouped_sdpa::Runs {
        &self.runs
    }

    /// The heads this rank holds.
    pub fn split(&self) -> HeadSplit {
        self.split
    }

    /// The layer's shape.
    pub fn config(&self) -> &GqaConfig {
        &self.config
    }

    /// Bytes of this rank's weights.
    pub fn nbytes(&self) -> usize {
        let weights = [&self.q, &self.k, &self.v].map(LinearWeight::nbytes);
        let biases = [&self.q_bias, &self.k_bias, &self.v_bias];
        let biases = biases.into_iter().flatten().map(|b| b.local().nbytes());
        let norms = [&self.q_norm, &self.k_norm, &self.o_bias];
        let norms = norms.into_iter().flatten().map(|b| b.local().nbytes());
        let sinks = self.sinks.as_ref().map_or(0, |a| a.local().nbytes());
        weights.iter().sum::<usize>() + self.o.nbytes() + biases.chain(norms).sum::<usize>() + sinks
    }

    /// Causal self-attention of the replicated tokens `x` `[T, D]`: the
    /// rows of a batch of sequences, each sequence's `len` rows in order,
    /// at its positions `cache.len()..` of its own `cache`, where its keys
    /// and values are appended (`batch` pairs each sequence's row count
    /// with its cache of this layer). The output is replicated. Cost: one
    /// `all_sum` of `[T, D]` for the whole batch.
    ///
    /// # Errors
    /// `x` is not `[T, D]`, rows that are not the batch's, or an MLX
    /// error.
    pub fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        batch: &mut [(usize, &mut dyn LayerKv)],
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        let rows: usize = batch.iter().map(|(len, _)| len).sum();
        self.around_heads(x, rows, s, |qkv, sinks, norms| {
            let sinks = sinks.as_ref();
            if let [(_, cache)] = batch {
                return self.attend(qkv, (sinks, &norms), *cache, s);
            }
            // Each sequence attends over its own rows and cache.
            let mut start = 0;
            let mut outputs = Vec::with_capacity(batch.len());
            for (len, cache) in batch.iter_mut() {
                let rows = |a: &Array| slice_axis(a, 0, start, *len, s);
                let [q, k, v] = &qkv;
                let part = [rows(q)?, rows(k)?, rows(v)?];
                outputs.push(self.attend(part, (sinks, &norms), *cache, s)?);
                start += *len;
            }
            Ok(safemlx::ops::concatenate_axis(&outputs, 0, s)?)
        })
    }

    /// What every forward shares: checks `x` is `[rows, D]`, projects it
    /// to this rank's q, k and v (`[rows, heads * hd]`, `[rows, kv * hd]`),
    /// runs `heads` on them, this rank's sinks `[1, heads]` (when the
    /// layer has them) and the q/k norm weights (the attention output
    /// `[rows, heads * hd]` on this rank), then the output projection, its
    /// `all_sum` and its bias.
    pub(super) fn around_heads(
        &self,
        x: &ShardedArray<Replicated>,
        rows: usize,
        s: &Stream,
        heads: impl FnOnce([Array; 3], Option<Array>, Vec<Array>) -> Result<Array>,
    ) -> Result<ShardedArray<Replicated>> {
        check_tokens(x, rows, self.config.dim)?;
        let project = |w: &LinearWeight<Sharded<0>>, bias: &Option<ShardedArray<Sharded<0>>>| {
            let y = x.linear(w, s)?;
            match bias {
                Some(b) => y.add_bias(b, s),
                None => Ok(y),
            }
        };
        let q = project(&self.q, &self.q_bias)?;
        let k = project(&self.k, &self.k_bias)?;
        let v = project(&self.v, &self.v_bias)?;
        let norms: Vec<_> = [&self.q_norm, &self.k_norm].into_iter().flatten().collect();
        let split = q.axis_split();
        let out_spec = (q.global_shape(), split.as_deref());
        // The sinks split by heads as q, k and v do.
        let out = match &self.sinks {
            None => shard_map(
                [&q, &k, &v],
                &norms,
                out_spec,
                |qkv, norms| heads(qkv, None, norms),
                s,
            )?,
            Some(sinks) => shard_map(
                [&q, &k, &v, sinks],
                &norms,
                out_spec,
                |[q, k, v, sinks], norms| heads([q, k, v], Some(sinks), norms),
                s,
            )?,
        };
        let y = out.linear(&self.o, s)?.all_sum(s)?;
        match &self.o_bias {
            Some(b) => y.add_bias(b, s),
            None => Ok(y),
        }
    }

    /// One sequence's heads on this rank: q `[T, heads * hd]`, k and v
    /// `[T, kv * hd]` to the attention output `[T, heads * hd]`, after the
    /// q/k norms (when `norms` has them) and the rotation, with the keys
    /// and values appended to `cache`; `sinks` `[1, heads]` join each
    /// softmax.
    fn attend(
        &self,
        [q, k, v]: [Array; 3],
        (sinks, norms): (Option<&Array>, &[Array]),
        cache: &mut dyn LayerKv,
        s: &Stream,
    ) -> Result<Array> {
        let t = q.shape()[0];
        let hd = self.config.head_dim as i32;
        let (heads, kv_heads) = (self.split.query.1 as i32, self.split.kv.1 as i32);
        if heads == 0 && !crate::grad::is_tracing() {
            // More ranks than query heads: this rank holds no heads and
            // keeps no keys (its positions still count). While traced it
            // computes on empty heads instead, to take part in the
            // gradient sums its peers run, in their order.
            cache.skip(t as usize);
            return Ok(safemlx::ops::zeros_dtype(&[t, 0], q.dtype(), s)?);
        }
        // [T, heads * hd] -> [1, heads, T, hd]
        let to_heads = |y: &Array, heads: i32| -> Result<Array> {
            Ok(y.reshape(&[1, t, heads, hd], s)?
                .transpose_axes(&[0, 2, 1, 3], s)?)
        };
        let (mut q, mut k, v) = (
            to_heads(&q, heads)?,
            to_heads(&k, kv_heads)?,
            to_heads(&v, kv_heads)?,
        );
        if let [q_norm, k_norm] = norms {
            q = safemlx::fast::rms_norm(&q, q_norm, self.config.norm_eps, s)?;
            k = safemlx::fast::rms_norm(&k, k_norm, self.config.norm_eps, s)?;
        }
        let offset = cache.len();
        let q = self.config.rope.apply(&q, offset, s)?;
        let k = self.config.rope.apply(&k, offset, s)?;
        let (mut keys, mut values) = cache.append(&k, &v, s)?;
        let scale = 1.0 / (self.config.head_dim as f32).sqrt();
        // A window mask only when some held key is outside a query's
        // window: otherwise causal attention is the same. One query (a
        // decode step) reads its window's keys instead.
        let first = cache.first_held();
        let window = match self.config.window {
            Some(w) if offset + t as usize - 1 - first.min(offset) >= w => {
                if t == 1 {
                    let held = usize::try_from(keys.shape()[2]).unwrap_or(0);
                    let last = |a: &Array| slice_axis(a, 2, held - w, w, s);
                    (keys, values) = (last(&keys)?, last(&values)?);
                    None
                } else {
                    Some(window_mask((offset, t), (first, &keys), w)?)
                }
            }
            _ => None,
        };
        let mask = match &window {
            Some(allowed) => Some(ScaledDotProductAttentionMask::Array(allowed)),
            None => (t > 1).then_some(ScaledDotProductAttentionMask::Causal),
        };
        let sinks = sinks.map(|a| a.reshape(&[heads], s)).transpose()?;
        let out = grouped_sdpa::attention(
            self.runs(),
            [&q, &keys, &values],
            scale,
            mask.as_ref(),
            sinks.as_ref(),
            s,
        )?;
        // [1, heads, T, hd] -> [T, heads * hd]
        Ok(out
            .transpose_axes(&[0, 2, 1, 3], s)?
            .reshape(&[t, heads * hd], s)?)
    }
}
