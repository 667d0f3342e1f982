//! `cargo xtask bench layouts`: SmolLM2-135M (float32 weights, as `bench
//! generate`'s rows) prefill of 512 tokens and 64 decode steps, one
//! compute thread per rank, as one rank, as 2 ranks tensor parallel
//! (`tp=2`) and as 2 pipeline stages (`pp=2`, the prompt in chunks of 64),
//! on ring and MPI over loopback; and the machine's two-process ceiling
//! (two one-rank runs started together) in the same run. JSON lines in
//! `target/bench/layouts.jsonl`, then each layout against one rank and
//! against the ceiling.

use serde_json::Value;

use super::{ceiling, finish, launch, prepare};
use crate::models;

const LAYOUTS: [(&str, &str); 3] = [("1", "pp=1,tp=1"), ("2", "pp=1,tp=2"), ("2", "pp=2,tp=1")];

pub fn run() -> Result<(), String> {
    let gguf = models::fetch_smollm2()?;
    let (release, out) = prepare("layouts.jsonl")?;
    let model = gguf.display().to_string();
    let args = |mesh: &'static str| {
        [
            "--model",
            model.as_str(),
            "--prompt-tokens",
            "512",
            "--decode-tokens",
            "64",
            "--dequantize",
            "--mesh",
            mesh,
            "--prefill-chunk",
            "64",
        ]
    };
    for backend in ["ring", "mpi"] {
        for (ranks, mesh) in LAYOUTS {
            launch(
                &release,
                (ranks, backend),
                "bench_generate",
                &args(mesh),
                &out,
            )?;
        }
    }
    let mut alone = args("pp=1,tp=1").to_vec();
    alone.extend(["--backend", "ring"]);
    ceiling(&release, &alone, &out, "smollm2")?;
    report(&finish(&out)?);
    Ok(())
}

fn row<'a>(rows: &'a [Value], backend: &str, mesh: &str) -> Option<&'a Value> {
    rows.iter()
        .find(|r| r["impl"] == "safemlx-dist" && r["backend"] == backend && r["mesh"] == mesh)
}

fn report(rows: &[Value]) {
    println!("| backend | mesh | prefill tokens/s | decode tokens/s |");
    println!("|---|---|---|---|");
    for backend in ["ring", "mpi"] {
        for (_, mesh) in LAYOUTS {
            if let Some(r) = row(rows, backend, mesh) {
                println!(
                    "| {backend} | {mesh} | {:.1} | {:.1} |",
                    r["prefill_tokens_per_s"].as_f64().unwrap_or(0.0),
                    r["decode_tokens_per_s"].as_f64().unwrap_or(0.0)
                );
            }
        }
    }
    let ceiling = rows.iter().find(|r| r["impl"] == "ceiling");
    let value = |r: Option<&Value>, key: &str| r.and_then(|r| r[key].as_f64());
    if let Some(c) = ceiling {
        println!(
            "| two 1-rank runs together (ceiling) | - | {:.1} | {:.1} |",
            c["prefill_tokens_per_s"].as_f64().unwrap_or(0.0),
            c["decode_tokens_per_s"].as_f64().unwrap_or(0.0)
        );
    }
    for backend in ["ring", "mpi"] {
        let one = row(rows, backend, "pp=1,tp=1");
        let (p1, d1) = (
            value(one, "prefill_tokens_per_s"),
            value(one, "decode_tokens_per_s"),
        );
        let pc = value(ceiling, "prefill_tokens_per_s");
        let pp = row(rows, backend, "pp=2,tp=1");
        let tp = row(rows, backend, "pp=1,tp=2");
        if let (Some(p1), Some(pc), Some(p)) = (p1, pc, value(pp, "prefill_tokens_per_s")) {
            println!(
                "target: {backend} pp=2 prefill {:.2}x one rank; the ceiling {:.2}x; ratio {:.2} (goal >= 0.75)",
                p / p1,
                pc / p1,
                p / pc
            );
        }
        if let (Some(d1), Some(d)) = (d1, value(pp, "decode_tokens_per_s")) {
            println!(
                "target: {backend} pp=2 decode {:.2}x one rank (goal >= 0.9)",
                d / d1
            );
        }
        if let (Some(d1), Some(d)) = (d1, value(tp, "decode_tokens_per_s")) {
            println!(
                "target: {backend} tp=2 decode {:.2}x one rank (goal on ring >= 1.0)",
                d / d1
            );
        }
    }
}
