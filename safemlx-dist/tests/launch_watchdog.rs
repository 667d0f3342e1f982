//! `safemlx-launch` and its ranks' watchdogs, from the outside: killing
//! the launcher (any signal, SIGKILL included) ends every rank and leaves
//! no files; a stopped rank ends the run after the collective timeout and
//! is named. The test binary itself is the ranks (selected by an
//! environment variable).

use std::process::Command;
use std::time::{Duration, Instant};

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
        .env("LAUNCH_WATCHDOG_KILLED_RANK", backend)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("safemlx-launch runs");
    // Kept open to the end: a launcher whose stdout closes ends the run
    // by itself (with SIGPIPE's status), which is not what this tests.
    let mut lines = std::io::BufReader::new(launcher.stdout.take().expect("stdout")).lines();
    let pids: Vec<u32> = lines
        .by_ref()
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
    drop(lines);
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
    match std::env::var("LAUNCH_WATCHDOG_KILLED_RANK").as_deref() {
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
    match std::env::var("LAUNCH_WATCHDOG_STALL_RANK").as_deref() {
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
            .env("LAUNCH_WATCHDOG_STALL_RANK", backend)
            .env("SAFEMLX_DIST_TIMEOUT", "2")
            .output()
            .expect("safemlx-launch runs");
        let took = started.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
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
        let pids: Vec<u32> = String::from_utf8_lossy(&out.stdout)
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
