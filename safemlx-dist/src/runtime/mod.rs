//! The safe runtime layer: backends, groups and collectives, with every
//! argument validated before native code (`spec/runtime.md`).

mod admission;
mod backend;
mod backend_env;
mod chain;
mod collectives;
mod composed;
pub(crate) mod contract;
mod deadline;
mod eval;
mod exchange;
mod gradient_rules;
mod gradient_sum;
mod group;
mod join;
mod launcher_watch;
mod lowering;
mod mesh;
mod native;
mod p2p_streams;
mod path;
mod profile;
mod progress;
mod relay;
mod slicing;
mod validate;

pub(crate) use admission::hex;
pub use admission::new_token;
pub use backend::{is_available, Backend};
pub(crate) use backend_env::restore_for_child;
pub use collectives::{
    all_gather, all_max, all_min, all_sum, all_to_all_v, recv, recv_like, send, sum_scatter,
};
pub use contract::{
    BACKEND_ENV, DEFAULT_TIMEOUT, JOIN_TIMEOUT_ENV, LAUNCHER_ENV, MIN_JOIN_TIMEOUT,
    PROGRESS_DIR_ENV, TIMEOUT_ENV, TIMEOUT_EXIT, TOKEN_ENV,
};
pub use eval::eval;
pub(crate) use eval::read_back;
pub use gradient_sum::{is_tracing, sum_gradients};
pub(crate) use gradient_sum::{sum_gradients_together, SharedSlots, Tracing};
pub use group::Group;
pub use join::init;
pub use launcher_watch::stop_reason;
pub(crate) use launcher_watch::this_launcher;
pub use lowering::{Lowering, LOWERING_ENV};
pub use mesh::{mesh_coords, DeviceMesh};
pub(crate) use native::take_vjp_error;
pub(crate) use native::{bitwise_and, right_shift};
pub use profile::{CollectiveProfile, CollectiveTime};
pub use progress::on_timeout;
pub use progress::timeout_from_env as collective_timeout;
pub(crate) use slicing::slice_axis;
