//! `cargo xtask bench serve`: `safemlx serve` on SmolLM2 (float32 and the
//! GGUF's blocks as stored) at 1 and 2 ranks, and in the same run its
//! peers on the same weights: `mlx_lm.server` (the float32 weights of
//! `peers.py convert`, the system OpenBLAS preloaded) and llama.cpp's
//! server (`llama-cpp-python[server]` on the GGUF). Each server gets 1, 4
//! and 16 concurrent streaming clients (`xtask/bench/serve_load.py`:
//! aggregate tokens/s, time to first token, inter-token latency) and the
//! time-to-first-token probe under 15 other streams; then the host time
//! to build one decode step's graph, ours (`bench_generate`) and mlx-lm's
//! (`peers.py graph`). JSON lines in `target/bench/serve.jsonl`, then the
//! table and the targets.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{finish, launch, prepare};
use crate::{cmd, models};

/// Tokens each streaming request asks for.
const TOKENS: &str = "64";
const CLIENTS: [&str; 3] = ["1", "4", "16"];

/// One server to measure: how to start it and what its rows say.
struct Server {
    labels: Value,
    /// The `model` field its requests carry.
    model: String,
    command: Command,
    /// Ours stops on SIGTERM to the launcher; the peers are killed.
    graceful: bool,
}

/// `peers_only`: keeps our rows of the last run and measures the peers
/// and the graph times again (`cargo xtask bench serve --peers-only`).
pub fn run(peers_only: bool) -> Result<(), String> {
    let gguf = models::fetch_smollm2()?;
    let kept = match peers_only {
        true => super::read_rows(&cmd::target_dir().join("bench").join("serve.jsonl"))?,
        false => Vec::new(),
    };
    let (release, out) = prepare("serve.jsonl")?;
    let ours_kept: String = kept
        .iter()
        .filter(|r| r["impl"] == "safemlx-dist" && r["kind"].is_string())
        .map(|r| format!("{r}\n"))
        .collect();
    std::fs::write(&out, ours_kept).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    cmd::run(cmd::cargo(&[
        "build",
        "--release",
        "--package",
        "safemlx-cli",
    ]))?;
    let python = super::generate::peers_python()?;
    let hf = super::generate::float_dir(&python, &gguf, Some(&release))?;
    let mut servers = Vec::new();
    for weights in ["float", "as-stored"].iter().filter(|_| !peers_only) {
        for (ranks, threads) in [("1", "1"), ("2", "1"), ("1", "all")] {
            servers.push(ours(&release, &gguf, weights, (ranks, threads)));
        }
    }
    for threads in ["1", "all"] {
        servers.push(mlx_lm(&python, &hf, threads));
        servers.push(llama_cpp(&python, &gguf, threads));
    }
    let load = cmd::root().join("xtask/bench/serve_load.py");
    for server in servers {
        let (graceful, labels) = (server.graceful, server.labels.to_string());
        match measure(server, &python, &load, &out) {
            // A peer that fails under load is reported, not fatal.
            Err(e) if !graceful => {
                println!("bench serve: {labels} failed: {e}");
                let mut row: Value = serde_json::from_str(&labels).unwrap_or_default();
                row["kind"] = json!("failed");
                row["error"] = json!(e);
                append(&out, &row)?;
            }
            other => other?,
        }
    }
    // The host's part of a decode step, ours then mlx-lm's.
    let model = gguf.display().to_string();
    let args = [
        "--model",
        model.as_str(),
        "--prompt-tokens",
        "128",
        "--decode-tokens",
        "64",
        "--repeats",
        "2",
        "--dequantize",
    ];
    launch(&release, ("1", "ring"), "bench_generate", &args, &out)?;
    let mut graph = Command::new(&python);
    graph
        .arg(cmd::root().join("xtask/bench/peers.py"))
        .arg("graph")
        .arg(&hf)
        .arg(&out)
        .args(["128", "64"]);
    cmd::run(graph)?;
    report(&finish(&out)?);
    Ok(())
}

fn ours(release: &Path, gguf: &Path, weights: &str, (ranks, threads): (&str, &str)) -> Server {
    let mut command = Command::new(release.join("safemlx-launch"));
    command
        .args(["-n", ranks, "--timeout", "600", "--"])
        .arg(release.join("safemlx"))
        .args(["serve", "--model"])
        .arg(gguf)
        .args(["--weights", weights, "--model-id", "smollm2"]);
    threads_env(&mut command, threads);
    Server {
        labels: json!({"impl": "safemlx-dist", "ranks": ranks.parse::<u64>().unwrap_or(1),
                       "threads": threads,
                       "weights": if weights == "float" { "float32" } else { "Q4_1/Q8_0 as stored" }}),
        model: "smollm2".to_owned(),
        command,
        graceful: true,
    }
}

fn mlx_lm(python: &Path, hf: &Path, threads: &str) -> Server {
    let mut command = Command::new(python);
    command.args(["-m", "mlx_lm.server", "--model"]).arg(hf);
    if let Some(lib) = super::openblas() {
        command.env("LD_PRELOAD", lib);
    }
    threads_env(&mut command, threads);
    Server {
        labels: json!({"impl": "mlx_lm.server", "ranks": 1, "threads": threads,
                       "weights": "float32", "blas": "openblas"}),
        model: hf.display().to_string(),
        command,
        graceful: false,
    }
}

fn llama_cpp(python: &Path, gguf: &Path, threads: &str) -> Server {
    let n = match threads {
        "1" => "1".to_owned(),
        _ => std::thread::available_parallelism()
            .map_or(1, usize::from)
            .to_string(),
    };
    let mut command = Command::new(python);
    command
        .args(["-m", "llama_cpp.server", "--model"])
        .arg(gguf)
        .args([
            "--n_ctx",
            "8192",
            "--n_threads",
            &n,
            "--n_threads_batch",
            &n,
        ]);
    threads_env(&mut command, threads);
    Server {
        labels: json!({"impl": "llama.cpp server", "ranks": 1, "threads": threads,
                       "weights": "Q4_1/Q8_0 as stored"}),
        model: gguf.display().to_string(),
        command,
        graceful: false,
    }
}

fn threads_env(command: &mut Command, threads: &str) {
    if threads == "1" {
        command
            .env("OPENBLAS_NUM_THREADS", "1")
            .env("OMP_NUM_THREADS", "1");
    } else {
        command
            .env_remove("OPENBLAS_NUM_THREADS")
            .env_remove("OMP_NUM_THREADS");
    }
}

/// Starts `server` on a free port, runs the clients against it, stops it.
fn measure(mut server: Server, python: &Path, load: &Path, out: &Path) -> Result<(), String> {
    let port = free_port()?;
    server.command.args(["--port", &port.to_string()]);
    println!("bench serve: starting {}", server.labels);
    let mut child = server
        .command
        .spawn()
        .map_err(|e| format!("cannot start the server {}: {e}", server.labels))?;
    let result = ready(&mut child, port).and_then(|()| {
        let url = format!("http://127.0.0.1:{port}");
        let labels = server.labels.to_string();
        for clients in CLIENTS {
            let mut run = Command::new(python);
            run.arg(load)
                .args(["clients", &url, &server.model, clients, TOKENS])
                .arg(out)
                .arg(&labels);
            cmd::run(run)?;
        }
        let mut ttft = Command::new(python);
        ttft.arg(load)
            .args(["ttft", &url, &server.model, "160"])
            .arg(out)
            .arg(&labels);
        cmd::run(ttft)
    });
    stop(&mut child, server.graceful);
    result
}

fn append(out: &Path, row: &Value) -> Result<(), String> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(out)
        .map_err(|e| format!("cannot open {}: {e}", out.display()))?;
    writeln!(file, "{row}").map_err(|e| format!("cannot write {}: {e}", out.display()))
}

/// A port nobody listens on now.
fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

/// Waits until the server answers on `port` (loading takes a while).
fn ready(child: &mut Child, port: u16) -> Result<(), String> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(600) {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the server exited before answering ({status})"));
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() && models_answer(port) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Err(format!("the server on port {port} did not answer in 600 s"))
}

/// Whether `GET /v1/models` answers 200.
fn models_answer(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = "GET /v1/models HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    let mut head = [0u8; 12];
    stream.write_all(request.as_bytes()).is_ok()
        && stream.read_exact(&mut head).is_ok()
        && head.ends_with(b"200")
}

fn stop(child: &mut Child, graceful: bool) {
    if graceful {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        for _ in 0..100 {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn report(rows: &[Value]) {
    println!(
        "{:<16} {:>5} {:>7} {:<20} {:>7} {:>9} {:>11} {:>11} {:>10} {:>10}",
        "impl",
        "ranks",
        "threads",
        "weights",
        "clients",
        "tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "ITL p50 ms",
        "ITL p99 ms"
    );
    let f = |r: &Value, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    let text = |r: &Value, k: &str| match &r[k] {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    for r in rows.iter().filter(|r| r["kind"] == "clients") {
        println!(
            "{:<16} {:>5} {:>7} {:<20} {:>7} {:>9.1} {:>11.0} {:>11.0} {:>10.1} {:>10.1}",
            text(r, "impl"),
            text(r, "ranks"),
            text(r, "threads"),
            text(r, "weights"),
            text(r, "clients"),
            f(r, "tokens_per_s"),
            f(r, "ttft_ms_p50"),
            f(r, "ttft_ms_p99"),
            f(r, "itl_ms_p50"),
            f(r, "itl_ms_p99"),
        );
    }
    for r in rows.iter().filter(|r| r["kind"] == "failed") {
        println!(
            "{} {} thread(s): failed under load: {}",
            text(r, "impl"),
            text(r, "threads"),
            text(r, "error")
        );
    }
    for r in rows.iter().filter(|r| r["kind"] == "ttft") {
        println!(
            "{} {} rank(s) {} thread(s) {}: TTFT of a {}-token prompt idle {:.0} ms, beside 15 streams {:.0} ms ({:.2}x)",
            text(r, "impl"),
            text(r, "ranks"),
            text(r, "threads"),
            text(r, "weights"),
            text(r, "probe_prompt_tokens"),
            f(r, "ttft_idle_ms"),
            f(r, "ttft_loaded_ms"),
            f(r, "ttft_ratio"),
        );
    }
    let clients = |imp: &str, ranks: u64, threads: &str, weights: &str, n: u64| {
        rows.iter().find(|r| {
            r["kind"] == "clients"
                && r["impl"] == imp
                && r["ranks"].as_u64() == Some(ranks)
                && r["threads"] == threads
                && r["weights"] == weights
                && r["clients"].as_u64() == Some(n)
        })
    };
    let tps = |r: Option<&Value>| r.map_or(f64::NAN, |r| f(r, "tokens_per_s"));
    for weights in ["float32", "Q4_1/Q8_0 as stored"] {
        let one = clients("safemlx-dist", 1, "1", weights, 1);
        let sixteen = clients("safemlx-dist", 1, "1", weights, 16);
        println!(
            "target: 16 clients on 1 rank ({weights}, one thread): {:.2}x one client's tokens/s (goal >= 5x)",
            tps(sixteen) / tps(one)
        );
    }
    for threads in ["1", "all"] {
        let ours = clients("safemlx-dist", 1, threads, "float32", 16);
        let theirs = clients("mlx_lm.server", 1, threads, "float32", 16);
        let llama = clients("llama.cpp server", 1, threads, "Q4_1/Q8_0 as stored", 16);
        println!(
            "target: 16 clients, float32, {threads} thread(s): {:.1} tokens/s, {:.2}x mlx_lm.server's {:.1} (goal >= 1x); llama.cpp server {:.1}",
            tps(ours),
            tps(ours) / tps(theirs),
            tps(theirs),
            tps(llama)
        );
    }
    if let Some(r) = rows.iter().find(|r| {
        r["kind"] == "ttft" && r["impl"] == "safemlx-dist" && r["ranks"] == 1 && r["threads"] == "1"
    }) {
        println!(
            "target: TTFT beside 15 streams (1 rank, {}): {:.2}x idle (goal <= 3x)",
            text(r, "weights"),
            f(r, "ttft_ratio")
        );
    }
    let graph = |imp: &str| {
        rows.iter()
            .find(|r| r["impl"] == imp && r["decode_graph_us"].is_number())
            .map_or(f64::NAN, |r| f(r, "decode_graph_us"))
    };
    let (ours, theirs) = (graph("safemlx-dist"), graph("mlx-lm"));
    println!(
        "target: host time to build a decode step: {:.0} us, mlx-lm {:.0} us: {:.2}x (goal <= 1x)",
        ours,
        theirs,
        ours / theirs
    );
}
