//! `cargo xtask bench moe`: the MoE layer (D 1024, 64 experts of hidden
//! 512, top-8, 2048 tokens) at 1, 2 and 4 ranks on ring and MPI, experts
//! split (expert parallel) and sliced (expert tensor parallel), beside the
//! dense single-process layer and, on one rank, its grouped matmuls beside
//! the per-expert loop; then a small random Mixtral-layout model's prefill
//! and decode at 1, 2 and 4 ranks in both placements, beside mlx-lm on the
//! same weights; then a random DeepSeek-V3-shaped model (latent attention,
//! grouped routing): one rank beside mlx-lm five times interleaved, the
//! machine's two-process ceiling (two one-rank runs started together), and
//! 2 and 4 ranks on ring and MPI in both placements, with the latent
//! cache's bytes per token beside a per-head cache's; then the same rows
//! for a random gpt-oss-shaped model (MXFP4 experts kept as stored on
//! both sides, sinks, windows) and a random GLM-4-MoE-shaped one (partial
//! rotary embedding, q/k norms, grouped routing); then the quantized
//! forms of a Qwen3-MoE-shaped model (`quantized_moe.rs`). `cargo xtask
//! bench moe deepseek`, `... moe gpt-oss`, `... moe glm` or `... moe
//! quantized` runs only that model's rows. JSON lines in
//! `target/bench/moe.jsonl` (layer rows have `"layer"`, model rows
//! `"impl"`), then a table and the targets' ratios.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::generate::peers_python;
use super::{dense_layer, finish, is_model, launch, median_of, prepare};
use crate::cmd;

const LAYER: [&str; 12] = [
    "--layer",
    "moe",
    "--tokens",
    "2048",
    "--d-model",
    "1024",
    "--experts",
    "64",
    "--hidden",
    "512",
    "--top-k",
    "8",
];
const ITERS: [&str; 2] = ["--iters", "3"];
const PROMPT: &str = "128";
const DECODE: &str = "32";
const PLACEMENTS: [&str; 2] = ["parallel", "tensor-parallel"];

/// A random model of a family's shape, made once into the cache by the
/// peers' Python.
struct Shaped {
    /// Its directory under the cache's `models/`, and what rows match.
    dir: &'static str,
    /// The name rows and messages use.
    name: &'static str,
    /// `peers.py`'s command that writes it.
    make: &'static str,
    /// The golden model whose tokenizer it copies.
    tokenizer: &'static str,
}

const SHAPED: [Shaped; 3] = [
    Shaped {
        dir: "deepseek-v3-small-random",
        name: "deepseek",
        make: "make-deepseek",
        tokenizer: "tests/golden/moe/deepseek-v3",
    },
    Shaped {
        dir: "gpt-oss-small-random",
        name: "gpt-oss",
        make: "make-gpt-oss",
        tokenizer: "tests/golden/moe/gpt-oss",
    },
    Shaped {
        dir: "glm4-moe-small-random",
        name: "glm",
        make: "make-glm",
        tokenizer: "tests/golden/moe/glm4-moe",
    },
];

/// `only`: `deepseek`, `gpt-oss`, `glm` or `quantized` runs that
/// model's rows alone.
pub fn run(only: Option<&str>) -> Result<(), String> {
    if only == Some("quantized") {
        let (release, out) = prepare("moe-quantized.jsonl")?;
        super::quantized_moe::rows(&release, &peers_python()?, &out)?;
        super::quantized_moe::report(&finish(&out)?);
        return Ok(());
    }
    if let Some(name) = only {
        let Some(shaped) = SHAPED.iter().find(|m| m.name == name) else {
            return Err(format!(
                "bench moe takes no argument, `deepseek`, `gpt-oss`, `glm` or `quantized`; got {name:?}"
            ));
        };
        let (release, out) = prepare(&format!("moe-{name}.jsonl"))?;
        shaped_rows(shaped, &release, &peers_python()?, &out)?;
        report(&finish(&out)?);
        return Ok(());
    }
    let (release, out) = prepare("moe.jsonl")?;
    let mut dense = LAYER.to_vec();
    dense.extend(ITERS);
    dense_layer(&release, &dense, &out)?;
    for matmul in ["grouped", "per-expert"] {
        let mut args = LAYER.to_vec();
        args.extend(ITERS);
        args.extend(["--expert-matmul", matmul]);
        launch(&release, ("1", "ring"), "bench_layers", &args, &out)?;
    }
    for backend in ["ring", "mpi"] {
        for ranks in ["2", "4"] {
            for placement in PLACEMENTS {
                let mut args = LAYER.to_vec();
                args.extend(ITERS);
                args.extend(["--placement", placement]);
                launch(&release, (ranks, backend), "bench_layers", &args, &out)?;
            }
        }
    }

    let python = peers_python()?;
    let model = mixtral_model(&python)?;
    let path = model.display().to_string();
    for backend in ["ring", "mpi"] {
        for (ranks, placements) in [
            ("1", &PLACEMENTS[..1]),
            ("2", &PLACEMENTS[..]),
            ("4", &PLACEMENTS[..]),
        ] {
            for placement in placements {
                let args = [
                    "--model",
                    path.as_str(),
                    "--prompt-tokens",
                    PROMPT,
                    "--decode-tokens",
                    DECODE,
                    "--experts",
                    placement,
                ];
                launch(&release, (ranks, backend), "bench_generate", &args, &out)?;
            }
        }
    }
    // mlx-lm as shipped (its wheel's reference BLAS) and on the system's
    // OpenBLAS, the BLAS ours links.
    for preload in [None, super::openblas()] {
        let mut peer = Command::new(&python);
        peer.arg(cmd::root().join("xtask/bench/peers.py"))
            .arg("moe-peer")
            .arg(&model)
            .arg(&out)
            .args([PROMPT, DECODE, "1"])
            .env("OPENBLAS_NUM_THREADS", "1")
            .env("OMP_NUM_THREADS", "1");
        if let Some(lib) = preload {
            peer.env("LD_PRELOAD", lib);
        }
        cmd::run(peer)?;
    }
    for shaped in &SHAPED {
        shaped_rows(shaped, &release, &python, &out)?;
    }
    super::quantized_moe::rows(&release, &python, &out)?;
    let rows = finish(&out)?;
    report(&rows);
    super::quantized_moe::report(&rows);
    Ok(())
}

/// The small random Mixtral-layout model, written once into the cache by
/// the peers' Python (`peers.py make-moe`).
pub(super) fn mixtral_model(python: &Path) -> Result<std::path::PathBuf, String> {
    let model = cmd::cache_root()
        .join("models")
        .join("mixtral-small-random");
    if !model.join("config.json").is_file() {
        let mut make = Command::new(python);
        make.arg(cmd::root().join("xtask/bench/peers.py"))
            .arg("make-moe")
            .arg(&model)
            .arg(cmd::root().join("tests/golden/moe/mixtral"));
        cmd::run(make)?;
    }
    Ok(model)
}

/// A family-shaped model's rows (see the module's comment).
fn shaped_rows(shaped: &Shaped, release: &Path, python: &Path, out: &Path) -> Result<(), String> {
    let model = cmd::cache_root().join("models").join(shaped.dir);
    if !model.join("config.json").is_file() {
        let mut make = Command::new(python);
        make.arg(cmd::root().join("xtask/bench/peers.py"))
            .arg(shaped.make)
            .arg(&model)
            .arg(cmd::root().join(shaped.tokenizer));
        cmd::run(make)?;
    }
    let path = model.display().to_string();
    let args = |placement: &'static str, repeats: &'static str| {
        [
            "--model".to_owned(),
            path.clone(),
            "--prompt-tokens".to_owned(),
            PROMPT.to_owned(),
            "--decode-tokens".to_owned(),
            DECODE.to_owned(),
            "--experts".to_owned(),
            placement.to_owned(),
            "--repeats".to_owned(),
            repeats.to_owned(),
        ]
    };
    // One rank beside mlx-lm on the system's OpenBLAS (the BLAS ours
    // links), interleaved: five runs of each.
    for _ in 0..5 {
        let one = args(PLACEMENTS[0], "1");
        launch(release, ("1", "ring"), "bench_generate", &strs(&one), out)?;
        let mut peer = Command::new(python);
        peer.arg(cmd::root().join("xtask/bench/peers.py"))
            .arg("moe-peer")
            .arg(&model)
            .arg(out)
            .args([PROMPT, DECODE, "1", "1"])
            .env("OPENBLAS_NUM_THREADS", "1")
            .env("OMP_NUM_THREADS", "1");
        if let Some(lib) = super::openblas() {
            peer.env("LD_PRELOAD", lib);
        }
        cmd::run(peer)?;
    }
    super::ceiling(release, &strs(&args(PLACEMENTS[0], "3")), out, shaped.name)?;
    for backend in ["ring", "mpi"] {
        for ranks in ["2", "4"] {
            for placement in PLACEMENTS {
                let a = args(placement, "3");
                launch(release, (ranks, backend), "bench_generate", &strs(&a), out)?;
            }
        }
    }
    Ok(())
}

/// The arguments as `&str`s.
fn strs(a: &[String]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

fn layer<'a>(
    rows: &'a [Value],
    backend: &str,
    ranks: u64,
    placement: &str,
    matmul: &str,
) -> Option<&'a Value> {
    rows.iter().find(|r| {
        r["layer"] == "moe"
            && r["backend"] == backend
            && r["ranks"].as_u64() == Some(ranks)
            && (backend == "dense" || r["placement"] == placement)
            && (backend == "dense" || r["expert_matmul"] == matmul)
            && (backend != "dense" || r["threads"] == "1")
    })
}

fn model<'a>(rows: &'a [Value], backend: &str, ranks: u64, placement: &str) -> Option<&'a Value> {
    rows.iter().find(|r| {
        r["impl"] == "safemlx-dist"
            && is_model(r, "mixtral")
            && r["backend"] == backend
            && r["ranks"].as_u64() == Some(ranks)
            && r["experts"] == placement
    })
}

fn report(rows: &[Value]) {
    let speed = |r: Option<&Value>| r.and_then(|r| r["tokens_per_s"].as_f64());
    let dense = speed(layer(rows, "dense", 1, "", ""));
    println!(
        "{:<6} {:>5} {:<24} {:<11} {:>7} {:>10} {:>10} {:>9} {:>12}",
        "backend",
        "ranks",
        "placement",
        "matmul",
        "threads",
        "ms/step",
        "tokens/s",
        "vs dense",
        "collectives"
    );
    for row in rows.iter().filter(|r| r["layer"] == "moe") {
        let tokens_per_s = row["tokens_per_s"].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:<6} {:>5} {:<24} {:<11} {:>7} {:>10.1} {:>10.0} {:>8.2}x {:>11.1}%",
            row["backend"].as_str().unwrap_or_default(),
            row["ranks"].as_u64().unwrap_or_default(),
            // The dense layer is examples/dense.rs: host routing, one
            // matmul per expert.
            if row["backend"] == "dense" {
                "-"
            } else {
                row["placement"].as_str().unwrap_or("-")
            },
            if row["backend"] == "dense" {
                "-"
            } else {
                row["expert_matmul"].as_str().unwrap_or("-")
            },
            row["threads"].as_str().unwrap_or_default(),
            row["seconds_median"].as_f64().unwrap_or(f64::NAN) * 1e3,
            tokens_per_s,
            tokens_per_s / dense.unwrap_or(f64::NAN),
            row["collective_share"].as_f64().unwrap_or(0.0) * 100.0
        );
    }
    println!(
        "{:<12} {:<6} {:>5} {:<24} {:>10} {:>10}",
        "model", "backend", "ranks", "experts", "prefill/s", "decode/s"
    );
    for row in rows.iter().filter(|r| r.get("impl").is_some()) {
        println!(
            "{:<12} {:<6} {:>5} {:<24} {:>10.1} {:>10.1}",
            row["impl"].as_str().unwrap_or_default(),
            row["backend"].as_str().unwrap_or_default(),
            row["ranks"].as_u64().unwrap_or_default(),
            row["experts"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| row["blas"].as_str().map(|b| format!("({b} BLAS)")))
                .unwrap_or_else(|| "-".to_owned()),
            row["prefill_tokens_per_s"].as_f64().unwrap_or(f64::NAN),
            row["decode_tokens_per_s"].as_f64().unwrap_or(f64::NAN)
        );
    }
    let grouped = speed(layer(rows, "ring", 1, "expert parallel", "Grouped"));
    let looped = speed(layer(rows, "ring", 1, "expert parallel", "PerExpert"));
    if let (Some(g), Some(l)) = (grouped, looped) {
        println!(
            "target: grouped matmuls vs the per-expert loop, 64 experts, top-8, one rank: {:.2}x the tokens/s (goal >= 2x)",
            g / l
        );
    }
    for backend in ["ring", "mpi"] {
        if let (Some(ep), Some(d)) = (
            speed(layer(rows, backend, 2, "expert parallel", "Auto")),
            dense,
        ) {
            println!(
                "target: MoE layer {backend} x2 expert parallel vs dense (one thread each): {:.2}x the tokens/s (goal >= 1.7x)",
                ep / d
            );
        }
    }
    for shaped in &SHAPED {
        report_shaped(rows, shaped.name);
    }
    let decode = |ranks, placement| {
        model(rows, "mpi", ranks, placement).and_then(|r| r["decode_tokens_per_s"].as_f64())
    };
    let best = ["expert parallel", "expert tensor parallel"]
        .into_iter()
        .filter_map(|p| decode(2, p).map(|v| (v, p)))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    if let (Some((two, placement)), Some(one)) = (best, decode(1, "expert parallel")) {
        println!(
            "target: MoE model decode, MPI x2 ({placement}) vs 1 rank: {:.2}x the tokens/s (goal >= 1.2x)",
            two / one
        );
    }
}

/// A family-shaped model's targets: one rank vs mlx-lm, two MPI ranks vs
/// the two-process ceiling, and the cache's bytes per token.
fn report_shaped(rows: &[Value], name: &str) {
    let ours = |r: &Value| r["impl"] == "safemlx-dist" && is_model(r, name);
    let one = |r: &Value| ours(r) && r["ranks"].as_u64() == Some(1);
    let peer = |r: &Value| r["impl"] == "mlx-lm" && is_model(r, name);
    let decode = "decode_tokens_per_s";
    if let Some(row) = rows.iter().find(|r| one(r)) {
        println!(
            "{name}-shaped: KV cache {} bytes per token per rank; a per-head cache would hold {}",
            row["cache_bytes_per_token"], row["per_head_cache_bytes_per_token"]
        );
    }
    let (alone, mlx_lm) = (median_of(rows, one, decode), median_of(rows, peer, decode));
    if let (Some(a), Some(m)) = (alone, mlx_lm) {
        println!(
            "target: {name}-shaped decode, 1 rank vs mlx-lm (OpenBLAS, medians of 5 interleaved runs): {a:.1} vs {m:.1} tokens/s = {:.2}x (goal >= 0.9x)",
            a / m
        );
    }
    let ceiling = median_of(
        rows,
        |r| r["impl"] == "ceiling" && is_model(r, name),
        decode,
    );
    let best = ["expert parallel", "expert tensor parallel"]
        .into_iter()
        .filter_map(|p| {
            let two = |r: &Value| {
                ours(r)
                    && r["backend"] == "mpi"
                    && r["ranks"].as_u64() == Some(2)
                    && r["experts"] == p
            };
            median_of(rows, two, decode).map(|v| (v, p))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0));
    if let (Some((two, placement)), Some(a), Some(c)) = (best, alone, ceiling) {
        println!(
            "target: {name}-shaped decode, MPI x2 ({placement}) vs 1 rank: {:.2}x; the ceiling (two 1-rank runs together) {:.2}x; ratio {:.2} (goal >= 0.7)",
            two / a,
            c / a,
            (two / a) / (c / a)
        );
    }
}
