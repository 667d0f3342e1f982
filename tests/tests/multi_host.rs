//! Ranks on several hosts, started over ssh by `safemlx-launch --hosts`:
//! four Linux network namespaces on one bridge, each running its own sshd
//! (`safemlx_dist_tests::netns`), the launcher inside the first.
//!
//! The rank bodies are ordinary tests (`rank_*`): run by themselves they
//! start their ranks on loopback; the multi-host tests start the same test
//! across the namespaces (the launcher passes `SAFEMLX_DIST_RANK_OF` with
//! `--env`), so both compute, and check, the same values.
//!
//! Where the machine cannot make namespaces (not root, no sshd) the
//! multi-host tests print why and pass, unless
//! `SAFEMLX_DIST_REQUIRE_NETNS=1` (set by `cargo xtask test`) makes that a
//! failure.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use safemlx_dist::launch::{Ranks, RANK_OF_ENV};
use safemlx_dist::{all_sum, Backend, Group};
use safemlx_dist_tests::netns::{self, Network};
use safemlx_dist_tests::{check_every_collective, cpu};

/// The tests of this binary run one at a time (one network; the loopback
/// runs of the rank bodies would slow the fault tests' timings).
static NETWORK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn network(hosts: usize) -> Option<Network> {
    if let Some(why) = netns::unavailable() {
        assert!(
            std::env::var("SAFEMLX_DIST_REQUIRE_NETNS").as_deref() != Ok("1"),
            "multi-host tests cannot run here: {why}"
        );
        eprintln!("skipped: {why}");
        return None;
    }
    Some(Network::new(hosts).unwrap_or_else(|e| panic!("building the test network: {e}")))
}

/// `target/<profile>/safemlx-launch`, beside this test's directory.
fn launcher() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let path = exe
        .ancestors()
        .nth(2)
        .expect("target/<profile>")
        .join("safemlx-launch");
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build --release --bin safemlx-launch`",
        path.display()
    );
    path
}

/// `safemlx-launch` in host 0's namespace, running the rank test `test`
/// (started there for `ranks` ranks on `backend`) on `hosts`.
fn launch(net: &Network, test: &str, ranks: usize, backend: Backend, hosts: &str) -> Command {
    let ssh = format!("ssh -F {}", net.ssh_config().display());
    launch_with_ssh(net, (test, ranks, backend, hosts), &ssh, &[])
}

/// [`launch`] with `ssh` as the launcher's `--ssh` command.
fn launch_with_ssh(
    net: &Network,
    (test, ranks, backend, hosts): (&str, usize, Backend, &str),
    ssh: &str,
    env: &[&str],
) -> Command {
    let mut command = net.command(0, launcher());
    command
        .args(["--hosts", hosts, "-n", &ranks.to_string()])
        .args(["--backend", backend.as_str()])
        .args(["--ssh", ssh])
        .args(["--starting-port", "40100", "--timeout", "120"])
        .arg("--env")
        .arg(format!("{RANK_OF_ENV}={test}#{ranks}#{backend}"));
    for setting in env {
        command.args(["--env", setting]);
    }
    command
        .arg("--")
        .arg(std::env::current_exe().expect("test binary"))
        .args([
            test,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .stdin(Stdio::null());
    command
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The launcher's own `safemlx-launch: ...` line of `all` (empty if none).
fn launcher_message(all: &str) -> String {
    all.lines()
        .find(|l| l.starts_with("safemlx-launch: "))
        .unwrap_or_default()
        .to_owned()
}

// ---- What the ranks run (each also a loopback test by itself) ----

#[test]
fn rank_every_collective() {
    let _one = NETWORK.lock();
    for backend in [Backend::Ring, Backend::Mpi] {
        Ranks::new(4)
            .backend(backend)
            .run_test(|group| {
                check_every_collective(group);
                safemlx_dist_tests::check_every_lowering(group);
            })
            .unwrap();
    }
}

/// A tensor-parallel Llama (tied embeddings, 3 KV heads over 4 ranks: one
/// replicated) gives mlx-lm's logits, with the KV cache.
#[test]
fn rank_tensor_parallel_model() {
    let _one = NETWORK.lock();
    for backend in [Backend::Ring, Backend::Mpi] {
        Ranks::new(4)
            .backend(backend)
            .run_test(|group| {
                let s = cpu();
                let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("golden/llama/llama-tied-kv3");
                let source = safemlx_dist::checkpoint::HfDirectory::open(&dir).expect("opens");
                let model =
                    safemlx_dist::models::Llama::from_hf(group, &source, &s).expect("loads");
                let (prompt, want) =
                    safemlx_dist_tests::models::golden(&dir.join("golden.safetensors"), &s);
                let what = format!("rank {} of {}", group.rank(), group.size());
                safemlx_dist_tests::models::check_logits(&model, &prompt, &want, &what);
            })
            .unwrap();
    }
}

/// All-sums until stopped (the fault tests cut it short).
#[test]
#[ignore = "the fault tests' rank body: it sums for a minute"]
fn rank_sums_for_a_minute() {
    Ranks::new(4)
        .run_test(|group: &Group| {
            let s = cpu();
            let started = Instant::now();
            let x = safemlx::Array::from_slice(&[1.0f32; 1024], &[1024]);
            let mut rounds = 0;
            while started.elapsed() < Duration::from_secs(60) {
                let y = all_sum(&x, group, &s).unwrap();
                safemlx_dist::eval(&[&y]).unwrap();
                rounds += 1;
                if rounds % 200 == 0 {
                    println!("round {rounds}");
                }
            }
        })
        .unwrap();
}

// ---- Across hosts ----

#[test]
fn four_hosts_compute_what_loopback_computes_on_ring_and_mpi() {
    let _one = NETWORK.lock();
    let Some(net) = network(4) else { return };
    for backend in [Backend::Ring, Backend::Mpi] {
        for test in ["rank_every_collective", "rank_tensor_parallel_model"] {
            let run = || {
                let out = launch(&net, test, 4, backend, &net.hosts())
                    .output()
                    .expect("safemlx-launch runs");
                let all = text(&out);
                (out, all)
            };
            let (mut out, mut all) = run();
            // Known and not ours to fix here: now and then (about one 4-host
            // MPI launch in ten on this machine) a rank that passed exits
            // without MPI being finalized (MLX finalizes from a static
            // destructor), and mpirun fails the run saying so. Every rank
            // must still have passed; then the run is repeated once.
            let passed = (0..4).all(|rank| {
                all.contains(&format!(
                    "[rank {rank} host {}] test result: ok. 1 passed",
                    net.address(rank)
                ))
            });
            if backend == Backend::Mpi
                && !out.status.success()
                && passed
                && all.contains("exiting improperly")
            {
                eprintln!("{test} on mpi: every rank passed, then a rank exited without MPI finalized; running it again");
                (out, all) = run();
            }
            assert!(
                out.status.success(),
                "{test} on {backend} across 4 hosts:\n{all}"
            );
            // Every rank ran its checks, and passed, on its own host.
            for rank in 0..4 {
                let host = format!("[rank {rank} host {}]", net.address(rank));
                for line in [
                    format!("{host} test {test} ..."),
                    format!("{host} test result: ok. 1 passed"),
                ] {
                    assert!(all.contains(&line), "{backend}: no {line:?} in:\n{all}");
                }
            }
        }
    }
    assert_eq!(net.wait_for_no_leftovers(Duration::from_secs(5)), []);
}

/// A 2 ms delay and 1% loss on every host's link: `tc netem` where the
/// kernel has it. This machine's kernel has no netem, so there the delay is
/// [`Network::delay`] (each packet leaving `eth0` held 2 ms by an NFQUEUE
/// reader) and the loss an nftables rule (`numgen random mod 100 < 1 drop`,
/// both directions). Returns what was applied.
fn degrade(net: &mut Network, i: usize) -> &'static str {
    let ns = net.namespace(i).to_owned();
    let netem = [
        "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "2ms", "loss", "1%",
    ];
    if net.exec(&ns, "tc", &netem).is_ok() {
        return "netem: 2 ms delay, 1% loss";
    }
    net.delay(i, Duration::from_millis(2)).unwrap();
    net.exec(&ns, "nft", &["add", "table", "inet", "faults"])
        .unwrap();
    for hook in ["input", "output"] {
        net.exec(
            &ns,
            "nft",
            &[
                "add",
                "chain",
                "inet",
                "faults",
                hook,
                &format!("{{ type filter hook {hook} priority 0; }}"),
            ],
        )
        .unwrap();
        net.exec(
            &ns,
            "nft",
            &[
                "add", "rule", "inet", "faults", hook, "numgen", "random", "mod", "100", "<", "1",
                "drop",
            ],
        )
        .unwrap();
    }
    "no netem in this kernel: 2 ms delay out of each host (NFQUEUE), 1% loss each way (nftables)"
}

#[test]
fn delay_and_loss_leave_results_exact() {
    let _one = NETWORK.lock();
    let Some(mut net) = network(4) else { return };
    let applied: Vec<&str> = (0..4).map(|i| degrade(&mut net, i)).collect();
    // The delay is there: 2 ms out of each end of a round trip. (Loss may
    // cost a retransmitted SYN, which only adds.)
    let round_trip = net.round_trip(0, 1).unwrap();
    assert!(
        round_trip >= Duration::from_millis(4),
        "host 0 -> host 1 round trip {round_trip:?} with {}",
        applied[0]
    );
    // Ring only. Open MPI 4.1.4's own connection setup (its ssh-started
    // daemons calling back, its TCP transport's connects) failed on this
    // network in 5 of 7 runs (1 of 2 with the 1% loss, 4 of 5 with the
    // delay alone): "ORTE was unable to reliably start one or more daemons" and
    // "connect() to H:1024 failed: Operation now in progress (115)" (its
    // message prints a stale errno; open-mpi/ompi#10734 reports the same
    // on 4.1.4). MPI across the hosts runs in the tests above, unfaulted.
    // The packets are held by a thread of this process, which shares the 2
    // cores with 4 ranks whose ring threads spin: it can fall seconds
    // behind, and the launcher's ssh keepalive (lost after 3 s of silence)
    // then most likely ended a run whose ranks had all finished (seen once
    // in CI: "lost the ssh connection ... ssh exit status: 255"). On this link the
    // user's ssh options allow 20 s, as a user's would on a lossy network,
    // and so does each agent's wait for the launcher's next byte (5 s ran
    // out once with two more processes spinning beside the test).
    let ssh = format!(
        "ssh -F {} -o ServerAliveCountMax=20",
        net.ssh_config().display()
    );
    let silence = format!("{}=20", safemlx_dist::launch::agent::SILENCE_ENV);
    let started = Instant::now();
    for test in ["rank_every_collective", "rank_tensor_parallel_model"] {
        let out = launch_with_ssh(
            &net,
            (test, 4, Backend::Ring, &net.hosts()),
            &ssh,
            &[&silence],
        )
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "{test} with {}:\n{}",
            applied[0],
            text(&out)
        );
    }
    eprintln!(
        "fault table: {} (round trip {:.1} ms): every collective and the model exact, {:.1} s",
        applied[0],
        round_trip.as_secs_f64() * 1e3,
        started.elapsed().as_secs_f64()
    );
}

/// Starts `rank_sums_for_a_minute` across the 4 hosts, waits until every
/// rank has summed, then applies `fault`; returns the launcher's output,
/// its status and the seconds from the fault to its exit.
fn fault_mid_run(net: &Network, fault: impl FnOnce(&Network, u32)) -> (Output, f64) {
    let child = launch(
        net,
        "rank_sums_for_a_minute",
        4,
        Backend::Ring,
        &net.hosts(),
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // Long enough for ssh, the ring's connections and some rounds.
    std::thread::sleep(Duration::from_secs(6));
    let at = Instant::now();
    fault(net, child.id());
    let out = child.wait_with_output().unwrap();
    (out, at.elapsed().as_secs_f64())
}

#[test]
fn a_link_taken_down_mid_run_ends_every_rank_naming_the_host() {
    let _one = NETWORK.lock();
    let Some(net) = network(4) else { return };
    let lost = net.address(3).to_owned();
    let (out, seconds) = fault_mid_run(&net, |net, _| {
        // While it runs: nothing on host 1 listens on all interfaces, and
        // its rank's ring connections were accepted on its own address
        // (the ring closes its listener once its peers are connected).
        // `ss -tanH`: state, queues, local address, peer address.
        let sockets = |state: &str| {
            let out = net.exec(net.namespace(1), "ss", &["-tanH"]).unwrap();
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.starts_with(state))
                .filter_map(|l| l.split_whitespace().nth(3).map(str::to_owned))
                .collect::<Vec<_>>()
        };
        let own = format!("{}:", net.address(1));
        for local in sockets("LISTEN") {
            assert!(local.starts_with(&own), "host 1 listens on {local}");
        }
        let ring_port = format!("{}:40101", net.address(1));
        assert!(
            sockets("ESTAB").contains(&ring_port),
            "no ring connection on {ring_port}"
        );
        net.exec(net.namespace(3), "ip", &["link", "set", "eth0", "down"])
            .unwrap();
    });
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let message = launcher_message(&all);
    assert!(
        message.contains(&lost),
        "the message names {lost}: {message}\n{all}"
    );
    assert!(seconds < 20.0, "stopped after {seconds:.1} s");
    let left = net.wait_for_no_leftovers(Duration::from_secs(8));
    assert_eq!(left, [], "left running after the link went down");
    eprintln!("fault table: link down on host 3: stopped in {seconds:.1} s: {message}");
}

#[test]
fn a_killed_remote_rank_stops_every_host_and_is_named() {
    let _one = NETWORK.lock();
    let Some(net) = network(4) else { return };
    let (out, seconds) = fault_mid_run(&net, |net, _| {
        // The rank's process on host 2: the test binary under the agent.
        let victim = net
            .leftovers()
            .into_iter()
            .find(|(ns, _, cmd)| {
                ns == net.namespace(2)
                    && cmd.contains("rank_sums_for_a_minute")
                    && !cmd.contains("--agent")
            })
            .expect("rank 2 is running");
        Command::new("kill")
            .args(["-9", &victim.1.to_string()])
            .status()
            .unwrap();
    });
    let all = text(&out);
    let message = launcher_message(&all);
    assert!(message.contains("rank 2 failed"), "{message}\n{all}");
    assert!(message.contains(net.address(2)), "{message}");
    assert!(seconds < 5.0, "stopped after {seconds:.1} s");
    assert_eq!(net.wait_for_no_leftovers(Duration::from_secs(5)), []);
    eprintln!("fault table: rank 2 killed: stopped in {seconds:.1} s: {message}");
}

#[test]
fn a_killed_launcher_leaves_no_rank_on_any_host() {
    let _one = NETWORK.lock();
    let Some(net) = network(4) else { return };
    let mut seconds = 0.0;
    let (_, _) = fault_mid_run(&net, |net, launcher| {
        // `ip netns exec` execs the launcher: its pid is the child's.
        let at = Instant::now();
        Command::new("kill")
            .args(["-9", &launcher.to_string()])
            .status()
            .unwrap();
        let left = net.wait_for_no_leftovers(Duration::from_secs(10));
        seconds = at.elapsed().as_secs_f64();
        assert_eq!(left, [], "left running after the launcher was killed");
    });
    eprintln!("fault table: launcher SIGKILL: every rank gone in {seconds:.1} s");
}

#[test]
fn a_host_refusing_ssh_is_an_error_before_anything_runs() {
    let _one = NETWORK.lock();
    let Some(mut net) = network(4) else { return };
    net.stop_sshd(2);
    let started = Instant::now();
    let out = launch(
        &net,
        "rank_every_collective",
        4,
        Backend::Ring,
        &net.hosts(),
    )
    .output()
    .unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    let message = launcher_message(&all);
    assert!(
        message.starts_with(&format!(
            "safemlx-launch: host {} is not reachable over ssh, so nothing was started: ssh: ",
            net.address(2)
        )),
        "{message}"
    );
    assert!(!all.contains("[rank "), "a rank started:\n{all}");
    assert_eq!(net.leftovers(), []);
    eprintln!(
        "fault table: sshd refusing on host 2: error in {:.1} s: {message}",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn a_terminated_launcher_stops_every_host() {
    let _one = NETWORK.lock();
    let Some(net) = network(4) else { return };
    let (out, seconds) = fault_mid_run(&net, |_, launcher| {
        Command::new("kill")
            .args(["-TERM", &launcher.to_string()])
            .status()
            .unwrap();
    });
    let all = text(&out);
    assert_eq!(out.status.code(), Some(143), "{all}");
    assert!(
        all.contains("safemlx-launch: got signal 15 (SIGTERM); every rank was stopped"),
        "{all}"
    );
    assert_eq!(net.wait_for_no_leftovers(Duration::from_secs(5)), []);
    eprintln!("fault table: launcher SIGTERM: exit 143 after {seconds:.1} s, nothing left");
}
