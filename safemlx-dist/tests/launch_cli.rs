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
    // Three ranks on one loopback address of the run's own (127.a.b.c).
    let hosts: Vec<Vec<String>> =
        serde_json::from_str(hostfile_line.trim_start_matches("[rank 0] ")).expect("JSON");
    let addresses: Vec<std::net::SocketAddr> = hosts
        .iter()
        .map(|h| h[0].parse().expect("ip:port"))
        .collect();
    assert_eq!(addresses.len(), 3, "{hostfile_line}");
    assert!(
        addresses
            .iter()
            .all(|a| a.ip().is_loopback() && a.ip() == addresses[0].ip()),
        "{hostfile_line}"
    );
}

/// Two runs launched at once never share an address: each run's ranks
/// listen on a loopback address of its own, so a port the kernel hands
/// both (one freed by the other's launcher) cannot join them.
#[test]
fn concurrent_runs_listen_on_addresses_of_their_own() {
    let script = r#"cat "$MLX_HOSTFILE"; echo"#;
    let runs: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(move || launch(&["-n", "2", "--", "sh", "-c", script]).0))
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    for run in runs {
        let out = run.join().expect("launches");
        assert!(out.status.success(), "{}", stderr(&out));
        let line = stdout(&out)
            .lines()
            .find(|l| l.starts_with("[rank 0] [["))
            .expect("the hostfile is printed")
            .to_owned();
        let hosts: Vec<Vec<String>> =
            serde_json::from_str(line.trim_start_matches("[rank 0] ")).expect("JSON");
        let ip = hosts[0][0].rsplit_once(':').expect("ip:port").0.to_owned();
        assert!(seen.insert(ip), "two runs on one address: {line}");
    }
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
    let script = r#"if [ "${MLX_RANK:-$OMPI_COMM_WORLD_RANK}" = 0 ]; then exit 0; fi; sleep 60"#;
    for backend in ["ring", "mpi"] {
        let args = ["-n", "3", "--backend", backend, "--timeout", "2"];
        let (out, took) = launch(&[&args[..], &["sh", "-c", script]].concat());
        assert_eq!(out.status.code(), Some(1), "{backend}");
        assert!(
            stderr(&out).contains("timed out after 2 s; ranks still running: 1, 2\n"),
            "{backend}: {}",
            stderr(&out)
        );
        assert!(took < Duration::from_secs(8), "{backend}: took {took:?}");
    }
}

/// A line written in several writes, with other ranks writing between
/// them, arrives whole with one prefix (mpirun tags each write, not each
/// line); so does a last line without a newline.
#[test]
fn lines_written_in_pieces_arrive_whole_with_one_prefix() {
    let script = r#"r=${MLX_RANK:-$OMPI_COMM_WORLD_RANK}
        printf "moe"; sleep 0.3; printf ": rank $r"; sleep 0.3; echo " done"
        printf "to stderr" >&2; sleep 0.3; echo " whole" >&2
        printf "no newline at the end of $r""#;
    for backend in ["ring", "mpi"] {
        let (out, _) = launch(&["-n", "2", "--backend", backend, "sh", "-c", script]);
        assert!(out.status.success(), "{backend}: {}", stderr(&out));
        for rank in 0..2 {
            let prefix = format!("[rank {rank}] ");
            let mine = |text: String| -> Vec<String> {
                text.lines()
                    .filter(|l| l.starts_with(&prefix))
                    .map(String::from)
                    .collect()
            };
            assert_eq!(
                mine(stdout(&out)),
                [
                    format!("{prefix}moe: rank {rank} done"),
                    format!("{prefix}no newline at the end of {rank}")
                ],
                "{backend}: {}",
                stdout(&out)
            );
            assert_eq!(
                mine(stderr(&out)),
                [format!("{prefix}to stderr whole")],
                "{backend}: {}",
                stderr(&out)
            );
        }
    }
}

#[test]
fn bad_arguments_exit_2_and_start_nothing() {
    let marker = std::env::temp_dir().join(format!("safemlx-launch-marker-{}", std::process::id()));
    let touch = format!("touch {}", marker.display());
    let bad_hostfile =
        std::env::temp_dir().join(format!("safemlx-launch-bad-{}.json", std::process::id()));
    std::fs::write(&bad_hostfile, r#"[["127.0.0.1:1"]]"#).unwrap();
    let bad_hostfile = bad_hostfile.display().to_string();
    let temp = |name: &str, text: &str| {
        let path =
            std::env::temp_dir().join(format!("safemlx-launch-{name}-{}.json", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let port_zero = temp("port0", r#"[["127.0.0.1:0"], ["127.0.0.1:5001"]]"#);
    let ipv6 = temp("ipv6", r#"[["[::1]:5000"], ["127.0.0.1:5001"]]"#);
    let mlx_hostfile = temp("mlx", r#"[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]"#);
    let mlx_ipv6 = temp(
        "mlx-ipv6",
        r#"[{"ssh": "a", "ips": ["127.0.0.1"]}, {"ssh": "b", "ips": ["fe80::1"]}]"#,
    );
    let not_executable = temp("noexec", "#!/bin/sh\ntouch /tmp/never\n");
    let directory = std::env::temp_dir().display().to_string();
    let cases: [(&[&str], &str); 20] = [
        (
            &["-n", "2", "-n", "3", "sh", "-c", &touch],
            "-n is given twice; give it once",
        ),
        (
            &["-n", "2", "--backend", "ring", "--backend", "mpi", "sh", "-c", &touch],
            "--backend is given twice; give it once",
        ),
        (
            &["-n", "2", "--timeout", "1e20", "sh", "-c", &touch],
            "--timeout 1e20 is longer than the 31536000 s (one year) a run may be given",
        ),
        (
            &["-n", "18446744073709551615", "sh", "-c", &touch],
            "-n 18446744073709551615 asks for more ranks than one machine can hold here: safemlx-launch starts at most 256 local ranks",
        ),
        (
            &["-n", "10000", "--", "true"],
            "-n 10000 asks for more ranks than one machine can hold here",
        ),
        (
            &["-n", "2", &not_executable],
            "is not executable (no x permission); give an executable file",
        ),
        (&["-n", "2", &directory], "is a directory; give an executable file"),
        (
            &["-n", "2", "--backend", "mpi", "--hostfile", &bad_hostfile, "sh", "-c", &touch],
            "this --hostfile is a ring host list ([[\"ip:port\"], ...]), which MPI does not read",
        ),
        (
            &["-n", "2", "--hostfile", "/no/such/file", "sh", "-c", &touch],
            "bad hostfile \"/no/such/file\": cannot read it: No such file or directory",
        ),
        (
            &["--hosts", "127.0.0.1", "--hostfile", &mlx_hostfile, "sh", "-c", &touch],
            "give --hosts or an mlx.launch --hostfile, not both",
        ),
        (
            &["--hostfile", &mlx_ipv6, "sh", "-c", &touch],
            "host 1: \"fe80::1\" is not an IPv4 address; MLX's ring reads IPv4 addresses only",
        ),
        (
            &["--env", "1X=2", "-n", "2", "sh", "-c", &touch],
            "--env \"1X=2\": \"1X\" is not an environment variable name",
        ),
        (
            &["-n", "2", "--hostfile", &port_zero, "sh", "-c", &touch],
            "has port 0; each rank listens on the port it is given",
        ),
        (
            &["-n", "2", "--hostfile", &ipv6, "sh", "-c", &touch],
            "is an IPv6 address; MLX's ring reads IPv4 ip:port addresses only",
        ),
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
    for file in [
        port_zero,
        ipv6,
        mlx_hostfile,
        mlx_ipv6,
        not_executable,
        bad_hostfile,
    ] {
        std::fs::remove_file(file).ok();
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
    // A failing rank, and a killed one: reported by its signal as on ring
    // (not as the wrapper shell's exit code 137).
    for (failure, message) in [
        ("exit 3", "rank 1 failed (exit code: 3)"),
        (
            "sleep 0.5; kill -9 $$",
            "rank 1 failed (signal: 9 (SIGKILL))",
        ),
    ] {
        let script = format!(r#"if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then {failure}; fi; sleep 60"#);
        let (out, took) = launch(&[
            "-n",
            "2",
            "--backend",
            "mpi",
            "--timeout",
            "30",
            "sh",
            "-c",
            &script,
        ]);
        assert_eq!(out.status.code(), Some(1));
        assert!(stderr(&out).contains(message), "{}", stderr(&out));
        assert!(took < Duration::from_secs(10), "took {took:?}");
    }
}
