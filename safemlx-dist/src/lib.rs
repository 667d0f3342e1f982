//! Typed tensor and expert parallelism on MLX.
//!
//! `safemlx-dist` runs collectives between real processes on MLX's own
//! distributed backends (ring over TCP, MPI, NCCL, JACCL) and checks every
//! argument before native code runs, with errors that name the values and
//! the fix. See the book in `book/` for the guide.
//!
//! ```
//! use safemlx::{Array, Device, DeviceType, Stream};
//! use safemlx_dist::{all_sum, init, Backend};
//!
//! let stream = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));
//! // Non-strict: without peers this is a one-rank group.
//! let group = init(false, Backend::Any)?;
//! let x = Array::from_slice(&[1.0f32, 2.0], &[2]);
//! let total = all_sum(&x, &group, &stream)?;
//! let expected: Vec<f32> = [1.0, 2.0].iter().map(|v| v * group.size() as f32).collect();
//! assert_eq!(total.evaluated()?.try_to_vec::<f32>().unwrap(), expected);
//! # Ok::<(), safemlx_dist::Error>(())
//! ```

#![warn(missing_docs)]
// Without the `launcher` feature (default-features = false: a program that
// only runs as a rank), the launcher's side of the launcher/rank contract
// (`runtime/contract.rs`: the record parser, the heartbeat reader, the
// secret's generator) is compiled but has no caller.
#![cfg_attr(not(feature = "launcher"), allow(dead_code, unused_imports))]

// `#[sharded]` expands to `::safemlx_dist::...` paths; this makes them
// resolve inside the crate too (the parallel layers use the attribute).
extern crate self as safemlx_dist;

pub mod affine;
pub mod checkpoint;
mod error;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod fmaf;
pub mod generate;
pub mod grad;
#[cfg(feature = "launcher")]
pub mod launch;
pub mod models;
pub mod nn;
pub mod optim;
pub mod packing;
mod runtime;
pub mod tiktoken;
pub mod tokenizer;
pub mod train;
pub mod typed;

/// What `#[sharded]` expands to calls; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::typed::{
        check_weight_dims, checkpoint_tensors, gather_weight, shard_weight, Dim, Dims,
    };
}

/// Declares a layer's weight layout; see the book's "#[sharded]" chapter.
pub use safemlx_dist_macros::sharded;

pub use error::{AllToAllVError, Error, PeerRole, Result};
pub use runtime::{
    all_gather, all_max, all_min, all_sum, all_to_all_v, collective_timeout, eval, init,
    is_available, mesh_coords, on_timeout, recv, recv_like, send, stop_reason, sum_scatter,
    Backend, CollectiveProfile, CollectiveTime, DeviceMesh, Group, Lowering, DEFAULT_TIMEOUT,
    JOIN_TIMEOUT_ENV, LOWERING_ENV, MIN_JOIN_TIMEOUT, PROGRESS_DIR_ENV, TIMEOUT_ENV, TIMEOUT_EXIT,
    TOKEN_ENV,
};
pub use typed::{
    Collective, Mesh, Partial, Placement, QuantizedArray, Ragged, Replicated, Sharded, ShardedArray,
};
