//! `cargo xtask faults [TRIALS]`: kills the launcher at random times and
//! checks that nothing of its run survives it.
//!
//! Each trial starts `safemlx-launch -n 2` of the `bench_layers` example
//! (tensor-parallel MLP steps: collectives and OpenBLAS threads busy, as in
//! a real run), waits a random 0-3 s (start-up included), sends SIGKILL or
//! SIGTERM to the launcher, and watches every process that inherited the
//! trial's marker variable (ranks, and under MPI `mpirun` and the wrapper
//! shells) until all are gone, for at most 5 s. It also checks that the
//! launcher's temporary files are removed (by the launcher or its ranks;
//! a launcher killed before any rank started leaves them to the next
//! launch, which the trial then runs). One JSON line per trial goes to
//! `target/bench/faults.jsonl`, and a table per backend and signal to
//! stdout; any trial that leaves something behind fails the command.
//!
//! Then the cases of `faults_cases.rs` (a rank stopped mid-decode, two
//! runs on the same ports, non-UTF-8 arguments, a closed stdout), TRIALS/10
//! times each (at least once), into the same file.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::{cmd, setup, tasks};

/// The variable every process of a trial inherits.
pub(crate) const MARKER: &str = "SAFEMLX_FAULT_TRIAL";
/// How long the run's processes may outlive the launcher.
const BOUND: Duration = Duration::from_secs(5);

pub fn run(args: &[String]) -> Result<(), String> {
    let trials: usize = match args.first() {
        Some(n) => n
            .parse()
            .map_err(|_| format!("TRIALS must be a count, not {n:?}"))?,
        None => 30,
    };
    setup::run()?;
    let release = tasks::build_examples_and_launcher()?;
    let out_dir = cmd::target_dir().join("bench");
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    let out = out_dir.join("faults.jsonl");
    let mut lines = String::new();
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    println!("faults: {trials} trials per backend and signal (seed {seed})");
    let mut failures = Vec::new();
    for backend in ["ring", "mpi"] {
        for signal in ["KILL", "TERM"] {
            let mut clean = 0;
            let mut slowest = 0.0f64;
            for trial in 0..trials {
                let delay = Duration::from_millis(next(&mut seed) % 3000);
                let id = format!("{backend}-{signal}-{trial}-{}", std::process::id());
                let result = one_trial(&release, backend, signal, delay, &id)?;
                println!(
                    "  {backend} SIG{signal} #{trial}: after {:.2} s, {}",
                    delay.as_secs_f64(),
                    result.describe()
                );
                if result.left.is_empty() && result.files.is_empty() {
                    clean += 1;
                    slowest = slowest.max(result.seconds);
                } else {
                    failures.push(format!(
                        "{backend} SIG{signal} #{trial}: {}",
                        result.describe()
                    ));
                }
                let line = json!({
                    "backend": backend,
                    "signal": format!("SIG{signal}"),
                    "trial": trial,
                    "delay_s": delay.as_secs_f64(),
                    "exit": result.exit,
                    "clean": result.left.is_empty() && result.files.is_empty(),
                    "seconds_to_clean": result.seconds,
                    "left": result.left,
                    "files_left": result.files,
                    "files_removed_by_next_launch": result.swept,
                });
                lines.push_str(&line.to_string());
                lines.push('\n');
            }
            println!(
                "{backend} SIG{signal}: {clean}/{trials} clean, slowest {slowest:.2} s after the launcher exited"
            );
        }
    }
    let case_trials = (trials / 10).max(1);
    println!("faults: the other cases, {case_trials} times each");
    let smollm2 = crate::models::fetch_smollm2()?;
    for case in crate::faults_cases::run(&release, &smollm2, case_trials, &mut seed) {
        lines.push_str(&case.line.to_string());
        lines.push('\n');
        failures.extend(case.failure.map(|f| format!("{}: {f}", case.line["case"])));
    }
    std::fs::write(&out, lines).map_err(|e| format!("{}: {e}", out.display()))?;
    println!("faults: wrote {}", out.display());
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("faults not handled: {}", failures.join("; ")))
    }
}

/// What one trial left.
struct Trial {
    /// The launcher's exit status (`None`: killed).
    exit: Option<i32>,
    /// Seconds from the launcher's end until the last process was gone.
    seconds: f64,
    /// Processes still alive after [`BOUND`]: `pid (name)`.
    left: Vec<String>,
    /// Temporary files of the launcher still there.
    files: Vec<String>,
    /// Whether the next launch removed files the launcher left.
    swept: bool,
}

impl Trial {
    fn describe(&self) -> String {
        let exit = self
            .exit
            .map_or_else(|| "killed".to_owned(), |c| format!("exit {c}"));
        if self.left.is_empty() && self.files.is_empty() {
            let swept = if self.swept {
                " (its files: by the next launch)"
            } else {
                ""
            };
            format!("{exit}, clean {:.2} s later{swept}", self.seconds)
        } else {
            format!(
                "{exit}, left running: [{}], files: [{}]",
                self.left.join(", "),
                self.files.join(", ")
            )
        }
    }
}

fn one_trial(
    release: &std::path::Path,
    backend: &str,
    signal: &str,
    delay: Duration,
    id: &str,
) -> Result<Trial, String> {
    let mut launcher = Command::new(release.join("safemlx-launch"));
    launcher
        .args(["-n", "2", "--backend", backend, "--"])
        .arg(release.join("examples/bench_layers"))
        .args(["--layer", "mlp", "--tokens", "256", "--d-model", "512"])
        .args([
            "--hidden",
            "2048",
            "--iters",
            "100000",
            "--backend",
            backend,
        ])
        .env(MARKER, id)
        .env("OPENBLAS_NUM_THREADS", "2")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut launcher = launcher
        .spawn()
        .map_err(|e| format!("cannot start safemlx-launch: {e}"))?;
    let pid = launcher.id();
    std::thread::sleep(delay);
    let files = |pid: u32| -> Vec<String> {
        let prefix = format!("safemlx-launch-{pid}-");
        std::fs::read_dir(std::env::temp_dir())
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.starts_with(&prefix))
                    .collect()
            })
            .unwrap_or_default()
    };
    let killed = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .map_err(|e| format!("cannot run kill: {e}"))?;
    if !killed.success() {
        return Err(format!("kill -{signal} {pid} failed ({killed})"));
    }
    let status = launcher
        .wait()
        .map_err(|e| format!("cannot reap the launcher: {e}"))?;
    let ended = Instant::now();
    let mut alive = marked(id);
    while !alive.is_empty() && ended.elapsed() < BOUND {
        std::thread::sleep(Duration::from_millis(20));
        alive = marked(id);
    }
    let seconds = ended.elapsed().as_secs_f64();
    // A launcher killed before any rank started leaves its files to the
    // next launch, which removes those of launchers that are gone.
    let mut swept = false;
    if alive.is_empty() && !files(pid).is_empty() {
        let next = Command::new(release.join("safemlx-launch"))
            .args(["-n", "1", "--", "true"])
            .status()
            .map_err(|e| format!("cannot start safemlx-launch: {e}"))?;
        swept = next.success() && files(pid).is_empty();
    }
    Ok(Trial {
        exit: status.code(),
        seconds,
        swept,
        left: alive
            .into_iter()
            .map(|(pid, name)| format!("{pid} ({name})"))
            .collect(),
        files: files(pid),
    })
}

/// Live (not zombie) processes whose environment holds `MARKER=id`.
pub(crate) fn marked(id: &str) -> BTreeMap<u32, String> {
    let wanted = format!("{MARKER}={id}");
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return BTreeMap::new();
    };
    procs
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            if !environ
                .split(|b| *b == 0)
                .any(|var| var == wanted.as_bytes())
            {
                return None;
            }
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (name, rest) = stat.split_once(" (")?.1.rsplit_once(')')?;
            (!rest.trim_start().starts_with('Z')).then(|| (pid, name.to_owned()))
        })
        .collect()
}

/// xorshift64: the trials' random delays.
pub(crate) fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}
