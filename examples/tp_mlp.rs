//! The tensor-parallel SwiGLU MLP on N ranks: per-rank shapes, timing,
//! tokens/s, and with `--check` the error against the dense MLP.
//!
//! ```text
//! safemlx-launch -n 2 -- target/release/examples/tp_mlp --check
//! ```

use std::process::ExitCode;

use safemlx::Array;
use safemlx_dist::nn::SwiGluMlp;
use safemlx_dist::{init, ShardedArray};
use safemlx_dist_examples::{
    backend_from_args, check_requested, cpu_stream, report_check, time_steps, weights,
};

const TOKENS: i32 = 256;
const DIM: i32 = 256;
const HIDDEN: i32 = 1024;

fn main() -> ExitCode {
    safemlx_dist_examples::exit("tp_mlp", run())
}

fn run() -> Result<(), String> {
    let err = |e: safemlx_dist::Error| e.to_string();
    let s = cpu_stream();
    let group = init(false, backend_from_args()?).map_err(err)?;
    let (rank, n) = (group.rank(), group.size());
    let (gate, up, down) = (
        weights(&[DIM, HIDDEN], 1.0, 0.05),
        weights(&[DIM, HIDDEN], 2.0, 0.05),
        weights(&[HIDDEN, DIM], 3.0, 0.05),
    );
    let x = weights(&[TOKENS, DIM], 4.0, 1.0);
    let mlp =
        SwiGluMlp::from_full(&group, gate.clone(), up.clone(), down.clone(), &s).map_err(err)?;
    let layout = mlp.layout();
    let xr = ShardedArray::replicated(x.clone(), &group);
    let mut y = None;
    let seconds = time_steps(10, || {
        let out = mlp.forward(&xr, &s).map_err(err)?;
        out.local().evaluated().map_err(|e| e.what().to_owned())?;
        y = Some(out);
        Ok(())
    })?;
    println!(
        "rank {rank}/{n}: gate/up local {:?}, down local {:?}; [{TOKENS}, {DIM}] in {:.2} ms, {:.0} tokens/s",
        layout[0].local_shape,
        layout[2].local_shape,
        seconds * 1e3,
        TOKENS as f64 / seconds
    );
    if check_requested() {
        let dense = || -> safemlx::error::Result<Array> {
            let g = x.matmul(&gate, &s)?;
            let a = g.multiply(safemlx::ops::sigmoid(&g, &s)?, &s)?;
            a.multiply(x.matmul(&up, &s)?, &s)?.matmul(&down, &s)
        };
        let want = dense().map_err(|e| e.what().to_owned())?;
        let y = y.ok_or("no forward ran")?;
        report_check(&format!("rank {rank}/{n}"), y.local(), &want)?;
    }
    Ok(())
}
