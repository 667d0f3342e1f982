// Along tp, column-sharded activations times column-sharded weights has
// no placement (the inner dimension is split on one side only).
use safemlx::Stream;
use safemlx_dist::typed::{Axis, Dp, MeshArray, Tp};
use safemlx_dist::{Replicated, Sharded};

type Axes = (Axis<Dp, 2>, Axis<Tp, 2>);

fn project(
    h: &MeshArray<(Sharded<0>, Sharded<1>), Axes>,
    w: &MeshArray<(Replicated, Sharded<1>), Axes>,
    s: &Stream,
) {
    let _ = h.matmul(w, s);
}

fn main() {}
