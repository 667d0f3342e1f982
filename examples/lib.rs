//! Helpers shared by the example programs: command-line options, a CPU
//! stream, weights and checkpoints, timing, the `--check` report, and the
//! dense reference math (`dense`).

#[cfg(doctest)]
mod book;
pub mod dense;
pub mod layers;
pub mod loss_plot;
pub mod train_model;

use std::path::PathBuf;

use safemlx::{Array, Device, DeviceType, Stream};
use safemlx_dist::checkpoint::{save, SafetensorsFile};
use safemlx_dist::{all_sum, Backend, Group};

/// The exit status of an example: success, or its error on stderr
/// prefixed with the example's `name`.
pub fn exit(name: &str, result: Result<(), String>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            // One write: under mpirun every write is tagged as its own
            // line, so `eprintln!`'s pieces (name, ": ", message) would
            // arrive as three lines.
            use std::io::Write;
            let line = format!("{name}: {message}\n");
            let _ = std::io::stderr().write_all(line.as_bytes());
            std::process::ExitCode::FAILURE
        }
    }
}

/// A stream on the CPU device.
pub fn cpu_stream() -> Stream {
    Stream::new_with_device(&Device::new(DeviceType::Cpu, 0))
}

/// The backend from `--backend NAME` on the command line, else from
/// `SAFEMLX_DIST_BACKEND`, else `ring` (what `safemlx-launch` starts by default).
pub fn backend_from_args() -> Result<Backend, String> {
    let args: Vec<String> = std::env::args().collect();
    let from_flag = args
        .iter()
        .position(|a| a == "--backend")
        .map(|i| {
            args.get(i + 1)
                .cloned()
                .ok_or("--backend needs a value: any, ring, mpi, jaccl or nccl")
        })
        .transpose()?;
    let name = from_flag
        .or_else(|| std::env::var("SAFEMLX_DIST_BACKEND").ok())
        .unwrap_or_else(|| "ring".to_owned());
    name.parse().map_err(|e: safemlx_dist::Error| e.to_string())
}

/// An array's values as `f32` in logical (row-major) order, evaluated.
/// (`try_to_vec` reads the storage as it lies, which for a transposed or
/// sliced view is not the logical order: a row-contiguous copy first.)
pub fn values(array: &Array, stream: &Stream) -> Result<Vec<f32>, String> {
    let as_f32 = array
        .as_dtype(safemlx::Dtype::Float32, stream)
        .and_then(|a| a.contiguous(false, stream))
        .map_err(|e| e.what().to_owned())?;
    safemlx_dist::eval(&[&as_f32]).map_err(|e| e.to_string())?;
    let evaluated = as_f32.evaluated().map_err(|e| e.what().to_owned())?;
    evaluated.try_to_vec::<f32>().map_err(|e| e.to_string())
}

/// `shape [values]`, e.g. `[2, 2] [1, 2, 3, 4]`.
pub fn show(array: &Array, stream: &Stream) -> String {
    match values(array, stream) {
        Ok(v) => format!("{:?} {:?}", array.shape(), v),
        Err(e) => format!("<error: {e}>"),
    }
}

/// Pseudo-random weights, uniform in `[-scale, scale)`, the same for the
/// same `seed` on every rank and every run (splitmix64).
pub fn weights(shape: &[i32], seed: u64, scale: f32) -> Array {
    let len = shape.iter().product::<i32>() as usize;
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let values: Vec<f32> = (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect();
    Array::from_slice(&values, shape)
}

/// The value after `name` on the command line, if given.
pub fn flag(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// The checkpoint named by `--checkpoint PATH`; without one, a small
/// random checkpoint that rank 0 writes (`random()` gives its tensors) to
/// the temporary directory as `NAME.safetensors`. Every rank waits until
/// the file is complete, then opens it (reading only the header).
pub fn checkpoint(
    name: &str,
    group: &Group,
    random: impl FnOnce() -> Vec<(String, Array)>,
    stream: &Stream,
) -> Result<SafetensorsFile, String> {
    let path = match flag("--checkpoint") {
        Some(path) => PathBuf::from(path),
        None => {
            let path = std::env::temp_dir().join(format!("safemlx-dist-{name}.safetensors"));
            if group.rank() == 0 {
                save(&path, &random(), stream).map_err(|e| e.to_string())?;
                println!(
                    "rank 0: no --checkpoint given; wrote a random one to {}",
                    path.display()
                );
            }
            // A barrier: nobody opens the file before rank 0 has renamed it into place.
            let done = all_sum(&Array::from_f32(1.0), group, stream).map_err(|e| e.to_string())?;
            safemlx_dist::eval(&[&done]).map_err(|e| e.to_string())?;
            path
        }
    };
    SafetensorsFile::open(&path).map_err(|e| e.to_string())
}

/// With `--save PATH`: every rank gathers its weights (a collective, so all
/// take part) and rank 0 writes them to `PATH`, each name after `prefix`.
pub fn save_requested<N: AsRef<str>>(
    group: &Group,
    prefix: &str,
    gather: impl FnOnce() -> safemlx_dist::Result<Vec<(N, Array)>>,
    stream: &Stream,
) -> Result<(), String> {
    let Some(path) = flag("--save") else {
        return Ok(());
    };
    let gathered: Vec<(String, Array)> = gather()
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|(name, a)| (format!("{prefix}{}", name.as_ref()), a))
        .collect();
    if group.rank() == 0 {
        save(&path, &gathered, stream).map_err(|e| e.to_string())?;
        println!("rank 0: saved the gathered weights to {path}");
    }
    Ok(())
}

/// Whether `--check` was given.
pub fn check_requested() -> bool {
    std::env::args().any(|a| a == "--check")
}

/// Prints the `--check` line and fails above a relative error of 1e-4.
pub fn report_check(label: &str, got: &Array, want: &Array) -> Result<(), String> {
    let stream = cpu_stream();
    let read = |a: &Array| values(a, &stream);
    let (got, want) = (read(got)?, read(want)?);
    let (max_abs, rel) = compare(&got, &want)?;
    println!("{label}: --check against the dense computation: max abs error {max_abs:.3e}, max relative error {rel:.3e}");
    if rel > 1e-4 {
        return Err(format!("relative error {rel:.3e} is above 1e-4"));
    }
    Ok(())
}

/// The maximum absolute error of `got` against `want` and that error
/// relative to `want`'s largest magnitude; NaN or infinity on either side
/// is an error (see [`safemlx_dist::generate::check::compare_values`]).
pub fn compare(got: &[f32], want: &[f32]) -> Result<(f32, f32), String> {
    safemlx_dist::generate::check::compare_values(got, want)
}

/// Appends `lines` (JSON rows), one per line, to the file `path`, made if
/// missing: how the benchmarks write `target/bench/*.jsonl`.
///
/// # Errors
/// The file cannot be opened or written, naming it.
pub fn append_lines(path: &str, lines: &[impl std::fmt::Display]) -> Result<(), String> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot open {path}: {e}"))?;
    for line in lines {
        writeln!(file, "{line}").map_err(|e| format!("cannot write {path}: {e}"))?;
    }
    Ok(())
}

/// The median of `values` (the upper one of an even count; NaN when empty).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs `step` once to warm up, then `iters` times; the mean seconds.
pub fn time_steps(
    iters: usize,
    mut step: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    step()?;
    let started = std::time::Instant::now();
    for _ in 0..iters {
        step()?;
    }
    Ok(started.elapsed().as_secs_f64() / iters as f64)
}

/// One option of a program's command line: `--name`, its value's name
/// (`None` for a switch) and its help.
pub type Opt = (&'static str, Option<&'static str>, &'static str);

/// `--backend B`, which every program takes.
pub const BACKEND: Opt = (
    "--backend",
    Some("B"),
    "MLX's distributed backend: any, ring, mpi, jaccl or nccl [default: $SAFEMLX_DIST_BACKEND, or ring]",
);

/// The options of [`checkpoint`], [`save_requested`] and
/// [`check_requested`].
pub const CHECKPOINT: [Opt; 3] = [
    (
        "--checkpoint",
        Some("FILE"),
        "A safetensors checkpoint [default: a random one in the temporary directory]",
    ),
    (
        "--save",
        Some("FILE"),
        "Gather the weights and save them (rank 0 writes)",
    ),
    (
        "--check",
        None,
        "Compare with the dense computation in one process",
    ),
];

/// Checks this program's command line with clap against `options`
/// (`--help` prints them and exits 0; an unknown or mistyped flag, or a
/// missing value, is an error that names it and suggests the closest one,
/// exit 2). The values are then read with [`flag`].
pub fn command_line(name: &'static str, about: &'static str, options: &[Opt]) {
    let mut command = clap::Command::new(name).about(about);
    for &(long, value, help) in options {
        let id = long.trim_start_matches("--");
        let arg = clap::Arg::new(id).long(id).help(help);
        command = command.arg(match value {
            Some(value) => arg.value_name(value).action(clap::ArgAction::Set),
            None => arg.action(clap::ArgAction::SetTrue),
        });
    }
    command.get_matches();
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_check_sees_nan_and_infinity() {
        assert_eq!(super::compare(&[1.0, 2.5], &[1.0, 2.0]), Ok((0.5, 0.25)));
        assert_eq!(
            super::compare(&[f32::NAN, f32::NAN], &[1.0, 2.0]),
            Err("2 of 2 computed values are not finite (the first, at index 0, is NaN)".into())
        );
        assert_eq!(
            super::compare(&[1.0, 2.0], &[1.0, f32::INFINITY]),
            Err("1 of 2 expected values are not finite (the first, at index 1, is inf)".into())
        );
        assert!(super::compare(&[1.0], &[1.0, 2.0]).is_err());
    }
}
