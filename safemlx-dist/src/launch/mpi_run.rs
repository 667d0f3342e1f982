//! MPI ranks: one `mpirun` started and supervised for all of them, its
//! output relabelled per rank and its exit reports read.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use super::supervise::{supervise, Outcome, Relabel};
use super::{interrupted, mpi, Launch, LaunchError, LaunchReport, Remote};

impl Launch {
    pub(super) fn run_mpi(
        &self,
        env: Vec<(OsString, OsString)>,
        remote: Option<&Remote>,
        interrupt: &AtomicUsize,
        watch: &mut dyn FnMut(Option<&Outcome>),
    ) -> Result<LaunchReport, LaunchError> {
        let hosts = remote.map(|r| {
            let placement = r.list.placement(self.ranks);
            let slots: Vec<(String, usize)> = r
                .list
                .hosts
                .iter()
                .enumerate()
                .map(|(h, host)| {
                    (
                        host.ssh.clone(),
                        placement.iter().filter(|&&p| p == h).count(),
                    )
                })
                .filter(|(_, n)| *n > 0)
                .collect();
            mpi::Hosts {
                slots,
                ssh: self.ssh.clone(),
                program: r.program.clone(),
            }
        });
        let command = mpi::command(self.ranks, &env, &self.program, &self.args, hosts.as_ref());
        // mpirun's own (untagged) lines are kept to find the failed rank.
        let report = Arc::new(Mutex::new(Vec::<String>::new()));
        let seen = Arc::clone(&report);
        // The first rank that reported its own failure, and the ranks that
        // finished (see `mpi::command`).
        let first_exit = Arc::new(Mutex::new(None::<(usize, String)>));
        let finished = Arc::new(Mutex::new(BTreeSet::<usize>::new()));
        let (exits, done) = (Arc::clone(&first_exit), Arc::clone(&finished));
        // `[rank K] `, or on several hosts `[rank K host H] `.
        let rank_hosts: Arc<Vec<String>> = Arc::new(remote.map_or_else(Vec::new, |r| {
            r.list
                .placement(self.ranks)
                .iter()
                .map(|&h| r.list.hosts[h].ssh.clone())
                .collect()
        }));
        let relabel: Relabel = Arc::new(move |_| {
            let (seen, exits, done) = (Arc::clone(&seen), Arc::clone(&exits), Arc::clone(&done));
            let rank_hosts = Arc::clone(&rank_hosts);
            let prefix = move |rank: usize| match rank_hosts.get(rank) {
                Some(host) => format!("[rank {rank} host {host}]"),
                None => format!("[rank {rank}]"),
            };
            let mut whole = mpi::Reassembler::default();
            Box::new(move |line| {
                let lines = match line {
                    Some(line) => whole.line(line),
                    None => whole.end(),
                };
                lines
                    .into_iter()
                    .filter_map(|(rank, text)| match rank {
                        // The wrapper's marker is the launcher's, never
                        // output: only the rank's own text before it is.
                        Some(rank) => match mpi::reported_exit(&text) {
                            Some((before, reporter, status)) => {
                                if status == 0 {
                                    if let Ok(mut done) = done.lock() {
                                        done.insert(reporter);
                                    }
                                } else if let Ok(mut first) = exits.lock() {
                                    first.get_or_insert((reporter, mpi::exit_wording(status)));
                                }
                                (!before.is_empty()).then(|| format!("{} {before}", prefix(rank)))
                            }
                            None => Some(format!("{} {text}", prefix(rank))),
                        },
                        None => {
                            if let Ok(mut lines) = seen.lock() {
                                lines.push(text.clone());
                            }
                            Some(format!("[mpirun] {text}"))
                        }
                    })
                    .collect()
            })
        });
        // mpirun's label is not a rank, and mpirun stops the other ranks
        // itself: no reason is given to them.
        let mut watch = |outcome: Option<&Outcome>| {
            watch(outcome.filter(|o| !matches!(o, Outcome::Failed { .. })));
        };
        match supervise(
            vec![(0, command)],
            self.timeout,
            interrupt,
            relabel,
            &mut watch,
            None,
        )? {
            Outcome::Success => Ok(LaunchReport {
                mpirun_messages: report
                    .lock()
                    .map(|lines| {
                        lines
                            .iter()
                            .filter(|l| !l.trim().is_empty())
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default(),
            }),
            Outcome::Failed { status, .. } => {
                let lines = report.lock().map(|l| l.clone()).unwrap_or_default();
                let reported = first_exit.lock().ok().and_then(|first| first.clone());
                let all_passed = finished.lock().is_ok_and(|f| f.len() == self.ranks);
                // The wrapper's own report first: mpirun reports a rank
                // killed by a signal as the wrapper's exit code (137).
                Err(match reported.or_else(|| mpi::failed_rank(&lines)) {
                    Some((rank, how)) => LaunchError::RankFailed {
                        rank,
                        status: how,
                        detail: String::new(),
                    },
                    // Every wrapper reported status 0: what went wrong is
                    // mpirun's to say (a rank that exited without MPI
                    // being finalized, see the book's launching chapter).
                    None if all_passed => LaunchError::MpirunReported {
                        lines: lines.into_iter().filter(|l| !l.trim().is_empty()).collect(),
                    },
                    None => LaunchError::MpirunFailed {
                        status: status.to_string(),
                    },
                })
            }
            Outcome::TimedOut { .. } => {
                // Every rank but those whose wrapper reported status 0.
                let finished = finished.lock().map(|f| f.clone()).unwrap_or_default();
                let running: Vec<String> = (0..self.ranks)
                    .filter(|rank| !finished.contains(rank))
                    .map(|rank| rank.to_string())
                    .collect();
                Err(self.timed_out(&running.join(", ")))
            }
            Outcome::Interrupted { signal } => Err(interrupted(signal)),
        }
    }
}
