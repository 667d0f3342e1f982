//! Helpers for comparing parallel layers with dense computations.

use safemlx::{Array, Dtype, Stream};
use safemlx_dist::typed::chunk;
use safemlx_dist::Group;

use crate::typed::Rng;

/// Asserts that `got` has `want`'s shape and values (relative error at
/// most 1e-4, see [`max_relative_error`]); `what` names them.
pub fn assert_close(got: &Array, want: &Array, what: &str, s: &Stream) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let err = max_relative_error(&host(got, s), &host(want, s));
    assert!(err <= 1e-4, "{what}: relative error {err}");
}

/// This rank's chunk of `full` along `axis` (the chunk rule).
pub fn part(full: &Array, axis: i32, group: &Group, s: &Stream) -> Array {
    let dim = full.shape()[axis as usize] as usize;
    let (offset, len) = chunk(dim, group.rank(), group.size());
    let rows: Vec<i32> = (offset as i32..(offset + len) as i32).collect();
    full.take_axis(Array::from_slice(&rows, &[len as i32]), axis, s)
        .unwrap()
}

/// `[rows, cols]` of deterministic values depending on `seed`.
pub fn values(rows: i32, cols: i32, seed: i32) -> Array {
    let v: Vec<f32> = (0..rows * cols)
        .map(|i| (((i * 37 + seed * 11) % 23) as f32 - 11.0) / 17.0)
        .collect();
    Array::from_slice(&v, &[rows, cols])
}

/// `x * sigmoid(x)` on an MLX array.
pub fn silu_array(x: &Array, s: &Stream) -> Array {
    x.multiply(safemlx::ops::sigmoid(x, s).unwrap(), s).unwrap()
}

/// A float32 array of `shape` with small values (`-9..=9` times `scale`).
pub fn random(rng: &mut Rng, shape: &[i32], scale: f32) -> Array {
    let len = shape.iter().product::<i32>() as usize;
    let values: Vec<f32> = rng
        .values(len)
        .into_iter()
        .map(|v| v as f32 * scale)
        .collect();
    Array::from_slice(&values, shape)
}

/// `a` evaluated and read back as float32, in row-major order.
pub fn host(a: &Array, s: &Stream) -> Vec<f32> {
    a.contiguous(false, s)
        .and_then(|a| a.into_evaluated())
        .expect("evaluates")
        .try_to_vec::<f32>()
        .expect("float32")
}

/// `a`'s bytes in row-major order, whatever its dtype (for bit-exact
/// comparisons of files and dtypes `host` cannot read).
pub fn host_bytes(a: &Array, s: &Stream) -> Vec<u8> {
    let raw = a
        .contiguous(false, s)
        .and_then(|a| a.reshape(&[-1], s))
        .and_then(|a| a.view_dtype(Dtype::Uint8, s))
        .expect("bytes");
    raw.into_evaluated()
        .expect("evaluates")
        .try_to_vec::<u8>()
        .expect("u8")
}

/// The largest absolute difference, relative to the largest reference
/// value; infinite when either side holds a NaN or an infinity (which
/// `f32::max` would otherwise drop).
pub fn max_relative_error(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "sizes differ");
    if got.iter().chain(want).any(|v| !v.is_finite()) {
        return f32::INFINITY;
    }
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    got.iter()
        .zip(want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()))
        / scale
}

/// How a dense MoE gates its chosen experts (mirrors
/// `safemlx_dist::nn::Gating`, written out here on plain floats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseGating {
    /// Softmax over all experts, the top `k`, optionally renormalised.
    SoftmaxTopK {
        /// Rescale the `k` gates to sum to 1.
        normalize: bool,
    },
    /// The top `k` logits, then a softmax over them.
    TopKSoftmax,
    /// Sigmoid scores; chosen on scores plus `score_bias` within the
    /// `topk_group` of `groups` groups whose two best biased scores sum
    /// highest (other groups' experts score 0); gates the unbiased scores,
    /// optionally renormalised.
    SigmoidGroups {
        /// Expert groups.
        groups: usize,
        /// Groups a token may choose from.
        topk_group: usize,
        /// Rescale the `k` gates to sum to 1 (when `k > 1`).
        normalize: bool,
    },
}

/// A dense MoE on host floats: router `[d, e]`, SwiGLU experts `gate`,
/// `up` `[e, d, h]` and `down` `[e, h, d]`, optional shared SwiGLU experts
/// (`[d, hs]`, `[d, hs]`, `[hs, d]`) scaled by `sigmoid(x g)` when `g`
/// `[d]` is given.
#[derive(Debug, Clone)]
pub struct DenseMoe {
    /// `[d, e]`.
    pub router: Vec<f32>,
    /// `[e, d, h]`.
    pub gate: Vec<f32>,
    /// `[e, d, h]`.
    pub up: Vec<f32>,
    /// `[e, h, d]`.
    pub down: Vec<f32>,
    /// `(e, d, h)`.
    pub dims: (usize, usize, usize),
    /// Experts per token.
    pub k: usize,
    /// The gating.
    pub gating: DenseGating,
    /// A factor on the routed gates.
    pub scaling: f32,
    /// `[e]`, added to the scores experts are chosen on (sigmoid gating).
    pub score_bias: Option<Vec<f32>>,
    /// Shared experts.
    pub shared: Option<DenseShared>,
}

/// Dense shared experts: a SwiGLU MLP of hidden `hidden` (`gate`, `up`
/// `[d, hidden]`, `down` `[hidden, d]`), scaled by `sigmoid(x g)` when
/// `g` `[d]` is given.
#[derive(Debug, Clone)]
pub struct DenseShared {
    /// `[d, hidden]`.
    pub gate: Vec<f32>,
    /// `[d, hidden]`.
    pub up: Vec<f32>,
    /// `[hidden, d]`.
    pub down: Vec<f32>,
    /// The hidden width.
    pub hidden: usize,
    /// `[d]`, the optional gate.
    pub g: Option<Vec<f32>>,
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// `down(silu(x gate) * (x up))` for one token, `gate`/`up` `[d, h]`,
/// `down` `[h, d]`.
fn swiglu_token(x: &[f32], gate: &[f32], up: &[f32], down: &[f32], h: usize) -> Vec<f32> {
    let d = x.len();
    let hidden: Vec<f32> = (0..h)
        .map(|j| {
            let g: f32 = (0..d).map(|i| x[i] * gate[i * h + j]).sum();
            let u: f32 = (0..d).map(|i| x[i] * up[i * h + j]).sum();
            silu(g) * u
        })
        .collect();
    (0..d)
        .map(|o| (0..h).map(|j| hidden[j] * down[j * d + o]).sum())
        .collect()
}

impl DenseMoe {
    /// The router logits of token `x`.
    pub fn logits(&self, x: &[f32]) -> Vec<f32> {
        let (e, d, _) = self.dims;
        (0..e)
            .map(|c| (0..d).map(|i| x[i] * self.router[i * e + c]).sum())
            .collect()
    }

    /// The layer on one token `x` `[d]`. `keep(expert)` says whether a
    /// capacity limit lets the slot through (asked in token order).
    pub fn token(&self, x: &[f32], keep: &mut dyn FnMut(usize) -> bool) -> Vec<f32> {
        let (e, d, h) = self.dims;
        let logits = self.logits(x);
        let softmax = |v: &[f32]| -> Vec<f32> {
            let max = v.iter().cloned().fold(f32::MIN, f32::max);
            let exp: Vec<f32> = v.iter().map(|l| (l - max).exp()).collect();
            let total: f32 = exp.iter().sum();
            exp.iter().map(|v| v / total).collect()
        };
        let sigmoid: Vec<f32> = logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect();
        let rank_by = match self.gating {
            DenseGating::SigmoidGroups {
                groups, topk_group, ..
            } => self.group_limited(&sigmoid, groups, topk_group),
            _ => logits.clone(),
        };
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|a, b| rank_by[*b].total_cmp(&rank_by[*a]).then(a.cmp(b)));
        let chosen = &order[..self.k];
        let gates: Vec<f32> = match self.gating {
            DenseGating::SoftmaxTopK { normalize } => {
                let p = softmax(&logits);
                let norm: f32 = if normalize {
                    chosen.iter().map(|&c| p[c]).sum()
                } else {
                    1.0
                };
                chosen.iter().map(|&c| p[c] / norm).collect()
            }
            DenseGating::TopKSoftmax => {
                softmax(&chosen.iter().map(|&c| logits[c]).collect::<Vec<_>>())
            }
            DenseGating::SigmoidGroups { normalize, .. } => {
                let norm: f32 = match normalize && self.k > 1 {
                    true => chosen.iter().map(|&c| sigmoid[c]).sum(),
                    false => 1.0,
                };
                chosen.iter().map(|&c| sigmoid[c] / norm).collect()
            }
        };
        let mut y = vec![0f32; d];
        for (&c, gate) in chosen.iter().zip(&gates) {
            if !keep(c) {
                continue;
            }
            let out = swiglu_token(
                x,
                &self.gate[c * d * h..(c + 1) * d * h],
                &self.up[c * d * h..(c + 1) * d * h],
                &self.down[c * h * d..(c + 1) * h * d],
                h,
            );
            for (o, v) in y.iter_mut().zip(out) {
                *o += self.scaling * gate * v;
            }
        }
        if let Some(sh) = &self.shared {
            let out = swiglu_token(x, &sh.gate, &sh.up, &sh.down, sh.hidden);
            let scale = sh.g.as_ref().map_or(1.0, |g| {
                let v: f32 = x.iter().zip(g).map(|(a, b)| a * b).sum();
                1.0 / (1.0 + (-v).exp())
            });
            for (o, v) in y.iter_mut().zip(out) {
                *o += scale * v;
            }
        }
        y
    }
}

impl DenseMoe {
    /// Sigmoid `scores` plus the bias, zero outside the `topk_group`
    /// groups whose two best biased scores sum highest.
    fn group_limited(&self, scores: &[f32], groups: usize, topk_group: usize) -> Vec<f32> {
        let mut biased: Vec<f32> = match &self.score_bias {
            Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
            None => scores.to_vec(),
        };
        let per = biased.len() / groups;
        let group_score = |g: usize| {
            let mut v = biased[g * per..(g + 1) * per].to_vec();
            v.sort_by(|a, b| b.total_cmp(a));
            v.iter().take(2).sum::<f32>()
        };
        let mut ranked: Vec<(usize, f32)> = (0..groups).map(|g| (g, group_score(g))).collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        for &(g, _) in &ranked[topk_group..] {
            biased[g * per..(g + 1) * per].fill(0.0);
        }
        biased
    }
}

/// Causal multi-head attention on one process, all heads: the reference.
pub fn dense_attention(x: &Array, qkv: &Array, out: &Array, heads: i32, s: &Stream) -> Array {
    let (t, d) = (x.shape()[0], x.shape()[1]);
    let hd = d / heads;
    let proj = x.matmul(qkv, s).unwrap();
    let parts = proj.split_axis(&[d, 2 * d], 1, s).unwrap();
    let by_head = |a: &Array| {
        a.reshape(&[t, heads, hd], s)
            .unwrap()
            .transpose_axes(&[1, 0, 2], s)
            .unwrap()
    };
    let (q, k, v) = (by_head(&parts[0]), by_head(&parts[1]), by_head(&parts[2]));
    let mut mask = vec![0f32; (t * t) as usize];
    for i in 0..t {
        for j in (i + 1)..t {
            mask[(i * t + j) as usize] = -1e9;
        }
    }
    let scores = q
        .matmul(k.transpose_axes(&[0, 2, 1], s).unwrap(), s)
        .unwrap()
        .multiply(Array::from_f32(1.0 / (hd as f32).sqrt()), s)
        .unwrap()
        .add(Array::from_slice(&mask, &[t, t]), s)
        .unwrap();
    let weights = safemlx::ops::softmax_axis(&scores, -1, None, s).unwrap();
    let heads_out = weights
        .matmul(&v, s)
        .unwrap()
        .transpose_axes(&[1, 0, 2], s)
        .unwrap();
    heads_out
        .reshape(&[t, d], s)
        .unwrap()
        .matmul(out, s)
        .unwrap()
}
