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

#[test]
fn the_collective_profile_times_each_collective_and_its_wait() {
    Ranks::new(2)
        .run_test(|group| {
            use safemlx::Array;
            use safemlx_dist::{all_gather, all_sum, CollectiveProfile};
            let s = safemlx_dist_tests::cpu();
            let x = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
            if group.rank() == 1 {
                // Rank 0 waits for this rank inside its first collective.
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            let profile = CollectiveProfile::start();
            let sum = all_sum(&x, group, &s).unwrap();
            let gathered = all_gather(&sum, group, &s).unwrap();
            let spent = profile.stop();
            assert_eq!(spent.calls, 2);
            if group.rank() == 0 {
                assert!(spent.seconds >= 0.2, "the wait is counted: {spent:?}");
            }
            assert_eq!(gathered.shape(), [4, 2]);
            // Stopped: later collectives are not counted (nor evaluated here).
            let again = CollectiveProfile::start().stop();
            assert_eq!(again.calls, 0);
        })
        .unwrap();
}
