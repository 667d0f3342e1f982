//! Only the processes of one run form its group: two runs pointed at the
//! same ports refuse each other, a rank with another secret (or none) is
//! refused and named, and a foreign process at a rank's port ends the run
//! within the join timeout instead of joining it. Real processes, ring and
//! MPI.

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use safemlx_dist::launch::RingHosts;

/// Set in the ranks: what the rank does (`late-R`: rank R sleeps 3 s
/// before it joins; `intruder`: rank 1 joins with another secret).
const RANK_ENV: &str = "ADMISSION_TEST_RANK";

/// A rank: joins (ring, or MPI under mpirun), sums `rank + 1` and prints it.
fn rank_body(mode: &str) {
    let rank: usize = ["MLX_RANK", "OMPI_COMM_WORLD_RANK"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse().ok())
        .expect("a rank");
    if mode == format!("late-{rank}") {
        std::thread::sleep(Duration::from_secs(3));
    }
    if mode == "intruder" && rank == 1 {
        std::env::set_var(safemlx_dist::TOKEN_ENV, "not-this-run's-secret");
    }
    let backend = match std::env::var("SAFEMLX_DIST_BACKEND").as_deref() {
        Ok("mpi") => safemlx_dist::Backend::Mpi,
        _ => safemlx_dist::Backend::Ring,
    };
    let group = match safemlx_dist::init(true, backend) {
        Ok(group) => group,
        Err(e) => {
            eprintln!("init: {e}");
            std::process::exit(1);
        }
    };
    let s = safemlx::Stream::new_with_device(&safemlx::Device::new(safemlx::DeviceType::Cpu, 0));
    let x = safemlx::Array::from_slice(&[group.rank() as f32 + 1.0], &[1]);
    let sum = safemlx_dist::all_sum(&x, &group, &s).expect("all_sum");
    safemlx_dist::eval(&[&sum]).expect("eval");
    println!("sum={}", sum.into_evaluated().unwrap().item::<f32>());
}

/// Runs this test's rank body in `mode` under `safemlx-launch` with `args`.
fn launch(test: &str, mode: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_safemlx-launch"));
    command
        .args(args)
        .arg("--")
        .arg(std::env::current_exe().expect("test binary"))
        .args([test, "--exact", "--nocapture", "--quiet"])
        .env(RANK_ENV, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// One rank of this test's body, started by hand as a launcher would.
fn rank_by_hand(test: &str, rank: usize, hostfile: &Path, token: Option<&str>) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    command
        .args([test, "--exact", "--nocapture", "--quiet"])
        .env(RANK_ENV, "plain")
        .env("MLX_RANK", rank.to_string())
        .env("MLX_HOSTFILE", hostfile)
        .env("SAFEMLX_DIST_BACKEND", "ring")
        .env("SAFEMLX_DIST_JOIN_TIMEOUT", "30")
        .env_remove(safemlx_dist::TOKEN_ENV)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(token) = token {
        command.env(safemlx_dist::TOKEN_ENV, token);
    }
    command
}

/// Rank `rank`'s (first) address in `hosts`.
fn address(hosts: &RingHosts, rank: usize) -> String {
    let all: Vec<Vec<String>> = serde_json::from_str(&hosts.to_json()).expect("json");
    all[rank][0].clone()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn refusal(rank: usize, address: &str) -> String {
    format!(
        "rank {rank} of this group ({address}) did not prove this run's secret (SAFEMLX_DIST_TOKEN): \
         a process of another run, or another program, answered at that address"
    )
}

#[test]
fn two_runs_given_the_same_ports_refuse_each_other() {
    const TEST: &str = "two_runs_given_the_same_ports_refuse_each_other";
    if let Ok(mode) = std::env::var(RANK_ENV) {
        return rank_body(&mode);
    }
    let hosts = RingHosts::loopback(2).expect("free ports");
    let file = hosts.write_temp().expect("hostfile");
    let path = file.path().to_str().expect("a UTF-8 path");
    let args = ["-n", "2", "--hostfile", path, "--timeout", "60"];
    // Run A's rank 1 and run B's rank 0 are late: A's rank 0 and B's rank 1
    // are the first at the ports and meet.
    let a = launch(TEST, "late-1", &args).spawn().expect("run A");
    std::thread::sleep(Duration::from_millis(500));
    let b = launch(TEST, "late-0", &args).spawn().expect("run B");
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let (a_text, b_text) = (text(&a), text(&b));
    for (run, out, all) in [("A", &a, &a_text), ("B", &b, &b_text)] {
        assert!(!out.status.success(), "run {run} succeeded:\n{all}");
        assert!(!all.contains("sum="), "run {run} computed:\n{all}");
    }
    let in_file = |r: usize| format!("at {} in MLX_HOSTFILE", address(&hosts, r));
    assert!(
        a_text.contains(&format!("[rank 0] init: {}", refusal(1, &in_file(1)))),
        "run A:\n{a_text}"
    );
    assert!(
        b_text.contains(&format!("[rank 1] init: {}", refusal(0, &in_file(0)))),
        "run B:\n{b_text}"
    );
}

#[test]
fn ranks_started_by_hand_join_only_with_the_same_secret() {
    const TEST: &str = "ranks_started_by_hand_join_only_with_the_same_secret";
    if let Ok(mode) = std::env::var(RANK_ENV) {
        return rank_body(&mode);
    }
    let hosts = RingHosts::loopback(2).expect("free ports");
    let file = hosts.write_temp().expect("hostfile");
    let pair = |tokens: [Option<&str>; 2]| -> Vec<Output> {
        let ranks: Vec<_> = (0..2)
            .map(|r| {
                rank_by_hand(TEST, r, file.path(), tokens[r])
                    .spawn()
                    .unwrap()
            })
            .collect();
        ranks
            .into_iter()
            .map(|r| r.wait_with_output().unwrap())
            .collect()
    };
    let secret = "a secret of this run";
    let same = pair([Some(secret), Some(secret)]);
    for out in &same {
        assert!(out.status.success(), "{}", text(out));
        assert!(text(out).contains("sum=3"), "{}", text(out));
    }
    let in_file = |r: usize| format!("at {} in MLX_HOSTFILE", address(&hosts, r));
    let other = pair([Some(secret), Some("the secret of another run")]);
    assert!(text(&other[0]).contains(&refusal(1, &in_file(1))));
    assert!(text(&other[1]).contains(&refusal(0, &in_file(0))));
    let none = pair([None, Some(secret)]);
    assert!(
        text(&none[0]).contains(
            "init: SAFEMLX_DIST_TOKEN is not set, so this rank cannot prove to its peers \
             (a group of 2) that it belongs to their run; start the ranks with safemlx-launch"
        ),
        "{}",
        text(&none[0])
    );
    assert!(text(&none[1]).contains(&refusal(0, &in_file(0))));
    let short = pair([Some("short"), Some("short")]);
    assert!(text(&short[0])
        .contains("init: SAFEMLX_DIST_TOKEN has 5 bytes; a run's secret needs at least 16"));
    for out in other.iter().chain(&none).chain(&short) {
        assert!(
            !out.status.success() && !text(out).contains("sum="),
            "{}",
            text(out)
        );
    }
}

#[test]
fn an_mpi_rank_with_another_secret_is_refused_and_one_given_by_env_joins() {
    const TEST: &str = "an_mpi_rank_with_another_secret_is_refused_and_one_given_by_env_joins";
    if let Ok(mode) = std::env::var(RANK_ENV) {
        return rank_body(&mode);
    }
    if !safemlx_dist::is_available(safemlx_dist::Backend::Mpi) {
        panic!("this test needs MPI (Open MPI), which cargo xtask test installs");
    }
    let out = launch(TEST, "intruder", &["-n", "2", "--backend", "mpi"])
        .output()
        .unwrap();
    let all = text(&out);
    assert!(!out.status.success() && !all.contains("sum="), "{all}");
    assert!(
        all.contains(&refusal(1, "its address is not in a hostfile")),
        "{all}"
    );
    // A secret given with --env is the run's (for ranks of other launchers).
    for backend in ["mpi", "ring"] {
        let env = "SAFEMLX_DIST_TOKEN=given by the user, long enough";
        let out = launch(
            TEST,
            "plain",
            &["-n", "2", "--backend", backend, "--env", env],
        )
        .output()
        .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        assert!(text(&out).contains("[rank 1] sum=3"), "{}", text(&out));
    }
}

#[test]
fn a_foreign_connection_at_a_ranks_port_ends_the_run_within_the_join_timeout() {
    const TEST: &str = "a_foreign_connection_at_a_ranks_port_ends_the_run_within_the_join_timeout";
    if let Ok(mode) = std::env::var(RANK_ENV) {
        return rank_body(&mode);
    }
    for garbage in [true, false] {
        let hosts = RingHosts::loopback(2).expect("free ports");
        let file = hosts.write_temp().expect("hostfile");
        let path = file.path().to_str().expect("a UTF-8 path");
        let started = Instant::now();
        let run = launch(
            TEST,
            "late-1",
            &["-n", "2", "--hostfile", path, "--timeout", "60"],
        )
        .env("SAFEMLX_DIST_JOIN_TIMEOUT", "4")
        .spawn()
        .expect("the run");
        // The foreign process takes rank 0's port before rank 1 comes.
        let address = address(&hosts, 0);
        let mut foreign = loop {
            match TcpStream::connect(&address) {
                Ok(stream) => break stream,
                Err(_) if started.elapsed() < Duration::from_secs(3) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("rank 0 never listened at {address}: {e}"),
            }
        };
        if garbage {
            let bytes: Vec<u8> = (0..=255u8).cycle().take(1 << 16).collect();
            let _ = foreign.write_all(&bytes);
        }
        let out = run.wait_with_output().unwrap();
        let took = started.elapsed();
        let all = text(&out);
        assert!(!out.status.success() && !all.contains("sum="), "{all}");
        assert!(
            all.contains("waited 4 s to join its group without every rank connecting"),
            "{all}"
        );
        // 3 s late + the 4 s join timeout, and the launcher's stop.
        assert!(took < Duration::from_secs(20), "took {took:?}:\n{all}");
        eprintln!(
            "fault table: a foreign connection ({}) at rank 0's port: error in {:.1} s",
            if garbage { "sending garbage" } else { "silent" },
            took.as_secs_f64()
        );
        drop(foreign);
    }
}

/// The book's Python exchange (the launching chapter's `python` block),
/// then an `all_sum` of `rank + 1`, as an MLX Python rank.
fn python_rank_script() -> String {
    let book = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../book/src/launching.md"),
    )
    .expect("the book's launching chapter");
    let start = book.find("```python\n").expect("a python block") + "```python\n".len();
    let end = start + book[start..].find("```").expect("its end");
    format!(
        "{}\ngroup = mx.distributed.init(backend=\"ring\", strict=True)\nprove(group)\n\
         x = mx.distributed.all_sum(mx.array([group.rank() + 1.0]), group=group)\n\
         mx.eval(x)\nprint(\"sum=%g\" % x.item(), flush=True)\n",
        &book[start..end]
    )
}

#[test]
fn mlx_python_ranks_join_with_the_books_exchange_and_the_same_secret() {
    const TEST: &str = "mlx_python_ranks_join_with_the_books_exchange_and_the_same_secret";
    if let Ok(mode) = std::env::var(RANK_ENV) {
        return rank_body(&mode);
    }
    // `cargo xtask test` makes an environment with MLX Python and sets this.
    let Some(python) = std::env::var_os("SAFEMLX_DIST_MLX_PYTHON") else {
        eprintln!("skipped: SAFEMLX_DIST_MLX_PYTHON (a python with mlx) is not set");
        return;
    };
    let hosts = RingHosts::loopback(2).expect("free ports");
    let file = hosts.write_temp().expect("hostfile");
    let script = std::env::temp_dir().join(format!("safemlx-admission-{}.py", std::process::id()));
    std::fs::write(&script, python_rank_script()).expect("the script");
    let secret = "a secret of this run";
    let pair = |python_secret: &str| -> (Output, Output) {
        let ours = rank_by_hand(TEST, 0, file.path(), Some(secret))
            .env("SAFEMLX_DIST_LOWERING", "native")
            .spawn()
            .unwrap();
        let theirs = Command::new(&python)
            .arg(&script)
            .env("MLX_RANK", "1")
            .env("MLX_HOSTFILE", file.path())
            .env(safemlx_dist::TOKEN_ENV, python_secret)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("MLX Python runs");
        (
            ours.wait_with_output().unwrap(),
            theirs.wait_with_output().unwrap(),
        )
    };
    let (ours, theirs) = pair(secret);
    assert!(
        ours.status.success() && text(&ours).contains("sum=3"),
        "{}",
        text(&ours)
    );
    assert!(
        theirs.status.success() && text(&theirs).contains("sum=3"),
        "{}",
        text(&theirs)
    );
    let (ours, theirs) = pair("the secret of another run");
    let in_file = format!("at {} in MLX_HOSTFILE", address(&hosts, 1));
    assert!(
        text(&ours).contains(&refusal(1, &in_file)),
        "{}",
        text(&ours)
    );
    assert!(
        text(&theirs).contains("rank 0 did not prove this run's secret"),
        "{}",
        text(&theirs)
    );
    assert!(!ours.status.success() && !theirs.status.success());
    let _ = std::fs::remove_file(script);
}
