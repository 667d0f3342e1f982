//! Collective benchmark: run as ranks by `cargo xtask bench collectives`.
//!
//! Every rank runs the same measurements; rank 0 appends one JSON line per
//! (op, size, strategy) to the file named by `--out`:
//! `{"op", "backend", "ranks", "bytes", "dtype", "strategy", "iters",
//!   "seconds_median", "busbw_gbps"}`. `bytes` is one rank's input; bus
//! bandwidth follows the NCCL tests' convention for each op.
//!
//! ```text
//! safemlx-launch -n 2 -- target/release/examples/bench --out target/bench/collectives.jsonl
//! ```

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use safemlx::{Array, Stream};
use safemlx_dist::{
    all_gather, all_sum, all_to_all_v, init, recv, send, sum_scatter, Group, Lowering,
};
use safemlx_dist_examples::{backend_from_args, cpu_stream};

/// 4 KiB to 64 MiB, in steps of 4x.
const SIZES: [usize; 8] = [
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
];

fn main() -> ExitCode {
    safemlx_dist_examples::exit("bench", run())
}

fn flag(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// One operation under test, built fresh each iteration.
type Op = fn(&Group, &Array, &Stream) -> safemlx_dist::Result<Vec<Array>>;

/// How an op's bus bandwidth relates to its algorithm bandwidth (the
/// conventions of NCCL's tests).
#[derive(Clone, Copy)]
enum Traffic {
    /// All-reduce: `2 (n - 1) / n`.
    AllReduce,
    /// Reduce-scatter, all-gather, all-to-all: `(n - 1) / n`.
    OneWay,
    /// Point-to-point: 1.
    PeerToPeer,
}

impl Traffic {
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Self::AllReduce => 2.0 * (n - 1.0) / n,
            Self::OneWay => (n - 1.0) / n,
            Self::PeerToPeer => 1.0,
        }
    }
}

fn ops() -> Vec<(&'static str, Op, Traffic)> {
    vec![
        (
            "all_sum",
            |g, x, s| Ok(vec![all_sum(x, g, s)?]),
            Traffic::AllReduce,
        ),
        (
            "sum_scatter",
            |g, x, s| Ok(vec![sum_scatter(x, g, s)?]),
            Traffic::OneWay,
        ),
        (
            "all_gather",
            |g, x, s| Ok(vec![all_gather(x, g, s)?]),
            Traffic::OneWay,
        ),
        (
            "all_to_all_v",
            |g, x, s| {
                let n = g.size();
                let rows = x.shape()[0] as usize;
                let counts = vec![rows / n; n];
                Ok(vec![all_to_all_v(x, &counts, &counts, g, s)?])
            },
            Traffic::OneWay,
        ),
        (
            "send_recv",
            |g, x, s| {
                // Even ranks send first, odd ranks receive first: an order
                // that pairs up on every backend (MPI included).
                let n = g.size();
                let (next, prev) = ((g.rank() + 1) % n, (g.rank() + n - 1) % n);
                let sent = send(x, next, g, s)?;
                let got = recv(x.shape(), x.dtype(), prev, g, s)?;
                let (first, second) = if g.rank() % 2 == 0 {
                    (sent, got)
                } else {
                    (got, sent)
                };
                safemlx_dist::eval(&[&first])?;
                safemlx_dist::eval(&[&second])?;
                Ok(vec![first, second])
            },
            Traffic::PeerToPeer,
        ),
    ]
}

fn run() -> Result<(), String> {
    safemlx_dist_examples::command_line(
        "bench",
        "Collective latency and bandwidth, JSON lines",
        &[
            safemlx_dist_examples::BACKEND,
            ("--out", Some("FILE"), "Append the JSON lines to FILE"),
            ("--max-bytes", Some("N"), "The largest message"),
        ],
    );
    let backend = backend_from_args()?;
    let out = flag("--out");
    let max_bytes = flag("--max-bytes")
        .map(|v| v.parse::<usize>().map_err(|e| format!("--max-bytes: {e}")))
        .transpose()?
        .unwrap_or(64 << 20);
    let world = init(true, backend).map_err(|e| e.to_string())?;
    let (rank, n) = (world.rank(), world.size());
    let s = cpu_stream();
    let mut file = match (&out, rank) {
        (Some(path), 0) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("cannot open {path}: {e}"))?,
        ),
        _ => None,
    };
    let strategies: [(&str, Lowering); 4] = [
        ("native", Lowering::Native),
        ("composed", Lowering::Composed),
        ("all_to_all", Lowering::AllToAll),
        ("auto", Lowering::Auto),
    ];
    for (op_name, op, traffic) in ops() {
        // Only these ops have more than one lowering.
        let has_strategies = matches!(op_name, "all_sum" | "sum_scatter");
        for &bytes in SIZES.iter().filter(|b| **b <= max_bytes) {
            // float32 rows of 1 KiB, so every op's counts divide.
            let rows = (bytes / 1024).max(n).next_multiple_of(n);
            let data: Vec<f32> = (0..rows * 256).map(|i| (i % 1000) as f32).collect();
            let x = Array::from_slice(&data, &[rows as i32, 256]);
            safemlx_dist::eval(&[&x]).map_err(|e| e.to_string())?;
            let iters = ((256usize << 20) / bytes).clamp(5, 40);
            for (strategy, lowering) in strategies
                .iter()
                .filter(|(name, _)| has_strategies || *name == "native")
            {
                let group = world.with_lowering(*lowering).map_err(|e| e.to_string())?;
                let mut times = Vec::with_capacity(iters);
                for i in 0..=iters {
                    let started = Instant::now();
                    let outputs = op(&group, &x, &s).map_err(|e| e.to_string())?;
                    let outputs: Vec<&Array> = outputs.iter().collect();
                    safemlx_dist::eval(&outputs).map_err(|e| e.to_string())?;
                    if i > 0 {
                        times.push(started.elapsed().as_secs_f64());
                    }
                }
                times.sort_by(f64::total_cmp);
                let median = times[times.len() / 2];
                let busbw = (rows * 1024) as f64 / median * traffic.bus_factor(n) / 1e9;
                if rank == 0 {
                    Measurement {
                        op: op_name,
                        backend,
                        ranks: n,
                        bytes: rows * 1024,
                        strategy,
                        iters,
                        median,
                        busbw,
                    }
                    .record(file.as_mut())?;
                }
            }
        }
    }
    typed_overhead(&world, backend, file.as_mut())?;
    Ok(())
}

/// One row of `collectives.jsonl`.
struct Measurement<'a> {
    op: &'a str,
    backend: safemlx_dist::Backend,
    ranks: usize,
    bytes: usize,
    strategy: &'a str,
    iters: usize,
    median: f64,
    busbw: f64,
}

impl Measurement<'_> {
    /// Appends the JSON line to `file` and prints a progress line, each in
    /// one write (mpirun tags every chunk it reads as a line of its own).
    fn record(&self, file: Option<&mut std::fs::File>) -> Result<(), String> {
        let Self {
            op,
            backend,
            ranks,
            bytes,
            strategy,
            iters,
            median,
            busbw,
        } = self;
        let progress = format!(
            "{op:>13} {backend} x{ranks} {:>9} {strategy:>8}: {:>10.4} ms  {busbw:>7.3} GB/s\n",
            human(*bytes),
            median * 1e3
        );
        std::io::stderr()
            .write_all(progress.as_bytes())
            .map_err(|e| e.to_string())?;
        if let Some(f) = file {
            let line = format!(
                r#"{{"op":"{op}","backend":"{backend}","ranks":{ranks},"bytes":{bytes},"dtype":"float32","strategy":"{strategy}","iters":{iters},"seconds_median":{median:.9},"busbw_gbps":{busbw:.4}}}"#
            );
            writeln!(f, "{line}").map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

fn human(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// Builds one lazy collective.
type Build<'a> = dyn Fn() -> Result<Array, String> + 'a;

/// `typed` vs `raw` rows: the same `all_sum` through the runtime call and
/// through `ShardedArray<Partial>::all_sum`, under the native (lazy)
/// lowering, at 4 KiB and 1 MiB. `all_sum` rows time building and
/// evaluating; `all_sum_build` rows time building the graph alone, which is
/// where the typed layer adds its work (shape bookkeeping, one clone of the
/// group handle).
fn typed_overhead(
    world: &Group,
    backend: safemlx_dist::Backend,
    mut file: Option<&mut std::fs::File>,
) -> Result<(), String> {
    use safemlx_dist::{Partial, ShardedArray};
    let s = cpu_stream();
    let group = world
        .with_lowering(Lowering::Native)
        .map_err(|e| e.to_string())?;
    let (rank, n) = (group.rank(), group.size());
    for bytes in [4usize << 10, 1 << 20] {
        let len = bytes / 4;
        let x = Array::from_slice(&vec![1.0f32; len], &[len as i32]);
        x.evaluated().map_err(|e| e.to_string())?;
        let raw = || all_sum(&x, &group, &s).map_err(|e| e.to_string());
        let typed = || {
            ShardedArray::<Partial>::from_local(x.clone(), &group, &[len as i32])
                .and_then(|p| p.all_sum(&s))
                .map(|r| r.into_local())
                .map_err(|e| e.to_string())
        };
        let variants: [(&str, &Build); 2] = [("raw", &raw), ("typed", &typed)];
        for (strategy, build) in variants {
            let iters = 20;
            let mut full = Vec::with_capacity(iters);
            for _ in 0..iters {
                let started = Instant::now();
                safemlx_dist::eval(&[&build()?]).map_err(|e| e.to_string())?;
                full.push(started.elapsed().as_secs_f64());
            }
            // Building alone: many lazy graphs, none evaluated.
            let mut build_only = Vec::with_capacity(200);
            for _ in 0..200 {
                let started = Instant::now();
                let built = build()?;
                build_only.push(started.elapsed().as_secs_f64());
                drop(built);
            }
            for (op, mut times, iters) in
                [("all_sum", full, iters), ("all_sum_build", build_only, 200)]
            {
                times.sort_by(f64::total_cmp);
                let median = times[times.len() / 2];
                if rank == 0 {
                    Measurement {
                        op,
                        backend,
                        ranks: n,
                        bytes,
                        strategy,
                        iters,
                        median,
                        busbw: bytes as f64 / median / 1e9,
                    }
                    .record(file.as_deref_mut())?;
                }
            }
        }
    }
    Ok(())
}
