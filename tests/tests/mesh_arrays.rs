//! One array over several mesh axes (`MeshArray`), on a `dp x tp` = 2 x 2
//! mesh, ring and MPI: a data- and tensor-parallel MLP whose batch rows
//! are sharded over `dp` and whose weights over `tp` equals the dense MLP,
//! its loss too, and its weights' gradients equal the dense gradients'
//! parts, the `dp` sum coming from the placement rule (weights replicated
//! over `dp` meeting rows sharded over it), and the rows' gradient sums
//! over `tp` the same way. A three-axis placement
//! gathers back to the full array.

use safemlx::{Array, Stream};
use safemlx_dist::grad::value_and_grad;
use safemlx_dist::launch::Ranks;
use safemlx_dist::typed::{Axis, Dp, MeshArray, Pp, Tp};
use safemlx_dist::{
    Backend, Collective, DeviceMesh, Group, Partial, Replicated, Sharded, ShardedArray,
};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{assert_close, part, silu_array, values};

type Axes = (Axis<Dp, 2>, Axis<Tp, 2>);

/// The dense loss: sum of the MLP's outputs squared.
fn dense_loss(x: &Array, w1: &Array, w2: &Array, s: &Stream) -> Array {
    let y = silu_array(&x.matmul(w1, s).unwrap(), s)
        .matmul(w2, s)
        .unwrap();
    y.multiply(&y, s).unwrap().sum(None, s).unwrap()
}

/// The MLP over the mesh: rows over dp, columns then rows of the weights
/// over tp; the output `(Sharded<0>, Replicated)`.
fn mlp(
    x: &MeshArray<(Sharded<0>, Replicated), Axes>,
    w1: &MeshArray<(Replicated, Sharded<1>), Axes>,
    w2: &MeshArray<(Replicated, Sharded<0>), Axes>,
    s: &Stream,
) -> safemlx_dist::Result<MeshArray<(Sharded<0>, Replicated), Axes>> {
    let h = x.matmul(w1, s)?.silu(s)?;
    let y: MeshArray<(Sharded<0>, Partial), Axes> = h.matmul(w2, s)?;
    y.all_sum_over(Tp, s)
}

fn check(world: &Group) {
    let s = cpu();
    let mesh = DeviceMesh::new(world, &[("dp", 2), ("tp", 2)]).unwrap();
    let axes: Axes = (
        Axis::<Dp, 2>::of(&mesh).unwrap(),
        Axis::<Tp, 2>::of(&mesh).unwrap(),
    );
    let what = format!("{}, world rank {}", world.backend(), world.rank());
    let (x, w1, w2) = (values(4, 6, 10), values(6, 8, 1), values(8, 6, 2));
    let xs = MeshArray::<(Sharded<0>, Replicated), _>::from_full(x.clone(), &axes, &s).unwrap();
    let w1s = MeshArray::<(Replicated, Sharded<1>), _>::from_full(w1.clone(), &axes, &s).unwrap();
    let w2s = MeshArray::<(Replicated, Sharded<0>), _>::from_full(w2.clone(), &axes, &s).unwrap();
    assert_eq!(xs.local().shape(), &[2, 6], "{what}");
    assert_eq!(w1s.local().shape(), &[6, 4], "{what}");

    // Forward: this replica's rows, then every row gathered over dp.
    let y = mlp(&xs, &w1s, &w2s, &s).unwrap();
    let dense_y = silu_array(&x.matmul(&w1, &s).unwrap(), &s)
        .matmul(&w2, &s)
        .unwrap();
    let dp_group = axes.0.group();
    assert_close(
        y.local(),
        &part(&dense_y, 0, dp_group, &s),
        &format!("rows, {what}"),
        &s,
    );
    let whole = y.redistribute_over(Dp, Replicated, &s).unwrap();
    assert_close(whole.local(), &dense_y, &format!("gathered, {what}"), &s);

    // The hidden layer summed over both axes: (Partial, Partial) reduced
    // one axis at a time.
    let h = xs.matmul(&w1s, &s).unwrap().silu(&s).unwrap();
    let total = h.sum_all(&s).unwrap();
    let total: MeshArray<(Partial, Replicated), Axes> = total.all_sum_over(Tp, &s).unwrap();
    let total = total.all_sum_over(Dp, &s).unwrap();
    let dense_total = silu_array(&x.matmul(&w1, &s).unwrap(), &s)
        .sum(None, &s)
        .unwrap();
    assert_close(
        total.local(),
        &dense_total,
        &format!("sum of h, {what}"),
        &s,
    );

    // Gradients: each rank's weight parts; the dp sum is the rule's.
    let params = [w1s.local().clone(), w2s.local().clone(), xs.local().clone()];
    let (loss, grads) = value_and_grad(&params, |p| {
        let w1 = MeshArray::from_local(p[0].clone(), &axes, &[6, 8])?;
        let w2 = MeshArray::from_local(p[1].clone(), &axes, &[8, 6])?;
        let x = MeshArray::from_local(p[2].clone(), &axes, &[4, 6])?;
        let y = mlp(&x, &w1, &w2, &s)?;
        let squares = y.mul(&y, &s)?.sum_all(&s)?;
        Ok(squares.all_sum_over(Dp, &s)?.into_replicated(world))
    })
    .unwrap();
    let (dense, dense_grads) = value_and_grad(&[w1.clone(), w2.clone(), x.clone()], |p| {
        Ok(ShardedArray::replicated(
            dense_loss(&p[2], &p[0], &p[1], &s),
            &Group::local(),
        ))
    })
    .unwrap();
    assert_close(&loss, &dense, &format!("loss, {what}"), &s);
    let tp_group = axes.1.group();
    let want_w1 = part(&dense_grads[0], 1, tp_group, &s);
    let want_w2 = part(&dense_grads[1], 0, tp_group, &s);
    assert_close(&grads[0], &want_w1, &format!("w1 gradient, {what}"), &s);
    assert_close(&grads[1], &want_w2, &format!("w2 gradient, {what}"), &s);
    // The rows, replicated over tp, meet the tp-sharded w1: their gradient
    // is summed over tp by the rule.
    let want_x = part(&dense_grads[2], 0, dp_group, &s);
    assert_close(&grads[2], &want_x, &format!("x gradient, {what}"), &s);

    // Three axes: (Replicated, Sharded<0>, Sharded<1>) over pp x dp x tp
    // = 1 x 2 x 2 is this rank's block; gathered over tp, then dp, the
    // whole.
    let mesh3 = DeviceMesh::new(world, &[("pp", 1), ("dp", 2), ("tp", 2)]).unwrap();
    let axes3 = (
        Axis::<Pp, 1>::of(&mesh3).unwrap(),
        Axis::<Dp, 2>::of(&mesh3).unwrap(),
        Axis::<Tp, 2>::of(&mesh3).unwrap(),
    );
    let block = values(5, 7, 3);
    let parts =
        MeshArray::<(Replicated, Sharded<0>, Sharded<1>), _>::from_full(block.clone(), &axes3, &s)
            .unwrap();
    let (dp, tp) = (mesh3.coord("dp").unwrap(), mesh3.coord("tp").unwrap());
    let want: [i32; 2] = [[3, 2][dp], [4, 3][tp]];
    assert_eq!(parts.local().shape(), &want, "{what}");
    let back = parts
        .redistribute_over(Tp, Replicated, &s)
        .unwrap()
        .redistribute_over(Dp, Replicated, &s)
        .unwrap();
    assert_close(back.local(), &block, &format!("three axes, {what}"), &s);
}

#[test]
fn a_data_and_tensor_parallel_mlp_over_two_axes_equals_dense_on_ring_and_mpi() {
    for backend in [Backend::Ring, Backend::Mpi] {
        Ranks::new(4)
            .backend(backend)
            .run_test(check)
            .unwrap_or_else(|e| panic!("dp=2,tp=2 on {backend}: {e}"));
    }
}

/// What a wrong local shape or a dimension sharded along two axes says.
#[test]
fn shapes_that_do_not_fit_are_refused_naming_both() {
    let s = cpu();
    let mesh = DeviceMesh::new(&Group::local(), &[("dp", 1), ("tp", 1)]).unwrap();
    let axes = (
        Axis::<Dp, 1>::of(&mesh).unwrap(),
        Axis::<Tp, 1>::of(&mesh).unwrap(),
    );
    let err = MeshArray::<(Sharded<0>, Replicated), _>::from_local(values(2, 3, 0), &axes, &[2, 4])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "this rank's part of a (Sharded<0>, Replicated) array of shape [2, 4] over the axes dp, tp has shape [2, 4], not [2, 3]"
    );
    let err = MeshArray::<(Sharded<0>, Sharded<0>), _>::from_full(values(2, 3, 0), &axes, &s)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the placements (Sharded<0>, Sharded<0>) over the axes dp, tp shard dimension 0 along two axes; shard each dimension along one axis"
    );
    let err = MeshArray::<(Replicated, Sharded<2>), _>::from_full(values(2, 3, 0), &axes, &s)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "(Replicated, Sharded<2>) shards dimension 2 along axis tp, but the array's shape is [2, 3]"
    );
}
