//! `cargo xtask bench layers`: TP SwiGLU MLP, sharded attention and EP MoE
//! at 1, 2 and 4 ranks on ring and MPI, and their dense single-process
//! versions (one BLAS thread, and all threads); JSON lines in
//! `target/bench/layers.jsonl`, then a table and the targets' ratios.
//!
//! Each rank stands for one device, so every sharded rank and the dense
//! baseline run with one BLAS thread (`OPENBLAS_NUM_THREADS=1`; MLX's CPU
//! backend runs each stream's kernels on one thread).

use serde_json::Value;

use super::{dense_layer, finish, launch, prepare};

const LAYERS: [&str; 3] = ["mlp", "attention", "moe"];

pub fn run() -> Result<(), String> {
    let (release, out) = prepare("layers.jsonl")?;
    for layer in LAYERS {
        dense_layer(&release, &["--layer", layer], &out)?;
        for backend in ["ring", "mpi"] {
            for ranks in ["1", "2", "4"] {
                launch(
                    &release,
                    (ranks, backend),
                    "bench_layers",
                    &["--layer", layer],
                    &out,
                )?;
            }
        }
    }
    report(&finish(&out)?);
    Ok(())
}

fn find<'a>(rows: &'a [Value], layer: &str, backend: &str, ranks: u64) -> Option<&'a Value> {
    rows.iter().find(|r| {
        r["layer"] == layer
            && r["backend"] == backend
            && r["ranks"].as_u64() == Some(ranks)
            && (backend != "dense" || r["threads"] == "1")
    })
}

fn report(rows: &[Value]) {
    println!(
        "{:<10} {:<6} {:>5} {:>7} {:>10} {:>10} {:>9} {:>12}",
        "layer", "backend", "ranks", "threads", "ms/step", "tokens/s", "vs dense", "collectives"
    );
    for row in rows {
        let layer = row["layer"].as_str().unwrap_or_default();
        let tokens_per_s = row["tokens_per_s"].as_f64().unwrap_or(f64::NAN);
        let dense = find(rows, layer, "dense", 1)
            .and_then(|d| d["tokens_per_s"].as_f64())
            .unwrap_or(f64::NAN);
        println!(
            "{layer:<10} {:<6} {:>5} {:>7} {:>10.1} {:>10.0} {:>8.2}x {:>11.1}%",
            row["backend"].as_str().unwrap_or_default(),
            row["ranks"].as_u64().unwrap_or_default(),
            row["threads"].as_str().unwrap_or_default(),
            row["seconds_median"].as_f64().unwrap_or(f64::NAN) * 1e3,
            tokens_per_s,
            tokens_per_s / dense,
            row["collective_share"].as_f64().unwrap_or(0.0) * 100.0
        );
    }
    for (layer, name, goal) in [("moe", "EP MoE", 1.5), ("mlp", "TP MLP", 1.4)] {
        for backend in ["ring", "mpi"] {
            let speed = |backend, ranks| {
                find(rows, layer, backend, ranks).and_then(|r| r["tokens_per_s"].as_f64())
            };
            if let (Some(sharded), Some(dense)) = (speed(backend, 2), speed("dense", 1)) {
                println!(
                    "target: {name} {backend} x2 vs dense (one thread each): {:.2}x the tokens/s (goal >= {goal}x)",
                    sharded / dense
                );
            }
        }
    }
}
