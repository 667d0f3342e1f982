//! The tensor-parallel SwiGLU MLP on N ranks, loaded from a safetensors
//! checkpoint (each rank reads only its columns of `gate`/`up` and its
//! rows of `down`): per-rank shapes and bytes read, timing, tokens/s, and
//! with `--check` the error against the dense MLP of the same weights.
//!
//! ```text
//! safemlx-launch -n 2 -- target/release/examples/tp_mlp --check
//!     [--checkpoint FILE [--prefix P]] [--save FILE]
//! ```
//!
//! Without `--checkpoint`, rank 0 writes a random one (tensors `mlp.gate`
//! `[D, H]`, `mlp.up` `[D, H]`, `mlp.down` `[H, D]`); `--save` gathers the
//! weights back and rank 0 writes them.

use std::process::ExitCode;

use safemlx_dist::checkpoint::Weights;
use safemlx_dist::{init, ShardedArray};
use safemlx_dist_examples::layers::SwiGluMlp;
use safemlx_dist_examples::{
    backend_from_args, check_requested, checkpoint, cpu_stream, dense, flag, report_check,
    save_requested, time_steps, weights,
};

const TOKENS: i32 = 256;
const DIM: i32 = 256;
const HIDDEN: i32 = 1024;

fn main() -> ExitCode {
    safemlx_dist_examples::exit("tp_mlp", run())
}

fn run() -> Result<(), String> {
    safemlx_dist_examples::command_line(
        "tp_mlp",
        "A tensor-parallel SwiGLU MLP loaded from a checkpoint, each rank reading its part",
        &[
            safemlx_dist_examples::BACKEND,
            (
                "--prefix",
                Some("PREFIX"),
                "The tensors' name prefix [default: mlp.]",
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
    // Tensor names: PREFIX + field (`--prefix layers.0.mlp.` reads a block's).
    let prefix = flag("--prefix").unwrap_or_else(|| "mlp.".to_owned());
    let file = checkpoint(
        "tp_mlp",
        &group,
        || {
            vec![
                (format!("{prefix}gate"), weights(&[DIM, HIDDEN], 1, 0.05)),
                (format!("{prefix}up"), weights(&[DIM, HIDDEN], 2, 0.05)),
                (format!("{prefix}down"), weights(&[HIDDEN, DIM], 3, 0.05)),
            ]
        },
        &s,
    )?;
    let mlp = SwiGluMlp::load_fields(&Weights::new(&file, &group).pp(&prefix), &s).map_err(err)?;
    let layout = mlp.layout();
    let dim = layout[0].global_shape[0];
    let x = weights(&[TOKENS, dim], 4, 1.0);
    let xr = ShardedArray::replicated(x.clone(), &group);
    let mut y = None;
    let seconds = time_steps(10, || {
        let out = mlp.forward(&xr, &s).map_err(err)?;
        safemlx_dist::eval(&[out.local()]).map_err(err)?;
        y = Some(out);
        Ok(())
    })?;
    println!(
        "rank {rank}/{n}: gate/up local {:?}, down local {:?} ({} KiB read); [{TOKENS}, {dim}] in {:.2} ms, {:.0} tokens/s",
        layout[0].local_shape,
        layout[2].local_shape,
        file.bytes_read() / 1024,
        seconds * 1e3,
        TOKENS as f64 / seconds
    );
    if check_requested() {
        let read = |name: &str| file.read(&format!("{prefix}{name}"), &s).map_err(err);
        let want = dense::swiglu(&x, &read("gate")?, &read("up")?, &read("down")?, &s)?;
        let y = y.ok_or("no forward ran")?;
        report_check(&format!("rank {rank}/{n}"), y.local(), &want)?;
    }
    save_requested(&group, &prefix, || mlp.gather_full(&s), &s)
}
