//! A small virtual network for multi-host tests: `hosts` Linux network
//! namespaces, each with an `eth0` on one bridge (itself in a namespace of
//! its own, so the machine's own network is never touched) and an OpenSSH
//! server on its address, with keys made for the test. Everything is
//! removed on drop.
//!
//! A fixed delay on a host's link is `tc netem` where the kernel has it;
//! where it does not (this project's CI kernel has no netem), it is
//! [`Network::delay`]: the kernel queues every packet leaving the host's
//! `eth0` to user space (an iptables `NFQUEUE` rule) and a thread of this
//! process, inside that namespace, lets each one go on after the delay,
//! in order. Packets still cross the kernel's real TCP/IP path.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Runs `program args` and returns its output, or says what failed.
fn run(program: &str, args: &[&str]) -> Result<Output, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The virtual network (see the module docs).
#[derive(Debug)]
pub struct Network {
    switch: String,
    names: Vec<String>,
    addresses: Vec<String>,
    dir: PathBuf,
    sshd: Vec<Option<Child>>,
    delays: Vec<Delay>,
}

/// One host's delaying thread ([`Network::delay`]).
#[derive(Debug)]
struct Delay {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Delay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The delaying thread's body: joins namespace `ns`, binds netfilter
/// queue 0 there (reporting the outcome on `ready`), then holds each
/// queued packet for `by` before accepting it, until `stop`; packets still
/// held then are accepted at once.
fn hold_packets(
    ns: &str,
    by: Duration,
    stop: &AtomicBool,
    ready: &mpsc::Sender<Result<(), String>>,
) {
    let bound = (|| {
        let file = std::fs::File::open(format!("/run/netns/{ns}"))
            .map_err(|e| format!("cannot open namespace {ns}: {e}"))?;
        nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("cannot enter namespace {ns}: {e}"))?;
        let mut queue =
            nfq::Queue::open().map_err(|e| format!("no netfilter queue in {ns}: {e}"))?;
        queue
            .bind(0)
            .and_then(|()| queue.set_copy_range(0, 64))
            .and_then(|()| queue.set_queue_max_len(0, 1 << 16))
            .map_err(|e| format!("cannot bind netfilter queue 0 in {ns}: {e}"))?;
        queue.set_nonblocking(true);
        Ok(queue)
    })();
    let mut queue = match bound {
        Ok(queue) => {
            let _ = ready.send(Ok(()));
            queue
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut held: VecDeque<(Instant, nfq::Message)> = VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        loop {
            match queue.recv() {
                Ok(mut packet) => {
                    packet.set_verdict(nfq::Verdict::Accept);
                    held.push_back((Instant::now() + by, packet));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                // A full socket buffer (ENOBUFS is off) or an interrupted
                // read: the kernel keeps or drops the packet, as a lossy
                // link would; go on.
                Err(_) => break,
            }
        }
        let now = Instant::now();
        while held.front().is_some_and(|(due, _)| *due <= now) {
            if let Some((_, packet)) = held.pop_front() {
                let _ = queue.verdict(packet);
            }
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    for (_, packet) in held {
        let _ = queue.verdict(packet);
    }
}

/// Why the machine cannot host the network, when it cannot.
pub fn unavailable() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0");
    if !root {
        return Some("not root: network namespaces need CAP_SYS_ADMIN".to_owned());
    }
    for (tool, hint) in [
        ("/usr/sbin/sshd", "openssh-server"),
        ("/usr/bin/ssh", "openssh-client"),
        ("/usr/bin/ssh-keygen", "openssh-client"),
        ("/usr/sbin/ip", "iproute2"),
        ("/usr/sbin/tc", "iproute2"),
        ("/usr/sbin/nft", "nftables"),
        ("/usr/sbin/iptables-legacy", "iptables"),
    ] {
        if !Path::new(tool).exists() {
            return Some(format!("{tool} is missing (Debian package {hint})"));
        }
    }
    let probe = format!("smxprobe{}", std::process::id() % 100_000);
    match run("ip", &["netns", "add", &probe]) {
        Ok(_) => {
            let _ = run("ip", &["netns", "del", &probe]);
            None
        }
        Err(e) => Some(format!("cannot create a network namespace: {e}")),
    }
}

impl Network {
    /// `hosts` namespaces on 10.213.S.0/24 (S from this process id), host
    /// `i` at 10.213.S.(i + 1), each running sshd.
    ///
    /// # Errors
    /// A step that failed, with the command and its message (what was made
    /// so far is removed).
    pub fn new(hosts: usize) -> Result<Self, String> {
        let id = std::process::id() % 10_000;
        let prefix = format!("smx{id}");
        let subnet = format!("10.213.{}", 1 + id % 250);
        let dir = std::env::temp_dir().join(format!("{prefix}-netns"));
        let mut net = Self {
            switch: format!("{prefix}sw"),
            names: (0..hosts).map(|i| format!("{prefix}h{i}")).collect(),
            addresses: (0..hosts).map(|i| format!("{subnet}.{}", i + 1)).collect(),
            dir,
            sshd: Vec::new(),
            delays: Vec::new(),
        };
        net.build()?;
        Ok(net)
    }

    fn build(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        std::fs::create_dir_all("/run/sshd").map_err(|e| e.to_string())?;
        let sw = self.switch.clone();
        run("ip", &["netns", "add", &sw])?;
        self.exec(&sw, "ip", &["link", "add", "br0", "type", "bridge"])?;
        self.exec(&sw, "ip", &["link", "set", "br0", "up"])?;
        let key = |name: &str| self.dir.join(name).display().to_string();
        for name in ["host_key", "client_key"] {
            run(
                "ssh-keygen",
                &["-q", "-t", "ed25519", "-N", "", "-f", &key(name)],
            )?;
        }
        std::fs::copy(key("client_key.pub"), key("authorized_keys")).map_err(|e| e.to_string())?;
        std::fs::write(
            self.ssh_config(),
            format!(
                "Host *\n  User root\n  IdentityFile {}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n",
                key("client_key")
            ),
        )
        .map_err(|e| e.to_string())?;
        for i in 0..self.names.len() {
            let (ns, address) = (self.names[i].clone(), self.addresses[i].clone());
            run("ip", &["netns", "add", &ns])?;
            self.exec(&ns, "ip", &["link", "set", "lo", "up"])?;
            let port = format!("p{i}");
            self.exec(
                &sw,
                "ip",
                &[
                    "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
                ],
            )?;
            self.exec(&sw, "ip", &["link", "set", &port, "master", "br0", "up"])?;
            self.exec(
                &ns,
                "ip",
                &["addr", "add", &format!("{address}/24"), "dev", "eth0"],
            )?;
            self.exec(&ns, "ip", &["link", "set", "eth0", "up"])?;
            self.start_sshd(i)?;
        }
        for i in 0..self.names.len() {
            self.wait_for_ssh(i)?;
        }
        Ok(())
    }

    fn start_sshd(&mut self, i: usize) -> Result<(), String> {
        let config = self.dir.join(format!("sshd_config_{i}"));
        let key = |name: &str| self.dir.join(name).display().to_string();
        std::fs::write(
            &config,
            format!(
                "ListenAddress {}\nHostKey {}\nAuthorizedKeysFile {}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\nLogLevel ERROR\n",
                self.addresses[i],
                key("host_key"),
                key("authorized_keys")
            ),
        )
        .map_err(|e| e.to_string())?;
        let child = self
            .command(i, "/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start sshd in {}: {e}", self.names[i]))?;
        if self.sshd.len() <= i {
            self.sshd.resize_with(i + 1, || None);
        }
        self.sshd[i] = Some(child);
        Ok(())
    }

    fn wait_for_ssh(&self, i: usize) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ok = self
                .command(0, "ssh")
                .args(["-F"])
                .arg(self.ssh_config())
                .args([
                    "-o",
                    "BatchMode=yes",
                    "-o",
                    "ConnectTimeout=2",
                    &self.addresses[i],
                    "true",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "sshd on {} did not answer within 10 s",
                    self.addresses[i]
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `program args` in namespace `ns`.
    ///
    /// # Errors
    /// The command's failure.
    pub fn exec(&self, ns: &str, program: &str, args: &[&str]) -> Result<Output, String> {
        let mut all = vec!["netns", "exec", ns, program];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// A command that runs `program` in host `i`'s network namespace and a
    /// UTS namespace of its own whose host name is the namespace's (Open
    /// MPI tells hosts apart by name). Each step execs the next, so the
    /// child's pid is `program`'s.
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command
            .args([
                "netns",
                "exec",
                &self.names[i],
                "unshare",
                "--uts",
                "sh",
                "-c",
            ])
            .arg(r#"hostname "$0" && exec "$@""#)
            .arg(&self.names[i])
            .arg(program);
        command
    }

    /// Host `i`'s address.
    pub fn address(&self, i: usize) -> &str {
        &self.addresses[i]
    }

    /// `--hosts` for all hosts: their addresses.
    pub fn hosts(&self) -> String {
        self.addresses.join(",")
    }

    /// The ssh client configuration (keys, no host key checks).
    pub fn ssh_config(&self) -> PathBuf {
        self.dir.join("ssh_config")
    }

    /// Host `i`'s namespace.
    pub fn namespace(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// Delays every packet leaving host `i`'s `eth0` by `by`, in order,
    /// without netem (see the module docs), until the network is dropped.
    ///
    /// # Errors
    /// The queue could not be bound or the rule not added.
    pub fn delay(&mut self, i: usize, by: Duration) -> Result<(), String> {
        let ns = self.names[i].clone();
        let stop = Arc::new(AtomicBool::new(false));
        let (ready, bound) = mpsc::channel();
        let thread = {
            let (ns, stop) = (ns.clone(), Arc::clone(&stop));
            std::thread::spawn(move || hold_packets(&ns, by, &stop, &ready))
        };
        self.delays.push(Delay {
            stop,
            thread: Some(thread),
        });
        bound
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| format!("the delaying thread for {ns} did not start"))??;
        // `--queue-bypass`: with no thread bound, packets pass undelayed.
        self.exec(
            &ns,
            "iptables-legacy",
            &[
                "-A",
                "OUTPUT",
                "-o",
                "eth0",
                "-j",
                "NFQUEUE",
                "--queue-num",
                "0",
                "--queue-bypass",
            ],
        )?;
        Ok(())
    }

    /// The time a TCP connection from host `from` to host `to`'s sshd
    /// takes to open (one round trip), measured from inside `from`.
    ///
    /// # Errors
    /// The namespace could not be entered or the connection failed.
    pub fn round_trip(&self, from: usize, to: usize) -> Result<Duration, String> {
        let ns = self.names[from].clone();
        let address: std::net::IpAddr = self.addresses[to]
            .parse()
            .map_err(|e| format!("{}: {e}", self.addresses[to]))?;
        std::thread::spawn(move || {
            let file = std::fs::File::open(format!("/run/netns/{ns}"))
                .map_err(|e| format!("cannot open namespace {ns}: {e}"))?;
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| format!("cannot enter namespace {ns}: {e}"))?;
            let started = Instant::now();
            std::net::TcpStream::connect_timeout(&(address, 22).into(), Duration::from_secs(5))
                .map_err(|e| format!("cannot connect to {address}:22 from {ns}: {e}"))?;
            Ok(started.elapsed())
        })
        .join()
        .map_err(|_| "the measuring thread panicked".to_owned())?
    }

    /// Stops host `i`'s sshd: ssh to it is refused.
    pub fn stop_sshd(&mut self, i: usize) {
        if let Some(mut child) = self.sshd.get_mut(i).and_then(Option::take) {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The namespace's sshd itself (`ip netns exec` execs it, so the
        // child is sshd; its per-connection children are left alone here).
    }

    /// Starts host `i`'s sshd again.
    ///
    /// # Errors
    /// See [`Network::new`].
    pub fn restart_sshd(&mut self, i: usize) -> Result<(), String> {
        self.start_sshd(i)?;
        self.wait_for_ssh(i)
    }

    /// The processes in each namespace other than its sshd and the ssh
    /// sessions of that sshd: `(namespace, pid, command line)`.
    pub fn leftovers(&self) -> Vec<(String, u32, String)> {
        let sshd: Vec<u32> = self.sshd.iter().flatten().map(Child::id).collect();
        let mut left = Vec::new();
        for ns in &self.names {
            let Ok(out) = run("ip", &["netns", "pids", ns]) else {
                continue;
            };
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let Ok(pid) = pid.parse::<u32>() else {
                    continue;
                };
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|b| {
                        String::from_utf8_lossy(&b)
                            .replace('\0', " ")
                            .trim()
                            .to_owned()
                    })
                    .unwrap_or_default();
                if sshd.contains(&pid) || cmdline.starts_with("sshd") || cmdline.is_empty() {
                    continue;
                }
                left.push((ns.clone(), pid, cmdline));
            }
        }
        left
    }

    /// Waits up to `limit` for [`leftovers`](Self::leftovers) to be empty;
    /// returns what is left.
    pub fn wait_for_no_leftovers(&self, limit: Duration) -> Vec<(String, u32, String)> {
        let deadline = Instant::now() + limit;
        loop {
            let left = self.leftovers();
            if left.is_empty() || Instant::now() > deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.delays.clear();
        for i in 0..self.sshd.len() {
            self.stop_sshd(i);
        }
        for ns in self.names.iter().chain([&self.switch]) {
            if let Ok(out) = run("ip", &["netns", "pids", ns]) {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = run("kill", &["-9", pid]);
                }
            }
            let _ = run("ip", &["netns", "del", ns]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
