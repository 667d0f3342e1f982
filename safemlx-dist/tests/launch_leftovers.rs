//! What an MPI launch leaves behind: Open MPI's session directory lives in
//! the launch's own temporary directory, and nothing is left in `$TMPDIR`
//! after the run, whether it ends by itself, by the launcher's SIGTERM or
//! by its SIGKILL (the ranks then find their launcher gone and clean up);
//! and no rank outlives a launcher killed while it starts them.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const RANK_ENV: &str = "LAUNCH_LEFTOVERS_RANK";

/// A rank: joins its MPI group, then sums for about three seconds.
fn rank() {
    let group = safemlx_dist::init(true, safemlx_dist::Backend::Mpi).expect("joins");
    println!("joined {}", group.rank());
    let s = safemlx::Stream::new_with_device(&safemlx::Device::new(safemlx::DeviceType::Cpu, 0));
    let x = safemlx::Array::from_slice(&[1.0f32; 16], &[16]);
    for _ in 0..60 {
        let y = safemlx_dist::all_sum(&x, &group, &s).expect("all_sum");
        safemlx_dist::eval(&[&y]).expect("evaluates");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn an_mpi_launch_leaves_nothing_in_tmpdir() {
    const TEST: &str = "an_mpi_launch_leaves_nothing_in_tmpdir";
    if std::env::var(RANK_ENV).is_ok() {
        return rank();
    }
    let exe = std::env::current_exe().expect("test binary");
    for signal in ["none", "TERM", "KILL"] {
        let tmp =
            std::env::temp_dir().join(format!("safemlx-leftovers-{signal}-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_safemlx-launch"))
            .args(["-n", "2", "--backend", "mpi", "--timeout", "60", "--"])
            .arg(&exe)
            .args([TEST, "--exact", "--nocapture"])
            .env(RANK_ENV, "1")
            .env("TMPDIR", &tmp)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("safemlx-launch runs");
        let (lines, received) = mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let mut joined = 0;
        while joined < 2 {
            let line = received
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("{signal}: the ranks did not join"));
            joined += usize::from(line.contains("joined "));
        }
        // While it runs: one directory, the launch's, holding Open MPI's.
        let top = entries(&tmp);
        assert!(
            top.len() == 1 && top[0].starts_with("safemlx-launch-"),
            "{signal}: {top:?}"
        );
        let inside = entries(&tmp.join(&top[0]));
        assert!(
            inside.iter().any(|n| n.starts_with("ompi.")),
            "{signal}: no session directory in the launch's: {inside:?}"
        );
        if signal != "none" {
            let _ = Command::new("kill")
                .args([&format!("-{signal}"), &child.id().to_string()])
                .status();
        }
        let _ = child.wait();
        let deadline = Instant::now() + Duration::from_secs(15);
        while !entries(&tmp).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(
            entries(&tmp),
            Vec::<String>::new(),
            "{signal}: left in TMPDIR"
        );
        std::fs::remove_dir_all(&tmp).ok();
    }
}

#[test]
fn a_launch_removes_what_killed_launchers_left_before_their_ranks_started() {
    let tmp = std::env::temp_dir().join(format!("safemlx-leftovers-stale-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    // A launcher SIGKILLed before its ranks started: a pid that is gone.
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let live = std::process::id();
    let stale_dir = format!("safemlx-launch-{dead}-17-progress");
    let stale_file = format!("safemlx-launch-{dead}-17.json");
    let live_dir = format!("safemlx-launch-{live}-17-progress");
    let other = "safemlx-launch-notes.json".to_owned();
    std::fs::create_dir_all(tmp.join(&stale_dir).join("ompi.session")).unwrap();
    std::fs::write(tmp.join(&stale_file), "[]").unwrap();
    std::fs::create_dir(tmp.join(&live_dir)).unwrap();
    std::fs::write(tmp.join(&other), "mine").unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_safemlx-launch"))
        .args(["-n", "1", "--", "true"])
        .env("TMPDIR", &tmp)
        .status()
        .expect("safemlx-launch runs");
    assert!(status.success());
    assert_eq!(entries(&tmp), [live_dir, other]);
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// A rank of the early-kill test: writes its pid where the test reads it,
/// then joins (a join that would wait up to ten minutes for a peer).
fn pid_writing_rank(dir: &str) {
    let rank = std::env::var("MLX_RANK")
        .or_else(|_| std::env::var("OMPI_COMM_WORLD_RANK"))
        .unwrap_or_default();
    let pid = std::process::id();
    std::fs::write(Path::new(dir).join(format!("rank-{rank}-{pid}")), "").unwrap();
    let backend = match std::env::var("LAUNCH_LEFTOVERS_BACKEND").as_deref() {
        Ok("mpi") => safemlx_dist::Backend::Mpi,
        _ => safemlx_dist::Backend::Ring,
    };
    let _ = safemlx_dist::init(true, backend);
    std::thread::sleep(Duration::from_secs(600));
}

fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

#[test]
fn no_rank_outlives_a_launcher_killed_while_it_starts_them() {
    const TEST: &str = "no_rank_outlives_a_launcher_killed_while_it_starts_them";
    if let Ok(dir) = std::env::var(RANK_ENV) {
        return pid_writing_rank(&dir);
    }
    let exe = std::env::current_exe().expect("test binary");
    for backend in ["ring", "mpi"] {
        for delay_ms in [0u64, 20, 50, 100, 150, 300] {
            let pids = std::env::temp_dir().join(format!(
                "safemlx-early-kill-{backend}-{delay_ms}-{}",
                std::process::id()
            ));
            std::fs::create_dir_all(&pids).unwrap();
            let mut child = Command::new(env!("CARGO_BIN_EXE_safemlx-launch"))
                .args(["-n", "2", "--backend", backend, "--"])
                .arg(&exe)
                .args([TEST, "--exact", "--nocapture"])
                .env(RANK_ENV, &pids)
                .env("LAUNCH_LEFTOVERS_BACKEND", backend)
                .env("SAFEMLX_DIST_JOIN_TIMEOUT", "600")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("safemlx-launch runs");
            std::thread::sleep(Duration::from_millis(delay_ms));
            child.kill().expect("SIGKILL");
            child.wait().expect("reaped");
            // A rank started just before the kill may still be writing its
            // file; give the stragglers a moment to appear, then to go.
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut seen = Vec::new();
            loop {
                for name in entries(&pids) {
                    if let Some(pid) = name.rsplit('-').next().and_then(|p| p.parse::<u32>().ok()) {
                        if !seen.contains(&pid) {
                            seen.push(pid);
                        }
                    }
                }
                let alive: Vec<u32> = seen.iter().copied().filter(|&p| running(p)).collect();
                if alive.is_empty() && Instant::now() + Duration::from_secs(28) > deadline {
                    break;
                }
                if Instant::now() > deadline {
                    for pid in &alive {
                        let _ = Command::new("kill")
                            .args(["-KILL", &pid.to_string()])
                            .status();
                    }
                    panic!("{backend}, killed after {delay_ms} ms: ranks {alive:?} outlived their launcher");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            std::fs::remove_dir_all(&pids).ok();
        }
    }
}
