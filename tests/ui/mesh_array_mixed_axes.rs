// Arrays over dp x tp and over pp x tp do not combine.
use safemlx::Stream;
use safemlx_dist::typed::{Axis, Dp, MeshArray, Pp, Tp};
use safemlx_dist::Replicated;

fn add(
    a: &MeshArray<(Replicated, Replicated), (Axis<Dp, 2>, Axis<Tp, 2>)>,
    b: &MeshArray<(Replicated, Replicated), (Axis<Pp, 2>, Axis<Tp, 2>)>,
    s: &Stream,
) {
    let _ = a.add(b, s);
}

fn main() {}
