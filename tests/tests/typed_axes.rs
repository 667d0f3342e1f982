//! Arrays over typed mesh axes on a `dp x tp` = 2 x 2 mesh, ring and MPI:
//! each data-parallel replica runs a tensor-parallel MLP on its own input
//! (`Axis<Tp, 2>`: column-parallel, SiLU, row-parallel, `all_sum_over::<Tp>`),
//! then the replicas' outputs are summed over `Axis<Dp, 2>`
//! (`partial_over`, `all_sum_over::<Dp>`); both equal the dense result.

use safemlx::{Array, Stream};
use safemlx_dist::launch::Ranks;
use safemlx_dist::typed::{Axis, Dp, Tp};
use safemlx_dist::{Backend, DeviceMesh, Group, Replicated, ShardedArray};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{host, max_relative_error, values};

fn dense_mlp(x: &Array, w1: &Array, w2: &Array, s: &Stream) -> Array {
    let h = x.matmul(w1, s).unwrap();
    let h = h
        .multiply(safemlx::ops::sigmoid(&h, s).unwrap(), s)
        .unwrap();
    h.matmul(w2, s).unwrap()
}

fn check(world: &Group) {
    let s = cpu();
    let mesh = DeviceMesh::new(world, &[("dp", 2), ("tp", 2)]).unwrap();
    let (tp, dp) = (
        Axis::<Tp, 2>::of(&mesh).unwrap(),
        Axis::<Dp, 2>::of(&mesh).unwrap(),
    );
    let replica = mesh.coord("dp").unwrap() as i32;
    let (w1, w2) = (values(6, 8, 1), values(8, 6, 2));
    let x = values(3, 6, 10 + replica);
    let xs = ShardedArray::<Replicated, Axis<Tp, 2>>::replicated(x.clone(), &tp);
    let w1s = ShardedArray::replicated(w1.clone(), &tp)
        .shard::<1>(&s)
        .unwrap();
    let w2s = ShardedArray::replicated(w2.clone(), &tp)
        .shard::<0>(&s)
        .unwrap();
    let partial = xs
        .matmul(&w1s, &s)
        .unwrap()
        .silu(&s)
        .unwrap()
        .matmul(&w2s, &s)
        .unwrap();
    let y = partial.all_sum_over::<Tp>(&s).unwrap();
    let want = dense_mlp(&x, &w1, &w2, &s);
    let err = max_relative_error(&host(y.local(), &s), &host(&want, &s));
    assert!(err <= 1e-5, "replica {replica}: tp MLP vs dense {err}");
    // The replicas' outputs, summed over dp.
    let total = y.partial_over(&dp).unwrap().all_sum_over::<Dp>(&s).unwrap();
    let both = dense_mlp(&values(3, 6, 10), &w1, &w2, &s)
        .add(dense_mlp(&values(3, 6, 11), &w1, &w2, &s), &s)
        .unwrap();
    let err = max_relative_error(&host(total.local(), &s), &host(&both, &s));
    assert!(err <= 1e-5, "replica {replica}: dp sum vs dense {err}");
    assert_eq!(
        Axis::<Tp, 4>::of(&mesh).unwrap_err().to_string(),
        "this program places arrays over mesh axis `tp` of 4 ranks, but the mesh dp=2,tp=2 has 2 there"
    );
}

#[test]
fn a_data_parallel_tensor_parallel_mlp_equals_dense_on_ring_and_mpi() {
    for backend in [Backend::Ring, Backend::Mpi] {
        Ranks::new(4)
            .backend(backend)
            .run_test(check)
            .unwrap_or_else(|e| panic!("dp=2,tp=2 on {backend}: {e}"));
    }
}
