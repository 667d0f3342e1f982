//! `safemlx-launch`: start N ranks of a program on this machine, or on
//! other hosts over ssh.
//!
//! ```text
//! safemlx-launch [-n N] [--backend ring|mpi] [--hosts H1,H2,... | --hostfile FILE]
//!                [--env KEY=VALUE]... [--ssh "ssh -F CONFIG"] [--starting-port P]
//!                [--timeout SECONDS] [--] PROGRAM [ARGS...]
//! ```
//!
//! Without hosts, `-n` ranks run here. With `--hosts` or an `mlx.launch`
//! JSON hostfile, `-n` ranks (default: one per host) are spread over the
//! hosts and started with ssh; output lines are prefixed
//! `[rank K host H] `. (`safemlx-launch --agent ...` is what runs each
//! remote rank; it is not for direct use.)
//!
//! Exit status: 0 when every rank succeeded; 1 when a rank failed or the
//! timeout passed (the message names the ranks); 2 for bad arguments, in
//! which case nothing was started; 128 + N after signal N (SIGTERM,
//! SIGINT), which is forwarded to every rank before the launcher exits;
//! 141 (SIGPIPE's) when its stdout closed (`| head`), after stopping the
//! ranks, quietly as `cat` does. The program, its arguments, `--env`
//! values and `--hostfile` paths may be any bytes; they are passed on as
//! they are.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;
use std::time::Duration;

use safemlx_dist::launch::{parse_env, read_hostfile, HostList, Hostfile, Launch, LaunchError};
use safemlx_dist::Backend;

/// The longest `--timeout` accepted: a year.
const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

const USAGE: &str = "usage: safemlx-launch [-n N] [--backend ring|mpi] [--hosts H1,H2,... | --hostfile FILE] [--env KEY=VALUE]... [--ssh COMMAND] [--starting-port P] [--timeout SECONDS] [--] PROGRAM [ARGS...]";

/// Keeps the first value of an option; a second one is an error (the
/// user meant one of them, and silently taking the last hides which).
fn once<T>(slot: &mut Option<T>, flag: &str, value: T) -> Result<(), String> {
    if slot.is_some() {
        return Err(format!("{flag} is given twice; give it once"));
    }
    *slot = Some(value);
    Ok(())
}

/// An option's value as text: the options themselves are text, while the
/// program, its arguments, `--env` values and `--hostfile` paths may be
/// any bytes (they are passed on as they are).
fn text(flag: &str, value: &OsStr) -> Result<String, String> {
    value
        .to_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{flag} takes text, got {value:?}, which is not UTF-8"))
}

/// `--env KEY=VALUE`: the key is a variable name, the value any bytes.
fn env_entry(entry: &OsStr) -> Result<(String, OsString), String> {
    if let Some(entry) = entry.to_str() {
        let (key, value) = parse_env(entry).map_err(|e| format!("--env {e}"))?;
        return Ok((key, value.into()));
    }
    let bytes = entry.as_bytes();
    let Some(at) = bytes.iter().position(|&b| b == b'=') else {
        return Err(format!("--env {entry:?} is not KEY=VALUE"));
    };
    let key = text("--env", OsStr::from_bytes(&bytes[..at]))?;
    // The key's rules are parse_env's; the value is passed on as it is.
    let (key, _) = parse_env(&format!("{key}=")).map_err(|e| format!("--env {e}"))?;
    Ok((key, OsStr::from_bytes(&bytes[at + 1..]).to_owned()))
}

fn parse(args: &[OsString]) -> Result<Launch, String> {
    let mut ranks = None;
    let mut backend = None;
    let mut hostfile = None;
    let mut hosts = None;
    let mut envs = Vec::new();
    let mut ssh = None;
    let mut port = None;
    let mut timeout = None;
    let mut i = 0;
    while i < args.len() {
        // A word that is not text is no option: the program.
        let Some(arg) = args[i].to_str() else { break };
        let mut raw = |flag: &str| {
            i += 1;
            args.get(i)
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let mut value = |flag: &str| text(flag, &raw(flag)?);
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
                let path = std::path::PathBuf::from(raw(arg)?);
                once(&mut hostfile, "--hostfile", path)?;
            }
            "--hosts" => {
                let list = value(arg)?;
                once(&mut hosts, "--hosts", list)?;
            }
            "--env" => envs.push(env_entry(&raw(arg)?)?),
            "--ssh" => {
                let words: Vec<String> =
                    value(arg)?.split_whitespace().map(str::to_owned).collect();
                if words.is_empty() {
                    return Err(
                        "--ssh needs a command, e.g. --ssh \"ssh -F ./ssh_config\"".to_owned()
                    );
                }
                once(&mut ssh, "--ssh", words)?;
            }
            "--starting-port" | "-p" => {
                let v = value(arg)?;
                let p = v.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                    format!("--starting-port takes a port from 1 to 65535, got {v:?}")
                })?;
                once(&mut port, "--starting-port", p)?;
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
    let (program, program_args) = args[i..].split_first().ok_or("no PROGRAM given")?;
    let mut list = match hosts {
        Some(list) => Some(HostList::from_list(&list)?),
        None => None,
    };
    let mut ring_hostfile = None;
    if let Some(path) = hostfile {
        match read_hostfile(&path).map_err(|e| e.to_string())? {
            Hostfile::Ring => ring_hostfile = Some(path),
            Hostfile::Hosts(_) if list.is_some() => {
                return Err("give --hosts or an mlx.launch --hostfile, not both".to_owned())
            }
            Hostfile::Hosts(file) => list = Some(file),
        }
    }
    if list.is_none() {
        for (given, flag) in [
            (ssh.is_some(), "--ssh"),
            (port.is_some(), "--starting-port"),
        ] {
            if given {
                return Err(format!(
                    "{flag} is for ranks on other hosts: give --hosts or an mlx.launch --hostfile, or leave {flag} out"
                ));
            }
        }
    }
    let ranks = match (ranks, &list) {
        (Some(n), _) => n,
        (None, Some(list)) => list.hosts.len(),
        (None, None) => {
            return Err("-n N is required (or --hosts, for one rank per host)".to_owned())
        }
    };
    let backend = backend
        .or_else(|| list.as_ref().and_then(|l| l.backend))
        .unwrap_or(Backend::Ring);
    let mut launch = Launch::new(ranks, program)
        .backend(backend)
        .forward_signals(true)
        .args(program_args);
    if let Some(path) = ring_hostfile {
        launch = launch.hostfile(path);
    }
    if let Some(list) = list {
        for (key, value) in &list.envs {
            launch = launch.env(key, value);
        }
        launch = launch.hosts(list);
    }
    for (key, value) in envs {
        launch = launch.env(key, value);
    }
    if let Some(words) = ssh {
        launch = launch.ssh_command(words);
    }
    if let Some(port) = port {
        launch = launch.starting_port(port);
    }
    if let Some(t) = timeout {
        launch = launch.timeout(t);
    }
    Ok(launch)
}

fn main() -> ExitCode {
    let raw: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if raw.first().is_some_and(|a| a == "--agent") {
        return ExitCode::from(safemlx_dist::launch::agent::run(&raw[1..]));
    }
    let launch = match parse(&raw) {
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
        // Stdout closed (`| head`): quiet, as `cat`, with SIGPIPE's status.
        Err(LaunchError::Interrupted { signal: 13, .. }) => ExitCode::from(141),
        Err(error @ LaunchError::Interrupted { signal, .. }) => {
            eprintln!("safemlx-launch: {error}");
            ExitCode::from(u8::try_from(128 + signal).unwrap_or(1))
        }
        Err(error) => {
            eprintln!("safemlx-launch: {error}");
            let started = matches!(
                error,
                LaunchError::RankFailed { .. }
                    | LaunchError::HostLost { .. }
                    | LaunchError::MpirunFailed { .. }
                    | LaunchError::TimedOut { .. }
                    | LaunchError::Spawn { .. }
            );
            ExitCode::from(if started { 1 } else { 2 })
        }
    }
}
