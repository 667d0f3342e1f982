//! `cargo xtask bench collectives|layers|generate|moe|serve|train|layouts|mesh`: benchmarks run through the
//! launcher, writing JSON lines under `target/bench/`.

mod collectives;
mod generate;
mod layers;
mod layouts;
mod mesh;
mod moe;
mod quantized_moe;
mod serve;
mod train;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::{cmd, setup, tasks};

pub fn run(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("collectives") | None => collectives::run(),
        Some("layers") => layers::run(),
        Some("generate") => generate::run(),
        Some("moe") => moe::run(args.get(1).map(String::as_str)),
        Some("serve") => serve::run(args.get(1).is_some_and(|a| a == "--peers-only")),
        Some("train") => train::run(),
        Some("layouts") => layouts::run(),
        Some("mesh") => mesh::run(),
        Some(other) => Err(format!(
            "unknown benchmark {other:?}; expected: collectives, layers, generate, moe, serve, train, layouts or mesh"
        )),
    }
}

/// Installs what is missing, builds the examples and the launcher, and
/// empties `target/bench/NAME`: the release directory and that file.
fn prepare(name: &str) -> Result<(PathBuf, PathBuf), String> {
    setup::run()?;
    let release = tasks::build_examples_and_launcher()?;
    let out_dir = cmd::target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
    let out = out_dir.join(name);
    std::fs::write(&out, "").map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    Ok((release, out))
}

/// Runs `program ARGS --backend BACKEND --out OUT` as `ranks` ranks of
/// `backend` through the launcher, one BLAS thread per rank: each rank
/// stands for one device.
fn launch(
    release: &Path,
    (ranks, backend): (&str, &str),
    program: &str,
    args: &[&str],
    out: &Path,
) -> Result<(), String> {
    let mut launch = Command::new(release.join("safemlx-launch"));
    launch
        .args(["-n", ranks, "--backend", backend, "--timeout", "1800", "--"])
        .arg(release.join("examples").join(program))
        .args(args)
        .args(["--backend", backend, "--out"])
        .arg(out)
        .env("OPENBLAS_NUM_THREADS", "1");
    cmd::run(launch)
}

/// Runs `bench_layers ARGS --dense` on one process (the dense baseline)
/// with one BLAS thread and with all threads, appending to `out`.
fn dense_layer(release: &Path, args: &[&str], out: &Path) -> Result<(), String> {
    let program = release.join("examples").join("bench_layers");
    for threads in ["1", "all"] {
        let mut dense = Command::new(&program);
        dense
            .args(args)
            .args(["--dense", "--threads", threads, "--out"])
            .arg(out);
        if threads == "1" {
            dense.env("OPENBLAS_NUM_THREADS", "1");
        } else {
            dense.env_remove("OPENBLAS_NUM_THREADS");
        }
        cmd::run(dense)?;
    }
    Ok(())
}

/// The system's OpenBLAS (Debian's `libopenblas0`, which `libopenblas-dev`
/// brings), for preloading under MLX Python: its `mlx[cpu]` wheel ships
/// the reference BLAS, about 17x slower for a 1024³ sgemm here.
fn openblas() -> Option<PathBuf> {
    let arch = std::env::consts::ARCH;
    [
        format!("/usr/lib/{arch}-linux-gnu/libopenblas.so.0"),
        "/usr/lib/libopenblas.so.0".to_owned(),
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

/// Reads back what the runs wrote and prints the count.
fn finish(out: &Path) -> Result<Vec<Value>, String> {
    let rows = read_rows(out)?;
    println!("bench: {} measurements in {}", rows.len(), out.display());
    Ok(rows)
}

/// The JSON lines of `path`.
pub(super) fn read_rows(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| format!("bad bench line {l:?}: {e}")))
        .collect()
}

/// What two processes get at all on this machine: two one-rank runs of
/// `bench_generate ARGS` (on model `name`) started together; one row
/// `"impl": "ceiling"` with the sum of their tokens/s.
pub(super) fn ceiling(release: &Path, args: &[&str], out: &Path, name: &str) -> Result<(), String> {
    let parts: Vec<_> = (0..2)
        .map(|i| {
            let stem = out
                .file_stem()
                .map_or("bench".into(), |s| s.to_string_lossy());
            out.with_file_name(format!("{stem}-ceiling-{name}-{i}.jsonl"))
        })
        .collect();
    let children = parts
        .iter()
        .map(|part| {
            std::fs::write(part, "")
                .map_err(|e| format!("cannot write {}: {e}", part.display()))?;
            Command::new(release.join("safemlx-launch"))
                .args(["-n", "1", "--timeout", "1800", "--"])
                .arg(release.join("examples").join("bench_generate"))
                .args(args)
                .arg("--out")
                .arg(part)
                .env("OPENBLAS_NUM_THREADS", "1")
                .spawn()
                .map_err(|e| format!("cannot start bench_generate: {e}"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    for mut child in children {
        let status = child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("a ceiling run of bench_generate failed: {status}"));
        }
    }
    let runs: Vec<Value> = parts
        .iter()
        .map(|p| read_rows(p))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .flatten()
        .collect();
    let sum = |key: &str| runs.iter().filter_map(|r| r[key].as_f64()).sum::<f64>();
    let row = serde_json::json!({
        "impl": "ceiling",
        "model": runs.first().map(|r| r["model"].clone()),
        "runs": runs.len(),
        "prefill_tokens_per_s": sum("prefill_tokens_per_s"),
        "decode_tokens_per_s": sum("decode_tokens_per_s"),
    });
    println!("{row}");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(out)
        .map_err(|e| format!("cannot open {}: {e}", out.display()))?;
    writeln!(file, "{row}").map_err(|e| e.to_string())
}

/// Whether row `r` measured the model whose directory's name has `name`.
pub(super) fn is_model(r: &Value, name: &str) -> bool {
    r["model"].as_str().is_some_and(|m| m.contains(name))
}

/// The median of `key` over the rows `keep` selects.
pub(super) fn median_of(rows: &[Value], keep: impl Fn(&Value) -> bool, key: &str) -> Option<f64> {
    let mut v: Vec<f64> = rows
        .iter()
        .filter(|r| keep(r))
        .filter_map(|r| r[key].as_f64())
        .collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}
