//! A transformer block (sharded attention + tensor-parallel SwiGLU MLP) on
//! N ranks, loaded from a safetensors checkpoint (each rank reads only its
//! heads and its MLP columns/rows), with timing and, with `--check`, the
//! error against the same block computed densely in one process.
//!
//! ```text
//! safemlx-launch -n 4 -- target/release/examples/transformer_block --check
//!     [--sequence-parallel] [--checkpoint FILE] [--save FILE]
//! ```
//!
//! Without `--checkpoint`, rank 0 writes a random one with the tensors
//! `TransformerBlock::from_checkpoint` reads under `layers.0.`.
//! `--sequence-parallel` runs the block on rows split across ranks.

use std::process::ExitCode;

use safemlx::{Array, Stream};
use safemlx_dist::nn::{rms_norm, TransformerBlock};
use safemlx_dist::{init, ShardedArray};
use safemlx_dist_examples::{
    backend_from_args, check_requested, checkpoint, cpu_stream, dense, report_check,
    save_requested, time_steps, weights,
};

const TOKENS: i32 = 64;
const DIM: i32 = 64;
const HEADS: i32 = 8;
const HIDDEN: i32 = 256;
const PREFIX: &str = "layers.0.";

fn main() -> ExitCode {
    safemlx_dist_examples::exit("transformer_block", run())
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn random_block() -> Vec<(String, Array)> {
    [
        ("attention.qkv", weights(&[DIM, 3 * DIM], 1, 0.1)),
        ("attention.out", weights(&[DIM, DIM], 2, 0.1)),
        ("mlp.gate", weights(&[DIM, HIDDEN], 3, 0.1)),
        ("mlp.up", weights(&[DIM, HIDDEN], 4, 0.1)),
        ("mlp.down", weights(&[HIDDEN, DIM], 5, 0.1)),
        ("attention_norm", weights(&[DIM], 6, 1.0)),
        ("feed_forward_norm", weights(&[DIM], 7, 1.0)),
    ]
    .into_iter()
    .map(|(name, w)| (format!("{PREFIX}{name}"), w))
    .collect()
}

/// The same block on one process with plain MLX ops: the reference.
fn dense_block(
    x: &Array,
    w: &dyn Fn(&str) -> Result<Array, String>,
    s: &Stream,
) -> Result<Array, String> {
    let eps = safemlx_dist::nn::DEFAULT_EPS;
    let normed = rms_norm(x, &w("attention_norm")?, eps, s).map_err(err)?;
    let attn = dense::attention(
        &normed,
        &w("attention.qkv")?,
        &w("attention.out")?,
        HEADS,
        s,
    )?;
    let h = x.add(&attn, s).map_err(err)?;
    let normed = rms_norm(&h, &w("feed_forward_norm")?, eps, s).map_err(err)?;
    let mlp = dense::swiglu(&normed, &w("mlp.gate")?, &w("mlp.up")?, &w("mlp.down")?, s)?;
    h.add(&mlp, s).map_err(err)
}

fn run() -> Result<(), String> {
    let sequence_parallel = std::env::args().any(|a| a == "--sequence-parallel");
    let s = cpu_stream();
    let group = init(false, backend_from_args()?).map_err(err)?;
    let (rank, n) = (group.rank(), group.size());
    let file = checkpoint("transformer_block", &group, random_block, &s)?;
    let block = TransformerBlock::from_checkpoint(&group, HEADS as usize, 2, &file, PREFIX, &s)
        .map_err(err)?;
    let dim = file
        .info(&format!("{PREFIX}attention.out"))
        .map_err(err)?
        .shape[0];
    let hidden = file.info(&format!("{PREFIX}mlp.down")).map_err(err)?.shape[0];
    let x = weights(&[TOKENS, dim], 8, 1.0);
    let xr = ShardedArray::replicated(x.clone(), &group);
    let rows = xr.clone().shard::<0>(&s).map_err(err)?;
    let mut y = None;
    let seconds = time_steps(10, || {
        let out = if sequence_parallel {
            block
                .forward_sequence_parallel(&rows, &s)
                .map_err(err)?
                .0
                .all_gather(&s)
                .map_err(err)?
        } else {
            block.forward(&xr, &s).map_err(err)?.0
        };
        safemlx_dist::eval(&[out.local()]).map_err(err)?;
        y = Some(out);
        Ok(())
    })?;
    println!(
        "rank {rank}/{n}: block [{TOKENS}, {dim}]{}, {HEADS} heads ({} here), hidden {hidden} ({} here), {} KiB read: {:.2} ms, {:.0} tokens/s",
        if sequence_parallel { ", sequence parallel" } else { "" },
        HEADS as usize / n,
        hidden as usize / n,
        file.bytes_read() / 1024,
        seconds * 1e3,
        TOKENS as f64 / seconds
    );
    if check_requested() {
        let y = y.ok_or("no forward ran")?;
        let read = |name: &str| file.read(&format!("{PREFIX}{name}"), &s).map_err(err);
        report_check(
            &format!("rank {rank}/{n}"),
            y.local(),
            &dense_block(&x, &read, &s)?,
        )?;
    }
    save_requested(&group, "", || block.gather_full(PREFIX, &s), &s)
}
