// An axis is named by a marker type implementing `AxisName`.
use safemlx_dist::typed::Axis;
use safemlx_dist::DeviceMesh;

fn axis(mesh: &DeviceMesh) {
    let _ = Axis::<String, 2>::of(mesh);
}

fn main() {}
