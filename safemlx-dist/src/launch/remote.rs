//! Starting ranks on other hosts over ssh: the commands, and the checks
//! made before anything runs.

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::process::{Command, Stdio};

use super::LaunchError;

/// Options added to every ssh command (after the user's, which win): no
/// password prompts, a bounded connect, and a connection that counts as
/// lost after 3 s without an answer.
pub(crate) const SSH_OPTIONS: [&str; 8] = [
    "-o",
    "BatchMode=yes",
    "-o",
    "ConnectTimeout=5",
    "-o",
    "ServerAliveInterval=1",
    "-o",
    "ServerAliveCountMax=3",
];

/// `text` as one word of a POSIX shell command line.
pub(crate) fn quote(text: &OsStr) -> String {
    let text = text.to_string_lossy();
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// `ssh [user's words] [options] -- HOST COMMAND`.
pub(crate) fn ssh(ssh: &[OsString], host: &str, remote: &str) -> Command {
    let (program, words) = ssh
        .split_first()
        .map_or((OsStr::new("ssh"), &[][..]), |(p, w)| (p.as_os_str(), w));
    let mut command = Command::new(program);
    command
        .args(words)
        .args(SSH_OPTIONS)
        .arg("--")
        .arg(host)
        .arg(remote);
    command
}

/// The remote shell command of one rank: into the working directory, then
/// the agent with the rank's environment.
pub(crate) fn rank_command(
    cwd: &Path,
    env: &[(OsString, OsString)],
    launcher: &Path,
    host: &str,
    program: &Path,
    args: &[OsString],
) -> String {
    let mut words = vec![
        "cd".to_owned(),
        quote(cwd.as_os_str()),
        "&&".to_owned(),
        "exec".to_owned(),
        "env".to_owned(),
    ];
    for (key, value) in env {
        let mut pair = key.clone();
        pair.push("=");
        pair.push(value);
        words.push(quote(&pair));
    }
    words.push(quote(launcher.as_os_str()));
    words.extend([
        "--agent".to_owned(),
        "--host".to_owned(),
        quote(OsStr::new(host)),
        "--".to_owned(),
    ]);
    words.push(quote(program.as_os_str()));
    words.extend(args.iter().map(|a| quote(a)));
    words.join(" ")
}

/// Checks every host before a rank starts, all at once: ssh reaches it,
/// and the working directory, the program and the launcher are there.
///
/// # Errors
/// The first host (in order) that fails, with what ssh said.
pub(crate) fn probe(
    ssh_words: &[OsString],
    hosts: &[&str],
    cwd: &Path,
    program: &Path,
    launcher: &Path,
) -> Result<(), LaunchError> {
    let check = format!(
        "cd {} || exit 10; test -x {} || exit 11; test -x {} || exit 12",
        quote(cwd.as_os_str()),
        quote(program.as_os_str()),
        quote(launcher.as_os_str()),
    );
    let children: Vec<_> = hosts
        .iter()
        .map(|host| {
            let mut command = ssh(ssh_words, host, &check);
            command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            (host, command.spawn())
        })
        .collect();
    let mut first = None;
    for (host, child) in children {
        let failed = |reason: String| LaunchError::HostUnreachable {
            host: (*host).to_owned(),
            reason,
        };
        let result = match child {
            Err(e) => Err(failed(format!("cannot run ssh: {e}"))),
            Ok(child) => match child.wait_with_output() {
                Err(e) => Err(failed(format!("ssh did not finish: {e}"))),
                Ok(out) => {
                    let said = String::from_utf8_lossy(&out.stderr);
                    let said = said
                        .lines()
                        .rfind(|l| !l.trim().is_empty())
                        .unwrap_or("")
                        .trim()
                        .to_owned();
                    match out.status.code() {
                        Some(0) => Ok(()),
                        Some(10) => Err(LaunchError::MissingOnHost {
                            host: (*host).to_owned(),
                            what: format!("the working directory {}", cwd.display()),
                        }),
                        Some(11) => Err(LaunchError::MissingOnHost {
                            host: (*host).to_owned(),
                            what: format!(
                                "the program {} (ranks run the same path there)",
                                program.display()
                            ),
                        }),
                        Some(12) => Err(LaunchError::MissingOnHost {
                            host: (*host).to_owned(),
                            what: format!(
                                "safemlx-launch at {} (it runs each rank there)",
                                launcher.display()
                            ),
                        }),
                        _ => Err(failed(if said.is_empty() {
                            format!("ssh exited with {}", out.status)
                        } else if said.starts_with("ssh: ") {
                            said
                        } else {
                            format!("ssh: {said}")
                        })),
                    }
                }
            },
        };
        if let Err(e) = result {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_words_are_quoted_for_the_shell() {
        assert_eq!(quote(OsStr::new("a b")), "'a b'");
        assert_eq!(quote(OsStr::new("it's")), r"'it'\''s'");
        let command = rank_command(
            Path::new("/work/dir"),
            &[("MLX_RANK".into(), "1".into())],
            Path::new("/bin/safemlx-launch"),
            "10.0.0.2",
            Path::new("/bin/prog"),
            &["--x".into(), "$HOME".into()],
        );
        assert_eq!(
            command,
            "cd '/work/dir' && exec env 'MLX_RANK=1' '/bin/safemlx-launch' --agent --host '10.0.0.2' -- '/bin/prog' '--x' '$HOME'"
        );
    }
}
