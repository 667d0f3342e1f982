//! `cargo xtask bench moe quantized`: a random Qwen3-MoE-shaped model
//! (`peers.py make-qwen3-moe`: D 1024, 8 layers, 32 experts of 512, top-4)
//! in the forms people download, each made by the real tool: mlx-lm's
//! 4-bit conversion (groups of 64) and llama.cpp's Q4_K_M. Five
//! interleaved rounds, each: ours at 1 rank on the 4-bit directory
//! (`--weights` as stored) beside mlx-lm on the same directory, ours at 2
//! MPI ranks expert parallel beside the two-process ceiling (two 1-rank
//! runs started together), ours at 1 rank on the GGUF beside llama.cpp on
//! the same file (one thread each). Then each format's load at 1 and 2
//! ranks (time, peak resident memory per rank). Rows in
//! `target/bench/moe-quantized.jsonl` (or `moe.jsonl` within `bench moe`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::{ceiling, is_model, launch, median_of};
use crate::cmd;

const PROMPT: &str = "128";
const DECODE: &str = "32";
const ROUNDS: usize = 5;

/// The float model and its two quantized forms, made once into the cache.
struct Forms {
    float: PathBuf,
    mlx_4bit: PathBuf,
    gguf: PathBuf,
}

fn peer(python: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(python);
    c.arg(cmd::root().join("xtask/bench/peers.py")).args(args);
    c
}

fn forms(python: &Path) -> Result<Forms, String> {
    let models = cmd::cache_root().join("models");
    let forms = Forms {
        float: models.join("qwen3-moe-small-random"),
        mlx_4bit: models.join("qwen3-moe-small-4bit"),
        gguf: models.join("qwen3-moe-small-Q4_K_M.gguf"),
    };
    let path = |p: &Path| p.display().to_string();
    if !forms.float.join("config.json").is_file() {
        let tokenizer = cmd::root().join("tests/golden/moe/qwen3-moe");
        cmd::run(peer(
            python,
            &["make-qwen3-moe", &path(&forms.float), &path(&tokenizer)],
        ))?;
    }
    if !forms.mlx_4bit.join("config.json").is_file() {
        cmd::run(peer(
            python,
            &["quantize-mlx", &path(&forms.float), &path(&forms.mlx_4bit)],
        ))?;
    }
    if !forms.gguf.is_file() {
        cmd::run(peer(
            python,
            &["gguf-q4km", &path(&forms.float), &path(&forms.gguf)],
        ))?;
    }
    Ok(forms)
}

/// The rows (see the module's comment), appended to `out`.
pub fn rows(release: &Path, python: &Path, out: &Path) -> Result<(), String> {
    let forms = forms(python)?;
    let path = |p: &Path| p.display().to_string();
    let (q4, gguf, float) = (path(&forms.mlx_4bit), path(&forms.gguf), path(&forms.float));
    let args = |model: &str, repeats: &str| -> Vec<String> {
        [
            "--model",
            model,
            "--prompt-tokens",
            PROMPT,
            "--decode-tokens",
            DECODE,
            "--experts",
            "parallel",
            "--repeats",
            repeats,
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let ours = |model: &str, ranks: &str, backend: &str| -> Result<(), String> {
        let a = args(model, "1");
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        launch(release, (ranks, backend), "bench_generate", &a, out)
    };
    let one_thread = |mut c: Command| -> Result<(), String> {
        c.env("OPENBLAS_NUM_THREADS", "1")
            .env("OMP_NUM_THREADS", "1");
        if let Some(lib) = super::openblas() {
            c.env("LD_PRELOAD", lib);
        }
        cmd::run(c)
    };
    let sink = path(out);
    for round in 1..=ROUNDS {
        println!("bench moe quantized: round {round} of {ROUNDS}");
        ours(&q4, "1", "ring")?;
        one_thread(peer(
            python,
            &["moe-peer", &q4, &sink, PROMPT, DECODE, "1", "1"],
        ))?;
        ours(&q4, "2", "mpi")?;
        let a = args(&q4, "1");
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        ceiling(release, &a, out, "qwen3-4bit")?;
        ours(&gguf, "1", "ring")?;
        one_thread(peer(
            python,
            &["llama-cpp-peer", &gguf, &sink, PROMPT, DECODE, "1", "1"],
        ))?;
    }
    // The loads not measured above: the float model at 1 and 2 ranks, the
    // GGUF at 2.
    ours(&float, "1", "ring")?;
    ours(&float, "2", "mpi")?;
    ours(&gguf, "2", "mpi")
}

/// The table of loads and the targets' ratios.
pub fn report(rows: &[Value]) {
    let decode = "decode_tokens_per_s";
    let ours = |r: &Value, name: &str, ranks: u64| {
        r["impl"] == "safemlx-dist" && is_model(r, name) && r["ranks"].as_u64() == Some(ranks)
    };
    println!(
        "{:<36} {:>5} {:<5} {:>8} {:>10} {:>22}",
        "model", "ranks", "link", "load s", "decode/s", "peak RSS MiB by rank"
    );
    for r in rows
        .iter()
        .filter(|r| r["impl"] == "safemlx-dist" && is_model(r, "qwen3-moe-small"))
    {
        let model = r["model"].as_str().unwrap_or_default();
        let name = model.rsplit('/').next().unwrap_or(model);
        let peaks: Vec<String> = r["load_peak_rss_mib"]
            .as_array()
            .map(|v| {
                v.iter()
                    .map(|p| format!("{:.0}", p.as_f64().unwrap_or(f64::NAN)))
                    .collect()
            })
            .unwrap_or_default();
        println!(
            "{name:<36} {:>5} {:<5} {:>8.2} {:>10.1} {:>22}",
            r["ranks"].as_u64().unwrap_or_default(),
            r["backend"].as_str().unwrap_or_default(),
            r["load_seconds"].as_f64().unwrap_or(f64::NAN),
            r[decode].as_f64().unwrap_or(f64::NAN),
            peaks.join(" ")
        );
    }
    let ours_4bit = median_of(rows, |r| ours(r, "qwen3-moe-small-4bit", 1), decode);
    let mlx_lm = median_of(
        rows,
        |r| r["impl"] == "mlx-lm" && is_model(r, "qwen3-moe-small-4bit"),
        decode,
    );
    if let (Some(a), Some(m)) = (ours_4bit, mlx_lm) {
        println!(
            "target: 4-bit Qwen3-MoE-shaped decode, 1 rank (as stored) vs mlx-lm on the same directory (medians of {ROUNDS} interleaved runs): {a:.1} vs {m:.1} tokens/s = {:.2}x (goal >= 1.0x)",
            a / m
        );
    }
    let two = median_of(
        rows,
        |r| ours(r, "qwen3-moe-small-4bit", 2) && r["backend"] == "mpi",
        decode,
    );
    let ceiling = median_of(
        rows,
        |r| r["impl"] == "ceiling" && is_model(r, "qwen3-moe-small-4bit"),
        decode,
    );
    if let (Some(t), Some(c)) = (two, ceiling) {
        println!(
            "target: 4-bit Qwen3-MoE-shaped decode, MPI x2 expert parallel vs the two-process ceiling (two 1-rank runs together): {t:.1} vs {c:.1} tokens/s = {:.2} (goal >= 0.9)",
            t / c
        );
    }
    let gguf = median_of(rows, |r| ours(r, "Q4_K_M", 1), decode);
    let llama_cpp = median_of(
        rows,
        |r| r["impl"] == "llama.cpp" && is_model(r, "Q4_K_M"),
        decode,
    );
    if let (Some(g), Some(l)) = (gguf, llama_cpp) {
        println!(
            "report: Q4_K_M GGUF decode, 1 rank vs llama.cpp (one thread each): {g:.1} vs {l:.1} tokens/s = {:.2}x (no target on this CPU)",
            g / l
        );
    }
}
