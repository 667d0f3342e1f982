// A partial sum over tp is not the activation, whatever the other axis
// holds: silu needs every axis reduced.
use safemlx::Stream;
use safemlx_dist::typed::{Axis, Dp, MeshArray, Tp};
use safemlx_dist::{Partial, Sharded};

fn activate(x: &MeshArray<(Sharded<0>, Partial), (Axis<Dp, 2>, Axis<Tp, 2>)>, s: &Stream) {
    let _ = x.silu(s);
}

fn main() {}
