//! `safemlx-launch` from the outside: prefixes, failure propagation,
//! timeouts and argument errors, with small shell programs as ranks.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn launch(args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_safemlx-launch"))
        .args(args)
        .output()
        .expect("safemlx-launch runs");
    (output, started.elapsed())
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn ring_ranks_get_their_environment_and_prefixed_output() {
    let script = r#"echo "rank $MLX_RANK of $MLX_WORLD_SIZE via $SAFEMLX_DIST_BACKEND"; cat "$MLX_HOSTFILE"; echo; echo oops >&2"#;
    let (out, _) = launch(&["-n", "3", "--", "sh", "-c", script]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for rank in 0..3 {
        assert!(
            text.contains(&format!("[rank {rank}] rank {rank} of 3 via ring\n")),
            "{text}"
        );
        assert!(stderr(&out).contains(&format!("[rank {rank}] oops\n")));
    }
    let hostfile_line = text
        .lines()
        .find(|l| l.starts_with("[rank 0] [["))
        .expect("the hostfile is printed");
    assert_eq!(
        hostfile_line.matches("127.0.0.1:").count(),
        3,
        "{hostfile_line}"
    );
}

#[test]
fn a_failing_rank_stops_the_others_and_is_named() {
    let script = r#"if [ "$MLX_RANK" = 1 ]; then exit 3; fi; sleep 60"#;
    let (out, took) = launch(&["-n", "3", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(
            "safemlx-launch: rank 1 failed (exit status: 3); the other ranks were stopped"
        ),
        "{}",
        stderr(&out)
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn a_killed_rank_ends_the_run_within_five_seconds() {
    let script = r#"if [ "$MLX_RANK" = 2 ]; then sleep 0.5; kill -9 $$; fi; sleep 60"#;
    let (out, took) = launch(&["-n", "4", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("rank 2 failed (signal: 9 (SIGKILL)"),
        "{}",
        stderr(&out)
    );
    assert!(took < Duration::from_secs(6), "took {took:?}");
}

#[test]
fn the_timeout_names_the_ranks_still_running() {
    let script = r#"if [ "$MLX_RANK" = 0 ]; then exit 0; fi; sleep 60"#;
    let (out, took) = launch(&["-n", "3", "--timeout", "1", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("timed out after 1 s; ranks still running: 1, 2"),
        "{}",
        stderr(&out)
    );
    assert!(took < Duration::from_secs(6), "took {took:?}");
}

#[test]
fn bad_arguments_exit_2_and_start_nothing() {
    let marker = std::env::temp_dir().join(format!("safemlx-launch-marker-{}", std::process::id()));
    let touch = format!("touch {}", marker.display());
    let bad_hostfile =
        std::env::temp_dir().join(format!("safemlx-launch-bad-{}.json", std::process::id()));
    std::fs::write(&bad_hostfile, r#"[["127.0.0.1:1"]]"#).unwrap();
    let bad_hostfile = bad_hostfile.display().to_string();
    let cases: [(&[&str], &str); 6] = [
        (
            &["-n", "0", "sh", "-c", &touch],
            "the number of ranks must be at least 1, got 0",
        ),
        (
            &["-n", "2", "--backend", "tcp", "sh", "-c", &touch],
            "unknown distributed backend \"tcp\"",
        ),
        (
            &["-n", "2", "--backend", "nccl", "sh", "-c", &touch],
            "safemlx-launch starts ring or mpi ranks, not nccl",
        ),
        (
            &["-n", "2", "/no/such/program"],
            "program \"/no/such/program\" was not found",
        ),
        (
            &["-n", "2", "--hostfile", &bad_hostfile, "sh", "-c", &touch],
            "it lists 1 ranks but 2 were asked for with -n",
        ),
        (&["sh", "-c", &touch], "-n N is required"),
    ];
    for (args, message) in cases {
        let (out, _) = launch(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{args:?}: {}", stderr(&out));
        assert!(!marker.exists(), "{args:?} started a rank");
    }
}

#[test]
fn mpi_ranks_are_prefixed_and_a_failure_is_named() {
    let (out, _) = launch(&[
        "-n",
        "2",
        "--backend",
        "mpi",
        "sh",
        "-c",
        "echo hello $SAFEMLX_DIST_BACKEND",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    for rank in 0..2 {
        assert!(
            stdout(&out).contains(&format!("[rank {rank}] hello mpi")),
            "{}",
            stdout(&out)
        );
    }
    let script = r#"if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exit 3; fi; sleep 60"#;
    let (out, took) = launch(&[
        "-n",
        "2",
        "--backend",
        "mpi",
        "--timeout",
        "30",
        "sh",
        "-c",
        script,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("rank 1 failed (exit code: 3)"),
        "{}",
        stderr(&out)
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

/// Whether process `pid` is gone (exited, or a zombie nobody reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

#[test]
fn ranks_exit_when_their_launcher_is_killed() {
    const RANK: &str = "LAUNCH_CLI_WATCHDOG_RANK";
    if std::env::var(RANK).is_ok() {
        // A rank: join the group, say who we are, then wait "forever".
        let group = safemlx_dist::init(true, safemlx_dist::Backend::Ring).expect("joins");
        println!("pid {} rank {}", std::process::id(), group.rank());
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    use std::io::BufRead;
    let exe = std::env::current_exe().expect("test binary");
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_safemlx-launch"))
        .args(["-n", "2", "--"])
        .arg(exe)
        .args([
            "ranks_exit_when_their_launcher_is_killed",
            "--exact",
            "--nocapture",
        ])
        .env(RANK, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("safemlx-launch runs");
    let lines = std::io::BufReader::new(launcher.stdout.take().expect("stdout"));
    let pids: Vec<u32> = lines
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| {
            let rest = l.split("] pid ").nth(1)?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .take(2)
        .collect();
    assert_eq!(pids.len(), 2, "both ranks reported");
    launcher.kill().expect("SIGKILL the launcher");
    launcher.wait().ok();
    let started = Instant::now();
    while !pids.iter().all(|&p| gone(p)) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "ranks {pids:?} outlived their launcher"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
