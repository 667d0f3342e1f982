//! `cargo xtask bench mesh`: `all_sum` latency (4 KiB and 256 KiB) on the
//! world group and on each mesh axis's subgroup, on ring (a chain of
//! neighbours; `2 x 3`'s relayed first axis) and MPI (MLX's split), beside
//! each other. JSON lines in `target/bench/mesh.jsonl`. Runs of more than
//! 2 ranks share the machine's 2 cores: no target, the figures show the
//! routes' relative costs.

use serde_json::Value;

use super::{finish, launch, prepare};

/// (ranks, backend, mesh).
const RUNS: [(&str, &str, &str); 5] = [
    ("2", "ring", "pp=1,tp=2"),
    ("4", "ring", "pp=2,tp=2"),
    ("6", "ring", "pp=2,tp=3"),
    ("2", "mpi", "pp=1,tp=2"),
    ("4", "mpi", "pp=2,tp=2"),
];

pub fn run() -> Result<(), String> {
    let (release, out) = prepare("mesh.jsonl")?;
    for (ranks, backend, mesh) in RUNS {
        launch(
            &release,
            (ranks, backend),
            "bench_mesh",
            &["--mesh", mesh],
            &out,
        )?;
    }
    report(&finish(&out)?);
    Ok(())
}

fn report(rows: &[Value]) {
    println!("| backend | mesh | group | route | members | 4 KiB us | 256 KiB us |");
    println!("|---|---|---|---|---|---|---|");
    let text = |r: &Value, key: &str| r[key].as_str().unwrap_or("?").to_owned();
    let mut seen: Vec<(String, String, String)> = Vec::new();
    for r in rows {
        let key = (text(r, "backend"), text(r, "mesh"), text(r, "group"));
        if seen.contains(&key) {
            continue;
        }
        let us = |bytes: u64| {
            rows.iter()
                .find(|q| {
                    (text(q, "backend"), text(q, "mesh"), text(q, "group")) == key
                        && q["bytes"].as_u64() == Some(bytes)
                })
                .and_then(|q| q["us_median"].as_f64())
                .map_or("-".to_owned(), |v| format!("{v:.0}"))
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            key.0,
            key.1,
            key.2,
            text(r, "route"),
            r["members"].as_u64().unwrap_or(0),
            us(4 << 10),
            us(256 << 10)
        );
        seen.push(key);
    }
}
