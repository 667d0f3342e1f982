//! The expert-parallel MoE between real processes against a dense
//! single-process MoE on the same weights: balanced and skewed routing
//! (every token to one expert, so some ranks receive nothing), top-1 and
//! top-2, uneven token counts per rank, at 1, 2, 3 and 4 ranks (12 experts).

use safemlx::Array;
use safemlx_dist::launch::Ranks;
use safemlx_dist::nn::ExpertParallelMoe;
use safemlx_dist::{Group, Ragged, ShardedArray};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{host, max_relative_error, moe_token};
use safemlx_dist_tests::typed::Rng;

const E: usize = 12;
const D: usize = 4;
const H: usize = 6;

fn values(rng: &mut Rng, len: usize, scale: f32) -> Vec<f32> {
    rng.values(len)
        .into_iter()
        .map(|v| v as f32 * scale)
        .collect()
}

fn check(group: &Group, k: usize, skewed: bool, capacity: Option<f32>) {
    let s = cpu();
    let (rank, n) = (group.rank(), group.size());
    let mut rng = Rng::new(41);
    // Continuous router weights: no two experts tie on a token, so the
    // top-k choice cannot hang on a rounding difference.
    let mut router: Vec<f32> = (0..D * E)
        .map(|_| rng.range(0, 1_000_000) as f32 / 1_000_000.0 - 0.5)
        .collect();
    if skewed {
        // A large weight towards the last expert: every token picks it first.
        // The other experts get clearly different scores, so the second
        // choice never hangs on a rounding difference.
        for i in 0..D {
            for e in 0..E - 1 {
                router[i * E + e] = 0.5 * e as f32;
            }
            router[i * E + E - 1] = 8.0;
        }
    }
    let (w1, w2) = (
        values(&mut rng, E * D * H, 0.1),
        values(&mut rng, E * H * D, 0.1),
    );
    // Rank q has 3 + q tokens, all positive in the skewed case.
    let tokens: Vec<Vec<f32>> = (0..n)
        .map(|q| {
            values(&mut rng, (3 + q) * D, 0.1)
                .into_iter()
                .map(|v| if skewed { v.abs() + 0.1 } else { v })
                .collect()
        })
        .collect();
    let mine = &tokens[rank];
    let t = mine.len() / D;

    let moe = ExpertParallelMoe::from_full(
        group,
        k,
        Array::from_slice(&router, &[D as i32, E as i32]),
        Array::from_slice(&w1, &[E as i32, D as i32, H as i32]),
        Array::from_slice(&w2, &[E as i32, H as i32, D as i32]),
        &s,
    )
    .expect("moe");
    let moe = match capacity {
        Some(f) => moe.with_capacity_factor(f),
        None => moe,
    };
    let x = ShardedArray::<Ragged>::from_local(
        Array::from_slice(mine, &[t as i32, D as i32]),
        group,
        &[t as i32, D as i32],
    )
    .expect("tokens");
    let out = moe.forward(&x, &s).expect("forward");
    let got = host(out.tokens.local(), &s);
    let cap = capacity.map(|f| (f * (t * k) as f32 / E as f32).ceil() as usize);
    let mut used = [0usize; E];
    let mut dropped = 0;
    let mut keep = |e: usize| match cap {
        Some(cap) if used[e] >= cap => {
            dropped += 1;
            false
        }
        _ => {
            used[e] += 1;
            true
        }
    };
    let want: Vec<f32> = mine
        .chunks(D)
        .flat_map(|tok| moe_token(tok, &router, &w1, &w2, (E, D, H), k, &mut keep))
        .collect();
    assert_eq!(
        out.dropped, dropped,
        "dropped slots (k {k}, skewed {skewed})"
    );
    let err = max_relative_error(&got, &want);
    assert!(err <= 1e-4, "k {k}, skewed {skewed}: relative error {err}");
    assert_eq!(
        out.sent.iter().sum::<usize>(),
        t * k - dropped,
        "every kept slot is sent (all of them without a capacity)"
    );
    if capacity.is_none() {
        assert_eq!(dropped, 0, "dropless");
    }
    if skewed && n > 1 && capacity.is_none() {
        // All first choices go to the last expert, on the last rank.
        let first_rank_experts = E / n;
        if rank < n - 1 && k == 1 && first_rank_experts < E {
            assert_eq!(
                out.received.iter().sum::<usize>(),
                0,
                "rank {rank} receives nothing"
            );
        }
        assert!(
            out.aux_loss > 1.5,
            "a skewed router has a large balancing loss: {}",
            out.aux_loss
        );
    }
}

fn all_cases(group: &Group) {
    for k in [1, 2] {
        for skewed in [false, true] {
            check(group, k, skewed, None);
            // A tight capacity drops slots, most of all with skewed routing.
            check(group, k, skewed, Some(0.5));
        }
    }
}

#[test]
fn expert_parallel_moe_matches_dense_at_1_to_4_ranks() {
    for ranks in [1, 2, 3, 4] {
        Ranks::new(ranks)
            .run_test(all_cases)
            .unwrap_or_else(|e| panic!("{ranks} ranks: {e}"));
    }
}

#[test]
fn experts_must_split_evenly() {
    Ranks::new(2)
        .run_test(|group| {
            let s = cpu();
            let error = ExpertParallelMoe::from_full(
                group,
                1,
                Array::from_slice(&[0f32; 3 * 4], &[4, 3]),
                Array::from_slice(&[0f32; 3 * 4 * 2], &[3, 4, 2]),
                Array::from_slice(&[0f32; 3 * 2 * 4], &[3, 2, 4]),
                &s,
            )
            .expect_err("3 experts over 2 ranks");
            assert_eq!(
                error.to_string(),
                "3 experts over 2 ranks: each rank holds the same number of experts, so the expert count must be a multiple of the rank count"
            );
        })
        .unwrap();
}
