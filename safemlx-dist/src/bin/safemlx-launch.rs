//! `safemlx-launch`: start N ranks of a program on this machine.
//!
//! ```text
//! safemlx-launch -n N [--backend ring|mpi] [--hostfile FILE] [--timeout SECONDS] [--] PROGRAM [ARGS...]
//! ```
//!
//! Exit status: 0 when every rank succeeded; 1 when a rank failed or the
//! timeout passed (the message names the ranks); 2 for bad arguments, in
//! which case nothing was started; 128 + N after signal N (SIGTERM,
//! SIGINT), which is forwarded to every rank before the launcher exits.

use std::process::ExitCode;
use std::time::Duration;

use safemlx_dist::launch::{Launch, LaunchError};
use safemlx_dist::Backend;

/// The longest `--timeout` accepted: a year.
const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

const USAGE: &str = "usage: safemlx-launch -n N [--backend ring|mpi] [--hostfile FILE] [--timeout SECONDS] [--] PROGRAM [ARGS...]";

/// Keeps the first value of an option; a second one is an error (the
/// user meant one of them, and silently taking the last hides which).
fn once<T>(slot: &mut Option<T>, flag: &str, value: T) -> Result<(), String> {
    if slot.is_some() {
        return Err(format!("{flag} is given twice; give it once"));
    }
    *slot = Some(value);
    Ok(())
}

fn parse(args: &[String]) -> Result<Launch, String> {
    let mut ranks = None;
    let mut backend = None;
    let mut hostfile = None;
    let mut timeout = None;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        let mut value = |flag: &str| {
            i += 1;
            args.get(i)
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match arg {
            "-n" | "--ranks" => {
                let v = value(arg)?;
                let n = v
                    .parse::<usize>()
                    .map_err(|_| format!("-n takes a number of ranks, got {v:?}"))?;
                once(&mut ranks, "-n", n)?;
            }
            "--backend" => {
                let b: Backend = value(arg)?
                    .parse()
                    .map_err(|e: safemlx_dist::Error| e.to_string())?;
                once(&mut backend, "--backend", b)?;
            }
            "--hostfile" => {
                let path = value(arg)?;
                once(&mut hostfile, "--hostfile", path)?;
            }
            "--timeout" => {
                let v = value(arg)?;
                let t = v
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0)
                    .ok_or_else(|| {
                        format!("--timeout takes a positive number of seconds, got {v:?}")
                    })?;
                let t = Duration::try_from_secs_f64(t)
                    .ok()
                    .filter(|d| *d <= MAX_TIMEOUT)
                    .ok_or_else(|| {
                        format!(
                            "--timeout {v} is longer than the {} s (one year) a run may be given; leave --timeout out for no limit",
                            MAX_TIMEOUT.as_secs()
                        )
                    })?;
                once(&mut timeout, "--timeout", t)?;
            }
            "-h" | "--help" => return Err(String::new()),
            "--" => {
                i += 1;
                break;
            }
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag:?}")),
            _ => break,
        }
        i += 1;
    }
    let ranks = ranks.ok_or("-n N is required")?;
    let (program, program_args) = args[i..].split_first().ok_or("no PROGRAM given")?;
    let mut launch = Launch::new(ranks, program)
        .backend(backend.unwrap_or(Backend::Ring))
        .forward_signals(true)
        .args(program_args);
    if let Some(path) = hostfile {
        launch = launch.hostfile(path);
    }
    if let Some(t) = timeout {
        launch = launch.timeout(t);
    }
    Ok(launch)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let launch = match parse(&args) {
        Ok(launch) => launch,
        Err(message) if message.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("safemlx-launch: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match launch.run() {
        Ok(_) => ExitCode::SUCCESS,
        Err(error @ LaunchError::Interrupted { signal, .. }) => {
            eprintln!("safemlx-launch: {error}");
            ExitCode::from(u8::try_from(128 + signal).unwrap_or(1))
        }
        Err(error) => {
            eprintln!("safemlx-launch: {error}");
            let started = matches!(
                error,
                LaunchError::RankFailed { .. }
                    | LaunchError::MpirunFailed { .. }
                    | LaunchError::TimedOut { .. }
                    | LaunchError::Spawn { .. }
            );
            ExitCode::from(if started { 1 } else { 2 })
        }
    }
}
