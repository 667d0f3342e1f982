//! The layers' math on one process with plain MLX ops: the references the
//! examples check against (`--check`) and the dense baselines of
//! `cargo xtask bench layers`.

use safemlx::{Array, Stream};

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// `x * sigmoid(x)`.
pub fn silu(x: &Array, s: &Stream) -> Result<Array, String> {
    x.multiply(safemlx::ops::sigmoid(x, s).map_err(err)?, s)
        .map_err(err)
}

/// `(silu(x gate) * (x up)) down`.
pub fn swiglu(
    x: &Array,
    gate: &Array,
    up: &Array,
    down: &Array,
    s: &Stream,
) -> Result<Array, String> {
    let g = silu(&x.matmul(gate, s).map_err(err)?, s)?;
    g.multiply(x.matmul(up, s).map_err(err)?, s)
        .and_then(|h| h.matmul(down, s))
        .map_err(err)
}

/// `[T, T]`: 0 on and below the diagonal, -1e9 above it.
pub fn causal_mask(t: i32) -> Array {
    let values: Vec<f32> = (0..t * t)
        .map(|i| if i % t > i / t { -1e9 } else { 0.0 })
        .collect();
    Array::from_slice(&values, &[t, t])
}

/// Causal multi-head self-attention of `x` `[T, D]` with the fused `qkv`
/// `[D, 3D]` (`[Q | K | V]`) and the output projection `out` `[D, D]`.
pub fn attention(
    x: &Array,
    qkv: &Array,
    out: &Array,
    heads: i32,
    s: &Stream,
) -> Result<Array, String> {
    let (t, d) = (x.shape()[0], x.shape()[1]);
    let hd = d / heads;
    let proj = x.matmul(qkv, s).map_err(err)?;
    let parts = proj.split_axis(&[d, 2 * d], 1, s).map_err(err)?;
    let by_head = |a: &Array| -> Result<Array, String> {
        a.reshape(&[t, heads, hd], s)
            .and_then(|a| a.transpose_axes(&[1, 0, 2], s))
            .map_err(err)
    };
    let (q, k, v) = (
        by_head(&parts[0])?,
        by_head(&parts[1])?,
        by_head(&parts[2])?,
    );
    let scores = q
        .matmul(k.transpose_axes(&[0, 2, 1], s).map_err(err)?, s)
        .and_then(|a| a.multiply(Array::from_f32(1.0 / (hd as f32).sqrt()), s))
        .and_then(|a| a.add(causal_mask(t), s))
        .map_err(err)?;
    safemlx::ops::softmax_axis(&scores, -1, None, s)
        .and_then(|p| p.matmul(&v, s))
        .and_then(|o| o.transpose_axes(&[1, 0, 2], s))
        .and_then(|o| o.reshape(&[t, d], s))
        .and_then(|o| o.matmul(out, s))
        .map_err(err)
}

fn rows(indices: &[usize]) -> Array {
    let values: Vec<i32> = indices.iter().map(|&v| v as i32).collect();
    Array::from_slice(&values, &[values.len() as i32])
}

/// A mixture of experts on one process: softmax router `[D, E]`, each
/// token's `top_k` experts with renormalised gates, SwiGLU experts
/// `down_e(silu(x gate_e) * (x up_e))` (`gate`, `up` `[E, D, H]`, `down`
/// `[E, H, D]`), each expert run once on the tokens that chose it.
pub fn moe(
    x: &Array,
    router: &Array,
    (gate, up, down): (&Array, &Array, &Array),
    top_k: usize,
    s: &Stream,
) -> Result<Array, String> {
    let (t, d) = (x.shape()[0] as usize, x.shape()[1]);
    let e = router.shape()[1] as usize;
    let probs =
        safemlx::ops::softmax_axis(x.matmul(router, s).map_err(err)?, -1, None, s).map_err(err)?;
    let p = probs
        .evaluated()
        .map_err(err)?
        .try_to_vec::<f32>()
        .map_err(err)?;
    // Per expert: the slots (token * top_k + j) that chose it, and gates.
    let mut chosen: Vec<Vec<usize>> = vec![Vec::new(); e];
    let mut gates = vec![0f32; t * top_k];
    for token in 0..t {
        let row = &p[token * e..(token + 1) * e];
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|a, b| row[*b].total_cmp(&row[*a]).then(a.cmp(b)));
        let norm: f32 = order[..top_k].iter().map(|&c| row[c]).sum();
        for (j, &c) in order[..top_k].iter().enumerate() {
            chosen[c].push(token * top_k + j);
            gates[token * top_k + j] = row[c] / norm;
        }
    }
    let split = |w: &Array| -> Result<Vec<Array>, String> {
        w.split(e as i32, 0, s)
            .map_err(err)?
            .iter()
            .map(|part| part.reshape(&w.shape()[1..], s).map_err(err))
            .collect()
    };
    let (gates_w, ups, downs) = (split(gate)?, split(up)?, split(down)?);
    let mut outputs = Vec::new();
    let mut placed = Vec::new();
    for (c, slots) in chosen.iter().enumerate().filter(|(_, v)| !v.is_empty()) {
        let tokens: Vec<usize> = slots.iter().map(|slot| slot / top_k).collect();
        let inputs = x.take_axis(rows(&tokens), 0, s).map_err(err)?;
        outputs.push(swiglu(&inputs, &gates_w[c], &ups[c], &downs[c], s)?);
        placed.extend_from_slice(slots);
    }
    let all = safemlx::ops::concatenate_axis(&outputs, 0, s).map_err(err)?;
    let mut inverse = vec![0usize; t * top_k];
    for (position, &slot) in placed.iter().enumerate() {
        inverse[slot] = position;
    }
    let gates = Array::from_slice(&gates, &[(t * top_k) as i32, 1]);
    all.take_axis(rows(&inverse), 0, s)
        .and_then(|a| a.multiply(&gates, s))
        .and_then(|a| a.reshape(&[t as i32, top_k as i32, d], s))
        .and_then(|a| a.sum_axis(1, None, s))
        .map_err(err)
}
