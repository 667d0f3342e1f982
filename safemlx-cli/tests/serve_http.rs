//! `safemlx serve`'s HTTP side with real clients (curl, raw sockets): the
//! model's names, the API key's details, OpenAI error bodies for wrong
//! methods, clients that send half a request or nothing (closed after the
//! header or body timeout, whatever their number, also under a lowered
//! descriptor limit), and the settings refused at start.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::{curl, model, post, Server};

const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn chat_as(model: &str) -> Value {
    json!({"model": model, "max_tokens": 2, "temperature": 0,
           "messages": [{"role": "user", "content": "Hi"}]})
}

#[test]
fn a_model_answers_to_each_of_its_names_and_others_only_when_asked() {
    let server = Server::start(1, &["--served-model-name", "smol", "--model-id", "second"]);
    let port = server.port;
    let (status, list) = curl(port, "GET", "/v1/models", None, &[]);
    assert_eq!(status, 200, "{list}");
    let list: Value = serde_json::from_str(&list).unwrap();
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "smol",
            "second",
            FILE,
            "SmolLM2-135M-Instruct.Q4_1",
            "default_model"
        ]
    );
    for name in ids {
        let (status, body) = post(port, "/v1/chat/completions", &chat_as(name));
        assert_eq!(status, 200, "{name}: {body}");
        // Responses carry the first name.
        assert_eq!(body["model"], "smol", "{name}");
    }
    let (status, body) = post(port, "/v1/chat/completions", &chat_as("default"));
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "model_not_found");
    assert_eq!(body["error"]["param"], "model");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("start it with --any-model-name"),
        "{body}"
    );
    drop(server);
    let server = Server::start(1, &["--any-model-name"]);
    for name in ["claude-sonnet-4-5", "gpt-4o", "default"] {
        let (status, body) = post(server.port, "/v1/chat/completions", &chat_as(name));
        assert_eq!(status, 200, "{name}: {body}");
        assert_eq!(body["model"], FILE);
    }
}

#[test]
fn keys_methods_and_half_sent_requests_get_clear_answers() {
    let server = Server::start(
        1,
        &[
            "--api-key",
            "k3y",
            "--header-timeout",
            "1",
            "--body-timeout",
            "1",
            "--max-connections",
            "8",
        ],
    );
    let port = server.port;
    let hi = chat_as(FILE).to_string();
    // The scheme in any case, and more than one space (RFC 7235).
    for header in [
        "authorization: Bearer k3y",
        "authorization: bearer k3y",
        "Authorization: BEARER  k3y",
    ] {
        let (status, body) = curl(
            port,
            "POST",
            "/v1/chat/completions",
            Some(&hi),
            &["-H", header],
        );
        assert_eq!(status, 200, "{header}: {body}");
    }
    // A 401 says how to authenticate.
    let (status, head) = curl(
        port,
        "POST",
        "/v1/chat/completions",
        Some(&hi),
        &["-D", "-", "-H", "authorization: Basic k3y"],
    );
    assert_eq!(status, 401, "{head}");
    assert!(
        head.to_lowercase()
            .contains("www-authenticate: bearer realm=\"safemlx\""),
        "{head}"
    );
    // A wrong method: OpenAI's error body, naming the right one.
    let key = ["-H", "authorization: Bearer k3y"];
    let (status, body) = curl(port, "GET", "/v1/chat/completions", None, &key);
    assert_eq!(status, 405, "{body}");
    let body: Value = serde_json::from_str(&body).expect("a JSON error body");
    assert_eq!(
        body["error"]["message"],
        "GET is not allowed on /v1/chat/completions; use POST"
    );
    // Malformed HTTP: OpenAI's error body too (hyper's own 400 had none).
    for (request, status, message) in [
        (&b"GARBAGE\r\n\r\n"[..], 400, "malformed HTTP request: "),
        (
            &b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"[..],
            400,
            "malformed HTTP request: Content-Length is \"abc\", not a number of bytes",
        ),
    ] {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connects");
        stream.write_all(request).expect("writes");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("a read timeout");
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .expect("an answer, then the end");
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{answer}"
        );
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
        let body: Value = serde_json::from_str(body).expect("a JSON error body");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with(message),
            "{body}"
        );
    }
    // top_p that is 0 in float32.
    let tiny = json!({"messages": [{"role": "user", "content": "Hi"}], "top_p": 1e-300});
    let (status, body) = curl(
        port,
        "POST",
        "/v1/chat/completions",
        Some(&tiny.to_string()),
        &key,
    );
    assert_eq!(status, 400, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["param"], "top_p", "{body}");

    // A prompt no context could hold is refused before it is tokenized
    // (the scheduler's tokenizing of 3.9 MB held every stream for seconds).
    let huge = json!({"messages": [{"role": "user", "content": "x ".repeat(1_950_000)}]});
    let (status, body) = curl(
        port,
        "POST",
        "/v1/chat/completions",
        Some(&huge.to_string()),
        &key,
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains(
            "the prompt has 3900000 bytes: more than the model's context of 8192 tokens holds"
        ),
        "{body}"
    );

    // 40 clients (five times the connection cap) send half a request, or
    // half a body, then nothing: the server closes each one after its
    // timeout and keeps serving.
    let mut idle: Vec<TcpStream> = (0..40)
        .map(|i| {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connects");
            let part: &[u8] = if i % 2 == 0 {
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            } else {
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"mess"
            };
            stream.write_all(part).expect("writes");
            stream
                .set_read_timeout(Some(Duration::from_secs(120)))
                .expect("a read timeout");
            stream
        })
        .collect();
    let waited = Instant::now();
    for (i, stream) in idle.iter_mut().enumerate() {
        // The server's answer, if any (a 408 or 400 for a cut body), then
        // the end of the connection; a client still open after 120 s
        // fails here.
        let mut rest = Vec::new();
        let read = stream.read_to_end(&mut rest);
        let still_open = read.as_ref().is_err_and(|e| {
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )
        });
        assert!(
            !still_open,
            "client {i} was not disconnected after {:?}: {read:?}",
            waited.elapsed()
        );
    }
    let (status, body) = curl(
        port,
        "POST",
        "/v1/chat/completions",
        Some(&hi),
        &["-H", "authorization: Bearer k3y"],
    );
    assert_eq!(status, 200, "{body}");
}

#[test]
fn idle_clients_beyond_the_descriptor_limit_never_stop_the_server() {
    // 300 idle connections against a server whose launcher and ranks may
    // open 256 descriptors: the cap (256 less 128) keeps the rest in the
    // backlog; the ranks' watch of their launcher must not take a failed
    // open for a dead launcher.
    let server = Server::start_under(
        &["prlimit", "--nofile=256:256", "--"],
        1,
        &model(),
        &["--header-timeout", "3"],
        20,
    );
    let port = server.port;
    let idle: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    assert!(idle.len() >= 128, "only {} connections", idle.len());
    // Longer than the launcher watch's half second and the header timeout.
    std::thread::sleep(Duration::from_secs(5));
    let (status, body) = post(port, "/v1/chat/completions", &chat_as(FILE));
    assert_eq!(status, 200, "{body}\n{}", server.output());
    drop(idle);
    assert!(!server.output().contains("is gone"), "{}", server.output());
}

#[test]
fn settings_that_cannot_work_are_refused_at_start() {
    let exe = env!("CARGO_BIN_EXE_safemlx");
    for (args, env, message) in [
        (
            vec!["--api-key", ""],
            None,
            "--api-key (or SAFEMLX_API_KEY) is empty",
        ),
        (
            vec![],
            Some(("SAFEMLX_API_KEY", " ")),
            "--api-key (or SAFEMLX_API_KEY) is empty",
        ),
        (
            vec!["--header-timeout", "0"],
            None,
            "0 is not a number of seconds above 0",
        ),
        (
            vec!["--max-connections", "100000000"],
            None,
            "--max-connections 100000000 leaves too few",
        ),
    ] {
        let mut command = Command::new(exe);
        command
            .args(["serve", "--port", "0", "--model"])
            .arg(model())
            .args(&args);
        if let Some((key, value)) = env {
            command.env(key, value);
        }
        let out = command.output().expect("safemlx runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(err.contains(message), "{args:?}: {err}");
    }
}
