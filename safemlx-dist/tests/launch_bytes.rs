//! `safemlx-launch` with arguments and output that are not UTF-8, and with a stdout
//! that closes early (`| head -c 1`), on ring and MPI.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn launcher() -> Command {
    Command::new(env!("CARGO_BIN_EXE_safemlx-launch"))
}

fn bytes(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

#[test]
fn arguments_that_are_not_utf8_are_passed_on_as_they_are() {
    for backend in ["ring", "mpi"] {
        let out = launcher()
            .args(["-n", "2", "--backend", backend, "--env"])
            .arg(bytes(b"ODD=\xff"))
            .args([
                "--",
                "sh",
                "-c",
                r#"printf '%s|%s\n' "$1" "$ODD" | od -An -tx1"#,
            ])
            .arg("sh")
            .arg(bytes(b"\xfe"))
            .output()
            .expect("safemlx-launch runs");
        let (text, err) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{backend}: {err}");
        for rank in 0..2 {
            // The argument's byte, `|`, the variable's byte, a newline.
            assert!(
                text.contains(&format!("[rank {rank}]  fe 7c ff 0a")),
                "{backend}: {text}"
            );
        }
    }
    // A program or a hostfile whose name is not UTF-8: a clear error.
    let out = launcher()
        .args(["-n", "2", "--"])
        .arg(bytes(b"/nonexistent-\xff"))
        .output()
        .expect("safemlx-launch runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with(r#"safemlx-launch: program "/nonexistent-\xFF" was not found (give a path or a name on PATH)"#),
        "{err}"
    );
    let out = launcher()
        .args(["-n", "2", "--hostfile"])
        .arg(bytes(b"/nonexistent-\xff.json"))
        .args(["--", "true"])
        .output()
        .expect("safemlx-launch runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with(
            r#"safemlx-launch: bad hostfile "/nonexistent-\xFF.json": cannot read it: No such file or directory (os error 2)"#
        ),
        "{err}"
    );
    // An option's value must be text: named, exit 2, nothing started.
    let out = launcher()
        .args(["-n"])
        .arg(bytes(b"\xff"))
        .args(["--", "true"])
        .output()
        .expect("safemlx-launch runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("safemlx-launch: -n takes text, got \"\\xFF\", which is not UTF-8"),
        "{err}"
    );
}

fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// Reads one byte of the launcher's stdout and closes it, as `head -c 1`
/// does; the launcher's exit status, which must come within `bound`.
fn read_a_byte_and_close(
    child: &mut std::process::Child,
    bound: Duration,
    backend: &str,
) -> std::process::ExitStatus {
    let mut out = child.stdout.take().expect("stdout");
    let mut first = [0u8; 1];
    out.read_exact(&mut first).expect("a byte of output");
    drop(out);
    let closed = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("waits") {
            return status;
        }
        if closed.elapsed() > bound {
            let _ = child.kill();
            panic!("{backend}: the launcher kept running {bound:?} after its stdout closed");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_closed_stdout_stops_the_ranks_quietly_with_sigpipes_status() {
    for backend in ["ring", "mpi"] {
        let mut child = launcher()
            .args(["-n", "2", "--backend", backend, "--", "sh", "-c"])
            .arg("echo pid $$ >&2; while :; do echo line; sleep 0.01; done")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("safemlx-launch runs");
        // `head -c 1` has what it wanted and goes away.
        let status = read_a_byte_and_close(&mut child, Duration::from_secs(20), backend);
        let mut err = String::new();
        child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut err)
            .expect("stderr");
        assert_eq!(status.code(), Some(141), "{backend}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("safemlx-launch:"),
            "{backend}: not quiet: {err}"
        );
        let pids: Vec<u32> = err
            .lines()
            .filter_map(|l| l.split("pid ").nth(1)?.trim().parse().ok())
            .collect();
        assert_eq!(pids.len(), 2, "{backend}: {err}");
        assert!(
            pids.iter().all(|&p| gone(p)),
            "{backend}: ranks {pids:?} left running"
        );
    }
}

#[test]
fn output_that_is_not_utf8_comes_through_byte_for_byte() {
    for backend in ["ring", "mpi"] {
        let out = launcher()
            .args(["-n", "2", "--backend", backend, "--", "sh", "-c"])
            .arg(r#"printf 'caf\377\376 \364\217\275\201\n'; printf 'err\377\n' >&2"#)
            .output()
            .expect("safemlx-launch runs");
        assert!(out.status.success(), "{backend}: {out:?}");
        // Rank `rank`'s line, prefixed, byte for byte in `stream`.
        let has = |stream: &[u8], rank: usize, text: &str, raw: &[u8]| {
            let line = [format!("[rank {rank}] {text}").into_bytes(), raw.to_vec()].concat();
            assert!(
                stream.windows(line.len()).any(|w| w == line),
                "{backend}: {:?}",
                String::from_utf8_lossy(stream)
            );
        };
        for rank in 0..2 {
            has(&out.stdout, rank, "caf", b"\xff\xfe \xf4\x8f\xbd\x81\n");
            has(&out.stderr, rank, "err", b"\xff\n");
        }
    }
}

#[test]
fn a_stdout_closed_while_ranks_print_nothing_ends_the_run_at_once() {
    // `| head -c 1` after the first line; the rank would print its next
    // line only after ten minutes (or never: tokens without a newline).
    for backend in ["ring", "mpi"] {
        let mut child = launcher()
            .args(["-n", "1", "--backend", backend, "--", "sh", "-c"])
            .arg("echo hi; sleep 600; echo bye")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("safemlx-launch runs");
        let status = read_a_byte_and_close(&mut child, Duration::from_secs(120), backend);
        assert_eq!(status.code(), Some(141), "{backend}");
    }
}

#[test]
fn text_written_in_pieces_comes_through_as_written() {
    // A `[` of the rank's own, then more text after a pause: MPI tags the
    // second piece, and the first must not be taken for a tag.
    for backend in ["ring", "mpi"] {
        let out = launcher()
            .args(["-n", "1", "--backend", backend, "--", "sh", "-c"])
            .arg(r#"printf "x = ["; sleep 0.2; printf "1, 2]\n"; printf "[9] ["; sleep 0.2; printf "[1,0]\n""#)
            .output()
            .expect("safemlx-launch runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{backend}: {out:?}");
        assert_eq!(
            text, "[rank 0] x = [1, 2]\n[rank 0] [9] [[1,0]\n",
            "{backend}"
        );
    }
}

#[test]
fn a_failed_mpi_rank_s_exit_report_is_never_printed() {
    // The rank's last stderr text has no newline: the wrapper's report
    // follows it on the same line.
    let out = launcher()
        .args(["-n", "2", "--backend", "mpi", "--", "sh", "-c"])
        .arg(r#"printf "last words" >&2; exit 3"#)
        .output()
        .expect("safemlx-launch runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("safemlx-launch-exit"), "{err}");
    assert!(
        err.contains("[rank 0] last words") || err.contains("[rank 1] last words"),
        "{err}"
    );
    assert!(err.contains("failed (exit code: 3)"), "{err}");
}
