// Partial sums over dp times partial sums over dp: the product of two
// sums is not the sum of the products.
use safemlx::Stream;
use safemlx_dist::typed::{Axis, Dp, MeshArray, Tp};
use safemlx_dist::{Partial, Replicated};

type Axes = (Axis<Dp, 2>, Axis<Tp, 2>);

fn square(x: &MeshArray<(Partial, Replicated), Axes>, s: &Stream) {
    let _ = x.mul(x, s);
}

fn main() {}
