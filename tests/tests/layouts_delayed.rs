//! The benchmark half of `cargo xtask bench layouts` that needs the test
//! network: SmolLM2 as 2 ranks tensor parallel and as 2 pipeline stages
//! across two hosts (network namespaces) whose links each hold every
//! packet 2 ms (see `netns.rs`), on ring and on MPI. Open MPI 4.1.4's own
//! connection setup (its ssh-started daemons calling back, its TCP
//! transport's connects) fails on these links in most runs
//! (open-mpi/ompi#10734); an MPI run that fails so is started again, up
//! to 4 times, and its row says how many it took (or that none started).
//! Ignored by `cargo test`: the
//! xtask runs it with `SAFEMLX_BENCH_MODEL` (the GGUF) and
//! `SAFEMLX_BENCH_OUT` (the JSON lines file) set. Each row also gives the
//! CPU seconds the delaying threads of this process spent during the run
//! (they share the machine's cores with the ranks) and the measured round
//! trip.

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use safemlx_dist_tests::built;
use safemlx_dist_tests::netns::{self, Network};

/// What Open MPI prints when its own connection setup fails on the
/// delayed links.
const MPI_SETUP_FAILURES: [&str; 2] = [
    "ORTE was unable to reliably start one or more daemons",
    "Operation now in progress",
];

/// Starts of an MPI run before its row says that none started.
const MPI_ATTEMPTS: usize = 4;

/// This process's CPU seconds so far (user + system), from `/proc`.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime: fields 14 and 15 of stat, 11 and 12 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

#[test]
#[ignore = "a benchmark: cargo xtask bench layouts runs it"]
fn layouts_across_links_delayed_2_ms() {
    let (Ok(model), Ok(out)) = (
        std::env::var("SAFEMLX_BENCH_MODEL"),
        std::env::var("SAFEMLX_BENCH_OUT"),
    ) else {
        panic!("set SAFEMLX_BENCH_MODEL and SAFEMLX_BENCH_OUT (cargo xtask bench layouts does)");
    };
    if let Some(why) = netns::unavailable() {
        println!("skipped: the test network cannot be built here: {why}");
        return;
    }
    let mut net = Network::new(2).expect("test network");
    for host in 0..2 {
        net.delay(host, Duration::from_millis(2)).expect("delay");
    }
    let round_trip = net.round_trip(0, 1).expect("round trip");
    let hosts = format!("{},{}", net.address(0), net.address(1));
    for backend in ["ring", "mpi"] {
        for mesh in ["pp=1,tp=2", "pp=2,tp=1"] {
            let mut attempts = 0;
            let mut before;
            let failed = loop {
                attempts += 1;
                // The delaying threads' CPU time of the last attempt.
                before = cpu_seconds();
                let run = net
                    .command(0, built("safemlx-launch"))
                    .args(["--hosts", &hosts, "-n", "2", "--backend", backend])
                    .args(["--starting-port", "40100"])
                    .arg("--ssh")
                    .arg(format!("ssh -F {}", net.ssh_config().display()))
                    .args(["--timeout", "1800", "--env", "OPENBLAS_NUM_THREADS=1", "--"])
                    .arg(built("examples/bench_generate"))
                    .args(["--model", &model, "--prompt-tokens", "128"])
                    .args(["--decode-tokens", "16", "--repeats", "2"])
                    .args(["--dequantize", "--mesh", mesh, "--prefill-chunk", "64"])
                    .args(["--backend", backend, "--link", "2ms"])
                    .args(["--out", &out])
                    .stdin(Stdio::null())
                    .output()
                    .expect("safemlx-launch runs");
                let text = safemlx_dist_tests::output_text(&run);
                if run.status.success() {
                    break None;
                }
                let setup = MPI_SETUP_FAILURES.iter().find(|m| text.contains(**m));
                match setup {
                    Some(why) if backend == "mpi" => {
                        eprintln!("{backend} {mesh}, attempt {attempts}: Open MPI: {why}");
                        if attempts == MPI_ATTEMPTS {
                            break Some(format!("Open MPI could not start ({why})"));
                        }
                    }
                    _ => panic!("{backend} {mesh}:\n{text}"),
                }
            };
            let line = serde_json::json!({
                "bench": "layouts-delay",
                "backend": backend,
                "mesh": mesh,
                "attempts": attempts,
                "failed": failed,
                "delay_threads_cpu_s": cpu_seconds() - before,
                "round_trip_ms": round_trip.as_secs_f64() * 1e3,
            });
            println!("{line}");
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(&out)
                .expect("the bench file");
            writeln!(file, "{line}").expect("writes the bench file");
        }
    }
}
