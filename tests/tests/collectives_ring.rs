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

/// Two all_sums whose inputs do not depend on each other on some ranks (a
/// rank whose part adds nothing, as one holding no attention head) still
/// run in program order on every rank: before collectives were sequenced,
/// MLX ran the second first on those ranks and the two sums swapped
/// operands across ranks.
#[test]
fn collectives_run_in_program_order_when_their_inputs_are_independent() {
    for ranks in [2, 3] {
        Ranks::new(ranks)
            .backend(Backend::Ring)
            .run_test(|group| {
                use safemlx::Array;
                use safemlx_dist::all_sum;
                let s = safemlx_dist_tests::cpu();
                let n = group.size() as f32;
                let first = all_sum(&Array::from_slice(&[1.0f32; 4], &[4]), group, &s).unwrap();
                // Rank 0's second input depends on the first sum; the
                // others' are constants.
                let second_input = if group.rank() == 0 {
                    first
                        .add(Array::from_slice(&[10.0f32; 4], &[4]), &s)
                        .unwrap()
                } else {
                    Array::from_slice(&[100.0f32; 4], &[4])
                };
                let second = all_sum(&second_input, group, &s).unwrap();
                // As a residual stream: x + all_sum(part), then evaluated.
                let out = first.add(&second, &s).unwrap();
                safemlx_dist::eval(&[&out]).unwrap();
                let read = |a: &Array| safemlx_dist_tests::dense::host(a, &s);
                assert_eq!(read(&first), [n; 4], "rank {}", group.rank());
                let want = n + 10.0 + 100.0 * (n - 1.0);
                assert_eq!(read(&second), [want; 4], "rank {}", group.rank());
                assert_eq!(read(&out), [n + want; 4], "rank {}", group.rank());
            })
            .unwrap_or_else(|e| panic!("{ranks} ring ranks: {e}"));
    }
}
