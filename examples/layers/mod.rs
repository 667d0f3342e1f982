//! The `#[sharded]` attribute's demonstration layers: tensor-parallel
//! linear layers (float and quantized), a SwiGLU MLP, multi-head attention
//! and a transformer block, each declared with `#[sharded]` and built from
//! the full weights or a checkpoint. The models in `safemlx_dist::nn` are
//! written without the attribute (their splits follow heads and
//! quantization groups); these layers show the attribute on small models
//! and back the `tp_mlp`, `transformer_block` and `bench_layers` examples.

mod attention;
mod block;
mod linear;
mod quantized;
mod swiglu;

pub use attention::{AttentionWeights, ShardedAttention};
pub use block::{rms_norm, FeedForward, TransformerBlock, DEFAULT_EPS};
pub use linear::{ColumnParallelLinear, RowParallelLinear};
pub use quantized::{QuantizedColumnParallelLinear, QuantizedRowParallelLinear};
pub use swiglu::SwiGluMlp;
