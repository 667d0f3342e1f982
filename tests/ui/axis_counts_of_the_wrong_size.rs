// On an expert axis of 2 ranks a routing plan takes exactly 2
// per-destination counts, not one per rank of the whole mesh.
use safemlx::Stream;
use safemlx_dist::typed::{Axis, Ep, RoutingPlan};

fn plan(ep: &Axis<Ep, 2>, s: &Stream) {
    let _ = RoutingPlan::exchange(ep, &[3, 1, 0, 2], s);
}

fn main() {}
