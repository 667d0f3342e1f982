//! Every collective on small arrays, printed per rank.
//!
//! Runs as one process (a singleton group: each collective returns its
//! input) or as N ranks, e.g. through the ring backend's launcher. The group
//! is initialised non-strictly, so a missing peer configuration falls back
//! to a single rank instead of failing.
//!
//! ```text
//! cargo run --release -p safemlx-dist-examples --example collectives [-- --backend ring|mpi|any]
//! ```

use std::process::ExitCode;

use safemlx::{Array, Dtype};
use safemlx_dist::{
    all_gather, all_max, all_min, all_sum, all_to_all_v, init, recv, recv_like, send, sum_scatter,
};
use safemlx_dist_examples::{backend_from_args, cpu_stream, show};

fn main() -> ExitCode {
    safemlx_dist_examples::exit("collectives", run())
}

fn run() -> Result<(), String> {
    safemlx_dist_examples::command_line("collectives", "Every collective on this group of ranks, with its inputs and outputs: safemlx-launch -n N -- collectives", &[safemlx_dist_examples::BACKEND]);
    let backend = backend_from_args()?;
    let stream = cpu_stream();
    let group = init(false, backend).map_err(|e| e.to_string())?;
    let (rank, size) = (group.rank(), group.size());
    let say = |line: String| println!("rank {rank}/{size}: {line}");
    say(format!("group {group:?} on backend {backend}"));

    // [r*10 + 0, r*10 + 1, ...], `2 * size` values so sum_scatter divides.
    let n = 2 * size;
    let data: Vec<f32> = (0..n).map(|i| (rank * 10 + i) as f32).collect();
    let x = Array::from_slice(&data, &[n as i32]);
    say(format!("input x = {}", show(&x, &stream)));

    type Op = fn(&Array, &safemlx_dist::Group, &safemlx::Stream) -> safemlx_dist::Result<Array>;
    let reductions: [(&str, Op); 5] = [
        ("all_sum", |x, g, s| all_sum(x, g, s)),
        ("all_max", |x, g, s| all_max(x, g, s)),
        ("all_min", |x, g, s| all_min(x, g, s)),
        ("all_gather", |x, g, s| all_gather(x, g, s)),
        ("sum_scatter", |x, g, s| sum_scatter(x, g, s)),
    ];
    for (name, op) in reductions {
        let shown = match op(&x, &group, &stream) {
            Ok(y) => show(&y, &stream),
            Err(e) => format!("<error: {e}>"),
        };
        say(format!("{name}(x) = {shown}"));
    }

    // all_to_all_v: rank r sends (r + d) % 3 rows to rank d, so it receives
    // (s + r) % 3 rows from rank s; rows carry [sender, destination].
    let send_counts: Vec<usize> = (0..size).map(|d| (rank + d) % 3).collect();
    let recv_counts: Vec<usize> = (0..size).map(|s| (s + rank) % 3).collect();
    let rows: Vec<f32> = send_counts
        .iter()
        .enumerate()
        .flat_map(|(d, &c)| std::iter::repeat_n([rank as f32, d as f32], c).flatten())
        .collect();
    let total: usize = send_counts.iter().sum();
    let routed = Array::from_slice(&rows, &[total as i32, 2]);
    let exchanged = all_to_all_v(&routed, &send_counts, &recv_counts, &group, &stream)
        .map(|y| show(&y, &stream))
        .unwrap_or_else(|e| format!("<error: {e}>"));
    say(format!(
        "all_to_all_v(send {send_counts:?}, recv {recv_counts:?}) of {} = {exchanged}",
        show(&routed, &stream)
    ));

    // send / recv around the ring: to the next rank, from the previous one.
    // Sends and receives each get a stream of their own: a receive blocks its
    // stream until the data arrives, so nothing a send needs may queue behind it.
    if size > 1 {
        let (send_stream, recv_stream) = (cpu_stream(), cpu_stream());
        let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
        let sent = send(&x, next, &group, &send_stream).map_err(|e| e.to_string())?;
        let got = recv(&[n as i32], Dtype::Float32, prev, &group, &recv_stream)
            .map_err(|e| e.to_string())?;
        safemlx::transforms::eval([&sent, &got]).map_err(|e| e.what().to_owned())?;
        say(format!(
            "send(x) to {next}; recv from {prev} = {}",
            show(&got, &stream)
        ));
        let sent = send(&x, next, &group, &send_stream).map_err(|e| e.to_string())?;
        let got = recv_like(&x, prev, &group, &recv_stream).map_err(|e| e.to_string())?;
        safemlx::transforms::eval([&sent, &got]).map_err(|e| e.what().to_owned())?;
        say(format!(
            "recv_like(x) from {prev} = {}",
            show(&got, &stream)
        ));
    } else {
        say("send/recv need two ranks or more: skipped on a singleton".to_owned());
    }
    Ok(())
}
