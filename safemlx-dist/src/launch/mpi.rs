//! Running ranks under Open MPI's `mpirun`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::process::Command;

/// Where a multi-host MPI run puts its ranks.
pub(crate) struct Hosts {
    /// `(ssh destination, ranks on it)`, in rank order.
    pub slots: Vec<(String, usize)>,
    /// The ssh command mpirun starts its daemons with.
    pub ssh: Vec<OsString>,
    /// The program's absolute path (the same on every host).
    pub program: std::path::PathBuf,
}

/// Open MPI's base directory for its session directories.
pub(crate) const SESSION_BASE_ENV: &str = "OMPI_MCA_orte_tmpdir_base";

/// Open MPI's directory for its shared-memory transport's segments.
const SHM_DIR_ENV: &str = "OMPI_MCA_btl_vader_backing_directory";

/// Open MPI's setting that accepts a rank's exit before its finalize is
/// seen; a user's value is kept.
const EXIT_WITHOUT_SYNC_ENV: &str = "OMPI_MCA_orte_allowed_exit_without_sync";

/// `mpirun` flags: allowed as root, more ranks than cores allowed, and each
/// output line tagged `[1,K]<stdout>:` so it can be relabelled `[rank K] `;
/// with `hosts`, `--host a:3,b:2` (ranks in order) and mpirun's daemons
/// started with the same ssh command as ring ranks.
pub(crate) fn command(
    ranks: usize,
    env: &[(OsString, OsString)],
    program: &OsString,
    args: &[OsString],
    hosts: Option<&Hosts>,
) -> Command {
    let mut mpirun = Command::new("mpirun");
    // Not the variables of this process's own MPI singleton, if it has one:
    // an mpirun that inherits them exits 1 without a word.
    crate::runtime::restore_for_child(&mut mpirun);
    mpirun
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "--tag-output",
            "--bind-to",
            "none",
        ])
        .arg("-n")
        .arg(ranks.to_string());
    let mut program = program.clone();
    if let Some(hosts) = hosts {
        let list: Vec<String> = hosts
            .slots
            .iter()
            .map(|(h, n)| format!("{h}:{n}"))
            .collect();
        let mut agent: Vec<String> = hosts
            .ssh
            .iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect();
        agent.extend(super::remote::SSH_OPTIONS.map(str::to_owned));
        mpirun.args(["--host", &list.join(",")]).args([
            "--map-by",
            "slot",
            "--mca",
            "plm_rsh_agent",
            &agent.join(" "),
        ]);
        program = hosts.program.clone().into_os_string();
    } else if std::env::var_os(EXIT_WITHOUT_SYNC_ENV).is_none() {
        // Open MPI's daemon may see a rank's exit before that rank's
        // finalize (open-mpi/ompi#7833) and fail a run in which every rank
        // passed: 1 of 150 runs of 2 local ranks under load here, 0 of 400
        // with this setting. A rank's non-zero exit still ends the run.
        mpirun.args(["--mca", "orte_allowed_exit_without_sync", "1"]);
    }
    for (key, value) in env {
        mpirun.env(key, value).arg("-x").arg(key);
    }
    // Open MPI's session directory (its `ompi.HOST.UID` tree, shared-memory
    // backing files) inside the launch's own directory, which goes when the
    // launch ends, or when a rank finds its launcher gone; not in $TMPDIR,
    // where runs ended by a signal left them. Local runs only: a remote
    // host has no such directory. A base the user chose is kept.
    let progress = env
        .iter()
        .find(|(key, _)| key == crate::runtime::PROGRESS_DIR_ENV);
    if let (None, Some((_, dir))) = (hosts, progress) {
        if std::env::var_os(SESSION_BASE_ENV).is_none() {
            mpirun.env(SESSION_BASE_ENV, dir);
        }
        // Its shared-memory segments in a directory of this launch's, swept
        // with it when mpirun itself is killed (`contract::shm_dir_for`).
        let shm = crate::runtime::contract::shm_dir_for(std::path::Path::new(dir));
        if let Some(shm) = shm.filter(|d| d.is_dir()) {
            if std::env::var_os(SHM_DIR_ENV).is_none() {
                mpirun.env(SHM_DIR_ENV, shm);
            }
        }
    }
    // Each rank runs under a small shell wrapper that reports its own exit
    // status: mpirun's report of the failed rank is not always printed.
    mpirun
        .args(["sh", "-c", EXIT_REPORTER, "sh"])
        .arg(&program)
        .args(args);
    mpirun
}

/// Splits one line of `mpirun --tag-output` into its tagged pieces: a rank
/// that printed without a final newline shares its line with the next tag,
/// as in `[1,0]<stdout>:test x ... [1,1]<stdout>:more`. Untagged text (from
/// mpirun itself) comes back with `None`.
pub(crate) fn untag_all(line: &str) -> Vec<(Option<usize>, &str)> {
    let starts: Vec<usize> = line
        .match_indices('[')
        .map(|(i, _)| i)
        .filter(|&i| untag(&line[i..]).is_some())
        .collect();
    if starts.first() != Some(&0) {
        let end = starts.first().copied().unwrap_or(line.len());
        let mut pieces = vec![(None, &line[..end])];
        pieces.extend(tagged_pieces(line, &starts));
        return pieces;
    }
    tagged_pieces(line, &starts)
}

fn tagged_pieces<'a>(line: &'a str, starts: &[usize]) -> Vec<(Option<usize>, &'a str)> {
    starts
        .iter()
        .enumerate()
        .filter_map(|(k, &start)| {
            let end = starts.get(k + 1).copied().unwrap_or(line.len());
            untag(&line[start..end]).map(|(rank, text)| (Some(rank), text))
        })
        .collect()
}

/// Runs `"$@"` and prints [`EXIT_MARKER`] with the rank and the status on
/// stderr before exiting with that status: a failure names its rank, and a
/// rank that finished is known not to be running.
const EXIT_REPORTER: &str =
    r#""$@"; rc=$?; echo "safemlx-launch-exit $OMPI_COMM_WORLD_RANK $rc" >&2; exit "$rc""#;

/// The start of the wrapper's line.
pub(crate) const EXIT_MARKER: &str = "safemlx-launch-exit ";

/// `safemlx-launch-exit 1 3` -> `("", 1, 3)`: the text before the marker,
/// the rank and its exit status. The marker ends the line; it may follow
/// the rank's own last text when that had no newline (`done.safemlx-launch-exit 1 3`
/// -> `("done.", 1, 3)`), since the reassembler joins a rank's pieces.
pub(crate) fn reported_exit(text: &str) -> Option<(&str, usize, i32)> {
    let text = text.trim_end();
    let at = text.rfind(EXIT_MARKER)?;
    let (rank, status) = text[at + EXIT_MARKER.len()..].split_once(' ')?;
    Some((&text[..at], rank.parse().ok()?, status.trim().parse().ok()?))
}

/// An exit status as the ring launch words it: `exit code: 3`, or a status
/// above 128 as the signal the shell saw, `signal: 9 (SIGKILL)`.
pub(crate) fn exit_wording(status: i32) -> String {
    if status > 128 {
        let signal = status - 128;
        match nix::sys::signal::Signal::try_from(signal) {
            Ok(name) => format!("signal: {signal} ({name})"),
            Err(_) => format!("signal: {signal}"),
        }
    } else {
        format!("exit code: {status}")
    }
}

/// Puts the lines of one of mpirun's streams back together.
///
/// mpirun tags every chunk a rank writes, not every line: a line written
/// in three writes (`moe`, `: `, `8 experts ...\n`) arrives as three tagged
/// pieces, and pieces of other ranks may come between them. A piece that
/// another tag follows on the same line ended without a newline, so it is
/// held until the rest of its rank's line arrives.
#[derive(Debug, Default)]
pub(crate) struct Reassembler {
    pending: BTreeMap<usize, String>,
}

impl Reassembler {
    /// The whole lines completed by one line of mpirun's output: a rank
    /// (`None` for mpirun's own text) and its line.
    pub(crate) fn line(&mut self, line: &str) -> Vec<(Option<usize>, String)> {
        let pieces = untag_all(line);
        let last = pieces.len().saturating_sub(1);
        let mut whole = Vec::new();
        for (at, (rank, text)) in pieces.into_iter().enumerate() {
            match rank {
                Some(rank) if at < last => self.pending.entry(rank).or_default().push_str(text),
                Some(rank) => {
                    let mut line = self.pending.remove(&rank).unwrap_or_default();
                    line.push_str(text);
                    whole.push((Some(rank), line));
                }
                None => whole.push((None, text.to_owned())),
            }
        }
        whole
    }

    /// What is still held at the end of the stream (ranks whose last
    /// output had no newline).
    pub(crate) fn end(&mut self) -> Vec<(Option<usize>, String)> {
        std::mem::take(&mut self.pending)
            .into_iter()
            .map(|(rank, text)| (Some(rank), text))
            .collect()
    }
}

/// `[1,3]<stdout>:text` -> `(3, "text")`: a job number, a rank number and
/// one of Open MPI's three stream names, nothing else. A rank's own `[`
/// (`x = [1, 2]` written in two pieces, so that the next tag follows it)
/// is text, not a tag.
fn untag(line: &str) -> Option<(usize, &str)> {
    let rest = line.strip_prefix('[')?;
    let (job_and_rank, rest) = rest.split_once(']')?;
    let (job, rank) = job_and_rank.split_once(',')?;
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !number(job) || !number(rank) {
        return None;
    }
    let (stream, text) = rest.strip_prefix('<')?.split_once(">:")?;
    if !matches!(stream, "stdout" | "stderr" | "stddiag") {
        return None;
    }
    Some((rank.parse().ok()?, text))
}

/// The rank and exit code from mpirun's report of a failed process:
/// `Process name: [[28213,1],1]` followed by `Exit code: 3`.
pub(crate) fn failed_rank(report: &[String]) -> Option<(usize, String)> {
    let at = report
        .iter()
        .position(|l| l.trim_start().starts_with("Process name:"))?;
    let name = report[at].rsplit(',').next()?;
    let rank = name.trim_end_matches([']', ' ']).parse().ok()?;
    let how = report[at + 1..]
        .iter()
        .find_map(|l| {
            let l = l.trim();
            (l.starts_with("Exit code:") || l.starts_with("Signal:"))
                .then(|| l.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_else(|| String::from("failed"));
    Some((rank, how.to_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_and_reports_are_parsed() {
        assert_eq!(untag("[1,3]<stdout>:hello: x"), Some((3, "hello: x")));
        assert_eq!(untag("[1,0]<stderr>:"), Some((0, "")));
        assert_eq!(untag("plain line"), None);
        assert_eq!(
            untag_all("[1,0]<stdout>:test x ... [1,1]<stdout>:ok"),
            [(Some(0), "test x ... "), (Some(1), "ok")]
        );
        assert_eq!(
            untag_all("mpirun says [1] hi"),
            [(None, "mpirun says [1] hi")]
        );
        // A rank's own brackets are text, whatever follows them.
        assert_eq!(
            untag_all("[1,0]<stdout>:x = [[1,0]<stdout>:1, 2]"),
            [(Some(0), "x = ["), (Some(0), "1, 2]")]
        );
        assert_eq!(untag("[a,0]<stdout>:x"), None);
        assert_eq!(untag("[1,0]<other>:x"), None);
        assert_eq!(untag("[1,]<stdout>:x"), None);
        let report: Vec<String> = [
            "mpirun detected that one or more processes exited with non-zero status, thus causing",
            "the job to be terminated. The first process to do so was:",
            "",
            "  Process name: [[28213,1],1]",
            "  Exit code:    3",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(failed_rank(&report), Some((1, "exit code: 3".into())));
        assert_eq!(reported_exit("safemlx-launch-exit 2 3"), Some(("", 2, 3)));
        assert_eq!(reported_exit("safemlx-launch-exit 0 0 "), Some(("", 0, 0)));
        // The rank's last stderr text had no newline: the marker follows it.
        assert_eq!(
            reported_exit("error: no file safemlx-launch-exit 0 1"),
            Some(("error: no file ", 0, 1))
        );
        assert_eq!(reported_exit("safemlx-launch-exit 0 x"), None);
        assert_eq!(exit_wording(3), "exit code: 3");
        assert_eq!(exit_wording(137), "signal: 9 (SIGKILL)");
        assert_eq!(reported_exit("other text"), None);
    }

    #[test]
    fn lines_written_in_pieces_come_back_whole() {
        let mut lines = Reassembler::default();
        let whole = |rank: Option<usize>, text: &str| (rank, text.to_owned());
        assert_eq!(
            lines.line("[1,0]<stderr>:moe[1,1]<stderr>:rank one[1,0]<stderr>:: 8 experts"),
            [whole(Some(0), "moe: 8 experts")]
        );
        assert_eq!(
            lines.line("[1,1]<stderr>: is done"),
            [whole(Some(1), "rank one is done")]
        );
        assert_eq!(
            lines.line("mpirun noticed[1,2]<stdout>:no newline[1,3]<stdout>:x"),
            [whole(None, "mpirun noticed"), whole(Some(3), "x")]
        );
        assert_eq!(lines.end(), [whole(Some(2), "no newline")]);
        assert_eq!(lines.end(), []);
        // `printf "x = ["; sleep 0.2; printf "1, 2]\n"` on one rank.
        assert_eq!(
            lines.line("[1,0]<stdout>:x = [[1,0]<stdout>:1, 2]"),
            [whole(Some(0), "x = [1, 2]")]
        );
    }
}
