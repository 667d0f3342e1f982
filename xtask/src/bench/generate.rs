//! `cargo xtask bench generate`: SmolLM2-135M prefill (512 tokens) and
//! decode tokens/s at 1, 2 and 3 ranks on ring and MPI, one compute thread
//! per rank, and in the same run the peers on the same weights: mlx-lm
//! (MLX Python, the GGUF's tensors dequantized to the same float32 values,
//! and its quantized layers on the GGUF's blocks as MLX's GGUF loader maps
//! them) and llama.cpp (llama-cpp-python on the GGUF itself), with one
//! thread and with all threads. JSON lines in `target/bench/generate.jsonl`, then the
//! table and the targets' ratios. Our rows run twice: with the weights
//! dequantized to float32 (`--dequantize`, the peers' weights) and with the
//! GGUF's quantized blocks kept quantized.
//!
//! The peers run from a virtual environment in the cache
//! (`<cache>/bench-venv`, made once: llama-cpp-python compiles llama.cpp).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::{finish, launch, prepare};
use crate::{cmd, models, setup};

const PROMPT: &str = "512";
const DECODE: &str = "64";
const PEERS: &[&str] = &[
    "mlx[cpu]==0.32.4",
    "mlx-lm==0.32.2",
    "llama-cpp-python[server]==0.3.36",
    "gguf==0.19.0",
    "numpy",
    "safetensors",
];

/// The peers' Python, installing the environment the first time.
pub(super) fn peers_python() -> Result<PathBuf, String> {
    let venv = cmd::cache_root().join("bench-venv");
    let python = venv.join("bin").join("python");
    let ready = venv.join(".ready");
    if std::fs::read_to_string(&ready).is_ok_and(|done| done == PEERS.join("\n")) {
        return Ok(python);
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        setup::install_debian_packages(&["python3-venv", "python3-pip"])?;
        let mut venv_cmd = Command::new("python3");
        venv_cmd.args(["-m", "venv"]).arg(&venv);
        cmd::run(venv_cmd)?;
    }
    println!(
        "bench: installing the peers in {} (llama-cpp-python compiles llama.cpp: minutes, once)",
        venv.display()
    );
    let mut pip = Command::new(&python);
    pip.args(["-m", "pip", "install", "--disable-pip-version-check"])
        .args(PEERS);
    cmd::run(pip)?;
    std::fs::write(&ready, PEERS.join("\n"))
        .map_err(|e| format!("cannot write {}: {e}", ready.display()))?;
    Ok(python)
}

/// The GGUF's tensors dequantized to float32 as a Hugging Face directory
/// in the cache, made the first time; with `release`, also the GGUF's
/// tokenizer as our tokenizer reads it (`mlx_lm.server` needs one).
pub(super) fn float_dir(
    python: &Path,
    gguf: &Path,
    release: Option<&Path>,
) -> Result<PathBuf, String> {
    let hf = converted(python, gguf, "SmolLM2-135M-Instruct-f32-hf", "convert")?;
    if let Some(release) = release.filter(|_| !hf.join("tokenizer_config.json").is_file()) {
        let mut tokenizer = Command::new(release.join("examples").join("gguf_tokenizer"));
        tokenizer.arg("--model").arg(gguf).arg("--out").arg(&hf);
        cmd::run(tokenizer)?;
    }
    Ok(hf)
}

/// `peers.py HOW GGUF <cache>/models/NAME`, unless done before.
fn converted(python: &Path, gguf: &Path, name: &str, how: &str) -> Result<PathBuf, String> {
    let dir = cmd::cache_root().join("models").join(name);
    if !dir.join("config.json").is_file() {
        let mut convert = Command::new(python);
        convert
            .arg(cmd::root().join("xtask/bench/peers.py"))
            .arg(how)
            .arg(gguf)
            .arg(&dir);
        cmd::run(convert)?;
    }
    Ok(dir)
}

fn peers(python: &Path, gguf: &Path, out: &Path) -> Result<(), String> {
    let script = cmd::root().join("xtask/bench/peers.py");
    let hf = float_dir(python, gguf, None)?;
    let quantized = converted(
        python,
        gguf,
        "SmolLM2-135M-Instruct-Q4_1-mlx",
        "convert-quantized",
    )?;
    // As shipped (the wheel's reference BLAS) with llama.cpp, then the
    // mlx-lm rows again on the system's OpenBLAS, the BLAS ours links.
    let openblas = super::openblas();
    for threads in ["1", "all"] {
        for preload in [None, openblas.as_ref()] {
            let mut run = Command::new(python);
            run.arg(&script)
                .arg("run")
                .arg(gguf)
                .arg(&hf)
                .arg(&quantized)
                .arg(out)
                .args([PROMPT, DECODE, threads]);
            if let Some(lib) = preload {
                run.arg("mlx-only").env("LD_PRELOAD", lib);
            }
            if threads == "1" {
                run.env("OPENBLAS_NUM_THREADS", "1")
                    .env("OMP_NUM_THREADS", "1");
            } else {
                run.env_remove("OPENBLAS_NUM_THREADS")
                    .env_remove("OMP_NUM_THREADS");
            }
            cmd::run(run)?;
        }
    }
    Ok(())
}

pub fn run() -> Result<(), String> {
    let gguf = models::fetch_smollm2()?;
    let (release, out) = prepare("generate.jsonl")?;
    let model = gguf.display().to_string();
    let args = [
        "--model",
        model.as_str(),
        "--prompt-tokens",
        PROMPT,
        "--decode-tokens",
        DECODE,
        "--dequantize",
    ];
    for backend in ["ring", "mpi"] {
        for ranks in ["1", "2", "3"] {
            launch(&release, (ranks, backend), "bench_generate", &args, &out)?;
        }
    }
    // The same with the GGUF's Q4_1/Q8_0 blocks kept quantized.
    let quantized = &args[..args.len() - 1];
    for backend in ["ring", "mpi"] {
        for ranks in ["1", "2", "3"] {
            launch(
                &release,
                (ranks, backend),
                "bench_generate",
                quantized,
                &out,
            )?;
        }
    }
    let python = peers_python()?;
    peers(&python, &gguf, &out)?;
    report(&finish(&out)?);
    Ok(())
}

fn find<'a>(
    rows: &'a [Value],
    implementation: &str,
    backend: &str,
    ranks: u64,
    threads: &str,
) -> Option<&'a Value> {
    find_weights(rows, implementation, backend, ranks, threads, false)
}

/// As [`find`], among the rows whose weights stay quantized or not.
fn find_weights<'a>(
    rows: &'a [Value],
    implementation: &str,
    backend: &str,
    ranks: u64,
    threads: &str,
    quantized: bool,
) -> Option<&'a Value> {
    rows.iter().find(|r| {
        (r["weights"] == "quantized") == quantized
            && r["impl"] == implementation
            && r["backend"] == backend
            && r["ranks"].as_u64() == Some(ranks)
            && (r["threads"] == threads
                || r["threads"].as_u64().map(|t| t.to_string()).as_deref() == Some(threads))
    })
}

fn report(rows: &[Value]) {
    let ours_1 = find(rows, "safemlx-dist", "ring", 1, "1");
    let speed = |r: Option<&Value>, key: &str| r.and_then(|r| r[key].as_f64()).unwrap_or(f64::NAN);
    println!(
        "{:<13} {:<5} {:>5} {:>7} {:>12} {:>11} {:>11} {:>10}  weights",
        "impl",
        "backend",
        "ranks",
        "threads",
        "prefill t/s",
        "decode t/s",
        "vs 1 rank",
        "4K all_sum"
    );
    for row in rows {
        let threads = match &row["threads"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        println!(
            "{:<13} {:<5} {:>5} {:>7} {:>12.1} {:>11.1} {:>10.2}x {:>8}  {}",
            row["impl"].as_str().unwrap_or_default(),
            row["backend"].as_str().unwrap_or_default(),
            row["ranks"].as_u64().unwrap_or_default(),
            threads,
            speed(Some(row), "prefill_tokens_per_s"),
            speed(Some(row), "decode_tokens_per_s"),
            speed(Some(row), "decode_tokens_per_s") / speed(ours_1, "decode_tokens_per_s"),
            row["all_sum_4k_us"]
                .as_f64()
                .map_or("-".to_owned(), |us| format!("{us:.0} us")),
            match row["blas"].as_str() {
                Some(blas) => format!(
                    "{} ({blas} BLAS)",
                    row["weights"].as_str().unwrap_or_default()
                ),
                None => row["weights"].as_str().unwrap_or_default().to_owned(),
            },
        );
    }
    for blas in ["openblas", "bundled"] {
        let mlx_lm = rows.iter().find(|r| {
            r["impl"] == "mlx-lm"
                && r["blas"] == blas
                && r["weights"] != "quantized"
                && r["threads"] == "1"
        });
        println!(
            "target: 1 rank decode vs mlx-lm ({blas} BLAS; same weights, one thread): {:.2}x (goal >= 1x)",
            speed(ours_1, "decode_tokens_per_s") / speed(mlx_lm, "decode_tokens_per_s")
        );
    }
    for backend in ["ring", "mpi"] {
        let one = find(rows, "safemlx-dist", backend, 1, "1");
        let two = find(rows, "safemlx-dist", backend, 2, "1");
        println!(
            "target: {backend} x2 prefill of {PROMPT} tokens: {:.2}x the 1-rank tokens/s (goal >= 1.7x)",
            speed(two, "prefill_tokens_per_s") / speed(one, "prefill_tokens_per_s")
        );
        let goal = if backend == "mpi" { 1.3 } else { 1.0 };
        println!(
            "target: {backend} x2 decode: {:.2}x the 1-rank tokens/s (goal >= {goal}x); 4 KiB all_sum {:.0} us",
            speed(two, "decode_tokens_per_s") / speed(one, "decode_tokens_per_s"),
            speed(two, "all_sum_4k_us")
        );
    }
    let q1 = find_weights(rows, "safemlx-dist", "ring", 1, "1", true);
    println!(
        "target: quantized 1 rank decode vs dequantized: {:.2}x (goal >= 2x)",
        speed(q1, "decode_tokens_per_s") / speed(ours_1, "decode_tokens_per_s")
    );
    for blas in ["openblas", "bundled"] {
        let mlx_lm_q = rows.iter().find(|r| {
            r["impl"] == "mlx-lm"
                && r["blas"] == blas
                && r["weights"] == "quantized"
                && r["threads"] == "1"
        });
        println!(
            "target: quantized 1 rank decode vs mlx-lm's quantized layers ({blas} BLAS; same weights, one thread): {:.2}x (goal >= 1x)",
            speed(q1, "decode_tokens_per_s") / speed(mlx_lm_q, "decode_tokens_per_s")
        );
    }
    let q_mpi = |n| find_weights(rows, "safemlx-dist", "mpi", n, "1", true);
    println!(
        "target: quantized mpi x2 decode: {:.2}x the 1-rank tokens/s (goal >= 1.3x)",
        speed(q_mpi(2), "decode_tokens_per_s") / speed(q_mpi(1), "decode_tokens_per_s")
    );
}
