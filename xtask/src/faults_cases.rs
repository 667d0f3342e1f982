//! The fault cases of `cargo xtask faults` beyond the launcher kills, each
//! a few times per backend where it applies:
//!
//! - `decode-stop`: SmolLM2 `generate` at 2 ranks, rank 1 stopped
//!   (SIGSTOP) 4-6 s after the start (mid-decode) with
//!   `SAFEMLX_DIST_TIMEOUT=5`: the run must end within 30 s of the stop
//!   and name rank 1;
//! - `same-ports`: two `tp_mlp --check` runs of 2 ring ranks with the same
//!   hostfile and different weights, started together: each run either
//!   passes its check or is refused ("did not prove this run's secret");
//!   none computes a wrong number;
//! - `non-utf8`: `safemlx-launch -n 2 -- sh -c '...' sh $'caf\xff'` passes
//!   the argument's bytes through (the rank prints them in hexadecimal) and
//!   exits 0;
//! - `broken-pipe`: the launcher's stdout closed after one byte (`| head
//!   -c 1`) while its ranks print: the launcher exits 141 without a panic.

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::faults::{marked, next, MARKER};

/// One case's result: its JSON line, and why it failed if it did.
pub struct Case {
    pub line: Value,
    pub failure: Option<String>,
}

/// Runs every case `trials` times; prints a line per trial.
pub fn run(release: &Path, smollm2: &Path, trials: usize, seed: &mut u64) -> Vec<Case> {
    let mut cases = Vec::new();
    for trial in 0..trials {
        for backend in ["ring", "mpi"] {
            let delay = Duration::from_millis(4000 + next(seed) % 2000);
            cases.push(decode_stop(release, smollm2, (backend, None), delay, trial));
            // The same with the ranks as two pipeline stages.
            let delay = Duration::from_millis(4000 + next(seed) % 2000);
            let layout = (backend, Some("pp=2"));
            cases.push(decode_stop(release, smollm2, layout, delay, trial));
        }
        cases.push(same_ports(release, trial, seed));
        for backend in ["ring", "mpi"] {
            cases.push(non_utf8(release, backend, trial));
            cases.push(broken_pipe(release, backend, trial));
        }
    }
    cases
}

fn case(name: &str, backend: &str, trial: usize, failure: Option<String>, extra: Value) -> Case {
    let mut line =
        json!({"case": name, "backend": backend, "trial": trial, "ok": failure.is_none()});
    if let (Value::Object(line), Value::Object(extra)) = (&mut line, extra) {
        line.extend(extra);
    }
    println!(
        "  {name} {backend} #{trial}: {}",
        failure
            .as_deref()
            .map_or_else(|| line.to_string(), |f| format!("FAILED: {f}"))
    );
    Case { line, failure }
}

/// Waits for `child` at most `limit`; kills it past that. Returns its
/// output and whether it ended by itself.
fn wait_bounded(mut child: Child, limit: Duration) -> (Output, bool) {
    let started = Instant::now();
    let mut ended = true;
    while matches!(child.try_wait(), Ok(None)) {
        if started.elapsed() > limit {
            let _ = child.kill();
            ended = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap_or_else(|e| Output {
        status: std::os::unix::process::ExitStatusExt::from_raw(1),
        stdout: Vec::new(),
        stderr: e.to_string().into_bytes(),
    });
    (output, ended)
}

fn last_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    text.lines()
        .rfind(|l| l.starts_with("safemlx-launch"))
        .or_else(|| text.lines().rfind(|l| !l.trim().is_empty()))
        .unwrap_or("")
        .to_owned()
}

/// Rank 1 of a 2-rank `generate` SIGSTOPped `delay` into its decode
/// (tensor parallel, or as pipeline stage 1 with `mesh`): the run must end
/// within 30 s, naming rank 1.
fn decode_stop(
    release: &Path,
    smollm2: &Path,
    (backend, mesh): (&str, Option<&str>),
    delay: Duration,
    trial: usize,
) -> Case {
    let name = if mesh.is_some() {
        "decode-stop-pp2"
    } else {
        "decode-stop"
    };
    let id = format!("decode-{backend}-{trial}-{}", std::process::id());
    let mesh_args = mesh.map_or(Vec::new(), |m| vec!["--mesh", m]);
    let spawned = Command::new(release.join("safemlx-launch"))
        .args(["-n", "2", "--backend", backend, "--"])
        .arg(release.join("examples/generate"))
        .arg("--model")
        .arg(smollm2)
        .args(["--chat", "--prompt", "Write a long story about a dragon."])
        .args(["--max-tokens", "400", "--backend", backend])
        .args(&mesh_args)
        .env(MARKER, &id)
        .env("SAFEMLX_DIST_TIMEOUT", "5")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let child = match spawned {
        Ok(child) => child,
        Err(e) => {
            return case(name, backend, trial, Some(e.to_string()), json!({}));
        }
    };
    std::thread::sleep(delay);
    let rank_var = if backend == "mpi" {
        "OMPI_COMM_WORLD_RANK=1"
    } else {
        "MLX_RANK=1"
    };
    let victim = marked(&id).into_iter().find(|(pid, name)| {
        name == "generate"
            && std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == rank_var.as_bytes()))
    });
    let Some((pid, _)) = victim else {
        let (out, _) = wait_bounded(child, Duration::from_secs(60));
        let why = format!(
            "rank 1 was not running after {delay:?}: {}",
            last_line(&out.stderr)
        );
        return case(name, backend, trial, Some(why), json!({}));
    };
    let signal = |s: &str| {
        let _ = Command::new("kill")
            .arg(format!("-{s}"))
            .arg(pid.to_string())
            .stderr(Stdio::null())
            .status();
    };
    signal("STOP");
    let stopped = Instant::now();
    let (out, ended) = wait_bounded(child, Duration::from_secs(60));
    let seconds = stopped.elapsed().as_secs_f64();
    signal("KILL");
    signal("CONT");
    let message = last_line(&out.stderr);
    let all = String::from_utf8_lossy(&out.stderr);
    let failure = if !ended {
        Some(format!("still running {seconds:.1} s after the stop"))
    } else if seconds > 30.0 {
        Some(format!("ended {seconds:.1} s after the stop"))
    } else if !all.contains("rank 1 shows no sign of life") {
        Some(format!("rank 1 is not named: {message}"))
    } else {
        None
    };
    let extra = json!({"stopped_after_s": delay.as_secs_f64(), "seconds_to_end": seconds, "message": message});
    case(name, backend, trial, failure, extra)
}

/// A `tp_mlp` checkpoint of random weights drawn from `seed`.
fn write_checkpoint(path: &Path, seed: &mut u64) -> std::io::Result<()> {
    let (dim, hidden) = (256usize, 1024usize);
    let tensors = [
        ("mlp.gate", [dim, hidden]),
        ("mlp.up", [dim, hidden]),
        ("mlp.down", [hidden, dim]),
    ];
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, shape) in tensors {
        let start = data.len();
        for _ in 0..shape[0] * shape[1] {
            let unit = (next(seed) >> 40) as f32 / (1u64 << 24) as f32;
            data.extend_from_slice(&((unit - 0.5) * 0.1).to_le_bytes());
        }
        header.insert(
            name.to_owned(),
            json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let header = Value::Object(header).to_string();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&data);
    std::fs::write(path, bytes)
}

fn same_ports(release: &Path, trial: usize, seed: &mut u64) -> Case {
    let dir = std::env::temp_dir().join(format!("safemlx-faults-{}-{trial}", std::process::id()));
    let prepared = (|| -> Result<(PathBuf, Vec<PathBuf>), String> {
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let ports: Vec<u16> = (0..2)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?
            .iter()
            .map(|a| a.port())
            .collect();
        let hostfile = dir.join("hosts.json");
        let hosts = json!([
            [format!("127.0.0.1:{}", ports[0])],
            [format!("127.0.0.1:{}", ports[1])]
        ]);
        std::fs::write(&hostfile, hosts.to_string()).map_err(|e| e.to_string())?;
        let mut files = Vec::new();
        for run in ["a", "b"] {
            let file = dir.join(format!("{run}.safetensors"));
            write_checkpoint(&file, seed).map_err(|e| e.to_string())?;
            files.push(file);
        }
        Ok((hostfile, files))
    })();
    let (hostfile, files) = match prepared {
        Ok(p) => p,
        Err(e) => return case("same-ports", "ring", trial, Some(e), json!({})),
    };
    let runs: Vec<_> = files
        .iter()
        .map(|file| {
            Command::new(release.join("safemlx-launch"))
                .args(["-n", "2", "--hostfile"])
                .arg(&hostfile)
                .arg("--")
                .arg(release.join("examples/tp_mlp"))
                .arg("--check")
                .arg("--checkpoint")
                .arg(file)
                .env("SAFEMLX_DIST_JOIN_TIMEOUT", "10")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect();
    let mut outcomes = Vec::new();
    let mut failure = None;
    for run in runs {
        let (out, ended) = match run {
            Ok(child) => wait_bounded(child, Duration::from_secs(90)),
            Err(e) => return case("same-ports", "ring", trial, Some(e.to_string()), json!({})),
        };
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let outcome =
            if out.status.success() && all.contains("--check against the dense computation") {
                "passed its check"
            } else if all.contains("did not prove this run's secret") {
                "refused"
            } else if all.contains("to join its group") {
                "join timed out"
            } else {
                failure.get_or_insert(format!(
                    "a run {}: {}",
                    if ended { "failed" } else { "hung" },
                    last_line(&out.stderr)
                ));
                "other"
            };
        if all.contains("is above 1e-4") {
            failure = Some(format!(
                "a run computed wrong numbers: {}",
                last_line(&out.stderr)
            ));
        }
        outcomes.push(outcome);
    }
    let _ = std::fs::remove_dir_all(&dir);
    case(
        "same-ports",
        "ring",
        trial,
        failure,
        json!({"runs": outcomes}),
    )
}

fn non_utf8(release: &Path, backend: &str, trial: usize) -> Case {
    // The rank prints its argument's bytes in hexadecimal.
    let arg = std::ffi::OsStr::from_bytes(b"caf\xff");
    let out = Command::new(release.join("safemlx-launch"))
        .args(["-n", "2", "--backend", backend, "--", "sh", "-c"])
        .arg(r#"printf %s "$1" | od -An -tx1"#)
        .arg("sh")
        .arg(arg)
        .output();
    let failure = match &out {
        Err(e) => Some(e.to_string()),
        Ok(out) if out.status.code() != Some(0) => {
            Some(format!("exit {}: {}", out.status, last_line(&out.stderr)))
        }
        Ok(out) if !String::from_utf8_lossy(&out.stdout).contains("63 61 66 ff") => {
            Some("the bytes did not come through".to_owned())
        }
        Ok(_) => None,
    };
    let exit = out.as_ref().ok().and_then(|o| o.status.code());
    case("non-utf8", backend, trial, failure, json!({"exit": exit}))
}

fn broken_pipe(release: &Path, backend: &str, trial: usize) -> Case {
    let spawned = Command::new(release.join("safemlx-launch"))
        .args(["-n", "2", "--backend", backend, "--", "sh", "-c"])
        .arg("while :; do echo line; sleep 0.01; done")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            return case(
                "broken-pipe",
                backend,
                trial,
                Some(e.to_string()),
                json!({}),
            )
        }
    };
    let started = Instant::now();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_exact(&mut [0u8; 1]);
    }
    let (out, ended) = wait_bounded(child, Duration::from_secs(30));
    let seconds = started.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let status = std::os::unix::process::ExitStatusExt::signal(&out.status)
        .map_or_else(|| out.status.code().unwrap_or(-1), |s| 128 + s);
    let failure = if !ended {
        Some("still running 30 s after its stdout closed".to_owned())
    } else if stderr.contains("panicked") {
        Some(format!("panicked: {}", last_line(&out.stderr)))
    } else if status != 141 {
        Some(format!("exit {status}, not 141"))
    } else {
        None
    };
    case(
        "broken-pipe",
        backend,
        trial,
        failure,
        json!({"exit": status, "seconds": seconds}),
    )
}
