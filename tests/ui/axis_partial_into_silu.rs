// A partial sum over one axis is not the activation until it is reduced
// over that axis: silu of a partial sum is not the sum of the silus.
use safemlx::Stream;
use safemlx_dist::typed::{Axis, Tp};
use safemlx_dist::{Partial, ShardedArray};

fn activate(x: &ShardedArray<Partial, Axis<Tp, 2>>, s: &Stream) {
    let _ = x.silu(s);
}

fn main() {}
