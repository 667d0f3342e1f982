//! Starting rank processes, forwarding their output line by line with a
//! prefix, and stopping all of them when one fails or time runs out.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::LaunchError;

/// How often running processes are polled.
const POLL: Duration = Duration::from_millis(20);
/// How long a process gets between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(2);

/// Which of our streams a child's stream goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sink {
    Stdout,
    Stderr,
}

/// Turns one output stream into the lines to print: called with each line
/// read (without its newline) and, with `None`, once at the stream's end.
pub(crate) type Lines = Box<dyn FnMut(Option<&str>) -> Vec<String> + Send>;

/// Makes the [`Lines`] of each output stream of process `label` (they add
/// the `[rank K] ` prefix).
pub(crate) type Relabel = Arc<dyn Fn(usize) -> Lines + Send + Sync>;

/// One supervised process: a rank, or `mpirun` standing for all ranks.
struct Supervised {
    label: usize,
    child: Child,
    status: Option<ExitStatus>,
}

/// How a supervised run ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Every process exited with status 0.
    Success,
    /// Process `label` failed first; the others were stopped.
    Failed { label: usize, status: ExitStatus },
    /// The timeout passed; these processes were still running.
    TimedOut { running: Vec<usize> },
    /// The launcher got this signal; every process was stopped.
    Interrupted { signal: i32 },
}

/// Set when this process's stdout is closed (its reader, such as `head`,
/// went away): the run then ends as `cat` would, with SIGPIPE's status.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// SIGPIPE's number, what a run whose stdout closed reports.
pub(crate) const SIGPIPE: i32 = 13;

fn forward(
    label: usize,
    stream: impl Read + Send + 'static,
    sink: Sink,
    relabel: Relabel,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut lines = relabel(label);
        let print = |lines: Vec<String>| {
            if lines.is_empty() {
                return;
            }
            let text = super::bytes_text::encode(&(lines.join("\n") + "\n"));
            match sink {
                Sink::Stdout if !STDOUT_CLOSED.load(Ordering::Relaxed) => {
                    let mut out = std::io::stdout().lock();
                    if out.write_all(&text).and_then(|()| out.flush()).is_err() {
                        STDOUT_CLOSED.store(true, Ordering::Relaxed);
                    }
                }
                // Closed: the rest is read (so no rank blocks) and dropped.
                Sink::Stdout => {}
                Sink::Stderr => {
                    let _ = std::io::stderr().lock().write_all(&text);
                }
            }
        };
        let mut reader = BufReader::new(stream);
        let mut raw = Vec::new();
        while matches!(reader.read_until(b'\n', &mut raw), Ok(n) if n > 0) {
            // Every byte kept, UTF-8 or not (see `bytes_text.rs`).
            let text = super::bytes_text::decode(&raw);
            print(lines(Some(text.trim_end_matches(['\n', '\r']))));
            raw.clear();
        }
        print(lines(None));
    })
}

/// Whether this process's stdout is a pipe whose reader went away
/// (`| head -c 1` had what it wanted): a rank that prints nothing more, or
/// streams tokens without a newline, would otherwise run on until its next
/// line met the closed pipe.
fn stdout_hung_up() -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let stdout = std::io::stdout();
    let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::empty())];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
        && fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP))
}

/// Sends `signal` to the process group led by `pid` (each child leads its own).
fn signal_group(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, "--", &format!("-{pid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Starts `commands` (label, command), each in its own process group with
/// piped output, and waits: for all to succeed, for the first failure (then
/// the rest are stopped), for `timeout` (then all are stopped), or for a
/// signal number to appear in `interrupt` (then all are stopped).
/// `watch` runs at every poll (with `None`) and once more, with the
/// outcome, before any process is signalled. Without `heartbeat`, the first process (rank 0, or mpirun)
/// reads the launcher's stdin and the others none. With `heartbeat`, each
/// process's stdin is a pipe that gets
/// those bytes first, then a byte every
/// [`agent::HEARTBEAT`](super::agent::HEARTBEAT) (what a remote rank's
/// agent waits for), and is closed when the run ends.
pub(crate) fn supervise(
    commands: Vec<(usize, Command)>,
    timeout: Option<Duration>,
    interrupt: &AtomicUsize,
    relabel: Relabel,
    watch: &mut dyn FnMut(Option<&Outcome>),
    heartbeat: Option<&[u8]>,
) -> Result<Outcome, LaunchError> {
    let started = Instant::now();
    let mut running = Vec::with_capacity(commands.len());
    let mut forwarders = Vec::new();
    let mut beats = Vec::new();
    let mut last_beat = Instant::now();
    for (label, mut command) in commands {
        command
            .stdin(if heartbeat.is_some() || label == 0 {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) => {
                stop(&mut running);
                return Err(LaunchError::Spawn {
                    rank: label,
                    reason: error.to_string(),
                });
            }
        };
        if let Some(out) = child.stdout.take() {
            forwarders.push(forward(label, out, Sink::Stdout, relabel.clone()));
        }
        if let Some(err) = child.stderr.take() {
            forwarders.push(forward(label, err, Sink::Stderr, relabel.clone()));
        }
        if heartbeat.is_none() {
            // Rank 0 (or mpirun, which passes it on to rank 0) reads what
            // the launcher reads: a terminal stays in the launcher's
            // foreground process group, where reading it does not stop.
            if let Some(mut stdin) = child.stdin.take() {
                let _ = std::thread::Builder::new()
                    .name("safemlx-launch-stdin".to_owned())
                    .spawn(move || std::io::copy(&mut std::io::stdin().lock(), &mut stdin));
            }
        }
        if let Some(mut stdin) = child.stdin.take() {
            // A pipe's first bytes fit its buffer: this does not block.
            let first = heartbeat.unwrap_or_default();
            beats.push(stdin.write_all(first).is_ok().then_some(stdin));
        }
        running.push(Supervised {
            label,
            child,
            status: None,
        });
    }

    let outcome = loop {
        watch(None);
        if !beats.is_empty() && last_beat.elapsed() >= super::agent::HEARTBEAT {
            last_beat = Instant::now();
            for beat in beats.iter_mut() {
                // A process that is gone gives EPIPE: stop writing to it.
                if beat.as_mut().is_some_and(|b| b.write_all(b"\n").is_err()) {
                    *beat = None;
                }
            }
        }
        let mut failed = None;
        for process in running.iter_mut().filter(|p| p.status.is_none()) {
            if let Ok(Some(status)) = process.child.try_wait() {
                process.status = Some(status);
                if !status.success() && failed.is_none() {
                    failed = Some((process.label, status));
                }
            }
        }
        if let Some((label, status)) = failed {
            break Outcome::Failed { label, status };
        }
        if stdout_hung_up() {
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
        }
        let mut signal = interrupt.load(Ordering::Relaxed);
        if signal == 0 && STDOUT_CLOSED.load(Ordering::Relaxed) {
            signal = SIGPIPE as usize;
        }
        if signal != 0 {
            break Outcome::Interrupted {
                signal: i32::try_from(signal).unwrap_or(0),
            };
        }
        if running.iter().all(|p| p.status.is_some()) {
            break Outcome::Success;
        }
        if timeout.is_some_and(|t| started.elapsed() >= t) {
            let still = running
                .iter()
                .filter(|p| p.status.is_none())
                .map(|p| p.label)
                .collect();
            break Outcome::TimedOut { running: still };
        }
        std::thread::sleep(POLL);
    };
    // Once more before any signal, with the outcome: stopping a run can
    // wake a stopped rank (mpirun sends SIGCONT first), which would then
    // move on; and the ranks may be told why they are stopped.
    watch(Some(&outcome));
    drop(beats);
    stop(&mut running);
    for forwarder in forwarders {
        let _ = forwarder.join();
    }
    // The ranks may have finished before their last line met the closed pipe.
    if matches!(outcome, Outcome::Success) && STDOUT_CLOSED.load(Ordering::Relaxed) {
        return Ok(Outcome::Interrupted { signal: SIGPIPE });
    }
    Ok(outcome)
}

/// Stops every process still running: SIGTERM to its group, then SIGKILL
/// after [`GRACE`]; reaps all of them.
fn stop(processes: &mut [Supervised]) {
    let alive: Vec<u32> = processes
        .iter_mut()
        .filter_map(|p| {
            let running = p.status.is_none() && matches!(p.child.try_wait(), Ok(None));
            running.then(|| p.child.id())
        })
        .collect();
    for pid in &alive {
        signal_group(*pid, "-TERM");
    }
    let deadline = Instant::now() + GRACE;
    while Instant::now() < deadline
        && processes
            .iter_mut()
            .any(|p| p.status.is_none() && matches!(p.child.try_wait(), Ok(None)))
    {
        std::thread::sleep(POLL);
    }
    for process in processes.iter_mut() {
        if matches!(process.child.try_wait(), Ok(None)) {
            signal_group(process.child.id(), "-KILL");
            let _ = process.child.kill();
        }
        if process.status.is_none() {
            process.status = process.child.wait().ok();
        }
    }
}
