//! Helpers shared by the example programs: command-line options, a CPU
//! stream, and printing arrays.

use safemlx::{Array, Device, DeviceType, Stream};
use safemlx_dist::Backend;

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

/// An array's values as `f32`, evaluated, for printing.
pub fn values(array: &Array, stream: &Stream) -> Result<Vec<f32>, String> {
    let as_f32 = array
        .as_dtype(safemlx::Dtype::Float32, stream)
        .map_err(|e| e.what().to_owned())?;
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
