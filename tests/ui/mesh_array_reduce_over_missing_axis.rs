// The array lies over dp and tp: there is no pp axis to reduce over.
use safemlx::Stream;
use safemlx_dist::typed::{Axis, Dp, MeshArray, Pp, Tp};
use safemlx_dist::{Partial, Replicated};

fn reduce(x: MeshArray<(Replicated, Partial), (Axis<Dp, 2>, Axis<Tp, 2>)>, s: &Stream) {
    let _ = x.all_sum_over(Pp, s);
}

fn main() {}
