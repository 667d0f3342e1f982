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

/// A rank of the watchdog tests: joins the group, keeps OpenBLAS's worker
/// threads busy (their exit handler is what deadlocked `exit`), says who it
/// is, then waits "forever".
fn watchdog_rank(backend: safemlx_dist::Backend) {
    let group = safemlx_dist::init(true, backend).expect("joins");
    std::thread::spawn(|| {
        let s =
            safemlx::Stream::new_with_device(&safemlx::Device::new(safemlx::DeviceType::Cpu, 0));
        let a = safemlx::Array::from_slice(&vec![0.5f32; 256 * 256], &[256, 256]);
        loop {
            let b = a.matmul(&a, &s).expect("matmul");
            safemlx_dist::eval(&[&b]).expect("evaluates");
        }
    });
    println!("pid {} rank {}", std::process::id(), group.rank());
    std::thread::sleep(Duration::from_secs(60));
}

/// Starts 2 ranks of [`watchdog_rank`] on `backend`, kills the launcher
/// with `signal` once both ranks report, and checks that every process of
/// the run (ranks, and under MPI mpirun and the wrapper shells) is gone
/// within 5 s.
fn launcher_killed(test: &str, backend: &str, signal: nix::sys::signal::Signal) {
    use std::io::BufRead;
    let exe = std::env::current_exe().expect("test binary");
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_safemlx-launch"))
        .args(["-n", "2", "--backend", backend, "--"])
        .arg(exe)
        .args([test, "--exact", "--nocapture"])
        .env("LAUNCH_CLI_WATCHDOG_RANK", backend)
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
    let mut everything = descendants(launcher.id());
    everything.extend(&pids);
    let prefix = format!("safemlx-launch-{}-", launcher.id());
    let leftovers = || -> Vec<String> {
        std::fs::read_dir(std::env::temp_dir())
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.starts_with(&prefix))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(
        !leftovers().is_empty(),
        "the run has its hostfile or progress directory"
    );
    let pid = nix::unistd::Pid::from_raw(launcher.id() as i32);
    nix::sys::signal::kill(pid, signal).expect("signals the launcher");
    let status = launcher.wait().expect("the launcher is reaped");
    if signal != nix::sys::signal::Signal::SIGKILL {
        // Forwarded to the ranks, then the launcher exits as 128 + signal.
        assert_eq!(
            status.code(),
            Some(128 + signal as i32),
            "{backend}: {signal}"
        );
    }
    let started = Instant::now();
    while !everything.iter().all(|&p| gone(p)) {
        let left: Vec<u32> = everything.iter().copied().filter(|&p| !gone(p)).collect();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{backend}: processes {left:?} outlived their launcher ({signal})"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Removed by the launcher on a signal it catches, by the ranks after a SIGKILL.
    assert_eq!(
        leftovers(),
        Vec::<String>::new(),
        "{backend}: {signal} left files"
    );
}

/// Every process below `pid`, from `/proc`.
fn descendants(pid: u32) -> Vec<u32> {
    let parent_of = |p: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let all: Vec<u32> = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut found = vec![pid];
    let mut at = 0;
    while at < found.len() {
        let p = found[at];
        found.extend(all.iter().copied().filter(|&c| parent_of(c) == Some(p)));
        at += 1;
    }
    found.remove(0);
    found
}

#[test]
fn ranks_exit_when_their_launcher_is_killed() {
    use nix::sys::signal::Signal;
    const TEST: &str = "ranks_exit_when_their_launcher_is_killed";
    match std::env::var("LAUNCH_CLI_WATCHDOG_RANK").as_deref() {
        Ok("ring") => return watchdog_rank(safemlx_dist::Backend::Ring),
        Ok(_) => return watchdog_rank(safemlx_dist::Backend::Mpi),
        Err(_) => {}
    }
    for signal in [
        Signal::SIGKILL,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGKILL,
    ] {
        launcher_killed(TEST, "ring", signal);
        launcher_killed(TEST, "mpi", signal);
    }
}

/// A rank of the stall test: all_sums in a loop; rank 2 stops itself (as a
/// debugger or a deadlock would) after its 6th.
fn stalling_rank(backend: safemlx_dist::Backend) {
    let group = safemlx_dist::init(true, backend).expect("joins");
    println!("pid {} rank {}", std::process::id(), group.rank());
    let s = safemlx::Stream::new_with_device(&safemlx::Device::new(safemlx::DeviceType::Cpu, 0));
    let x = safemlx::Array::from_slice(&[1.0f32; 16], &[16]);
    for i in 0.. {
        let y = safemlx_dist::all_sum(&x, &group, &s).expect("all_sum");
        safemlx_dist::eval(&[&y]).expect("evaluates");
        if group.rank() == 2 && i == 5 {
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP).expect("stops");
        }
    }
}

/// With one rank stopped and no --timeout, the collective timeout ends the
/// run and the launcher names the stopped rank from the progress files;
/// nothing is left running.
#[test]
fn a_stopped_rank_is_named_after_the_collective_timeout() {
    const TEST: &str = "a_stopped_rank_is_named_after_the_collective_timeout";
    match std::env::var("LAUNCH_CLI_STALL_RANK").as_deref() {
        Ok("ring") => return stalling_rank(safemlx_dist::Backend::Ring),
        Ok(_) => return stalling_rank(safemlx_dist::Backend::Mpi),
        Err(_) => {}
    }
    let exe = std::env::current_exe().expect("test binary");
    for backend in ["ring", "mpi"] {
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_safemlx-launch"))
            .args(["-n", "3", "--backend", backend, "--"])
            .arg(&exe)
            .args([TEST, "--exact", "--nocapture"])
            .env("LAUNCH_CLI_STALL_RANK", backend)
            .env("SAFEMLX_DIST_TIMEOUT", "2")
            .output()
            .expect("safemlx-launch runs");
        let took = started.elapsed();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{backend}: {err}");
        // The lowering agreement at init is #1; rank 2 stops after its 6th
        // all_sum (#7); the others wait in #8.
        assert!(
            err.contains("after a collective timed out: rank 2 never entered all_sum #8 (rank 2 is at all_sum #7); ranks 0, 1 wait in it"),
            "{backend}: {err}"
        );
        assert!(
            err.contains(
                "waited 2 s in all_sum #8 (group of 3, [16] Float32) without it completing"
            ),
            "{backend}: {err}"
        );
        assert!(took < Duration::from_secs(15), "{backend}: took {took:?}");
        let pids: Vec<u32> = stdout(&out)
            .lines()
            .filter_map(|l| {
                l.split("] pid ")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        assert_eq!(pids.len(), 3, "{backend}: every rank reported");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !pids.iter().all(|&p| gone(p)) {
            assert!(
                Instant::now() < deadline,
                "{backend}: ranks {pids:?} left running"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
