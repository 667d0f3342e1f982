// The partial sums are over tp; summing over dp (where the array is
// replicated) would count each value twice.
use safemlx::Stream;
use safemlx_dist::typed::{Axis, Dp, MeshArray, Tp};
use safemlx_dist::{Partial, Replicated};

fn reduce(x: MeshArray<(Replicated, Partial), (Axis<Dp, 2>, Axis<Tp, 2>)>, s: &Stream) {
    let _ = x.all_sum_over(Dp, s);
}

fn main() {}
