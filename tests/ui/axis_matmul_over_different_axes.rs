// Column-parallel weights over the tensor-parallel axis take activations
// over that axis, not a data-parallel replica's array.
use safemlx::Stream;
use safemlx_dist::typed::{Axis, Dp, Tp};
use safemlx_dist::{Replicated, Sharded, ShardedArray};

fn project(
    x: &ShardedArray<Replicated, Axis<Dp, 2>>,
    w: &ShardedArray<Sharded<1>, Axis<Tp, 2>>,
    s: &Stream,
) {
    let _ = x.matmul(w, s);
}

fn main() {}
