//! The rank agent: what `safemlx-launch --agent` runs on a remote host,
//! started over ssh by the launcher, to run one rank there and make sure it
//! never outlives the run.
//!
//! The launcher first writes the run's secret to each agent's ssh
//! connection (`preamble`), then a byte every second.
//! The agent starts the rank (in its own process group, its output going
//! straight back over ssh) and stops it (SIGTERM, SIGKILL 2 s later) when
//! the connection closes (the launcher stopped the run, or was killed), when
//! no byte came for [`SILENCE`] (the network is gone), or on SIGTERM,
//! SIGINT or SIGHUP. Its exit status is the rank's (128 + N after signal
//! N). The rank watches the agent as a local rank watches its launcher
//! ([`LAUNCHER_ENV`](super::LAUNCHER_ENV)), so killing the agent ends it
//! too.

use std::ffi::OsString;
use std::io::{BufRead, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::runtime::TOKEN_ENV;

/// The ring's host list, as JSON, for the agent to write where its rank
/// reads it (`MLX_HOSTFILE`).
pub const RING_HOSTS_ENV: &str = "SAFEMLX_LAUNCH_RING_HOSTS";
/// How often the launcher writes to each agent.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long an agent waits for the launcher's next byte before it stops
/// its rank, unless [`SILENCE_ENV`] says otherwise.
pub const SILENCE: Duration = Duration::from_secs(5);
/// Seconds an agent waits for the launcher's next byte (default 5): more
/// on a lossy network, as ssh's `ServerAliveCountMax` (give it with
/// `safemlx-launch --env`, which reaches the agent's environment).
pub const SILENCE_ENV: &str = "SAFEMLX_LAUNCH_AGENT_SILENCE";

/// [`SILENCE`], or [`SILENCE_ENV`]'s positive number of seconds.
fn silence() -> Duration {
    std::env::var(SILENCE_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0 && *s < 3.2e7)
        .map_or(SILENCE, Duration::from_secs_f64)
}
const POLL: Duration = Duration::from_millis(20);
const GRACE: Duration = Duration::from_secs(2);

fn say(host: &str, what: &str) {
    let _ = writeln!(std::io::stderr(), "safemlx-launch agent on {host}: {what}");
}

fn signal_group(pid: u32, signal: nix::sys::signal::Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), signal);
    }
}

/// The first line the launcher writes to an agent: the run's secret
/// (`token` and its bytes in hexadecimal), or an empty line without one.
/// It travels in the ssh connection, never on a command line.
pub(crate) fn preamble(secret: Option<&std::ffi::OsStr>) -> Vec<u8> {
    let mut line = Vec::new();
    if let Some(secret) = secret {
        line.extend_from_slice(b"token ");
        line.extend_from_slice(crate::runtime::hex(secret.as_encoded_bytes()).as_bytes());
    }
    line.push(b'\n');
    line
}

/// The secret in a [`preamble`] line, if it holds a well-formed one.
fn secret_from(line: &[u8]) -> Option<OsString> {
    let hex = line.strip_prefix(b"token ")?.strip_suffix(b"\n")?;
    let digits = std::str::from_utf8(hex).ok()?;
    let bytes = (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(digits.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    // The bytes came from an `OsStr` on a Unix launcher.
    Some(std::os::unix::ffi::OsStringExt::from_vec(bytes))
}

/// Runs `--agent [--host NAME] -- PROGRAM [ARGS...]` (the arguments after
/// `--agent`); returns the exit status.
pub fn run(args: &[OsString]) -> u8 {
    let mut host = String::from("this host");
    let mut rest = args;
    while let Some((first, tail)) = rest.split_first() {
        match first.to_str() {
            Some("--host") => {
                if let Some((name, tail)) = tail.split_first() {
                    host = name.to_string_lossy().into_owned();
                    rest = tail;
                    continue;
                }
                rest = tail;
            }
            Some("--") => {
                rest = tail;
                break;
            }
            _ => break,
        }
    }
    let Some((program, program_args)) = rest.split_first() else {
        say(
            &host,
            "no program given (usage: --agent [--host NAME] -- PROGRAM [ARGS...])",
        );
        return 2;
    };
    let hostfile = match std::env::var(RING_HOSTS_ENV) {
        Ok(json) => {
            let path = std::env::temp_dir()
                .join(format!("safemlx-launch-agent-{}.json", std::process::id()));
            if let Err(e) = std::fs::write(&path, json) {
                say(
                    &host,
                    &format!(
                        "cannot write the ring's host list to {}: {e}",
                        path.display()
                    ),
                );
                return 1;
            }
            Some(path)
        }
        Err(_) => None,
    };
    let status = supervise_rank(&host, program, program_args, hostfile.as_deref());
    if let Some(path) = hostfile {
        let _ = std::fs::remove_file(path);
    }
    status
}

fn supervise_rank(
    host: &str,
    program: &OsString,
    args: &[OsString],
    hostfile: Option<&std::path::Path>,
) -> u8 {
    let signal = Arc::new(AtomicUsize::new(0));
    for s in [
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ] {
        let _ = signal_hook::flag::register_usize(s, Arc::clone(&signal), s as usize);
    }
    // The launcher's bytes: the time of the last one, and whether the
    // connection closed; its first line, the preamble, is sent on `first`.
    let started = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let closed = Arc::new(AtomicBool::new(false));
    let (first, preamble) = std::sync::mpsc::channel();
    {
        let (last, closed) = (Arc::clone(&last), Arc::clone(&closed));
        std::thread::spawn(move || {
            let mut stdin = std::io::BufReader::new(std::io::stdin().lock());
            let mut line = Vec::new();
            if matches!(stdin.read_until(b'\n', &mut line), Ok(n) if n > 0) {
                // The preamble counts as the launcher's first sign of life.
                last.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                let _ = first.send(line);
                let mut byte = [0u8; 64];
                loop {
                    match stdin.read(&mut byte) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            last.store(started.elapsed().as_millis() as u64, Ordering::Relaxed)
                        }
                    }
                }
            }
            closed.store(true, Ordering::Relaxed);
        });
    }
    let silence = silence();
    let secret = match preamble.recv_timeout(silence) {
        Ok(line) => secret_from(&line),
        Err(_) => {
            say(host, "the launcher sent nothing; not starting the rank");
            return 3;
        }
    };
    let mut command = Command::new(program);
    command
        .args(args)
        .env_remove(RING_HOSTS_ENV)
        .env(super::LAUNCHER_ENV, crate::runtime::this_launcher())
        .stdin(Stdio::null())
        .process_group(0);
    if let Some(path) = hostfile {
        command.env("MLX_HOSTFILE", path);
    }
    if let Some(secret) = secret {
        command.env(TOKEN_ENV, secret);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            say(
                host,
                &format!("cannot start {}: {e}", program.to_string_lossy()),
            );
            return 127;
        }
    };
    let why = loop {
        if let Ok(Some(status)) = child.try_wait() {
            return match (status.code(), status.signal()) {
                (Some(code), _) => u8::try_from(code).unwrap_or(1),
                (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
                _ => 1,
            };
        }
        let got = signal.load(Ordering::Relaxed);
        if got != 0 {
            break format!("got signal {got}");
        }
        if closed.load(Ordering::Relaxed) {
            break "the launcher's connection closed".to_owned();
        }
        let quiet = started
            .elapsed()
            .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
        if quiet >= silence {
            break format!(
                "nothing from the launcher for {} s (the network to it is down?)",
                silence.as_secs_f64()
            );
        }
        std::thread::sleep(POLL);
    };
    say(host, &format!("{why}; stopping the rank"));
    signal_group(child.id(), nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + GRACE;
    while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
        std::thread::sleep(POLL);
    }
    if matches!(child.try_wait(), Ok(None)) {
        signal_group(child.id(), nix::sys::signal::Signal::SIGKILL);
    }
    let _ = child.wait();
    3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preamble_carries_any_secret_and_nothing_else_is_one() {
        let secret = std::ffi::OsStr::new("s3cret\nwith a newline");
        assert_eq!(
            secret_from(&preamble(Some(secret))).as_deref(),
            Some(secret)
        );
        assert_eq!(preamble(None), b"\n");
        assert_eq!(secret_from(b"\n"), None);
        assert_eq!(secret_from(b"token 4g\n"), None);
        assert_eq!(secret_from(b"token 414\n"), None);
        assert_eq!(secret_from(b"token 4142"), None);
    }
}
