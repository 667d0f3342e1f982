//! The expert-parallel MoE on N ranks (experts split across ranks, top-2
//! routing): per-rank routing counts, timing, tokens/s, the load-balancing
//! loss, and with `--check` the error against a dense MoE of the same
//! weights.
//!
//! ```text
//! safemlx-launch -n 2 -- target/release/examples/moe --check
//! ```

use std::process::ExitCode;

use safemlx::{Array, Stream};
use safemlx_dist::nn::ExpertParallelMoe;
use safemlx_dist::{init, Ragged, ShardedArray};
use safemlx_dist_examples::{
    backend_from_args, check_requested, cpu_stream, report_check, time_steps, weights,
};

const TOKENS: i32 = 128; // per rank
const DIM: i32 = 64;
const HIDDEN: i32 = 128;
const EXPERTS: i32 = 8;
const TOP_K: usize = 2;

fn main() -> ExitCode {
    safemlx_dist_examples::exit("moe", run())
}

/// The dense MoE of `x` on one process: every token through its top-2
/// experts, with MLX ops (per expert, masked by the gate).
fn dense(
    x: &Array,
    router: &Array,
    w1: &Array,
    w2: &Array,
    s: &Stream,
) -> safemlx::error::Result<Array> {
    let probs = safemlx::ops::softmax_axis(x.matmul(router, s)?, -1, None, s)?;
    let p = probs.evaluated()?.try_to_vec::<f32>().unwrap_or_default();
    let e = EXPERTS as usize;
    let mut gates = vec![0f32; p.len()];
    for (token, row) in p.chunks(e).enumerate() {
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|a, b| row[*b].total_cmp(&row[*a]).then(a.cmp(b)));
        let norm: f32 = order[..TOP_K].iter().map(|&c| row[c]).sum();
        for &c in &order[..TOP_K] {
            gates[token * e + c] = row[c] / norm;
        }
    }
    let gates = Array::from_slice(&gates, &[x.shape()[0], EXPERTS]);
    let w1s = w1.split(EXPERTS, 0, s)?;
    let w2s = w2.split(EXPERTS, 0, s)?;
    let mut y = safemlx::ops::zeros_dtype(x.shape(), x.dtype(), s)?;
    for c in 0..e {
        let h = x.matmul(w1s[c].reshape(&[DIM, HIDDEN], s)?, s)?;
        let h = h.multiply(safemlx::ops::sigmoid(&h, s)?, s)?;
        let out = h.matmul(w2s[c].reshape(&[HIDDEN, DIM], s)?, s)?;
        let gate = gates.split(EXPERTS, 1, s)?.swap_remove(c);
        y = y.add(out.multiply(gate, s)?, s)?;
    }
    Ok(y)
}

fn run() -> Result<(), String> {
    let err = |e: safemlx_dist::Error| e.to_string();
    let what = |e: safemlx::error::Exception| e.what().to_owned();
    let s = cpu_stream();
    let group = init(false, backend_from_args()?).map_err(err)?;
    let (rank, n) = (group.rank(), group.size());
    let (router, w1, w2) = (
        weights(&[DIM, EXPERTS], 1.0, 0.5),
        weights(&[EXPERTS, DIM, HIDDEN], 2.0, 0.05),
        weights(&[EXPERTS, HIDDEN, DIM], 3.0, 0.05),
    );
    // Every rank has its own tokens.
    let x = weights(&[TOKENS, DIM], 10.0 + rank as f32 * 1000.0, 1.0);
    let moe =
        ExpertParallelMoe::from_full(&group, TOP_K, router.clone(), w1.clone(), w2.clone(), &s)
            .map_err(err)?;
    let tokens =
        ShardedArray::<Ragged>::from_local(x.clone(), &group, &[TOKENS, DIM]).map_err(err)?;
    let mut last = None;
    let seconds = time_steps(5, || {
        let out = moe.forward(&tokens, &s).map_err(err)?;
        out.tokens.local().evaluated().map_err(what)?;
        last = Some(out);
        Ok(())
    })?;
    let out = last.ok_or("no forward ran")?;
    println!(
        "rank {rank}/{n}: {} experts here of {EXPERTS}; sent {:?}, received {:?}; {:.2} ms, {:.0} tokens/s; aux loss {:.3}",
        EXPERTS as usize / n,
        out.sent,
        out.received,
        seconds * 1e3,
        TOKENS as f64 / seconds,
        out.aux_loss
    );
    if check_requested() {
        let want = dense(&x, &router, &w1, &w2, &s).map_err(what)?;
        report_check(&format!("rank {rank}/{n}"), out.tokens.local(), &want)?;
    }
    Ok(())
}
