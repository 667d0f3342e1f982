//! The expert-parallel MoE on N ranks (SwiGLU experts split across ranks
//! by the chunk rule, top-2 routing), loaded from a safetensors checkpoint (each rank reads only
//! its experts): per-rank routing counts, bytes read, timing, tokens/s, the
//! load-balancing loss, and with `--check` the error against a dense MoE
//! of the same weights.
//!
//! ```text
//! safemlx-launch -n 2 -- target/release/examples/moe --check
//!     [--checkpoint FILE [--prefix P]] [--save FILE]
//! ```
//!
//! Without `--checkpoint`, rank 0 writes a random one (tensors
//! `moe.router` `[D, E]`, `moe.gate`, `moe.up` `[E, D, H]`, `moe.down`
//! `[E, H, D]`).

use std::process::ExitCode;

use safemlx_dist::checkpoint::Weights;
use safemlx_dist::nn::{Moe, MoeConfig};
use safemlx_dist::typed::chunk;
use safemlx_dist::{init, Ragged, ShardedArray};
use safemlx_dist_examples::{
    backend_from_args, check_requested, checkpoint, cpu_stream, dense, flag, report_check,
    save_requested, time_steps, weights,
};

const TOKENS: i32 = 128; // per rank
const DIM: i32 = 64;
const HIDDEN: i32 = 128;
const EXPERTS: i32 = 8;
const TOP_K: usize = 2;

fn main() -> ExitCode {
    safemlx_dist_examples::exit("moe", run())
}

fn run() -> Result<(), String> {
    safemlx_dist_examples::command_line(
        "moe",
        "An expert-parallel MoE layer loaded from a checkpoint, tokens routed with all_to_all_v",
        &[
            safemlx_dist_examples::BACKEND,
            (
                "--prefix",
                Some("PREFIX"),
                "The tensors' name prefix [default: moe.]",
            ),
            safemlx_dist_examples::CHECKPOINT[0],
            safemlx_dist_examples::CHECKPOINT[1],
            safemlx_dist_examples::CHECKPOINT[2],
        ],
    );
    let err = |e: safemlx_dist::Error| e.to_string();
    let s = cpu_stream();
    let group = init(false, backend_from_args()?).map_err(err)?;
    let (rank, n) = (group.rank(), group.size());
    // Tensor names: PREFIX + field (`--prefix layers.0.moe.` reads a block's).
    let prefix = flag("--prefix").unwrap_or_else(|| "moe.".to_owned());
    let file = checkpoint(
        "moe",
        &group,
        || {
            vec![
                (format!("{prefix}router"), weights(&[DIM, EXPERTS], 1, 0.5)),
                (
                    format!("{prefix}gate"),
                    weights(&[EXPERTS, DIM, HIDDEN], 2, 0.05),
                ),
                (
                    format!("{prefix}up"),
                    weights(&[EXPERTS, DIM, HIDDEN], 4, 0.05),
                ),
                (
                    format!("{prefix}down"),
                    weights(&[EXPERTS, HIDDEN, DIM], 3, 0.05),
                ),
            ]
        },
        &s,
    )?;
    let moe = Moe::load(
        &Weights::new(&file, &group).pp(&prefix),
        MoeConfig::new(TOP_K),
        &s,
    )
    .map_err(err)?;
    let router = file
        .info(&format!("{prefix}router"))
        .map_err(err)?
        .shape
        .clone();
    let (dim, experts) = (router[0], router[1] as usize);
    // Every rank has its own tokens.
    let x = weights(&[TOKENS, dim], 10 + rank as u64, 1.0);
    let tokens =
        ShardedArray::<Ragged>::from_local(x.clone(), &group, &[TOKENS, dim]).map_err(err)?;
    let mut last = None;
    let seconds = time_steps(5, || {
        let out = moe.forward_rows(&tokens, &s).map_err(err)?;
        safemlx_dist::eval(&[out.tokens.local()]).map_err(err)?;
        last = Some(out);
        Ok(())
    })?;
    let out = last.ok_or("no forward ran")?;
    println!(
        "rank {rank}/{n}: {} experts here of {experts} ({} KiB read); sent {:?}, received {:?}; {:.2} ms, {:.0} tokens/s; aux loss {:.3}",
        chunk(experts, rank, n).1,
        file.bytes_read() / 1024,
        out.sent,
        out.received,
        seconds * 1e3,
        TOKENS as f64 / seconds,
        out.aux_loss
    );
    if check_requested() {
        let read = |name: &str| file.read(&format!("{prefix}{name}"), &s).map_err(err);
        let experts = (&read("gate")?, &read("up")?, &read("down")?);
        let want = dense::moe(&x, &read("router")?, experts, TOP_K, &s)?;
        report_check(&format!("rank {rank}/{n}"), out.tokens.local(), &want)?;
    }
    save_requested(&group, &prefix, || moe.gather_full(&s), &s)
}
