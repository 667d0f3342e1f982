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

/// Collectives of strided views (a transpose, a column slice): MLX's ring
/// and MPI backends send the input's buffer as it lies, so a view that is
/// not row-contiguous used to come back scrambled (found through a model's
/// vocabulary-parallel logits, gathered along axis 1).
fn check_strided_inputs(group: &safemlx_dist::Group) {
    use safemlx::Array;
    use safemlx_dist::{all_gather, all_sum, sum_scatter};
    use safemlx_dist_tests::dense::host;
    let s = safemlx_dist_tests::cpu();
    let (r, n) = (group.rank() as f32, group.size() as i32);
    let values: Vec<f32> = (0..6 * 4 * n).map(|i| i as f32 + 100.0 * r).collect();
    let base = Array::from_slice(&values, &[6, 4 * n]);
    let view = base.transpose(&s).unwrap(); // [4n, 6], strided
    let dense = view.contiguous(false, &s).unwrap();
    let pairs = [
        (
            all_sum(&view, group, &s).unwrap(),
            all_sum(&dense, group, &s).unwrap(),
        ),
        (
            all_gather(&view, group, &s).unwrap(),
            all_gather(&dense, group, &s).unwrap(),
        ),
        (
            sum_scatter(&view, group, &s).unwrap(),
            sum_scatter(&dense, group, &s).unwrap(),
        ),
    ];
    for (i, (got, want)) in pairs.iter().enumerate() {
        assert_eq!(got.shape(), want.shape(), "collective {i}");
        assert_eq!(
            host(got, &s),
            host(want, &s),
            "collective {i} of a strided view"
        );
    }
}

#[test]
fn strided_views_are_sent_in_logical_order() {
    for n in [2, 3] {
        Ranks::new(n)
            .run_test(check_strided_inputs)
            .unwrap_or_else(|e| panic!("{n} ring ranks: {e}"));
    }
    Ranks::new(2)
        .backend(Backend::Mpi)
        .run_test(check_strided_inputs)
        .unwrap_or_else(|e| panic!("2 MPI ranks: {e}"));
}
