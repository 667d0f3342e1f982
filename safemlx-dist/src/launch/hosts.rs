//! The hosts of a multi-host run: `--hosts a,b` or an `mlx.launch` JSON
//! hostfile, each host an ssh destination and the IPv4 addresses its ranks
//! listen on.
//!
//! `mlx.launch`'s two forms are accepted as they are, so users' files work:
//!
//! ```json
//! [{"ssh": "mac1", "ips": ["10.0.0.1"]}, {"ssh": "mac2", "ips": ["10.0.0.2"]}]
//! {"backend": "ring", "envs": ["K=V"], "hosts": [{"ssh": "mac1", "ips": ["10.0.0.1"]}, ...]}
//! ```

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use super::RingHosts;
use crate::runtime::Backend;

/// The ring's first port on each host when none is given (`mlx.launch`'s).
pub const DEFAULT_STARTING_PORT: u16 = 32323;

/// One host: where to ssh, and the addresses its ranks listen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The ssh destination (`host`, `user@host`, an alias of `~/.ssh/config`).
    pub ssh: String,
    /// The IPv4 addresses the ring uses on this host (the first one when a
    /// host lists several).
    pub ips: Vec<Ipv4Addr>,
}

/// Hosts in rank order, with what an `mlx.launch` hostfile may add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostList {
    /// The hosts; `-n` ranks are spread over them by the chunk rule.
    pub hosts: Vec<Host>,
    /// The file's `"backend"`, if any.
    pub backend: Option<Backend>,
    /// The file's `"envs"`, `KEY=VALUE` for every rank.
    pub envs: Vec<(String, String)>,
}

/// `KEY=VALUE`, checked: a non-empty key of letters, digits and `_` not
/// starting with a digit.
///
/// # Errors
/// What is wrong with `entry`.
pub fn parse_env(entry: &str) -> Result<(String, String), String> {
    let (key, value) = entry
        .split_once('=')
        .ok_or_else(|| format!("{entry:?} is not KEY=VALUE"))?;
    let valid = !key.is_empty()
        && !key.starts_with(|c: char| c.is_ascii_digit())
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!(
            "{entry:?}: {key:?} is not an environment variable name (letters, digits and _, not starting with a digit)"
        ));
    }
    Ok((key.to_owned(), value.to_owned()))
}

fn check_ssh(ssh: &str, at: &str) -> Result<(), String> {
    if ssh.is_empty() || ssh.starts_with('-') || ssh.chars().any(char::is_whitespace) {
        return Err(format!(
            "{at}: {ssh:?} is not an ssh destination (a host name, user@host or an address; no spaces, not starting with -)"
        ));
    }
    Ok(())
}

impl HostList {
    /// `--hosts a,b,c`: each name is the ssh destination and, when it is an
    /// IPv4 address, the ring's address; a name is looked up (its first
    /// IPv4 address) otherwise.
    ///
    /// # Errors
    /// An empty list or entry, or a name without an IPv4 address.
    pub fn from_list(list: &str) -> Result<Self, String> {
        let hosts = list
            .split(',')
            .enumerate()
            .map(|(i, name)| {
                let name = name.trim();
                check_ssh(name, &format!("--hosts entry {i}"))?;
                let ip = resolve(name).ok_or_else(|| {
                    format!("--hosts entry {i}: {name:?} has no IPv4 address here; give the address, or a hostfile with \"ips\"")
                })?;
                Ok(Host {
                    ssh: name.to_owned(),
                    ips: vec![ip],
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            hosts,
            backend: None,
            envs: Vec::new(),
        })
    }

    /// An `mlx.launch` hostfile's text (either form, see the module docs).
    ///
    /// # Errors
    /// Invalid JSON, or an entry without `ssh` or with an address that is
    /// not IPv4, naming the entry.
    pub fn parse(text: &str) -> Result<Self, String> {
        const FORM: &str = r#"expected mlx.launch's hostfile: [{"ssh": "host1", "ips": ["10.0.0.1"]}, ...] or {"hosts": [...], "backend": "ring", "envs": ["K=V"]}"#;
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("invalid JSON ({e}); {FORM}"))?;
        let (entries, backend, envs) = match &value {
            serde_json::Value::Array(list) => (list.as_slice(), None, None),
            serde_json::Value::Object(map) => (
                map.get("hosts")
                    .and_then(|h| h.as_array())
                    .map(Vec::as_slice)
                    .ok_or_else(|| format!("no \"hosts\" list; {FORM}"))?,
                map.get("backend"),
                map.get("envs"),
            ),
            _ => return Err(format!("not a list or an object; {FORM}")),
        };
        if entries.is_empty() {
            return Err(format!("it lists no hosts; {FORM}"));
        }
        let hosts = entries
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                let at = format!("host {i}");
                let ssh = entry
                    .get("ssh")
                    .and_then(|s| s.as_str())
                    .ok_or_else(|| format!("{at}: no \"ssh\" string; {FORM}"))?;
                check_ssh(ssh, &at)?;
                let ips = match entry.get("ips") {
                    None => Vec::new(),
                    Some(serde_json::Value::Array(ips)) => ips
                        .iter()
                        .map(|ip| {
                            let text = ip.as_str().unwrap_or_default();
                            text.parse::<Ipv4Addr>().map_err(|_| {
                                format!("{at}: {ip} is not an IPv4 address; MLX's ring reads IPv4 addresses only")
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()?,
                    Some(other) => return Err(format!("{at}: \"ips\" is {other}, not a list of addresses")),
                };
                let ips = if ips.is_empty() {
                    vec![resolve(ssh).ok_or_else(|| {
                        format!("{at}: no \"ips\" and {ssh:?} has no IPv4 address here; list the address the ring should use in \"ips\"")
                    })?]
                } else {
                    ips
                };
                Ok(Host {
                    ssh: ssh.to_owned(),
                    ips,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let backend = match backend {
            None | Some(serde_json::Value::Null) => None,
            Some(b) if b.as_str() == Some("") => None,
            Some(b) => Some(
                b.as_str()
                    .unwrap_or_default()
                    .parse::<Backend>()
                    .map_err(|e| format!("\"backend\": {e}"))?,
            ),
        };
        let envs = match envs {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::Array(envs)) => envs
                .iter()
                .map(|e| {
                    parse_env(e.as_str().unwrap_or_default()).map_err(|m| format!("\"envs\": {m}"))
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(format!(
                    "\"envs\" is {other}, not a list of \"KEY=VALUE\" strings"
                ))
            }
        };
        Ok(Self {
            hosts,
            backend,
            envs,
        })
    }

    /// The host of each of `ranks` ranks: the chunk rule over the hosts
    /// (5 ranks on 2 hosts: 0, 0, 0, 1, 1).
    pub fn placement(&self, ranks: usize) -> Vec<usize> {
        let lengths = crate::typed::chunk_lengths(ranks, self.hosts.len());
        lengths
            .iter()
            .enumerate()
            .flat_map(|(host, &n)| std::iter::repeat_n(host, n))
            .collect()
    }

    /// The ring's addresses: rank `r` on its host's first IP, ports from
    /// `starting_port` up by one per rank (as `mlx.launch` does).
    ///
    /// # Errors
    /// Ports past 65535.
    pub fn ring(&self, ranks: usize, starting_port: u16) -> Result<RingHosts, String> {
        let ranks = self
            .placement(ranks)
            .iter()
            .enumerate()
            .map(|(rank, &host)| {
                let port = u16::try_from(usize::from(starting_port) + rank)
                    .map_err(|_| format!("rank {rank} would listen on a port past 65535; give a lower --starting-port"))?;
                Ok(vec![SocketAddr::V4(SocketAddrV4::new(self.hosts[host].ips[0], port))])
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(RingHosts::from_addresses(ranks))
    }
}

/// What a `--hostfile` holds: a ring host list for ranks on this machine
/// (`[["ip:port"], ...]`), or `mlx.launch`'s hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hostfile {
    /// `[["ip:port", ...], ...]`: read by [`RingHosts::read`] at launch.
    Ring,
    /// An `mlx.launch` hostfile.
    Hosts(HostList),
}

/// Reads `path` and tells its kind by its shape: a list of lists is a ring
/// host list, anything else must be an `mlx.launch` hostfile.
///
/// # Errors
/// An unreadable file or a bad `mlx.launch` hostfile, naming the file.
pub fn read_hostfile(path: &std::path::Path) -> Result<Hostfile, super::LaunchError> {
    let bad = |reason: String| super::LaunchError::Hostfile {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    let ring = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            v.as_array()
                .and_then(|l| l.first().map(serde_json::Value::is_array))
        })
        .unwrap_or(false);
    if ring {
        return Ok(Hostfile::Ring);
    }
    HostList::parse(&text).map(Hostfile::Hosts).map_err(bad)
}

/// `name` as an IPv4 address, or its first IPv4 address by lookup.
fn resolve(name: &str) -> Option<Ipv4Addr> {
    let host = name.rsplit_once('@').map_or(name, |(_, h)| h);
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Some(ip);
    }
    use std::net::ToSocketAddrs;
    (host, 0).to_socket_addrs().ok()?.find_map(|a| match a {
        SocketAddr::V4(v4) => Some(*v4.ip()),
        SocketAddr::V6(_) => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_mlx_launch_forms_are_read() {
        let list = HostList::parse(r#"[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "u@b", "ips": ["10.0.0.2", "10.1.0.2"]}]"#).unwrap();
        assert_eq!(list.hosts[1].ssh, "u@b");
        assert_eq!(
            list.hosts[1].ips,
            [
                "10.0.0.2".parse::<Ipv4Addr>().unwrap(),
                "10.1.0.2".parse().unwrap()
            ]
        );
        let object = HostList::parse(
            r#"{"backend": "mpi", "envs": ["A=1", "B=x=y"], "hosts": [{"ssh": "10.0.0.7"}]}"#,
        )
        .unwrap();
        assert_eq!(object.backend, Some(Backend::Mpi));
        assert_eq!(
            object.envs,
            [("A".into(), "1".into()), ("B".into(), "x=y".into())]
        );
        assert_eq!(
            object.hosts[0].ips,
            ["10.0.0.7".parse::<Ipv4Addr>().unwrap()]
        );
    }

    #[test]
    fn bad_hostfiles_say_what_is_wrong() {
        let error = |text| HostList::parse(text).unwrap_err();
        assert!(error("[").starts_with("invalid JSON"));
        assert!(error("[]").starts_with("it lists no hosts"));
        assert!(error(r#"[{"ips": ["10.0.0.1"]}]"#).starts_with("host 0: no \"ssh\" string"));
        assert_eq!(
            error(r#"[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["fe80::1"]}]"#),
            "host 1: \"fe80::1\" is not an IPv4 address; MLX's ring reads IPv4 addresses only"
        );
        assert_eq!(
            error(r#"[{"ssh": "-oProxyCommand=x", "ips": ["10.0.0.1"]}]"#),
            "host 0: \"-oProxyCommand=x\" is not an ssh destination (a host name, user@host or an address; no spaces, not starting with -)"
        );
        assert_eq!(
            error(r#"{"envs": ["1X=2"], "hosts": [{"ssh": "10.0.0.1"}]}"#),
            "\"envs\": \"1X=2\": \"1X\" is not an environment variable name (letters, digits and _, not starting with a digit)"
        );
        assert!(
            error(r#"{"backend": "carrier-pigeon", "hosts": [{"ssh": "10.0.0.1"}]}"#)
                .starts_with("\"backend\": ")
        );
        assert!(HostList::from_list("10.0.0.1,,10.0.0.2")
            .unwrap_err()
            .starts_with("--hosts entry 1: \"\""));
    }

    #[test]
    fn ranks_spread_over_hosts_by_the_chunk_rule_with_ports_per_rank() {
        let list = HostList::from_list("10.0.0.1,10.0.0.2").unwrap();
        assert_eq!(list.placement(5), [0, 0, 0, 1, 1]);
        assert_eq!(list.placement(1), [0]);
        assert_eq!(
            list.ring(3, 5000).unwrap().to_json(),
            r#"[["10.0.0.1:5000"],["10.0.0.1:5001"],["10.0.0.2:5002"]]"#
        );
        assert_eq!(
            list.ring(2, 65535).unwrap_err(),
            "rank 1 would listen on a port past 65535; give a lower --starting-port"
        );
    }
}
