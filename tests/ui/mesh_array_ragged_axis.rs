// Ragged rows belong to one axis's routing; they are not one axis's
// placement of a mesh array.
use safemlx_dist::typed::{Axis, Dp, MeshArray, Tp};
use safemlx_dist::{Ragged, Replicated};

fn rows(x: &MeshArray<(Ragged, Replicated), (Axis<Dp, 2>, Axis<Tp, 2>)>) {
    let _ = x.local();
}

fn main() {}
