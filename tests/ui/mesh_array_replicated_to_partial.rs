// Redistribution per axis follows the single-axis rules: no rule turns a
// replicated axis into partial sums.
use safemlx::Stream;
use safemlx_dist::typed::{Axis, Dp, MeshArray, Tp};
use safemlx_dist::{Partial, Replicated, Sharded};

fn shard(x: MeshArray<(Sharded<0>, Replicated), (Axis<Dp, 2>, Axis<Tp, 2>)>, s: &Stream) {
    let _ = x.redistribute_over(Tp, Partial, s);
}

fn main() {}
