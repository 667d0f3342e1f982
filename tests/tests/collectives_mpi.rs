//! Every collective between real processes on the MPI backend, and `split`.

use safemlx_dist::launch::Ranks;
use safemlx_dist::{all_sum, Backend};
use safemlx_dist_tests::{array, check_every_collective, cpu, read};

fn on_mpi(ranks: usize) {
    Ranks::new(ranks)
        .backend(Backend::Mpi)
        .run_test(check_every_collective)
        .unwrap_or_else(|e| panic!("{ranks} MPI ranks: {e}"));
}

#[test]
fn mpi_2_ranks() {
    on_mpi(2);
}

#[test]
fn mpi_4_ranks() {
    on_mpi(4);
}

#[test]
fn mpi_split_into_two_pairs_runs_collectives_in_each() {
    Ranks::new(4)
        .backend(Backend::Mpi)
        .run_test(|world| {
            let r = world.rank();
            // Pairs {0, 2} and {1, 3}, ordered by world rank.
            let pair = world.split((r % 2) as i32, None).expect("MPI groups split");
            assert_eq!(pair.size(), 2);
            assert_eq!(pair.rank(), r / 2);
            let s = cpu();
            let x = array(&[r as i32 + 1], &[1], safemlx::Dtype::Float32, &s);
            let sum = all_sum(&x, &pair, &s).expect("all_sum in the pair");
            let expected = if r % 2 == 0 { 1 + 3 } else { 2 + 4 };
            assert_eq!(read(&sum, safemlx::Dtype::Float32, &s), [expected]);
            check_every_collective(&pair);
        })
        .unwrap();
}
