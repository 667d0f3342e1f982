//! Subgroup collective latency: run as ranks by `cargo xtask bench mesh`.
//!
//! On a mesh of axes `pp` x `tp` over the world group, every rank times
//! `all_sum` of small and medium messages on the world group and on its
//! subgroup along each axis (all subgroups of an axis at once); rank 0
//! appends one JSON line per (group, size) to `--out`:
//! `{"bench": "mesh", "backend", "ranks", "mesh", "group", "route",
//!   "members", "bytes", "iters", "us_median"}`. `route` says how the group
//! carries collectives: `mlx` (MLX's own group: the world, or an MPI
//! split), `chain` (ring neighbours, `send`/`recv`) or `relay` (the
//! world's `all_to_all_v`).
//!
//! ```text
//! safemlx-launch -n 4 -- target/release/examples/bench_mesh --mesh pp=2,tp=2 --out target/bench/mesh.jsonl
//! ```

use std::process::ExitCode;
use std::time::Instant;

use safemlx::Array;
use safemlx_dist::typed::MeshSpec;
use safemlx_dist::{all_sum, init, DeviceMesh, Group};
use safemlx_dist_examples::{backend_from_args, cpu_stream, flag, median};

/// 4 KiB (a decode step's row) and 256 KiB (a prefill chunk's rows).
const SIZES: [usize; 2] = [4 << 10, 256 << 10];
const ITERS: usize = 50;

fn main() -> ExitCode {
    safemlx_dist_examples::exit("bench_mesh", run())
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Median microseconds of one `all_sum` of `bytes` on `group`, each
/// evaluated alone, after warm-up.
fn time_all_sum(group: &Group, bytes: usize) -> Result<f64, String> {
    let s = cpu_stream();
    let x = Array::from_slice(&vec![1.0f32; bytes / 4], &[(bytes / 4) as i32]);
    safemlx_dist::eval(&[&x]).map_err(err)?;
    let mut times = Vec::with_capacity(ITERS);
    for i in 0..ITERS + 5 {
        let started = Instant::now();
        let y = all_sum(&x, group, &s).map_err(err)?;
        safemlx_dist::eval(&[&y]).map_err(err)?;
        if i >= 5 {
            times.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(median(times))
}

fn run() -> Result<(), String> {
    safemlx_dist_examples::command_line(
        "bench_mesh",
        "Times all_sum on the world group and on each mesh axis's subgroup",
        &[
            safemlx_dist_examples::BACKEND,
            ("--mesh", Some("pp=P,tp=T"), "The mesh's axes"),
            ("--out", Some("FILE"), "Append the JSON lines to FILE"),
        ],
    );
    let backend = backend_from_args()?;
    let world = init(true, backend).map_err(err)?;
    let spec: MeshSpec = match flag("--mesh") {
        Some(m) => m.parse().map_err(err)?,
        None => MeshSpec::default(),
    };
    let axes = spec.resolve(world.size()).map_err(err)?;
    let mesh = DeviceMesh::new(&world, &[("pp", axes.pp), ("tp", axes.tp)]).map_err(err)?;
    let mut lines = Vec::new();
    for (name, group) in [
        ("world", &world),
        ("pp", mesh.axis("pp").map_err(err)?),
        ("tp", mesh.axis("tp").map_err(err)?),
    ] {
        if group.size() == 1 {
            continue;
        }
        for bytes in SIZES {
            let us = time_all_sum(group, bytes)?;
            lines.push(serde_json::json!({
                "bench": "mesh",
                "backend": format!("{backend}"),
                "ranks": world.size(),
                "mesh": format!("{mesh}"),
                "group": name,
                "route": group.route(),
                "members": group.size(),
                "bytes": bytes,
                "iters": ITERS,
                "us_median": us,
            }));
        }
    }
    if world.rank() == 0 {
        for line in &lines {
            println!("{line}");
        }
        if let Some(path) = flag("--out") {
            safemlx_dist_examples::append_lines(&path, &lines)?;
        }
    }
    Ok(())
}
