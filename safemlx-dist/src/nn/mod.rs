//! Parallel layers, written with `#[sharded]` and the typed layer.
//!
//! Each layer is built on every rank from the full weights (`from_full`,
//! each rank keeping its part) and gives, through its forward, the same
//! numbers as the dense single-process layer (tested at 1, 2 and 4 ranks).

mod attention;
mod block;
mod linear;
mod mlp;
mod moe;

pub use attention::{AttentionWeights, ShardedAttention};
pub use block::{rms_norm, FeedForward, TransformerBlock, DEFAULT_EPS};
pub use linear::{ColumnParallelLinear, RowParallelLinear};
pub use mlp::SwiGluMlp;
pub use moe::{ExpertParallelMoe, MoeOutput, MoeWeights};
