//! A transformer block (sharded attention + tensor-parallel SwiGLU MLP or
//! expert-parallel MoE) on N ranks, loaded from a safetensors checkpoint
//! (each rank reads only its heads and its MLP columns/rows or experts),
//! with timing and, with `--check`, the error against the same block
//! computed densely in one process.
//!
//! ```text
//! safemlx-launch -n 4 -- target/release/examples/transformer_block --check
//!     [--sequence-parallel] [--moe] [--checkpoint FILE] [--save FILE]
//! ```
//!
//! Without `--checkpoint`, rank 0 writes a random one with the tensors
//! `TransformerBlock::load` reads under `layers.0.` (with
//! `--moe`, an expert-parallel MoE of 8 experts, top-2, instead of the
//! MLP). `--sequence-parallel` runs the block on rows split across ranks.

use std::process::ExitCode;

use safemlx::{Array, Stream};
use safemlx_dist::checkpoint::Weights;
use safemlx_dist::typed::chunk;
use safemlx_dist::{init, ShardedArray};
use safemlx_dist_examples::layers::{rms_norm, TransformerBlock};
use safemlx_dist_examples::{
    backend_from_args, check_requested, checkpoint, cpu_stream, dense, report_check,
    save_requested, time_steps, weights,
};

const TOKENS: i32 = 64;
const DIM: i32 = 64;
const HEADS: i32 = 8;
const HIDDEN: i32 = 256;
const EXPERTS: i32 = 8;
const TOP_K: usize = 2;
const PREFIX: &str = "layers.0.";

fn main() -> ExitCode {
    safemlx_dist_examples::exit("transformer_block", run())
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A random block: attention, norms, and an MLP or (`moe`) a mixture of
/// experts.
fn random_block(moe: bool) -> Vec<(String, Array)> {
    let mut w = vec![
        ("attention.qkv", weights(&[DIM, 3 * DIM], 1, 0.1)),
        ("attention.out", weights(&[DIM, DIM], 2, 0.1)),
        ("attention_norm", weights(&[DIM], 6, 1.0)),
        ("feed_forward_norm", weights(&[DIM], 7, 1.0)),
    ];
    if moe {
        w.push(("moe.router", weights(&[DIM, EXPERTS], 8, 0.5)));
        w.push(("moe.gate", weights(&[EXPERTS, DIM, HIDDEN], 9, 0.1)));
        w.push(("moe.up", weights(&[EXPERTS, DIM, HIDDEN], 11, 0.1)));
        w.push(("moe.down", weights(&[EXPERTS, HIDDEN, DIM], 10, 0.1)));
    } else {
        w.push(("mlp.gate", weights(&[DIM, HIDDEN], 3, 0.1)));
        w.push(("mlp.up", weights(&[DIM, HIDDEN], 4, 0.1)));
        w.push(("mlp.down", weights(&[HIDDEN, DIM], 5, 0.1)));
    }
    w.into_iter()
        .map(|(name, w)| (format!("{PREFIX}{name}"), w))
        .collect()
}

/// The same block on one process with plain MLX ops: the reference.
fn dense_block(
    x: &Array,
    w: &dyn Fn(&str) -> Result<Array, String>,
    moe: bool,
    s: &Stream,
) -> Result<Array, String> {
    let eps = safemlx_dist_examples::layers::DEFAULT_EPS;
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
    let ff = if moe {
        dense::moe(
            &normed,
            &w("moe.router")?,
            (&w("moe.gate")?, &w("moe.up")?, &w("moe.down")?),
            TOP_K,
            s,
        )?
    } else {
        dense::swiglu(&normed, &w("mlp.gate")?, &w("mlp.up")?, &w("mlp.down")?, s)?
    };
    h.add(&ff, s).map_err(err)
}

fn run() -> Result<(), String> {
    safemlx_dist_examples::command_line(
        "transformer_block",
        "A tensor-parallel transformer block loaded from a checkpoint",
        &[
            safemlx_dist_examples::BACKEND,
            ("--moe", None, "An MoE block (in the random checkpoint)"),
            (
                "--sequence-parallel",
                None,
                "Tokens split by rows between layers",
            ),
            safemlx_dist_examples::CHECKPOINT[0],
            safemlx_dist_examples::CHECKPOINT[1],
            safemlx_dist_examples::CHECKPOINT[2],
        ],
    );
    let sequence_parallel = std::env::args().any(|a| a == "--sequence-parallel");
    let s = cpu_stream();
    let group = init(false, backend_from_args()?).map_err(err)?;
    let (rank, n) = (group.rank(), group.size());
    let want_moe = std::env::args().any(|a| a == "--moe");
    let name = if want_moe {
        "transformer_block_moe"
    } else {
        "transformer_block"
    };
    let file = checkpoint(name, &group, || random_block(want_moe), &s)?;
    let source = Weights::new(&file, &group).pp(PREFIX);
    let block = TransformerBlock::load(&source, HEADS as usize, TOP_K, &s).map_err(err)?;
    // The checkpoint decides: an MoE block when it has a router.
    let moe = file.contains(&format!("{PREFIX}moe.router"));
    let dim = file
        .info(&format!("{PREFIX}attention.out"))
        .map_err(err)?
        .shape[0];
    let feed_forward = if moe {
        let experts = file
            .info(&format!("{PREFIX}moe.router"))
            .map_err(err)?
            .shape[1];
        format!(
            "{experts} experts ({} here, top-{TOP_K})",
            chunk(experts as usize, rank, n).1
        )
    } else {
        let hidden = file.info(&format!("{PREFIX}mlp.down")).map_err(err)?.shape[0];
        // The chunk rule: 301 over 4 ranks is 76 + 75 + 75 + 75.
        format!(
            "hidden {hidden} ({} here)",
            chunk(hidden as usize, rank, n).1
        )
    };
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
        "rank {rank}/{n}: block [{TOKENS}, {dim}]{}, {HEADS} heads ({} here), {feed_forward}, {} KiB read: {:.2} ms, {:.0} tokens/s",
        if sequence_parallel { ", sequence parallel" } else { "" },
        HEADS as usize / n,
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
            &dense_block(&x, &read, moe, &s)?,
        )?;
    }
    save_requested(&group, "", || block.gather_full(PREFIX, &s), &s)
}
