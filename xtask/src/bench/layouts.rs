//! `cargo xtask bench layouts`: SmolLM2-135M (float32 weights, as `bench
//! generate`'s rows) prefill of 512 tokens and 64 decode steps, one
//! compute thread per rank, as one rank, as 2 ranks tensor parallel
//! (`tp=2`) and as 2 pipeline stages (`pp=2`, the prompt in chunks of 64),
//! on ring and MPI over loopback; the same at 4 ranks (`tp=4`, `pp=2,tp=2`,
//! `pp=4`; oversubscribed on 2 cores); the small random Mixtral-layout
//! model (`peers.py make-moe`) as one rank, `tp=2` and `pp=2`; and the
//! machine's two-process ceiling (two one-rank runs started together) in
//! the same run. Then `tp=2` and
//! `pp=2` on ring across two test-network hosts whose links hold every
//! packet 2 ms (`tests/tests/layouts_delayed.rs`, 128-token prompt, 16
//! decode steps; skipped where the network cannot be built). JSON lines in
//! `target/bench/layouts.jsonl`, then each layout against one rank and
//! against the ceiling, and pipeline against tensor-parallel decode across
//! the delayed links.

use serde_json::Value;

use super::{ceiling, finish, launch, prepare};
use crate::{cmd, models};

const LAYOUTS: [(&str, &str); 3] = [("1", "pp=1,tp=1"), ("2", "pp=1,tp=2"), ("2", "pp=2,tp=1")];

/// SmolLM2 at 4 ranks: oversubscribed on 2 cores (two ranks per core), so
/// these rows compare the layouts with each other, not with one rank.
const FOUR: [(&str, &str); 3] = [("4", "pp=1,tp=4"), ("4", "pp=2,tp=2"), ("4", "pp=4,tp=1")];

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
        for (ranks, mesh) in LAYOUTS.iter().chain(&FOUR) {
            launch(
                &release,
                (ranks, backend),
                "bench_generate",
                &args(mesh),
                &out,
            )?;
        }
    }
    // The small Mixtral-layout model (float32, experts split across each
    // stage's ranks).
    let moe = super::moe::mixtral_model(&super::generate::peers_python()?)?;
    let moe = moe.display().to_string();
    for backend in ["ring", "mpi"] {
        for (ranks, mesh) in LAYOUTS {
            let moe_args = [
                "--model",
                moe.as_str(),
                "--prompt-tokens",
                "512",
                "--decode-tokens",
                "64",
                "--mesh",
                mesh,
                "--prefill-chunk",
                "64",
            ];
            launch(
                &release,
                (ranks, backend),
                "bench_generate",
                &moe_args,
                &out,
            )?;
        }
    }
    let mut alone = args("pp=1,tp=1").to_vec();
    alone.extend(["--backend", "ring"]);
    ceiling(&release, &alone, &out, "smollm2")?;
    let mut delayed = cmd::cargo(&[
        "test",
        "--release",
        "-p",
        "safemlx-dist-tests",
        "--test",
        "layouts_delayed",
        "--",
        "--ignored",
        "--nocapture",
    ]);
    delayed
        .env("SAFEMLX_BENCH_MODEL", &gguf)
        .env("SAFEMLX_BENCH_OUT", &out);
    cmd::run(delayed)?;
    let rows = finish(&out)?;
    report(&rows);
    report_more(&rows);
    report_delayed(&rows);
    Ok(())
}

/// `tp=2` against `pp=2` across the delayed links on ring and MPI (goal:
/// pipeline decode at least 1.8x tensor parallel), with the delaying
/// threads' CPU time and how many starts each run took.
fn report_delayed(rows: &[Value]) {
    for backend in ["ring", "mpi"] {
        // Rows of runs before MPI joined them name no backend: ring.
        let of = |r: &&Value| r["backend"].as_str().unwrap_or("ring") == backend;
        let across = |mesh: &str| {
            rows.iter()
                .filter(of)
                .find(|r| r["link"] == "2ms" && r["mesh"] == mesh && r["impl"] == "safemlx-dist")
        };
        let note = |mesh: &str| {
            rows.iter()
                .filter(of)
                .find(|r| r["bench"] == "layouts-delay" && r["mesh"] == mesh)
        };
        let value = |r: &Value, key: &str| r[key].as_f64().unwrap_or(0.0);
        for mesh in ["pp=1,tp=2", "pp=2,tp=1"] {
            let name = mesh.replace("pp=1,", "").replace(",tp=1", "");
            let attempts = note(mesh).map_or(1.0, |n| value(n, "attempts"));
            match (across(mesh), note(mesh)) {
                (Some(r), n) => println!(
                    "{backend} across 2 ms links: {name} prefill {:.1} tokens/s, decode {:.2} tokens/s, all_sum 4 KiB {:.0} us; the delaying threads used {:.1} CPU s; started in {attempts} attempt(s)",
                    value(r, "prefill_tokens_per_s"),
                    value(r, "decode_tokens_per_s"),
                    value(r, "all_sum_4k_us"),
                    n.map_or(0.0, |n| value(n, "delay_threads_cpu_s")),
                ),
                (None, Some(n)) => println!(
                    "{backend} across 2 ms links: {name}: {} in {attempts} attempts",
                    n["failed"].as_str().unwrap_or("no row")
                ),
                (None, None) => {
                    println!("{backend}: no rows across delayed links (the test network could not be built)");
                }
            }
        }
        if let (Some(tp), Some(pp)) = (across("pp=1,tp=2"), across("pp=2,tp=1")) {
            println!(
                "target: {backend} across 2 ms links pp=2 decode {:.2}x tp=2 decode (goal >= 1.8)",
                value(pp, "decode_tokens_per_s") / value(tp, "decode_tokens_per_s").max(1e-9)
            );
        }
    }
}

/// SmolLM2's loopback row of `backend` and `mesh`.
fn row<'a>(rows: &'a [Value], backend: &str, mesh: &str) -> Option<&'a Value> {
    model_row(rows, "SmolLM2", backend, mesh)
}

/// The loopback row of the model whose path has `model`.
fn model_row<'a>(rows: &'a [Value], model: &str, backend: &str, mesh: &str) -> Option<&'a Value> {
    rows.iter().find(|r| {
        r["impl"] == "safemlx-dist"
            && r["model"].as_str().is_some_and(|m| m.contains(model))
            && r["backend"] == backend
            && r["mesh"] == mesh
            && r["link"] != "2ms"
    })
}

/// The 4-rank SmolLM2 rows and the MoE model's, each against its model's
/// one rank on the same backend.
fn report_more(rows: &[Value]) {
    println!("| model | backend | mesh | prefill tokens/s | decode tokens/s | vs 1 rank (prefill, decode) |");
    println!("|---|---|---|---|---|---|");
    let cases = [
        ("SmolLM2", &FOUR[..]),
        ("mixtral-small-random", &LAYOUTS[1..]),
    ];
    for (model, layouts) in cases {
        for backend in ["ring", "mpi"] {
            let one = model_row(rows, model, backend, "pp=1,tp=1");
            for (_, mesh) in layouts {
                let Some(r) = model_row(rows, model, backend, mesh) else {
                    continue;
                };
                let value = |r: &Value, key: &str| r[key].as_f64().unwrap_or(0.0);
                let (p, d) = (
                    value(r, "prefill_tokens_per_s"),
                    value(r, "decode_tokens_per_s"),
                );
                let versus = one.map_or(String::from("-"), |o| {
                    let (p1, d1) = (
                        value(o, "prefill_tokens_per_s"),
                        value(o, "decode_tokens_per_s"),
                    );
                    format!("{:.2}x, {:.2}x", p / p1.max(1e-9), d / d1.max(1e-9))
                });
                println!("| {model} | {backend} | {mesh} | {p:.1} | {d:.1} | {versus} |");
            }
        }
    }
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
        if let (Some(p1), Some(pc), Some(p)) = (p1, pc, value(tp, "prefill_tokens_per_s")) {
            println!(
                "target: {backend} tp=2 prefill {:.2}x one rank; ratio {:.2} of the ceiling (goal >= 0.92; 4 + 4 query heads, head 4 shared by rows)",
                p / p1,
                p / pc
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
