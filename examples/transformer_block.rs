//! A transformer block (sharded attention + tensor-parallel SwiGLU MLP) on
//! N ranks, with timing and, with `--check`, the error against the same
//! block computed densely in one process.
//!
//! ```text
//! safemlx-launch -n 4 -- target/release/examples/transformer_block --check
//! ```

use std::process::ExitCode;
use std::time::Instant;

use safemlx::{Array, Stream};
use safemlx_dist::nn::{rms_norm, FeedForward, ShardedAttention, SwiGluMlp, TransformerBlock};
use safemlx_dist::{init, ShardedArray};
use safemlx_dist_examples::{backend_from_args, cpu_stream};

const TOKENS: i32 = 64;
const DIM: i32 = 64;
const HEADS: i32 = 8;
const HIDDEN: i32 = 256;
const EPS: f32 = 1e-5;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("transformer_block: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Deterministic weights, identical on every rank: `sin` of the index.
fn weights(shape: &[i32], seed: f32, scale: f32) -> Array {
    let len = shape.iter().product::<i32>() as usize;
    let values: Vec<f32> = (0..len)
        .map(|i| ((i as f32 + seed) * 0.7311).sin() * scale)
        .collect();
    Array::from_slice(&values, shape)
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The same block on one process with plain MLX ops: the reference.
fn dense(x: &Array, w: &[Array; 7], s: &Stream) -> Result<Array, String> {
    let [qkv, out, gate, up, down, n1, n2] = w;
    let hd = DIM / HEADS;
    let normed = rms_norm(x, n1, EPS, s).map_err(err)?;
    let proj = normed.matmul(qkv, s).map_err(err)?;
    let parts = proj.split_axis(&[DIM, 2 * DIM], 1, s).map_err(err)?;
    let by_head = |a: &Array| -> Result<Array, String> {
        a.reshape(&[TOKENS, HEADS, hd], s)
            .and_then(|a| a.transpose_axes(&[1, 0, 2], s))
            .map_err(err)
    };
    let (q, k, v) = (
        by_head(&parts[0])?,
        by_head(&parts[1])?,
        by_head(&parts[2])?,
    );
    let mask: Vec<f32> = (0..TOKENS * TOKENS)
        .map(|i| if i % TOKENS > i / TOKENS { -1e9 } else { 0.0 })
        .collect();
    let scores = q
        .matmul(k.transpose_axes(&[0, 2, 1], s).map_err(err)?, s)
        .and_then(|a| a.multiply(Array::from_f32(1.0 / (hd as f32).sqrt()), s))
        .and_then(|a| a.add(Array::from_slice(&mask, &[TOKENS, TOKENS]), s))
        .map_err(err)?;
    let attn = safemlx::ops::softmax_axis(&scores, -1, None, s)
        .and_then(|p| p.matmul(&v, s))
        .and_then(|o| o.transpose_axes(&[1, 0, 2], s))
        .and_then(|o| o.reshape(&[TOKENS, DIM], s))
        .and_then(|o| o.matmul(out, s))
        .map_err(err)?;
    let h = x.add(&attn, s).map_err(err)?;
    let normed = rms_norm(&h, n2, EPS, s).map_err(err)?;
    let g = normed.matmul(gate, s).map_err(err)?;
    let act = g
        .multiply(safemlx::ops::sigmoid(&g, s).map_err(err)?, s)
        .and_then(|a| a.multiply(normed.matmul(up, s)?, s))
        .and_then(|a| a.matmul(down, s))
        .map_err(err)?;
    h.add(&act, s).map_err(err)
}

fn run() -> Result<(), String> {
    let check = std::env::args().any(|a| a == "--check");
    let backend = backend_from_args()?;
    let s = cpu_stream();
    let group = init(false, backend).map_err(err)?;
    let (rank, n) = (group.rank(), group.size());
    let w = [
        weights(&[DIM, 3 * DIM], 1.0, 0.08),
        weights(&[DIM, DIM], 2.0, 0.08),
        weights(&[DIM, HIDDEN], 3.0, 0.08),
        weights(&[DIM, HIDDEN], 4.0, 0.08),
        weights(&[HIDDEN, DIM], 5.0, 0.08),
        weights(&[DIM], 6.0, 1.0),
        weights(&[DIM], 7.0, 1.0),
    ];
    let x = weights(&[TOKENS, DIM], 8.0, 1.0);
    let block = TransformerBlock {
        attention: ShardedAttention::from_full(
            &group,
            HEADS as usize,
            w[0].clone(),
            w[1].clone(),
            &s,
        )
        .map_err(err)?,
        feed_forward: FeedForward::Mlp(
            SwiGluMlp::from_full(&group, w[2].clone(), w[3].clone(), w[4].clone(), &s)
                .map_err(err)?,
        ),
        attention_norm: w[5].clone(),
        feed_forward_norm: w[6].clone(),
        eps: EPS,
    };
    let xr = ShardedArray::replicated(x.clone(), &group);
    let (warm, _) = block.forward(&xr, &s).map_err(err)?;
    warm.local().evaluated().map_err(err)?;
    let iters = 10;
    let started = Instant::now();
    let mut y = warm;
    for _ in 0..iters {
        y = block.forward(&xr, &s).map_err(err)?.0;
        y.local().evaluated().map_err(err)?;
    }
    let seconds = started.elapsed().as_secs_f64() / iters as f64;
    println!(
        "rank {rank}/{n}: block [{TOKENS}, {DIM}], {HEADS} heads ({} here), hidden {HIDDEN} ({} here): {:.2} ms, {:.0} tokens/s",
        HEADS as usize / n,
        HIDDEN as usize / n,
        seconds * 1e3,
        TOKENS as f64 / seconds
    );
    if check {
        let want = dense(&x, &w, &s)?;
        let got = y
            .local()
            .evaluated()
            .map_err(err)?
            .try_to_vec::<f32>()
            .map_err(err)?;
        let want = want
            .evaluated()
            .map_err(err)?
            .try_to_vec::<f32>()
            .map_err(err)?;
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let max_abs = got
            .iter()
            .zip(&want)
            .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        let rel = max_abs / scale.max(1e-12);
        println!("rank {rank}/{n}: --check against the dense block: max abs error {max_abs:.3e}, max relative error {rel:.3e}");
        if rel > 1e-4 {
            return Err(format!("relative error {rel:.3e} is above 1e-4"));
        }
    }
    Ok(())
}
