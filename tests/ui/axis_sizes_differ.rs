// Arrays over axes of different sizes are different types.
use safemlx::Stream;
use safemlx_dist::typed::{Axis, Tp};
use safemlx_dist::{Replicated, ShardedArray};

fn mix(
    a: &ShardedArray<Replicated, Axis<Tp, 2>>,
    b: &ShardedArray<Replicated, Axis<Tp, 4>>,
    s: &Stream,
) {
    let _ = a.add(b, s);
}

fn main() {}
