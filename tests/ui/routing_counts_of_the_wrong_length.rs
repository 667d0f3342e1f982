use safemlx::Stream;
use safemlx_dist::typed::RoutingPlan;
use safemlx_dist::Mesh;

// On a Mesh<4>, a routing plan takes exactly 4 per-destination counts.
fn plan(mesh: &Mesh<4>, s: &Stream) {
    let _ = RoutingPlan::exchange(mesh, &[3, 1, 0], s);
}

fn main() {}
