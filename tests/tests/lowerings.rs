//! Native and composed lowerings give the same numbers, on ring and MPI, and
//! ranks that disagree on the lowering fail instead of deadlocking.

use safemlx_dist::launch::Ranks;
use safemlx_dist::{Backend, Error, Lowering};
use safemlx_dist_tests::check_every_lowering;

#[test]
fn ring_lowerings_agree_at_2_3_and_4_ranks() {
    for ranks in [2, 3, 4] {
        Ranks::new(ranks)
            .run_test(check_every_lowering)
            .unwrap_or_else(|e| panic!("{ranks} ring ranks: {e}"));
    }
}

#[test]
fn mpi_lowerings_agree_at_2_and_4_ranks() {
    for ranks in [2, 4] {
        Ranks::new(ranks)
            .backend(Backend::Mpi)
            .run_test(check_every_lowering)
            .unwrap_or_else(|e| panic!("{ranks} MPI ranks: {e}"));
    }
}

#[test]
fn ranks_that_disagree_on_the_lowering_get_a_clear_error() {
    Ranks::new(3)
        .run_test(|group| {
            let mine = if group.rank() == 0 { Lowering::Composed } else { Lowering::Auto };
            let error = group
                .with_lowering(mine)
                .expect_err("rank 0 chose another lowering");
            assert!(matches!(error, Error::LoweringMismatch { .. }), "{error:?}");
            assert_eq!(
                error.to_string(),
                format!(
                    "ranks disagree on SAFEMLX_DIST_LOWERING (this rank: {mine}; the group has auto to composed); set the same value on every rank"
                )
            );
        })
        .unwrap();
}
