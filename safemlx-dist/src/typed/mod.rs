//! The typed layer: placements as types.
//!
//! A [`ShardedArray<P, C>`] is a rank's local array together with its group
//! `C` and the logical shape; `P` says how the local array relates to the
//! logical one. Transitions between placements lower to collectives
//! ([`ShardedArray::redistribute`]); ops propagate placements by the tables
//! in `ops.rs`, and what has no rule does not compile.

mod axis;
pub(crate) mod collective;
mod linear;
mod mesh;
mod mesh_array;
mod mesh_array_ops;
mod mesh_axes;
mod ops;
mod placement;
mod quantized;
mod redistribute;
mod routing;
mod shard_map;
mod sharded;
mod stage_link;
pub(crate) mod weights;
mod wide_sum;

pub use axis::{Axis, AxisName, Dp, Ep, Pp, SameAxis, Tp};
pub use collective::Collective;
pub use linear::{BiasRule, LinearRule, LinearWeight};
pub use mesh::Mesh;
pub use mesh_array::{
    AllReplicated, AxisAt, AxisPlacement, AxisSet, First, IsPartial, MeshArray, MeshPlacement,
    NoPartial, PlacementAt, Position, Second, Third,
};
pub use mesh_array_ops::{MeshMatmul, MeshMul, MeshSum};
pub use mesh_axes::{MeshAxes, MeshSpec};
pub use ops::{
    MatmulRule, MulRule, NoRule, Operand, SamePlacement, SoftmaxAlong, SumRule, TransposeRule,
};
pub use placement::{
    chunk, chunk_lengths, split_part, weighted_lengths, Nonlinear, Partial, Placement, Ragged,
    Replicated, Sharded,
};
pub(crate) use quantized::quantized_part;
pub use quantized::{checkpoint_tensors, QuantizedArray, QuantizedMatmulRule, QuantizedPlacement};
pub use redistribute::RedistributeTo;
pub use routing::{Routable, RoutingPlan};
pub use shard_map::{partial_map, shard_map};
pub use sharded::ShardedArray;
pub use stage_link::{StageLink, StageMessage};
pub use weights::{check_weight_dims, gather_weight, shard_weight, Dim, Dims, FieldLayout};
pub(crate) use wide_sum::wide_sum_of;
