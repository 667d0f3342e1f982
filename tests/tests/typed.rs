//! The typed layer between real processes: redistribution identities and
//! matmul placement propagation against host and dense computations, at 1
//! to 4 ranks, through both a run-time `Group` and a static `Mesh<N>`.

use safemlx_dist::launch::Ranks;
use safemlx_dist::Mesh;
use safemlx_dist_tests::rows_between;
use safemlx_dist_tests::typed::{check_matmul_propagation, check_redistribution, check_routing};

fn on_ring(ranks: usize) {
    Ranks::new(ranks)
        .run_test(|group| {
            check_redistribution(group, 7 + ranks as u64);
            check_matmul_propagation(group, 11 + ranks as u64);
            let counts: Vec<usize> = (0..ranks).map(|d| rows_between(group.rank(), d)).collect();
            check_routing(group, counts.as_slice());
        })
        .unwrap_or_else(|e| panic!("{ranks} ring ranks: {e}"));
}

#[test]
fn typed_layer_on_1_rank() {
    on_ring(1);
}

#[test]
fn typed_layer_on_2_ranks() {
    on_ring(2);
}

#[test]
fn typed_layer_on_3_ranks() {
    on_ring(3);
}

#[test]
fn typed_layer_on_4_ranks() {
    on_ring(4);
}

#[test]
fn typed_layer_on_a_static_mesh_of_4() {
    Ranks::new(4)
        .run_test(|group| {
            let mesh = Mesh::<4>::new(group.clone()).expect("launched with 4 ranks");
            check_redistribution(&mesh, 23);
            check_matmul_propagation(&mesh, 29);
            // On a Mesh<4>, counts are a [usize; 4].
            let r = group.rank();
            let counts = [0, 1, 2, 3].map(|d| rows_between(r, d));
            check_routing(&mesh, &counts);
        })
        .unwrap();
}
