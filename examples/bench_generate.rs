//! The generation benchmark of `cargo xtask bench generate`: prefill of a
//! prompt of `--prompt-tokens` tokens and `--decode-tokens` decode steps
//! with the KV cache, on N ranks; rank 0 appends one JSON line to `--out`.
//! It also times a 4 KiB `all_sum` through `safemlx_dist::eval`, the
//! collective each decode step waits on twice per layer, and the host
//! time to build one decode step's graph (`decode_graph_us`, before any of
//! it is computed).
//!
//! With `--mesh pp=N` the ranks are N pipeline stages (the prompt in
//! chunks of `--prefill-chunk` tokens), timed by rank 0 through
//! `generate_stages`: prefill until the first token is back on stage 0.
//!
//! ```text
//! safemlx-launch -n 2 -- target/release/examples/bench_generate --model FILE.gguf --out FILE.jsonl [--dequantize] [--mesh pp=2]
//! ```
//!
//! The prompt is the token ids `(i * 7919) % 20000 + 100`, which the
//! peers' script (`xtask/bench/peers.py`) feeds too. The row also has the
//! load's time (`load_seconds`, rank 0) and each rank's peak resident
//! memory once loaded (`load_peak_rss_mib`, Linux's `VmHWM`, by rank).

use std::process::ExitCode;
use std::time::Instant;

use safemlx::Array;
use safemlx_dist::generate::{generate_stages, Sampler};
use safemlx_dist::models::{load_stage, load_with, LayerSplit, LoadOptions, Storage};
use safemlx_dist::nn::{gather_logits, ExpertPlacement};
use safemlx_dist::typed::{MeshSpec, StageLink};
use safemlx_dist::{all_sum, init, DeviceMesh};
use safemlx_dist_examples::{backend_from_args, cpu_stream, flag, median, values};

fn main() -> ExitCode {
    safemlx_dist_examples::exit("bench_generate", run())
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn number(name: &str, default: usize) -> Result<usize, String> {
    match flag(name) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|_| format!("{name} takes a whole number, got {v:?}")),
    }
}

fn run() -> Result<(), String> {
    safemlx_dist_examples::command_line(
        "bench_generate",
        "Prefill and decode tokens/s of a model, JSON lines",
        &[
            safemlx_dist_examples::BACKEND,
            ("--model", Some("DIR|FILE.gguf"), "The model"),
            ("--out", Some("FILE"), "Append the JSON lines to FILE"),
            ("--prompt-tokens", Some("N"), "Prompt length"),
            ("--decode-tokens", Some("N"), "Decode steps"),
            ("--repeats", Some("N"), "Repetitions"),
            ("--dequantize", None, "Load quantized weights as float32"),
            (
                "--experts",
                Some("parallel|tensor-parallel"),
                "Where an MoE model's experts go",
            ),
            (
                "--mesh",
                Some("pp=P,tp=T"),
                "Pipeline stages x tensor-parallel ranks",
            ),
            (
                "--link",
                Some("LABEL"),
                "What links the ranks (written to the row; loopback when absent)",
            ),
            (
                "--prefill-chunk",
                Some("C"),
                "Prompt tokens per chunk of a pipelined prefill",
            ),
        ],
    );
    let model_path = flag("--model").ok_or("--model FILE is required")?;
    let out = flag("--out").ok_or("--out FILE is required")?;
    let prompt_len = number("--prompt-tokens", 512)?;
    let decode = number("--decode-tokens", 64)?;
    let repeats = number("--repeats", 3)?.max(1);
    let backend = backend_from_args()?;
    let s = cpu_stream();
    let group = init(false, backend).map_err(err)?;
    let (rank, n) = (group.rank(), group.size());
    // `--dequantize`: float32 weights (the rows measured so far); without
    // it the quantized blocks stay quantized.
    let weights = if std::env::args().any(|a| a == "--dequantize") {
        Storage::Dequantized
    } else {
        Storage::AsStored
    };
    let experts = match flag("--experts").as_deref() {
        None | Some("parallel") => ExpertPlacement::ExpertParallel,
        Some("tensor-parallel") => ExpertPlacement::ExpertTensorParallel,
        Some(other) => {
            return Err(format!(
                "--experts takes parallel or tensor-parallel, got {other:?}"
            ))
        }
    };
    let path = std::path::Path::new(&model_path);
    let mesh: MeshSpec = match flag("--mesh") {
        Some(m) => m.parse().map_err(err)?,
        None => MeshSpec::default(),
    };
    let axes = mesh.resolve(n).map_err(err)?;
    let chunk = number("--prefill-chunk", 64)?;
    let options = LoadOptions {
        weights,
        experts,
        tensor_split: None,
    };
    let mesh = if axes.pp > 1 {
        Some(DeviceMesh::new(&group, &[("pp", axes.pp), ("tp", axes.tp)]).map_err(err)?)
    } else {
        None
    };
    let load_started = Instant::now();
    let loaded = if let Some(mesh) = &mesh {
        let split = LayerSplit::Even(axes.pp);
        let stage = mesh.coord("pp").map_err(err)?;
        load_stage(
            mesh.axis("tp").map_err(err)?,
            path,
            options,
            &split,
            stage,
            &s,
        )
    } else {
        load_with(&group, path, options, &s)
    }
    .map_err(err)?;
    let load_seconds = load_started.elapsed().as_secs_f64();
    // Each rank's peak resident memory so far, gathered on every rank.
    let mut mine = vec![0.0f32; n];
    mine[rank] = peak_rss_mib()? as f32;
    let peaks = all_sum(&Array::from_slice(&mine, &[n as i32]), &group, &s).map_err(err)?;
    let peaks = values(&peaks, &s)?;
    let model = &loaded.model;
    let vocab = model.config().vocab_size;
    let prompt: Vec<u32> = (0..prompt_len)
        .map(|i| (((i * 7919) % 20000 + 100) % vocab) as u32)
        .collect();

    let greedy = |last: &Array| -> Result<u32, String> {
        Sampler::greedy().sample(&values(last, &s)?).map_err(err)
    };
    let next_token = |logits: &safemlx_dist::ShardedArray<safemlx_dist::Sharded<1>>,
                      rows: usize|
     -> Result<u32, String> {
        greedy(
            gather_logits(logits, rows - 1..rows, &s)
                .map_err(err)?
                .local(),
        )
    };
    let (mut prefill, mut decode_runs, mut graph_us) = (Vec::new(), Vec::new(), Vec::new());
    if let Some(mesh) = &mesh {
        let link = StageLink::new(mesh).map_err(err)?;
        for run in 0..=repeats {
            let mut cache = model.new_cache();
            let limits = (decode + 1, chunk);
            let mut greedy = Sampler::greedy();
            let g = generate_stages(
                model,
                &link,
                &mut cache,
                &prompt,
                limits,
                &mut greedy,
                &[],
                |_| Ok(()),
                &s,
            )
            .map_err(err)?;
            if run > 0 {
                prefill.push(g.prefill_tokens_per_second());
                decode_runs.push(g.decode_tokens_per_second());
            }
        }
    }
    // One warm-up run, then `repeats` timed ones.
    for run in (0..=repeats).filter(|_| axes.pp == 1) {
        let mut cache = model.new_cache();
        let started = Instant::now();
        let logits = model.forward_last(&prompt, &mut cache, &s).map_err(err)?;
        let mut token = next_token(&logits, 1)?;
        let prefill_seconds = started.elapsed().as_secs_f64();
        let started = Instant::now();
        for _ in 0..decode {
            // The host's part of a step: building its graph, before any
            // of it is computed.
            let building = Instant::now();
            let logits = model.forward_last(&[token], &mut cache, &s).map_err(err)?;
            let last = gather_logits(&logits, 0..1, &s).map_err(err)?;
            if run > 0 {
                graph_us.push(building.elapsed().as_secs_f64() * 1e6);
            }
            token = greedy(last.local())?;
        }
        let decode_seconds = started.elapsed().as_secs_f64();
        if run > 0 {
            prefill.push(prefill_len_per_s(prompt_len, prefill_seconds));
            decode_runs.push(decode as f64 / decode_seconds.max(1e-9));
        }
    }
    // The latency of the decode step's collective: a 4 KiB all_sum.
    let x = Array::from_slice(&[1.0f32; 1024], &[1, 1024]);
    let mut latencies = Vec::new();
    for i in 0..220 {
        let started = Instant::now();
        let y = all_sum(&x, &group, &s).map_err(err)?;
        safemlx_dist::eval(&[&y]).map_err(err)?;
        if i >= 20 {
            latencies.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    if rank == 0 {
        let row = serde_json::json!({
            "impl": "safemlx-dist",
            "backend": backend.as_str(),
            "ranks": n,
            "threads": 1,
            "mesh": axes.to_string(),
            "link": flag("--link").unwrap_or_else(|| "loopback".to_owned()),
            "model": model_path,
            "weights": if model.is_quantized() { "quantized" } else { "dequantized f32" },
            "prompt_tokens": prompt_len,
            "decode_tokens": decode,
            "prefill_tokens_per_s": median(prefill),
            "decode_tokens_per_s": median(decode_runs),
            "all_sum_4k_us": median(latencies),
            "decode_graph_us": (!graph_us.is_empty()).then(|| median(graph_us)),
            "weight_bytes_per_rank": model.weight_bytes(),
            "load_seconds": load_seconds,
            "load_peak_rss_mib": peaks,
            "cache_bytes_per_token": model.cache_bytes_per_token(),
            "per_head_cache_bytes_per_token": model.per_head_cache_bytes_per_token(),
            "experts": model.config().moe.as_ref().map(|_| experts.as_str()),
        });
        println!("{row}");
        safemlx_dist_examples::append_lines(&out, &[row])?;
    }
    Ok(())
}

/// This process's peak resident memory in MiB (`VmHWM` of
/// `/proc/self/status`).
fn peak_rss_mib() -> Result<f64, String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
        .ok_or_else(|| "/proc/self/status has no VmHWM line".to_owned())
}

fn prefill_len_per_s(tokens: usize, seconds: f64) -> f64 {
    tokens as f64 / seconds.max(1e-9)
}
