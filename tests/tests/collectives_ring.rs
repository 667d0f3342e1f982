//! Every collective between real processes on the ring backend.

use safemlx_dist::launch::Ranks;
use safemlx_dist::Backend;
use safemlx_dist_tests::check_every_collective;

fn on_ring(ranks: usize) {
    Ranks::new(ranks)
        .backend(Backend::Ring)
        .run_test(check_every_collective)
        .unwrap_or_else(|e| panic!("{ranks} ring ranks: {e}"));
}

#[test]
fn ring_2_ranks() {
    on_ring(2);
}

#[test]
fn ring_3_ranks() {
    on_ring(3);
}

#[test]
fn ring_4_ranks() {
    on_ring(4);
}

#[test]
fn ring_split_is_a_clear_error() {
    Ranks::new(2)
        .run_test(|group| {
            let error = group.split(0, None).expect_err("ring groups do not split");
            let message = error.to_string();
            assert!(
                message.starts_with("mlx_distributed_group_split failed: "),
                "{message}"
            );
            assert!(message.to_lowercase().contains("split"), "{message}");
        })
        .unwrap();
}
