//! Helpers for comparing parallel layers with dense computations.

use safemlx::{Array, Stream};

use crate::typed::Rng;

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

/// The dense MoE of one token `x` `[d]`: softmax router `[d, e]`, top-`k`
/// experts with renormalised gates, experts `silu(x w1_e) w2_e` with `w1`
/// `[e, d, h]` and `w2` `[e, h, d]`. `keep(expert)` says whether a capacity
/// limit lets the slot through (asked in slot order, like the layer).
pub fn moe_token(
    x: &[f32],
    router: &[f32],
    w1: &[f32],
    w2: &[f32],
    (e, d, h): (usize, usize, usize),
    k: usize,
    keep: &mut dyn FnMut(usize) -> bool,
) -> Vec<f32> {
    let logits: Vec<f32> = (0..e)
        .map(|c| (0..d).map(|i| x[i] * router[i * e + c]).sum())
        .collect();
    let max = logits.iter().cloned().fold(f32::MIN, f32::max);
    let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let total: f32 = exp.iter().sum();
    let p: Vec<f32> = exp.iter().map(|v| v / total).collect();
    let mut order: Vec<usize> = (0..e).collect();
    order.sort_by(|a, b| p[*b].total_cmp(&p[*a]).then(a.cmp(b)));
    let norm: f32 = order[..k].iter().map(|&c| p[c]).sum();
    let mut y = vec![0f32; d];
    for &c in &order[..k] {
        if !keep(c) {
            continue;
        }
        let hidden: Vec<f32> = (0..h)
            .map(|j| {
                let v: f32 = (0..d).map(|i| x[i] * w1[c * d * h + i * h + j]).sum();
                v / (1.0 + (-v).exp())
            })
            .collect();
        for (o, out) in y.iter_mut().enumerate() {
            let v: f32 = (0..h).map(|j| hidden[j] * w2[c * h * d + j * d + o]).sum();
            *out += p[c] / norm * v;
        }
    }
    y
}
