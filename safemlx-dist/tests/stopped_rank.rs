//! A rank stopped (SIGSTOP) in the middle of a real model's decode, or
//! before it joins its group: the collective timeout ends the run even
//! though the waiting ranks are blocked inside MLX's evaluation, and the
//! launcher names the stopped rank, on ring and MPI (mid-decode: with
//! both cores kept busy by other processes).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const RANK_ENV: &str = "STOPPED_RANK_TEST_RANK";

/// A rank of the decode test: a tiny Llama (a golden model of the tests)
/// split over the group, decoding greedily until it is stopped.
fn decoding_rank() {
    use safemlx_dist::checkpoint::HfDirectory;
    use safemlx_dist::generate::{generate, Sampler};
    let backend = match std::env::var(RANK_ENV).as_deref() {
        Ok("decode-mpi") => safemlx_dist::Backend::Mpi,
        _ => safemlx_dist::Backend::Ring,
    };
    let group = safemlx_dist::init(true, backend).expect("joins");
    let rank = group.rank();
    println!("pid {} rank {rank}", std::process::id());
    let s = safemlx::Stream::new_with_device(&safemlx::Device::new(safemlx::DeviceType::Cpu, 0));
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/golden/llama/llama-tied-kv3");
    let dir = HfDirectory::open(dir).expect("the golden model");
    let model = safemlx_dist::models::Llama::from_hf(&group, &dir, &s).expect("loads");
    let mut cache = model.new_cache();
    let mut sampler = Sampler::new(0.0, 1.0, 0).expect("greedy");
    let mut steps = 0u64;
    generate(
        &model,
        &mut cache,
        &[1, 2, 3],
        1 << 20,
        &mut sampler,
        &[],
        |_| {
            steps += 1;
            if rank == 0 && steps % 10 == 0 {
                println!("decoded {steps}");
            }
            Ok(())
        },
        &s,
    )
    .expect("decodes until stopped");
}

/// A rank of the init test: on ring rank 1, on MPI rank 0 stops itself
/// before it joins (its first heartbeat).
fn late_rank() {
    let (backend, victim, rank) = match std::env::var(RANK_ENV).as_deref() {
        Ok("late-mpi") => (
            safemlx_dist::Backend::Mpi,
            "0",
            std::env::var("OMPI_COMM_WORLD_RANK"),
        ),
        _ => (safemlx_dist::Backend::Ring, "1", std::env::var("MLX_RANK")),
    };
    if rank.as_deref() == Ok(victim) {
        println!("pid {} rank {victim} stops before init", std::process::id());
        nix::sys::signal::raise(Signal::SIGSTOP).expect("stops");
    }
    let _ = safemlx_dist::init(true, backend);
    println!("joined");
}

/// Launches 2 ranks of this test with `SAFEMLX_DIST_TIMEOUT=3` (joining:
/// 3 s for the late rank, 60 otherwise) and the
/// launcher's own `timeout` (90 s: a safety net); `stop` sees each stdout
/// line and returns the pid to stop, once. Returns the exit code, stderr
/// and the seconds from the stop (or the start) to the end.
fn run(
    (test, mode): (&str, &str),
    (backend, timeout): (&str, &str),
    mut stop: impl FnMut(&str) -> Option<u32>,
) -> (Option<i32>, String, Duration) {
    let exe = std::env::current_exe().expect("test binary");
    let mut child = Command::new(env!("CARGO_BIN_EXE_safemlx-launch"))
        .args(["-n", "2", "--backend", backend, "--timeout", timeout, "--"])
        .arg(&exe)
        .args([test, "--exact", "--nocapture"])
        .env(RANK_ENV, mode)
        .env("SAFEMLX_DIST_TIMEOUT", "3")
        .env(
            "SAFEMLX_DIST_JOIN_TIMEOUT",
            if mode.starts_with("late") { "3" } else { "60" },
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("safemlx-launch runs");
    let (lines, received) = mpsc::channel();
    let out = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let err = child.stderr.take().expect("stderr");
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let mut stopped = None;
    let mut from = Instant::now();
    while let Ok(line) = received.recv_timeout(Duration::from_secs(100)) {
        if stopped.is_none() {
            if let Some(pid) = stop(&line) {
                kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).expect("SIGSTOP");
                stopped = Some(pid);
                from = Instant::now();
            }
        }
    }
    let status = child.wait().expect("the launcher ends");
    let took = from.elapsed();
    if let Some(pid) = stopped {
        // Whatever is left of it (nothing, if the launcher did its job).
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
    }
    (status.code(), errors.join().expect("stderr"), took)
}

/// The pid in `[rank R] pid P rank R...`.
fn pid_of(line: &str, rank: usize) -> Option<u32> {
    let rest = line.strip_prefix(&format!("[rank {rank}] pid "))?;
    rest.split_whitespace().next()?.parse().ok()
}

#[test]
fn a_rank_stopped_mid_decode_ends_the_run_and_is_named() {
    const TEST: &str = "a_rank_stopped_mid_decode_ends_the_run_and_is_named";
    if std::env::var(RANK_ENV).is_ok() {
        return decoding_rank();
    }
    // Both cores kept busy: the launcher may read the ranks' files late,
    // after the rank whose wait timed out has exited.
    let _load = safemlx_dist::launch::Busy::cores(2);
    for backend in ["ring", "mpi"] {
        let mut victim = None;
        let mode = format!("decode-{backend}");
        let (code, err, took) = run((TEST, &mode), (backend, "90"), |line| {
            if let Some(pid) = pid_of(line, 1) {
                victim = Some(pid);
            }
            // Rank 0 has decoded 30 tokens: stop rank 1 wherever it is.
            let decoding = line.starts_with("[rank 0] decoded 30");
            victim.filter(|_| decoding)
        });
        assert_eq!(code, Some(1), "{backend}: {err}");
        assert!(
            err.contains("rank 1 shows no sign of life"),
            "{backend}: the stopped rank is not named: {err}"
        );
        assert!(
            err.contains("rank 0 waited 3 s in ") && err.contains("without it completing"),
            "{backend}: rank 0's own timeout did not fire: {err}"
        );
        assert!(
            took < Duration::from_secs(20),
            "{backend}: took {took:?}: {err}"
        );
    }
}

#[test]
fn a_rank_stopped_before_it_joins_times_out_the_group_initialisation() {
    const TEST: &str = "a_rank_stopped_before_it_joins_times_out_the_group_initialisation";
    if std::env::var(RANK_ENV).is_ok() {
        return late_rank();
    }
    for (backend, stopped, waiting) in [("ring", 1, 0), ("mpi", 0, 1)] {
        let mode = format!("late-{backend}");
        let (code, err, took) = run((TEST, &mode), (backend, "90"), |_| None);
        assert_eq!(code, Some(1), "{backend}: {err}");
        assert!(
            err.contains(&format!(
                "rank {waiting} waited 3 s to join its group without every rank connecting"
            )),
            "{backend}: {err}"
        );
        assert!(
            err.contains(&format!("rank {stopped} shows no sign of life since it started (stopped, or stuck whole); it entered no collective; rank {waiting} waits to join the group")),
            "{backend}: {err}"
        );
        assert!(
            took < Duration::from_secs(40),
            "{backend}: took {took:?}: {err}"
        );
    }
}

/// A healthy run cut by the launcher's `--timeout` is not reported as a
/// stuck one: every rank shows signs of life.
#[test]
fn a_healthy_run_cut_by_the_timeout_names_no_rank() {
    const TEST: &str = "a_healthy_run_cut_by_the_timeout_names_no_rank";
    if std::env::var(RANK_ENV).is_ok() {
        return decoding_rank();
    }
    let (code, err, _) = run((TEST, "decode-ring"), ("ring", "4"), |_| None);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("safemlx-launch: timed out after 4 s; ranks still running: 0, 1; every rank shows signs of life and entered "),
        "{err}"
    );
    assert!(
        err.contains("(a slow run, or a transport problem; none is stopped)"),
        "{err}"
    );
    assert!(!err.contains("no sign of life"), "{err}");
}
