//! Ring ranks: started directly on this machine, or over ssh under an
//! agent on other hosts.

use std::ffi::OsString;
use std::process::Command;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::hostfile::RingHosts;
use super::supervise::{supervise, Outcome, Relabel};
use super::{agent, interrupted, mpi, remote, Launch, LaunchError, LaunchReport, Remote};
use crate::runtime::{this_launcher, LAUNCHER_ENV, TOKEN_ENV};

impl Launch {
    pub(super) fn run_ring(
        &self,
        hosts: &RingHosts,
        env: Vec<(OsString, OsString)>,
        interrupt: &AtomicUsize,
        watch: &mut dyn FnMut(Option<&Outcome>),
    ) -> Result<LaunchReport, LaunchError> {
        let file = hosts.write_temp()?;
        let commands = (0..self.ranks)
            .map(|rank| {
                let mut command = Command::new(&self.program);
                crate::runtime::restore_for_child(&mut command);
                command
                    .args(&self.args)
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .env("MLX_RANK", rank.to_string())
                    .env("MLX_WORLD_SIZE", self.ranks.to_string())
                    .env(LAUNCHER_ENV, this_launcher());
                // MLX's ring does not form a ring of one: a single rank gets
                // no hostfile and runs as the singleton group.
                if self.ranks > 1 {
                    command.env("MLX_HOSTFILE", file.path());
                } else {
                    command.env_remove("MLX_HOSTFILE");
                }
                (rank, command)
            })
            .collect();
        let relabel: Relabel = Arc::new(|rank| {
            Box::new(move |line| {
                line.map(|line| format!("[rank {rank}] {line}"))
                    .into_iter()
                    .collect()
            })
        });
        let outcome = supervise(commands, self.timeout, interrupt, relabel, watch, None)?;
        drop(file);
        match outcome {
            Outcome::Success => Ok(LaunchReport::default()),
            Outcome::Failed { label, status } => Err(LaunchError::RankFailed {
                rank: label,
                status: status.to_string(),
                detail: String::new(),
            }),
            Outcome::TimedOut { running } => Err(self.timed_out(
                &running
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            )),
            Outcome::Interrupted { signal } => Err(interrupted(signal)),
        }
    }

    /// Ranks on other hosts, each started over ssh under an agent
    /// ([`agent`]) that stops it when the launcher's connection closes or
    /// falls silent.
    pub(super) fn run_remote_ring(
        &self,
        remote: &Remote,
        mut env: Vec<(OsString, OsString)>,
        interrupt: &AtomicUsize,
        watch: &mut dyn FnMut(Option<&Outcome>),
    ) -> Result<LaunchReport, LaunchError> {
        // The progress directory is this machine's: remote ranks do not see it.
        env.retain(|(k, _)| k != crate::runtime::PROGRESS_DIR_ENV);
        // The secret goes to each agent through its ssh connection, not on
        // the remote command line (see `agent.rs`).
        let secret = env
            .iter()
            .find(|(k, _)| k == TOKEN_ENV)
            .map(|(_, v)| v.clone());
        env.retain(|(k, _)| k != TOKEN_ENV);
        let preamble = agent::preamble(secret.as_deref());
        let placement = remote.list.placement(self.ranks);
        let host_of = |rank: usize| remote.list.hosts[placement[rank]].ssh.clone();
        let commands = (0..self.ranks)
            .map(|rank| {
                let mut env = env.clone();
                env.push(("MLX_RANK".into(), rank.to_string().into()));
                env.push(("MLX_WORLD_SIZE".into(), self.ranks.to_string().into()));
                if self.ranks > 1 {
                    env.push((agent::RING_HOSTS_ENV.into(), remote.ring.to_json().into()));
                }
                let host = host_of(rank);
                let line = remote::rank_command(
                    &remote.cwd,
                    &env,
                    &remote.launcher,
                    &host,
                    &remote.program,
                    &self.args,
                );
                (rank, remote::ssh(&self.ssh, &host, &line))
            })
            .collect();
        let hosts: Vec<String> = (0..self.ranks).map(host_of).collect();
        let labels = hosts.clone();
        let relabel: Relabel = Arc::new(move |rank| {
            let host = labels.get(rank).cloned().unwrap_or_default();
            Box::new(move |line| {
                line.map(|line| format!("[rank {rank} host {host}] {line}"))
                    .into_iter()
                    .collect()
            })
        });
        match supervise(
            commands,
            self.timeout,
            interrupt,
            relabel,
            watch,
            Some(&preamble),
        )? {
            Outcome::Success => Ok(LaunchReport::default()),
            Outcome::Failed { label, status } if status.code() == Some(255) => {
                Err(LaunchError::HostLost {
                    rank: label,
                    host: hosts[label].clone(),
                    status: status.to_string(),
                })
            }
            Outcome::Failed { label, status } => Err(LaunchError::RankFailed {
                rank: label,
                // The agent exits with the rank's status (128 + N after signal N).
                status: format!(
                    "{}, on host {}",
                    status
                        .code()
                        .map_or_else(|| status.to_string(), mpi::exit_wording),
                    hosts[label]
                ),
                detail: String::new(),
            }),
            Outcome::TimedOut { running } => Err(self.timed_out(
                &running
                    .iter()
                    .map(|r| format!("{r} (host {})", hosts[*r]))
                    .collect::<Vec<_>>()
                    .join(", "),
            )),
            Outcome::Interrupted { signal } => Err(interrupted(signal)),
        }
    }
}
