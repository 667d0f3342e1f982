//! `cargo xtask bench collectives`: every collective, ring and MPI, 2 and 4
//! ranks, 4 KiB to 64 MiB, each lowering; JSON lines in
//! `target/bench/collectives.jsonl`, then the targets' ratios.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{finish, launch, prepare};

pub fn run() -> Result<(), String> {
    let (release, out) = prepare("collectives.jsonl")?;
    for backend in ["ring", "mpi"] {
        for ranks in ["2", "4"] {
            launch(&release, (ranks, backend), "bench", &[], &out)?;
        }
    }
    report(&finish(&out)?);
    Ok(())
}

/// (op, backend, ranks, bytes) -> strategy -> median seconds.
type Table = BTreeMap<(String, String, u64, u64), BTreeMap<String, f64>>;

fn table(rows: &[Value]) -> Table {
    let mut table = Table::new();
    for row in rows {
        let key = (
            row["op"].as_str().unwrap_or_default().to_owned(),
            row["backend"].as_str().unwrap_or_default().to_owned(),
            row["ranks"].as_u64().unwrap_or_default(),
            row["bytes"].as_u64().unwrap_or_default(),
        );
        let strategy = row["strategy"].as_str().unwrap_or_default().to_owned();
        let seconds = row["seconds_median"].as_f64().unwrap_or(f64::NAN);
        table.entry(key).or_default().insert(strategy, seconds);
    }
    table
}

fn report(rows: &[Value]) {
    let table = table(rows);
    let time = |op: &str, backend: &str, ranks: u64, bytes: u64, strategy: &str| {
        table
            .get(&(op.to_owned(), backend.to_owned(), ranks, bytes))
            .and_then(|s| s.get(strategy))
            .copied()
    };
    let mib = 1 << 20;
    if let (Some(native), Some(auto)) = (
        time("all_sum", "ring", 2, mib, "native"),
        time("all_sum", "ring", 2, mib, "auto"),
    ) {
        println!(
            "target: ring x2 all_sum 1 MiB, auto vs native: {:.2}x faster (goal >= 4x)",
            native / auto
        );
    }
    for backend in ["ring", "mpi"] {
        if let (Some(slice), Some(auto)) = (
            time("sum_scatter", backend, 2, 16 * mib, "native"),
            time("sum_scatter", backend, 2, 16 * mib, "auto"),
        ) {
            println!(
                "target: {backend} x2 sum_scatter 16 MiB, auto vs all_sum + slice: {:.2}x the throughput (goal {})",
                slice / auto,
                if backend == "ring" { ">= 1.5x" } else { ">= 1x" }
            );
        }
    }
    for backend in ["ring", "mpi"] {
        if let (Some(raw), Some(typed)) = (
            time("all_sum", backend, 2, mib, "raw"),
            time("all_sum", backend, 2, mib, "typed"),
        ) {
            println!(
                "target: {backend} x2 all_sum 1 MiB, typed over raw: {:+.1}% (goal <= 2%)",
                (typed / raw - 1.0) * 100.0
            );
        }
        if let (Some(raw), Some(typed)) = (
            time("all_sum_build", backend, 2, 4096, "raw"),
            time("all_sum_build", backend, 2, 4096, "typed"),
        ) {
            println!(
                "target: {backend} x2 all_sum 4 KiB, typed adds {:.2} us per operation to building the graph (goal <= 5 us)",
                (typed - raw) * 1e6
            );
        }
    }
    // `auto` against the best strategy, over the ops that have strategies.
    let worst = table
        .iter()
        .filter_map(|(key, strategies)| {
            let auto = strategies.get("auto")?;
            let best = strategies.values().copied().fold(f64::INFINITY, f64::min);
            Some((auto / best, key))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((ratio, (op, backend, ranks, bytes))) = worst {
        println!(
            "target: auto's worst case is {:.0}% slower than the best strategy ({op}, {backend} x{ranks}, {bytes} bytes; goal <= 10%)",
            (ratio - 1.0) * 100.0
        );
    }
}
