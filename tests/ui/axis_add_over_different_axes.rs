// An array over the tensor-parallel axis and one over the data-parallel
// axis hold different things on each rank; they do not add.
use safemlx::Stream;
use safemlx_dist::typed::{Axis, Dp, Tp};
use safemlx_dist::{Replicated, ShardedArray};

fn mix(
    a: &ShardedArray<Replicated, Axis<Tp, 2>>,
    b: &ShardedArray<Replicated, Axis<Dp, 2>>,
    s: &Stream,
) {
    let _ = a.add(b, s);
}

fn main() {}
