//! The ring backend's host list: `[["ip:port", ...], ...]`, one list per rank.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};

use super::LaunchError;

/// The addresses each rank of a ring listens on, in rank order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingHosts {
    ranks: Vec<Vec<SocketAddr>>,
}

impl RingHosts {
    /// `ranks` loopback addresses on ports that were free when asked for.
    ///
    /// All listeners are held until every port is chosen, so the ports are
    /// distinct; they are released before the ranks start. The address is
    /// the run's own, `127.a.b.c` at random (Linux routes all of
    /// `127.0.0.0/8` to the loopback device): a port released here and
    /// handed by the kernel to a run launched at the same moment is then
    /// on another address, so concurrent runs never meet.
    pub fn loopback(ranks: usize) -> Result<Self, LaunchError> {
        let address = run_address();
        let listeners = (0..ranks)
            .map(|_| TcpListener::bind((address, 0)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| LaunchError::Io(format!("could not reserve a loopback port: {e}")))?;
        let ranks = listeners
            .iter()
            .map(|l| l.local_addr().map(|a| vec![a]))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| LaunchError::Io(format!("could not read a reserved port: {e}")))?;
        Ok(Self { ranks })
    }

    /// The list of `ranks` addresses, in rank order.
    pub(crate) fn from_addresses(ranks: Vec<Vec<SocketAddr>>) -> Self {
        Self { ranks }
    }

    /// Reads and validates a ring host list for `expected_ranks` ranks.
    pub fn read(path: &Path, expected_ranks: usize) -> Result<Self, LaunchError> {
        let bad = |reason: String| LaunchError::Hostfile {
            path: path.to_owned(),
            reason,
        };
        let text =
            std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        let hosts = Self::parse(&text).map_err(bad)?;
        if hosts.ranks.len() != expected_ranks {
            return Err(LaunchError::Hostfile {
                path: path.to_owned(),
                reason: format!(
                    "it lists {} ranks but {expected_ranks} were asked for with -n",
                    hosts.ranks.len()
                ),
            });
        }
        Ok(hosts)
    }

    /// Parses `[["ip:port", ...], ...]`; the error says what is wrong where.
    pub fn parse(text: &str) -> Result<Self, String> {
        const FORM: &str = r#"expected a JSON list with one list of "ip:port" strings per rank, e.g. [["127.0.0.1:5000"], ["127.0.0.1:5001"]]"#;
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("invalid JSON ({e}); {FORM}"))?;
        let list = value
            .as_array()
            .ok_or_else(|| format!("not a list; {FORM}"))?;
        if list.is_empty() {
            return Err(format!("it lists no ranks; {FORM}"));
        }
        let ranks = list
            .iter()
            .enumerate()
            .map(|(rank, entry)| {
                let addrs = entry
                    .as_array()
                    .filter(|a| !a.is_empty())
                    .ok_or_else(|| format!("rank {rank}: not a non-empty list; {FORM}"))?;
                addrs
                    .iter()
                    .map(|a| {
                        let s = a
                            .as_str()
                            .ok_or_else(|| format!("rank {rank}: {a} is not a string; {FORM}"))?;
                        let addr = s.parse::<SocketAddr>().map_err(|_| {
                            format!("rank {rank}: {s:?} is not an ip:port address")
                        })?;
                        if addr.is_ipv6() {
                            return Err(format!(
                                "rank {rank}: {s:?} is an IPv6 address; MLX's ring reads IPv4 ip:port addresses only"
                            ));
                        }
                        if addr.port() == 0 {
                            return Err(format!(
                                "rank {rank}: {s:?} has port 0; each rank listens on the port it is given, so give a real one"
                            ));
                        }
                        Ok(addr)
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { ranks })
    }

    /// The number of ranks listed.
    pub fn len(&self) -> usize {
        self.ranks.len()
    }

    /// Whether no rank is listed (never true for a parsed or generated list).
    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }

    /// The JSON text MLX reads.
    pub fn to_json(&self) -> String {
        let ranks: Vec<Vec<String>> = self
            .ranks
            .iter()
            .map(|r| r.iter().map(ToString::to_string).collect())
            .collect();
        serde_json::Value::from(ranks).to_string()
    }

    /// Writes the list to a new file in the temporary directory, removed
    /// when the returned guard drops.
    pub fn write_temp(&self) -> Result<TempHostfile, LaunchError> {
        let path = std::env::temp_dir().join(format!("{}.json", super::progress::temp_stem()));
        std::fs::write(&path, self.to_json())
            .map_err(|e| LaunchError::Io(format!("could not write {}: {e}", path.display())))?;
        Ok(TempHostfile { path })
    }
}

/// A hostfile that is deleted on drop.
#[derive(Debug)]
pub struct TempHostfile {
    path: PathBuf,
}

impl TempHostfile {
    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempHostfile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A loopback address for one run: `127.a.b.c`, `a`, `b` and `c` at
/// random (`c` neither 0 nor 255); `127.0.0.1` when the system gives no
/// random bytes.
fn run_address() -> Ipv4Addr {
    let mut bytes = [0u8; 3];
    match getrandom::fill(&mut bytes) {
        Ok(()) => Ipv4Addr::new(127, bytes[0], bytes[1], 1 + bytes[2] % 254),
        Err(_) => Ipv4Addr::LOCALHOST,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_ports_are_distinct_and_round_trip() {
        let hosts = RingHosts::loopback(4).unwrap();
        assert_eq!(hosts.len(), 4);
        let parsed = RingHosts::parse(&hosts.to_json()).unwrap();
        assert_eq!(parsed, hosts);
        let mut ports: Vec<u16> = hosts.ranks.iter().map(|r| r[0].port()).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 4);
    }

    #[test]
    fn bad_host_lists_say_what_is_wrong() {
        assert!(RingHosts::parse("{")
            .unwrap_err()
            .starts_with("invalid JSON"));
        assert!(RingHosts::parse("{}")
            .unwrap_err()
            .starts_with("not a list"));
        assert!(RingHosts::parse("[]")
            .unwrap_err()
            .starts_with("it lists no ranks"));
        assert_eq!(
            RingHosts::parse(r#"[["127.0.0.1:1"], ["nowhere"]]"#).unwrap_err(),
            "rank 1: \"nowhere\" is not an ip:port address"
        );
        assert_eq!(
            RingHosts::parse(r#"[["127.0.0.1:1"], ["127.0.0.1:0"]]"#).unwrap_err(),
            "rank 1: \"127.0.0.1:0\" has port 0; each rank listens on the port it is given, so give a real one"
        );
        assert_eq!(
            RingHosts::parse(r#"[["[::1]:5000"], ["127.0.0.1:5001"]]"#).unwrap_err(),
            "rank 0: \"[::1]:5000\" is an IPv6 address; MLX's ring reads IPv4 ip:port addresses only"
        );
        assert!(RingHosts::parse(r#"[["127.0.0.1:1"], []]"#)
            .unwrap_err()
            .starts_with("rank 1: not a non-empty list"));
    }
}
