//! `#[sharded(mesh = .., route(tokens, counts))]`: rows are dispatched to
//! the ranks their counts name (counts exchanged first), the body runs on
//! the rows each rank receives, and the results come back in place.

use safemlx::{Array, Dtype, Stream};
use safemlx_dist::launch::Ranks;
use safemlx_dist::typed::RoutingPlan;
use safemlx_dist::{sharded, Group, Mesh, Ragged, ShardedArray};
use safemlx_dist_tests::{array, cpu, read, rows_between};

/// Adds `1000 * rank` to every row it is given: after the combine, each row
/// tells which rank processed it.
#[sharded(mesh = mesh, route(tokens, counts))]
fn mark_owner<const N: usize>(
    mesh: &Mesh<N>,
    tokens: ShardedArray<Ragged, Mesh<N>>,
    counts: [usize; N],
    s: &Stream,
) -> safemlx_dist::Result<ShardedArray<Ragged, Mesh<N>>> {
    use safemlx_dist::Collective;
    let offset = Array::from_f32(1000.0 * mesh.rank() as f32).as_dtype(Dtype::Int32, s)?;
    let local = tokens.local().add(&offset, s)?;
    ShardedArray::from_local(local, mesh, tokens.global_shape())
}

fn check<const N: usize>(group: &Group) {
    let s = cpu();
    let mesh = Mesh::<N>::new(group.clone()).expect("launched with N ranks");
    let r = group.rank();
    let counts: [usize; N] = std::array::from_fn(|d| rows_between(r, d));
    // Row k to destination d holds [d, k].
    let rows: Vec<i32> = (0..N)
        .flat_map(|d| (0..counts[d]).flat_map(move |k| [d as i32, k as i32]))
        .collect();
    let n_rows = counts.iter().sum::<usize>() as i32;
    let tokens = ShardedArray::<Ragged, Mesh<N>>::from_local(
        array(&rows, &[n_rows, 2], Dtype::Int32, &s),
        &mesh,
        &[n_rows, 2],
    )
    .expect("ragged rows");
    let back = mark_owner(&mesh, tokens, counts, &s).expect("dispatch, experts, combine");
    let expected: Vec<i32> = rows
        .chunks(2)
        .flat_map(|row| [row[0] + 1000 * row[0], row[1] + 1000 * row[0]])
        .collect();
    assert_eq!(
        read(back.local(), Dtype::Int32, &s),
        expected,
        "each row visited its destination and came back"
    );
}

#[test]
fn routed_rows_visit_their_destination_and_come_back() {
    Ranks::new(2).run_test(check::<2>).unwrap();
    Ranks::new(4).run_test(check::<4>).unwrap();
}

/// Counts per bucket (rows per expert) exchanged once: every rank learns
/// every rank's counts, sends each owner its buckets' rows and knows how
/// what it receives splits by bucket; owners that are not contiguous
/// ranges are refused, naming the rank.
#[test]
fn bucket_counts_give_the_plan_and_the_split_of_what_arrives() {
    for n in [1usize, 2, 3] {
        Ranks::new(n)
            .run_test(|group| {
                let s = cpu();
                let (rank, n) = (group.rank(), group.size());
                // 5 buckets owned by the chunk rule; rank q has q + b rows in bucket b.
                let owners: Vec<(usize, usize)> =
                    (0..n).map(|d| safemlx_dist::typed::chunk(5, d, n)).collect();
                let counts: Vec<usize> = (0..5).map(|b| rank + b).collect();
                let (plan, matrix) =
                    RoutingPlan::exchange_buckets(group, &counts, &owners, &s).expect("exchange");
                let want_matrix: Vec<Vec<usize>> =
                    (0..n).map(|q| (0..5).map(|b| q + b).collect()).collect();
                assert_eq!(matrix, want_matrix);
                let mine = owners[rank];
                let in_range = |q: usize, (first, count): (usize, usize)| -> usize {
                    (first..first + count).map(|b| q + b).sum()
                };
                let send: Vec<usize> = owners.iter().map(|&o| in_range(rank, o)).collect();
                let recv: Vec<usize> = (0..n).map(|q| in_range(q, mine)).collect();
                assert_eq!(plan.send_counts(), send.as_slice());
                assert_eq!(plan.recv_counts(), recv.as_slice());
                if n == 2 {
                    let error = RoutingPlan::exchange_buckets(group, &counts, &[(0, 2), (3, 2)], &s)
                        .unwrap_err()
                        .to_string();
                    assert_eq!(
                        error,
                        "rank 1's buckets start at 3, but the buckets before end at 2: owners must be contiguous ranges in rank order"
                    );
                    let error = RoutingPlan::from_bucket_matrix(group, std::slice::from_ref(&counts), &owners)
                        .unwrap_err()
                        .to_string();
                    assert_eq!(
                        error,
                        "a bucket matrix needs 2 rows (one per rank) of equal length, got 1 rows"
                    );
                    // The matrix gathered once gives the same plan.
                    let again =
                        RoutingPlan::from_bucket_matrix(group, &matrix, &owners).unwrap();
                    assert_eq!(again, plan);
                }
            })
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}
