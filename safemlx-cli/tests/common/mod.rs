//! What the server's tests share: the model, a server under the launcher,
//! curl, and reading a stream.

#![allow(dead_code)] // each test file uses its part

use std::io::{BufRead, BufReader, Lines};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Six prompts of different kinds for greedy completions.
pub const QUESTIONS: [&str; 6] = [
    "The capital of France is",
    "def fibonacci(n):",
    "The three primary colors are",
    "Once upon a time, a dragon",
    "SELECT name FROM",
    "The opposite of hot is",
];

/// The model file: `SAFEMLX_SMOLLM2_GGUF`, else the cache's copy.
pub fn model() -> PathBuf {
    let path = std::env::var_os("SAFEMLX_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/safemlx-dist/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        path.is_file(),
        "{} is missing: `cargo xtask test` fetches it, or set SAFEMLX_SMOLLM2_GGUF",
        path.display()
    );
    path
}

pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// A server run under the launcher, stopped when dropped.
pub struct Server {
    pub launcher: Child,
    pub port: u16,
    log: PathBuf,
}

impl Server {
    /// A server whose collectives and stage boundaries time out after 20 s.
    pub fn start(ranks: usize, args: &[&str]) -> Self {
        Self::start_timeout(ranks, args, 20)
    }

    /// A server with `SAFEMLX_DIST_TIMEOUT` set to `timeout` seconds.
    pub fn start_timeout(ranks: usize, args: &[&str], timeout: u32) -> Self {
        Self::start_model(ranks, &model(), args, timeout)
    }

    /// A server of `model` (a GGUF file or a Hugging Face directory).
    pub fn start_model(ranks: usize, model: &Path, args: &[&str], timeout: u32) -> Self {
        Self::start_under(&[], ranks, model, args, timeout)
    }

    /// A server whose launcher runs under `wrapper` (`["prlimit",
    /// "--nofile=256", "--"]`), or as it is when `wrapper` is empty.
    pub fn start_under(
        wrapper: &[&str],
        ranks: usize,
        model: &Path,
        args: &[&str],
        timeout: u32,
    ) -> Self {
        let port = free_port();
        let exe = PathBuf::from(env!("CARGO_BIN_EXE_safemlx"));
        let launch = exe.with_file_name("safemlx-launch");
        assert!(
            launch.is_file(),
            "{} is missing: build the workspace (cargo test --workspace does)",
            launch.display()
        );
        let log = std::env::temp_dir().join(format!("safemlx-serve-test-{port}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(launch);
                command
            }
            None => Command::new(launch),
        };
        let launcher = command
            .args(["-n", &ranks.to_string(), "--timeout", "600", "--"])
            .arg(exe)
            .args(["serve", "--port", &port.to_string(), "--model"])
            .arg(model)
            .args(args)
            .env("SAFEMLX_DIST_TIMEOUT", timeout.to_string())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("the launcher");
        let mut server = Self {
            launcher,
            port,
            log,
        };
        let started = Instant::now();
        while curl(port, "GET", "/health", None, &[]).0 != 200 {
            if let Ok(Some(status)) = server.launcher.try_wait() {
                panic!("the server ended ({status}):\n{}", server.output());
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "no /health after 120 s:\n{}",
                server.output()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.launcher.kill();
        let _ = self.launcher.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// curl's answer: the status and the body.
pub fn curl(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
    extra: &[&str],
) -> (u16, String) {
    let mut c = Command::new("curl");
    c.args([
        "-s",
        "-S",
        "-N",
        "-m",
        "120",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ])
    .args(extra)
    .arg(format!("http://127.0.0.1:{port}{path}"));
    if body.is_some() {
        c.args([
            "-H",
            "content-type: application/json",
            "--data-binary",
            "@-",
        ]);
        c.stdin(Stdio::piped());
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("curl (cargo xtask test installs it)");
    if let Some(body) = body {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(body.as_bytes()).expect("body");
    }
    parse_curl(&child.wait_with_output().expect("curl's output"))
}

pub fn parse_curl(out: &Output) -> (u16, String) {
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

pub fn post(port: u16, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = curl(port, "POST", path, Some(&body.to_string()), &[]);
    let json = serde_json::from_str(&text).unwrap_or_else(|_| json!({"raw": text}));
    (status, json)
}

/// The text of a streamed answer, checked chunk by chunk.
pub fn streamed(body: &str) -> String {
    let events: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{body}");
    let mut text = String::new();
    for event in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(event).expect("a JSON chunk");
        let choice = &chunk["choices"][0];
        text.push_str(
            choice["text"]
                .as_str()
                .or_else(|| choice["delta"]["content"].as_str())
                .unwrap_or_default(),
        );
    }
    let last: Value = serde_json::from_str(events[events.len() - 2]).expect("the last chunk");
    assert!(last["choices"][0]["finish_reason"].is_string(), "{body}");
    assert!(
        last["usage"]["completion_tokens"].as_u64().is_some(),
        "{body}"
    );
    text
}

/// A streaming request left open: curl, and the lines after the first
/// event (which has arrived).
pub fn open_stream(
    port: u16,
    path: &str,
    body: &Value,
    extra: &[&str],
) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut client = Command::new("curl")
        .args([
            "-s",
            "-N",
            "-m",
            "60",
            "-H",
            "content-type: application/json",
        ])
        .args(extra)
        .arg("-d")
        .arg(body.to_string())
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl");
    let mut lines = BufReader::new(client.stdout.take().expect("curl's stdout")).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(
        first.starts_with("data: "),
        "the stream began with {first:?}"
    );
    (client, lines)
}

/// The texts of `prompts` sent at once as streamed greedy completions of
/// `max_tokens` (one batch), in order.
pub fn batched(port: u16, prompts: &[&str], max_tokens: usize) -> Vec<String> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|q| {
                scope.spawn(move || {
                    let body = json!({"prompt": q, "max_tokens": max_tokens,
                        "temperature": 0, "stream": true});
                    let (status, text) = curl(
                        port,
                        "POST",
                        "/v1/completions",
                        Some(&body.to_string()),
                        &[],
                    );
                    assert_eq!(status, 200, "{text}");
                    streamed(&text)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// What `script` prints as JSON, run by the Python environment that has
/// OpenAI's client (`SAFEMLX_OPENAI_PYTHON`) with `args`.
pub fn openai(script: &str, args: &[&str]) -> Value {
    let python = std::env::var("SAFEMLX_OPENAI_PYTHON")
        .expect("SAFEMLX_OPENAI_PYTHON: cargo xtask test makes the environment");
    let out = Command::new(python)
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the script's JSON")
}
