//! A transformer block (sharded attention + tensor-parallel SwiGLU MLP) on
//! N ranks, with timing and, with `--check`, the error against the same
//! block computed densely in one process.
//!
//! ```text
//! safemlx-launch -n 4 -- target/release/examples/transformer_block --check
//! ```

use std::process::ExitCode;

use safemlx::{Array, Stream};
use safemlx_dist::nn::{rms_norm, FeedForward, ShardedAttention, SwiGluMlp, TransformerBlock};
use safemlx_dist::{init, ShardedArray};
use safemlx_dist_examples::{
    backend_from_args, check_requested, cpu_stream, report_check, time_steps, weights,
};

const TOKENS: i32 = 64;
const DIM: i32 = 64;
const HEADS: i32 = 8;
const HIDDEN: i32 = 256;
const EPS: f32 = 1e-5;

fn main() -> ExitCode {
    safemlx_dist_examples::exit("transformer_block", run())
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
    let check = check_requested();
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
    let mut y = None;
    let seconds = time_steps(10, || {
        let (out, _) = block.forward(&xr, &s).map_err(err)?;
        out.local().evaluated().map_err(err)?;
        y = Some(out);
        Ok(())
    })?;
    println!(
        "rank {rank}/{n}: block [{TOKENS}, {DIM}], {HEADS} heads ({} here), hidden {HIDDEN} ({} here): {:.2} ms, {:.0} tokens/s",
        HEADS as usize / n,
        HIDDEN as usize / n,
        seconds * 1e3,
        TOKENS as f64 / seconds
    );
    if check {
        let y = y.ok_or("no forward ran")?;
        report_check(&format!("rank {rank}/{n}"), y.local(), &dense(&x, &w, &s)?)?;
    }
    Ok(())
}
