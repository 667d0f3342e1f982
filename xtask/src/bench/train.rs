//! `cargo xtask bench train`: training tokens/s of the `train` example's
//! Llama-family model in a compute-bound size (width 1024, MLP 4096, 2
//! layers, 256 tokens a step: about 48 GFLOP a step against 4 all_sums of
//! 1 MiB per layer) tensor parallel at 1, 2 and 4 ranks on ring and MPI,
//! one compute thread per rank, with the share of a step spent in
//! collectives, and as 2 pipeline stages (`--mesh pp=2`, GPipe with 4
//! micro-batches of 256 tokens); and in the same run MLX Python training the same model on
//! the same weights and bytes with its own distributed layers
//! (`shard_linear`, whose all-to-sharded layers put `sum_gradients` on
//! their input) at 1 and 2 ranks, with the BLAS its wheel ships and with
//! the system's OpenBLAS preloaded (ours links OpenBLAS). JSON lines in
//! `target/bench/train.jsonl`, then the table and the targets' ratios.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::{finish, prepare};
use crate::cmd;

const SIZE: [&str; 6] = ["--width", "1024", "--hidden", "4096", "--layers", "2"];
const SEQ: &str = "256";
const STEPS: &str = "10";
/// MLX Python with the reference BLAS takes about 8 s a step.
const PEER_STEPS: &str = "4";

pub fn run() -> Result<(), String> {
    let (release, out) = prepare("train.jsonl")?;
    let work = cmd::target_dir().join("bench").join("train");
    let _ = std::fs::remove_dir_all(&work);
    let launcher = release.join("safemlx-launch");
    let launch = |ranks: &str, backend: &str| {
        let mut command = Command::new(&launcher);
        command
            .args(["-n", ranks, "--backend", backend, "--timeout", "1800", "--"])
            .env("OPENBLAS_NUM_THREADS", "1");
        command
    };
    for backend in ["ring", "mpi"] {
        for ranks in ["1", "2", "4"] {
            let mut ours = launch(ranks, backend);
            ours.arg(release.join("examples").join("train"))
                .args(SIZE)
                .args(["--seq", SEQ, "--steps", STEPS, "--backend", backend])
                .arg("--out")
                .arg(&work)
                .arg("--bench")
                .arg(&out);
            cmd::run(ours)?;
        }
        let mut stages = launch("2", backend);
        stages
            .arg(release.join("examples").join("train"))
            .args(SIZE)
            .args(["--seq", SEQ, "--steps", STEPS, "--backend", backend])
            .args(["--mesh", "pp=2"])
            .arg("--out")
            .arg(&work)
            .arg("--bench")
            .arg(&out);
        cmd::run(stages)?;
    }
    let python = super::generate::peers_python()?;
    let script = cmd::root().join("xtask/bench/train_peer.py");
    let openblas = super::openblas();
    for backend in ["ring", "mpi"] {
        for ranks in ["1", "2"] {
            for preload in [None, openblas.as_ref()] {
                let mut peer = launch(ranks, backend);
                if let Some(lib) = preload {
                    peer.env("LD_PRELOAD", lib);
                }
                peer.arg(&python)
                    .arg(&script)
                    .arg(work.join("model"))
                    .arg(&out)
                    .args([SEQ, PEER_STEPS, backend]);
                // A peer that cannot run here is reported, not fatal.
                if let Err(e) = cmd::run(peer) {
                    println!("bench: MLX Python at {ranks} {backend} ranks failed: {e}");
                }
            }
        }
    }
    if openblas.is_none() {
        println!("bench: no libopenblas.so.0 found: MLX Python ran with its bundled BLAS only");
    }
    report(&finish(&out)?, &out);
    Ok(())
}

/// The row of `implementation` (with `blas`) at `ranks` ranks of
/// `backend`, tensor parallel (one stage) or with `stages` stages.
fn find<'a>(
    rows: &'a [Value],
    implementation: &str,
    blas: Option<&str>,
    (backend, ranks, stages): (&str, u64, u64),
) -> Option<&'a Value> {
    rows.iter().find(|r| {
        r["impl"] == implementation
            && r["blas"].as_str() == blas
            && r["backend"] == backend
            && r["ranks"].as_u64() == Some(ranks)
            && stages_of(r) == stages
    })
}

/// A row's pipeline stages (its `mesh`, `pp=P,tp=T`; 1 without).
fn stages_of(row: &Value) -> u64 {
    row["mesh"]
        .as_str()
        .and_then(|m| m.strip_prefix("pp="))
        .and_then(|m| m.split(',').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or(1)
}

fn report(rows: &[Value], out: &Path) {
    let speed = |r: Option<&Value>| {
        r.and_then(|r| r["tokens_per_s"].as_f64())
            .unwrap_or(f64::NAN)
    };
    println!(
        "{:<26} {:<7} {:>5} {:<9} {:>10} {:>10} {:>10} {:>12}  first losses",
        "impl", "backend", "ranks", "mesh", "step ms", "tokens/s", "vs 1 rank", "collectives"
    );
    for row in rows {
        let backend = row["backend"].as_str().unwrap_or_default();
        let implementation = row["impl"].as_str().unwrap_or_default();
        let blas = row["blas"].as_str();
        let one = find(rows, implementation, blas, (backend, 1, 1));
        let name = match blas {
            Some(blas) => format!("{implementation} ({blas} BLAS)"),
            None => implementation.to_owned(),
        };
        println!(
            "{:<26} {:<7} {:>5} {:<9} {:>10.1} {:>10.1} {:>9.2}x {:>12}  {}",
            name,
            backend,
            row["ranks"].as_u64().unwrap_or_default(),
            row["mesh"].as_str().unwrap_or("-"),
            row["step_ms"].as_f64().unwrap_or(f64::NAN),
            speed(Some(row)),
            speed(Some(row)) / speed(one),
            row["collective_share"]
                .as_f64()
                .map_or("-".to_owned(), |c| format!("{:.1}%", c * 100.0)),
            row["first_losses"],
        );
    }
    for backend in ["ring", "mpi"] {
        let ours = |n| find(rows, "safemlx-dist", None, (backend, n, 1));
        println!(
            "target: {backend} x2 training step: {:.2}x the 1-rank tokens/s (goal >= 1.6x)",
            speed(ours(2)) / speed(ours(1))
        );
        for blas in ["openblas", "bundled"] {
            println!(
                "target: {backend} x2 tokens/s vs MLX Python's tensor-parallel training at 2 ranks ({blas} BLAS): {:.2}x (goal >= 1x)",
                speed(ours(2)) / speed(find(rows, "mlx-python", Some(blas), (backend, 2, 1)))
            );
        }
        let stages = find(rows, "safemlx-dist", None, (backend, 2, 2));
        println!(
            "measured: {backend} 2 pipeline stages: {:.2}x the 1-rank tokens/s, {:.2}x tensor parallel at 2 ranks (no goal)",
            speed(stages) / speed(ours(1)),
            speed(stages) / speed(ours(2))
        );
    }
    println!("bench: rows in {}", out.display());
}
