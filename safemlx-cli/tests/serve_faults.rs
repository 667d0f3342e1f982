//! Faults of a running server: a killed rank ends the run and its open
//! stream; a stopped pipeline stage ends the run within the timeout,
//! named, and the open stream with an error event saying why; SIGTERM to the launcher ends the open stream with an error
//! event and stops every rank.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::{open_stream, Server};

/// The safemlx process of the server on `port` whose MLX_RANK is `rank`.
fn rank_pid(port: u16, rank: usize) -> i32 {
    let want = format!("MLX_RANK={rank}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            cmd.starts_with(env!("CARGO_BIN_EXE_safemlx"))
                && cmd.contains(&port.to_string())
                && env.split(|&b| b == 0).any(|v| v == want.as_bytes())
        })
        .unwrap_or_else(|| panic!("rank {rank}'s process"))
}

/// Stage 1 of `--mesh pp=2` stopped (SIGSTOP) while a stream decodes:
/// rank 0's wait (at the stage boundary, or in the next plan's sum) ends
/// within the timeout (5 s here) and the launcher ends the run naming the
/// stopped rank.
#[test]
fn a_stopped_pipeline_stage_ends_the_run_naming_it() {
    let mut server = Server::start_timeout(2, &["--mesh", "pp=2"], 5);
    // Both cores kept busy from here on: CI once saw the healthy rank 0
    // blamed when the launcher read the ranks' files late.
    let _load = safemlx_dist::launch::Busy::cores(2);
    let port = server.port;
    let body = json!({"prompt": "Once upon a time", "max_tokens": 4000, "stream": true});
    let (mut client, lines) = open_stream(port, "/v1/completions", &body, &[]);
    let rank1 = rank_pid(port, 1);
    let stopped = Instant::now();
    Command::new("kill")
        .args(["-STOP", &rank1.to_string()])
        .status()
        .unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(!rest.iter().any(|l| l == "data: [DONE]"));
    let status = server.launcher.wait().unwrap();
    let waited = stopped.elapsed();
    let output = server.output();
    assert!(!status.success(), "{output}");
    assert!(waited < Duration::from_secs(30), "{waited:?}\n{output}");
    // The launcher leads with the stopped rank, not with rank 0 (whose
    // count of sends and receives differs from stage 1's): `rank 1 never
    // entered ...` when its count is behind, `rank 1 shows no sign of
    // life ...` when it is not.
    assert!(
        output.contains("after a collective timed out: rank 1 ")
            && output.contains("rank 1 shows no sign of life for"),
        "{output}"
    );
    // Rank 0 timed out waiting on stage 1: before it exits, the stream
    // gets an error event saying so.
    let last = rest
        .iter()
        .rfind(|l| l.starts_with("data: "))
        .map_or("", |e| e.trim_start_matches("data: "));
    let event: Value = serde_json::from_str(last).unwrap_or_default();
    let message = event["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("the server stopped: rank 0 waited 5 s in ")
            && message.contains("without it completing: a peer never joined it"),
        "{rest:?}\n{output}"
    );
    client.wait().unwrap();
}

#[test]
fn a_killed_rank_ends_the_open_stream_and_the_run() {
    let mut server = Server::start(2, &[]);
    let port = server.port;
    let body = json!({"prompt": "Once upon a time", "max_tokens": 4000, "stream": true});
    let (mut client, lines) = open_stream(port, "/v1/completions", &body, &[]);
    let rank1 = rank_pid(port, 1);
    let killed = Instant::now();
    Command::new("kill")
        .args(["-9", &rank1.to_string()])
        .status()
        .unwrap();
    // The stream ends (no [DONE]) with an error naming rank 1, and the
    // launcher ends the run, naming rank 1.
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(!rest.iter().any(|l| l == "data: [DONE]"));
    let last = rest
        .iter()
        .rfind(|l| l.starts_with("data: "))
        .map_or("", |e| e.trim_start_matches("data: "));
    let event: Value = serde_json::from_str(last).unwrap_or_default();
    assert_eq!(
        event["error"]["message"],
        "the server stopped: rank 1 failed (signal: 9 (SIGKILL))",
        "{rest:?}\n{}",
        server.output()
    );
    let status = loop {
        if let Some(status) = server.launcher.try_wait().unwrap() {
            break status;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "the run did not end:\n{}",
            server.output()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!status.success());
    assert!(killed.elapsed() < Duration::from_secs(30));
    assert!(
        server
            .output()
            .contains("rank 1 failed (signal: 9 (SIGKILL)); the other ranks were stopped"),
        "{}",
        server.output()
    );
    client.wait().unwrap();
}

#[test]
fn sigterm_to_the_launcher_ends_the_open_stream_with_an_error_event() {
    let mut server = Server::start(2, &[]);
    let port = server.port;
    let body = json!({"prompt": "Once upon a time", "max_tokens": 4000, "stream": true});
    let (mut client, lines) = open_stream(port, "/v1/completions", &body, &[]);
    let signalled = Instant::now();
    let pid = server.launcher.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let events: Vec<String> = lines
        .map_while(Result::ok)
        .filter(|l| l.starts_with("data: "))
        .collect();
    server.launcher.wait().unwrap();
    let waited = signalled.elapsed();
    let output = server.output();
    let last = events.last().map_or("", |e| e.trim_start_matches("data: "));
    let event: Value = serde_json::from_str(last).unwrap_or_default();
    assert_eq!(
        event["error"]["message"], "the server is stopping",
        "{events:?}\n{output}"
    );
    assert!(waited < Duration::from_secs(10), "{waited:?}");
    assert!(
        output.contains("safemlx serve: SIGTERM: no new requests; ending the open ones"),
        "{output}"
    );
    client.wait().unwrap();
}
