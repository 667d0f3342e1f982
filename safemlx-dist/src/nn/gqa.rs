//! Grouped-query attention with rotary positions and a KV cache, heads
//! split across ranks.
//!
//! Query heads follow their KV head: with `n` ranks and `kv` KV heads,
//!
//! - `n <= kv`: KV heads are split by the chunk rule (uneven allowed: 3 KV
//!   heads over 2 ranks are 2 + 1), each rank taking every query head of
//!   its KV heads;
//! - `n > kv`: ranks are split over the KV heads by the chunk rule, each
//!   rank holding one KV head (replicated on the ranks that share it) and
//!   its chunk of that head's query heads. A rank may then hold no query
//!   head at all (more ranks than query heads); it adds nothing.
//!
//! Each rank's output projection is a partial sum over its heads, reduced
//! with one `all_sum` of `[T, D]`.

use safemlx::fast::ScaledDotProductAttentionMask;
use safemlx::{Array, Stream};

use super::head_split::HeadSplit;
use super::kv_cache::LayerCache;
use super::Projection;
use crate::checkpoint::Weights;
use crate::error::{Error, Result};
use crate::runtime::Group;
use crate::typed::{chunk, Partial, Replicated, ShardedArray};

/// Rotary position embedding, as MLX's fused `fast::rope` applies it.
#[derive(Debug, Clone)]
pub struct Rope {
    /// Feature dimensions rotated (the head dimension).
    pub dims: i32,
    /// `rotate_half` pairs (Hugging Face Llama) when false; interleaved when true.
    pub traditional: bool,
    /// The frequency base (`rope_theta`); `None` when `freqs` are given.
    pub base: Option<f32>,
    /// Position scale (`1 / factor` for linear scaling).
    pub scale: f32,
    /// Per-pair wavelengths (Llama 3's scaled frequencies).
    pub freqs: Option<Array>,
}

impl Rope {
    /// `x` `[1, heads, T, head_dim]` rotated for positions `offset..offset + T`.
    fn apply(&self, x: &Array, offset: usize, s: &Stream) -> Result<Array> {
        let offset = i32::try_from(offset).map_err(|_| Error::ShapeOverflow { value: offset })?;
        Ok(safemlx::fast::rope(
            x,
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
    /// RMSNorm of each query and key head before the rotation (Qwen3).
    pub qk_norm: bool,
    /// Epsilon of the q/k norms.
    pub norm_eps: f32,
    /// The rotation.
    pub rope: Rope,
}

/// One rank's part of a grouped-query attention layer.
#[derive(Debug)]
pub struct GqaAttention {
    config: GqaConfig,
    split: HeadSplit,
    /// Ranks of the group the heads are split over.
    group_size: usize,
    /// This rank's rows (heads) of q `[q * hd, D]`, k and v `[kv * hd, D]`.
    q: Projection,
    k: Projection,
    v: Projection,
    /// `[q * hd]`, `[kv * hd]`, `[kv * hd]` when the model has them.
    biases: Option<[Array; 3]>,
    /// `[hd]` each, when the model has q/k norms.
    norms: Option<[Array; 2]>,
    /// This rank's columns (heads) of the output projection `[D, q * hd]`.
    o: Projection,
}

impl GqaAttention {
    /// Reads this rank's heads of `{q,k,v,o}_proj.weight` (`[out, in]`),
    /// the biases and the `q_norm`/`k_norm` weights when the configuration
    /// has them: only this rank's rows of q, k, v and its columns of o.
    /// Tensors the checkpoint stores quantized stay quantized.
    ///
    /// # Errors
    /// A head split that cannot be (see [`HeadSplit::new`]), a missing
    /// tensor, a tensor whose shape disagrees with the configuration (the
    /// message names it), or a quantized output projection whose heads
    /// cut its quantization groups.
    pub fn load(w: &Weights, config: &GqaConfig, s: &Stream) -> Result<Self> {
        let group = w.comm();
        let split = HeadSplit::new(config.heads, config.kv_heads, group.rank(), group.size())?;
        let (hd, d) = (config.head_dim, config.dim);
        let (q_out, kv_out) = (config.heads * hd, config.kv_heads * hd);
        let rows = |(first, count): (usize, usize)| [(first * hd, count * hd)];
        let q = Projection::rows(w, "q_proj.weight", [q_out, d], &rows(split.query), s)?;
        let k = Projection::rows(w, "k_proj.weight", [kv_out, d], &rows(split.kv), s)?;
        let v = Projection::rows(w, "v_proj.weight", [kv_out, d], &rows(split.kv), s)?;
        let o = Projection::columns(w, "o_proj.weight", [d, q_out], &rows(split.query), s)?;
        let biases = if config.qkv_bias {
            let bias = |name: &str, heads, total: usize| w.rows(name, &[total], &rows(heads), s);
            Some([
                bias("q_proj.bias", split.query, q_out)?,
                bias("k_proj.bias", split.kv, kv_out)?,
                bias("v_proj.bias", split.kv, kv_out)?,
            ])
        } else {
            None
        };
        let norms = if config.qk_norm {
            Some([
                w.full("q_norm.weight", &[hd], s)?,
                w.full("k_norm.weight", &[hd], s)?,
            ])
        } else {
            None
        };
        Ok(Self {
            config: config.clone(),
            split,
            group_size: group.size(),
            q,
            k,
            v,
            biases,
            norms,
            o,
        })
    }

    /// Whether any projection stays quantized.
    pub fn is_quantized(&self) -> bool {
        [&self.q, &self.k, &self.v, &self.o]
            .iter()
            .any(|p| p.is_quantized())
    }

    /// The heads this rank holds.
    pub fn split(&self) -> HeadSplit {
        self.split
    }

    /// Bytes of this rank's weights.
    pub fn nbytes(&self) -> usize {
        let projections = [&self.q, &self.k, &self.v, &self.o];
        let biases = self.biases.iter().flatten();
        let norms = self.norms.iter().flatten();
        projections
            .into_iter()
            .map(Projection::nbytes)
            .sum::<usize>()
            + biases.chain(norms).map(Array::nbytes).sum::<usize>()
    }

    /// Causal self-attention of the replicated tokens `x` `[T, D]` at
    /// positions `cache.len()..`, appending their keys and values to this
    /// rank's `cache`; the output is replicated. Cost: one `all_sum` of
    /// `[T, D]`.
    ///
    /// # Errors
    /// `x` is not `[T, D]`, or an MLX error.
    pub fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        cache: &mut LayerCache,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        let &[t, d] = x.global_shape() else {
            return Err(Error::Shape(format!(
                "attention takes tokens [T, D], got {:?}",
                x.global_shape()
            )));
        };
        let comm = x.comm();
        let partial = if crate::grad::is_tracing() && comm.size() > 1 {
            self.forward_traced(x.local(), t, cache, comm, s)?
        } else if self.split.query.1 == 0 {
            // More ranks than query heads: this rank holds none.
            cache.skip(t as usize);
            safemlx::ops::zeros_dtype(&[t, d], x.local().dtype(), s)?
        } else {
            let inputs = HeadInputs {
                x: x.local().clone(),
                norms: self.norms.clone(),
                k: None,
                v: None,
                kv_biases: self.biases.as_ref().map(|[_, k, v]| [k.clone(), v.clone()]),
            };
            self.attend(&inputs, t, cache, s)?
        };
        ShardedArray::<Partial>::from_local(partial, comm, &[t, d])?.all_sum(s)
    }

    /// The forward while a gradient is traced. This rank's heads are a
    /// share of the layer: the gradients of the replicated tokens and q/k
    /// norm weights through them are summed over every rank, and with more
    /// ranks than KV heads those of the KV head's float weights and biases
    /// over the ranks sharing that head; one `all_sum` for all (see
    /// `grad::sum_gradients_together`), also on a rank without query
    /// heads, which computes zeros but takes part in the sum.
    fn forward_traced(
        &self,
        x: &Array,
        t: i32,
        cache: &mut LayerCache,
        comm: &Group,
        s: &Stream,
    ) -> Result<Array> {
        let mut whole = vec![x];
        whole.extend(self.norms.iter().flatten());
        let sharing = comm.size() > self.config.kv_heads;
        let mut shared: Vec<&Array> = Vec::new();
        if sharing {
            for projection in [&self.k, &self.v] {
                if let Projection::Float(w) = projection {
                    shared.push(w);
                }
            }
            if let Some([_, k, v]) = &self.biases {
                shared.extend([k, v]);
            }
        }
        let (whole, shared) = crate::grad::sum_gradients_together(
            &whole,
            &shared,
            (self.split.kv.0, self.config.kv_heads),
            comm,
            s,
        )?;
        if self.split.query.1 == 0 {
            // No query head: zeros that depend on every summed input, so
            // that this rank's backward pass runs the sum with its peers.
            cache.skip(t as usize);
            let d = x.shape()[1];
            let mut anchor = Array::from_f32(0.0);
            for a in whole.iter().chain(&shared) {
                anchor = anchor.add(a.sum(None, s)?, s)?;
            }
            let zeros = safemlx::ops::zeros_dtype(&[t, d], x.dtype(), s)?;
            return Ok(zeros.add(anchor.multiply(Array::from_f32(0.0), s)?, s)?);
        }
        let mut whole = whole.into_iter();
        let x = whole.next().unwrap_or_else(|| x.clone());
        let norms = match (whole.next(), whole.next()) {
            (Some(q), Some(k)) => Some([q, k]),
            _ => None,
        };
        let mut shared = shared.into_iter();
        let mut float = |p: &Projection| match p {
            Projection::Float(_) if sharing => shared.next(),
            _ => None,
        };
        let (k, v) = (float(&self.k), float(&self.v));
        let kv_biases = match &self.biases {
            Some([_, k, v]) if sharing => match (shared.next(), shared.next()) {
                (Some(k), Some(v)) => Some([k, v]),
                _ => None,
            },
            Some([_, k, v]) => Some([k.clone(), v.clone()]),
            None => None,
        };
        let inputs = HeadInputs {
            x,
            norms,
            k,
            v,
            kv_biases,
        };
        self.attend(&inputs, t, cache, s)
    }

    /// This rank's heads: `[T, D]`, its share of the output projection.
    fn attend(
        &self,
        inputs: &HeadInputs,
        t: i32,
        cache: &mut LayerCache,
        s: &Stream,
    ) -> Result<Array> {
        let x = &inputs.x;
        let hd = self.config.head_dim as i32;
        let (heads, kv_heads) = (self.split.query.1 as i32, self.split.kv.1 as i32);
        let project = |w: &Projection,
                       weight: Option<&Array>,
                       bias: Option<&Array>,
                       heads: i32|
         -> Result<Array> {
            let mut y = match weight {
                Some(w) => x.matmul(w, s)?,
                None => w.apply(x, s)?,
            };
            if let Some(b) = bias {
                y = y.add(b, s)?;
            }
            // [T, heads * hd] -> [1, heads, T, hd]
            Ok(y.reshape(&[1, t, heads, hd], s)?
                .transpose_axes(&[0, 2, 1, 3], s)?)
        };
        let q_bias = self.biases.as_ref().map(|b| &b[0]);
        let kv_bias = |i: usize| inputs.kv_biases.as_ref().map(|b| &b[i]);
        let mut q = project(&self.q, None, q_bias, heads)?;
        let mut k = project(&self.k, inputs.k.as_ref(), kv_bias(0), kv_heads)?;
        let v = project(&self.v, inputs.v.as_ref(), kv_bias(1), kv_heads)?;
        if let Some([q_norm, k_norm]) = &inputs.norms {
            q = safemlx::fast::rms_norm(&q, q_norm, self.config.norm_eps, s)?;
            k = safemlx::fast::rms_norm(&k, k_norm, self.config.norm_eps, s)?;
        }
        let offset = cache.len();
        let q = self.config.rope.apply(&q, offset, s)?;
        let k = self.config.rope.apply(&k, offset, s)?;
        let (keys, values) = cache.append(&k, &v, s)?;
        let scale = 1.0 / (self.config.head_dim as f32).sqrt();
        let mask = (t > 1).then_some(ScaledDotProductAttentionMask::Causal);
        let out =
            safemlx::fast::scaled_dot_product_attention(&q, &keys, &values, scale, mask, None, s)?;
        // [1, heads, T, hd] -> [T, heads * hd]
        let out = out
            .transpose_axes(&[0, 2, 1, 3], s)?
            .reshape(&[t, heads * hd], s)?;
        self.o.apply(&out, s)
    }

    /// Ranks holding this rank's KV head: 1 unless there are more ranks
    /// than KV heads.
    fn kv_copies(&self, n: usize) -> usize {
        if n > self.config.kv_heads {
            chunk(n, self.split.kv.0, self.config.kv_heads).1
        } else {
            1
        }
    }
}

/// The arrays one rank's heads read besides their own weights: the tokens,
/// the q/k norm weights, and the KV head's float weights (`[D, hd]`, in
/// place of the projections' own) and biases, each possibly routed through
/// a gradient sum.
struct HeadInputs {
    x: Array,
    norms: Option<[Array; 2]>,
    k: Option<Array>,
    v: Option<Array>,
    kv_biases: Option<[Array; 2]>,
}

impl crate::grad::Parameters for GqaAttention {
    /// q, k, v and o (float ones only: quantized ones stay frozen), the
    /// q/k/v biases, then the q/k norms (replicated). With more ranks than
    /// KV heads, k, v and their biases are copies held by the ranks that
    /// share the head.
    fn parameters(&self) -> Vec<crate::grad::Parameter> {
        let n = self.group_size;
        let copies = self.kv_copies(n);
        let held = |a: &Array, copies: usize| crate::grad::Parameter {
            local: a.clone(),
            copies,
        };
        let mut all: Vec<_> = self.q.parameters();
        for kv in [&self.k, &self.v] {
            all.extend(kv.parameters().into_iter().map(|p| held(&p.local, copies)));
        }
        all.extend(self.o.parameters());
        if let Some([q, k, v]) = &self.biases {
            all.extend([held(q, 1), held(k, copies), held(v, copies)]);
        }
        all.extend(self.norms.iter().flatten().map(|a| held(a, n)));
        all
    }

    fn with_parameters(&self, locals: &[Array]) -> Result<Self> {
        let projections = [&self.q, &self.k, &self.v, &self.o];
        let mut counts: Vec<usize> = projections.iter().map(|p| p.parameters().len()).collect();
        counts.push(self.biases.as_ref().map_or(0, |_| 3));
        counts.push(self.norms.as_ref().map_or(0, |_| 2));
        let parts = crate::grad::split_locals(locals, &counts)?;
        let arrays = |part: &[Array], like: &[Array]| -> Result<Vec<Array>> {
            if part.iter().zip(like).any(|(a, b)| a.shape() != b.shape()) {
                return Err(Error::Shape(
                    "attention biases or norms of other shapes were given".to_owned(),
                ));
            }
            Ok(part.to_vec())
        };
        let biases = match &self.biases {
            Some(b) => {
                let [q, k, v]: [Array; 3] = arrays(parts[4], b)?
                    .try_into()
                    .map_err(|_| Error::Shape("three biases expected".to_owned()))?;
                Some([q, k, v])
            }
            None => None,
        };
        let norms = match &self.norms {
            Some(n) => {
                let [q, k]: [Array; 2] = arrays(parts[5], n)?
                    .try_into()
                    .map_err(|_| Error::Shape("two norms expected".to_owned()))?;
                Some([q, k])
            }
            None => None,
        };
        Ok(Self {
            config: self.config.clone(),
            split: self.split,
            group_size: self.group_size,
            q: self.q.with_parameters(parts[0])?,
            k: self.k.with_parameters(parts[1])?,
            v: self.v.with_parameters(parts[2])?,
            o: self.o.with_parameters(parts[3])?,
            biases,
            norms,
        })
    }
}
