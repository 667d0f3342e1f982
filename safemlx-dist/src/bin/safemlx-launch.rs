//! `safemlx-launch`: start N ranks of a program on this machine.
//!
//! ```text
//! safemlx-launch -n N [--backend ring|mpi] [--hostfile FILE] [--timeout SECONDS] [--] PROGRAM [ARGS...]
//! ```
//!
//! Exit status: 0 when every rank succeeded; 1 when a rank failed or the
//! timeout passed (the message names the ranks); 2 for bad arguments, in
//! which case nothing was started.

use std::process::ExitCode;
use std::time::Duration;

use safemlx_dist::launch::{Launch, LaunchError};
use safemlx_dist::Backend;

const USAGE: &str = "usage: safemlx-launch -n N [--backend ring|mpi] [--hostfile FILE] [--timeout SECONDS] [--] PROGRAM [ARGS...]";

fn parse(args: &[String]) -> Result<Launch, String> {
    let mut ranks = None;
    let mut backend = Backend::Ring;
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
                ranks = Some(
                    v.parse::<usize>()
                        .map_err(|_| format!("-n takes a number of ranks, got {v:?}"))?,
                );
            }
            "--backend" => {
                backend = value(arg)?
                    .parse()
                    .map_err(|e: safemlx_dist::Error| e.to_string())?
            }
            "--hostfile" => hostfile = Some(value(arg)?),
            "--timeout" => {
                let v = value(arg)?;
                let seconds = v
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0)
                    .ok_or_else(|| {
                        format!("--timeout takes a positive number of seconds, got {v:?}")
                    })?;
                timeout = Some(Duration::from_secs_f64(seconds));
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
        .backend(backend)
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
