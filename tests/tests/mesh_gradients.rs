//! Gradients through the collectives of a mesh axis, on the `tp` axis of
//! a `2 x 2` mesh: under MPI (split groups: MLX's own rules) and on ring
//! (chains of send/recv: our rules), each equals MLX's rule computed here
//! from the members' values: a sum passes the gradient through, a maximum
//! sends it to the elements that are the maximum (split between the ranks
//! that tie), a gather gives each rank its rows of the output's, a
//! reduce-scatter every rank's part, and `all_to_all_v`'s gradient goes
//! back the way the rows came.

use safemlx::{Array, Stream};
use safemlx_dist::grad::value_and_grad;
use safemlx_dist::launch::Ranks;
use safemlx_dist::{
    all_gather, all_max, all_sum, all_to_all_v, sum_scatter, Backend, DeviceMesh, Group,
    ShardedArray,
};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::host;

/// Six values of member `q` of stage `p`'s subgroup; element 0 is the same
/// on both members (a tie), the others differ.
fn values(p: usize, q: usize, salt: f32) -> Vec<f32> {
    (0..6)
        .map(|i| match i {
            0 => 5.0,
            _ => salt + (10 * p + 3 * q) as f32 + (i as f32) * if q == 0 { 1.0 } else { -1.0 },
        })
        .collect()
}

/// d/dx of sum(w * collective(x)), `w` of the collective's output shape.
fn gradient(
    x: &[f32],
    x_shape: &[i32],
    w: &[f32],
    w_shape: &[i32],
    collective: impl Fn(&Array) -> safemlx_dist::Result<Array>,
    s: &Stream,
) -> safemlx_dist::Result<Vec<f32>> {
    let weights = Array::from_slice(w, w_shape);
    let (_, grads) = value_and_grad(&[Array::from_slice(x, x_shape)], |a| {
        let y = collective(&a[0])?.multiply(&weights, s)?.sum(None, s)?;
        Ok(ShardedArray::replicated(y, &Group::local()))
    })?;
    Ok(host(&grads[0], s))
}

fn check(world: &Group) {
    let s = cpu();
    let mesh = DeviceMesh::new(world, &[("pp", 2), ("tp", 2)]).unwrap();
    let tp = mesh.axis("tp").unwrap();
    let (p, q) = (mesh.coord("pp").unwrap(), tp.rank());
    let what = format!("{}, world rank {}", world.backend(), world.rank());
    let x = values(p, q, 0.0);
    let w_of = |q: usize| values(p, q, 100.0);
    // all_sum: the gradient passes through.
    let g = gradient(&x, &[2, 3], &w_of(q), &[2, 3], |a| all_sum(a, tp, &s), &s).unwrap();
    assert_eq!(g, w_of(q), "all_sum, {what}");
    // all_max: to the maximum's elements, half each on the tie.
    let other = values(p, 1 - q, 0.0);
    let g = gradient(&x, &[2, 3], &w_of(q), &[2, 3], |a| all_max(a, tp, &s), &s).unwrap();
    let want: Vec<f32> = (0..6)
        .map(|i| match (i, x[i] > other[i]) {
            (0, _) => w_of(q)[0] / 2.0,
            (_, true) => w_of(q)[i],
            (_, false) => 0.0,
        })
        .collect();
    assert_eq!(g, want, "all_max, {what}");
    // all_gather: this rank's rows of the output's gradient.
    let w: Vec<f32> = (0..12).map(|i| i as f32 + 0.5).collect();
    let g = gradient(&x, &[2, 3], &w, &[4, 3], |a| all_gather(a, tp, &s), &s).unwrap();
    assert_eq!(g, w[6 * q..6 * q + 6], "all_gather, {what}");
    // sum_scatter: every rank's part of the output's gradient.
    let x4: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let g = gradient(
        &x4,
        &[4, 3],
        &w_of(q),
        &[2, 3],
        |a| sum_scatter(a, tp, &s),
        &s,
    )
    .unwrap();
    assert_eq!(g, [w_of(0), w_of(1)].concat(), "sum_scatter, {what}");
    // all_to_all_v: row j of x goes to member j; the gradient comes back
    // from there: member j's rows of the output's gradient, row q of them.
    let g = gradient(
        &x,
        &[2, 3],
        &w_of(q),
        &[2, 3],
        |a| all_to_all_v(a, &[1, 1], &[1, 1], tp, &s),
        &s,
    )
    .unwrap();
    let want = [&w_of(0)[3 * q..3 * q + 3], &w_of(1)[3 * q..3 * q + 3]].concat();
    assert_eq!(g, want, "all_to_all_v, {what}");
}

#[test]
fn collectives_of_a_mesh_axis_have_mlx_gradient_rules_on_mpi_and_ring() {
    for backend in [Backend::Mpi, Backend::Ring] {
        Ranks::new(4)
            .backend(backend)
            .run_test(check)
            .unwrap_or_else(|e| panic!("2 x 2 on {backend}: {e}"));
    }
}
