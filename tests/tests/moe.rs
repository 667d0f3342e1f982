//! The MoE layer between real processes against a dense single-process MoE
//! on the same weights, at 1, 2, 3 and 4 ranks: both expert placements
//! (expert parallel, expert tensor parallel), the gatings of Mixtral,
//! Qwen (renormalised or not) and GLM-4-MoE (sigmoid scores in groups with
//! a correction bias), a routed scaling factor, shared experts
//! with their gate, top-1, top-2, top-k = E and top-8 of 64, uneven expert
//! splits (10 experts over 3 and 4 ranks; 3 experts over 4 ranks, so a rank
//! holds none), skewed routing (every token to one expert, so other ranks
//! receive nothing; every token to one expert group under group-limited
//! routing), a capacity factor (dropped counts must match),
//! grouped matmuls against the per-expert loop, one token (ranks with no
//! rows), and the balancing and z losses.

use safemlx::Array;
use safemlx_dist::launch::Ranks;
use safemlx_dist::nn::{ExpertMatmul, ExpertPlacement, Gating, Mlp, Moe, MoeConfig, SharedExperts};
use safemlx_dist::{Group, Ragged, ShardedArray};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{host, max_relative_error, DenseGating, DenseMoe, DenseShared};
use safemlx_dist_tests::typed::Rng;

const D: usize = 4;
const H: usize = 6;
const SHARED_H: usize = 5;

#[derive(Debug, Clone, Copy)]
struct Case {
    experts: usize,
    k: usize,
    gating: Gating,
    scaling: f32,
    skewed: bool,
    shared: bool,
    capacity: Option<f32>,
    matmul: ExpertMatmul,
    /// A score correction bias (sigmoid gating).
    bias: bool,
}

impl Case {
    fn new(experts: usize, k: usize) -> Self {
        Self {
            experts,
            k,
            gating: Gating::SoftmaxTopK { normalize: true },
            scaling: 1.0,
            skewed: false,
            shared: false,
            capacity: None,
            // The grouped matmuls, which Auto leaves to GPU streams.
            matmul: ExpertMatmul::Grouped,
            bias: false,
        }
    }
}

fn values(rng: &mut Rng, len: usize, scale: f32) -> Vec<f32> {
    rng.values(len)
        .into_iter()
        .map(|v| v as f32 * scale)
        .collect()
}

/// Continuous values in `[-scale, scale)`: no two router scores tie, so
/// the top-k choice never hangs on a rounding difference.
fn continuous(rng: &mut Rng, len: usize, scale: f32) -> Vec<f32> {
    (0..len)
        .map(|_| (rng.range(0, 1_000_000) as f32 / 500_000.0 - 1.0) * scale)
        .collect()
}

/// The case's weights, as the dense reference holds them.
fn dense(case: &Case) -> DenseMoe {
    let e = case.experts;
    let mut rng = Rng::new(41 + e as u64);
    let mut router = continuous(&mut rng, D * e, 0.5);
    if case.skewed {
        // Every token (all positive) picks the last expert first, then
        // clearly ordered others.
        for i in 0..D {
            for c in 0..e - 1 {
                router[i * e + c] = 0.37 * c as f32 + 0.01 * i as f32;
            }
            router[i * e + e - 1] = 8.0;
        }
    }
    let gate = values(&mut rng, e * D * H, 0.1);
    let up = values(&mut rng, e * D * H, 0.1);
    let down = values(&mut rng, e * H * D, 0.1);
    let shared = case.shared.then(|| DenseShared {
        gate: values(&mut rng, D * SHARED_H, 0.1),
        up: values(&mut rng, D * SHARED_H, 0.1),
        down: values(&mut rng, SHARED_H * D, 0.1),
        hidden: SHARED_H,
        g: Some(values(&mut rng, D, 0.2)),
    });
    DenseMoe {
        router,
        gate,
        up,
        down,
        dims: (e, D, H),
        k: case.k,
        gating: match case.gating {
            Gating::SoftmaxTopK { normalize } => DenseGating::SoftmaxTopK { normalize },
            Gating::TopKSoftmax => DenseGating::TopKSoftmax,
            Gating::SigmoidGroups {
                groups,
                topk_group,
                normalize,
            } => DenseGating::SigmoidGroups {
                groups,
                topk_group,
                normalize,
            },
        },
        scaling: case.scaling,
        score_bias: case.bias.then(|| continuous(&mut rng, e, 0.3)),
        shared,
    }
}

fn layer(group: &Group, case: &Case, placement: ExpertPlacement, w: &DenseMoe) -> Moe {
    let s = cpu();
    let e = case.experts as i32;
    let (d, h) = (D as i32, H as i32);
    let mut config = MoeConfig::new(case.k)
        .with_gating(case.gating)
        .with_routed_scaling(case.scaling)
        .with_placement(placement);
    if let Some(f) = case.capacity {
        config = config.with_capacity_factor(f);
    }
    config = config.with_expert_matmul(case.matmul);
    let moe = Moe::from_full(
        group,
        config,
        Array::from_slice(&w.router, &[d, e]),
        Array::from_slice(&w.gate, &[e, d, h]),
        Array::from_slice(&w.up, &[e, d, h]),
        Array::from_slice(&w.down, &[e, h, d]),
        &s,
    )
    .expect("moe");
    let moe = match &w.score_bias {
        Some(b) => moe
            .with_score_bias(Array::from_slice(b, &[e]))
            .expect("bias"),
        None => moe,
    };
    match &w.shared {
        None => moe,
        Some(sh) => {
            let hs = sh.hidden as i32;
            // Stored [in, out] for the dense reference; the layer takes
            // [out, in].
            let t = |a: &[f32], shape: &[i32]| Array::from_slice(a, shape).transpose(&s).unwrap();
            let mlp = Mlp::from_full(
                group,
                t(&sh.gate, &[d, hs]),
                t(&sh.up, &[d, hs]),
                t(&sh.down, &[hs, d]),
                &s,
            )
            .expect("shared experts");
            moe.with_shared(SharedExperts {
                mlp,
                gate: sh
                    .g
                    .as_ref()
                    .map(|g| ShardedArray::replicated(Array::from_slice(g, &[d, 1]), group)),
            })
        }
    }
}

/// A capacity limit as the layer applies it to `t` tokens' `t * k` slots.
fn keeper(case: &Case, t: usize) -> impl FnMut(usize) -> bool {
    let cap = case
        .capacity
        .map(|f| (f * (t * case.k) as f32 / case.experts as f32).ceil() as usize);
    let mut used = vec![0usize; case.experts];
    move |e| match cap {
        Some(cap) if used[e] >= cap => false,
        _ => {
            used[e] += 1;
            true
        }
    }
}

fn tokens(rng: &mut Rng, t: usize, skewed: bool) -> Vec<f32> {
    values(rng, t * D, 0.1)
        .into_iter()
        .map(|v| if skewed { v.abs() + 0.1 } else { v })
        .collect()
}

/// Expert parallel on each rank's own tokens (rank q has 3 + q).
fn check_rows(group: &Group, case: Case) {
    let s = cpu();
    let (rank, n) = (group.rank(), group.size());
    let w = dense(&case);
    let moe = layer(group, &case, ExpertPlacement::ExpertParallel, &w);
    let mut rng = Rng::new(7);
    let all: Vec<Vec<f32>> = (0..n)
        .map(|q| tokens(&mut rng, 3 + q, case.skewed))
        .collect();
    let mine = &all[rank];
    let t = mine.len() / D;
    let x = ShardedArray::<Ragged>::from_local(
        Array::from_slice(mine, &[t as i32, D as i32]),
        group,
        &[t as i32, D as i32],
    )
    .expect("tokens");
    let out = moe.forward_rows(&x, &s).expect("forward");
    let mut keep = keeper(&case, t);
    let mut dropped = 0;
    let mut counting = |e: usize| {
        let kept = keep(e);
        dropped += usize::from(!kept);
        kept
    };
    let want: Vec<f32> = mine
        .chunks(D)
        .flat_map(|tok| w.token(tok, &mut counting))
        .collect();
    let err = max_relative_error(&host(out.tokens.local(), &s), &want);
    assert!(err <= 1e-4, "{case:?} at {n} ranks: relative error {err}");
    assert_eq!(out.dropped, dropped, "{case:?}: dropped slots");
    assert_eq!(
        out.sent.iter().sum::<usize>(),
        t * case.k - dropped,
        "{case:?}: every kept slot is sent"
    );
    if case.capacity.is_none() {
        assert_eq!(dropped, 0, "dropless");
    }
    // Group-limited to one group, a skewed router sends every token to the
    // last group (the last two of 10 experts), on the last rank too.
    let one_group =
        matches!(case.gating, Gating::SigmoidGroups { topk_group: 1, groups, .. } if groups > 1);
    if case.skewed && (case.k == 1 || one_group) && case.capacity.is_none() && n > 1 && rank < n - 1
    {
        // Every token goes to the last expert(s), on the last rank.
        assert_eq!(
            out.received.iter().sum::<usize>(),
            0,
            "rank {rank} receives nothing"
        );
    }
    if case.skewed {
        assert!(
            out.aux_loss > 1.5,
            "a skewed router has a large balancing loss: {}",
            out.aux_loss
        );
    }
}

/// Both placements on replicated tokens `[t, D]`, against the dense layer
/// over all of them, with the balancing and z losses.
fn check_replicated(group: &Group, case: Case, placement: ExpertPlacement, t: usize) {
    let s = cpu();
    let n = group.size();
    let w = dense(&case);
    let moe = layer(group, &case, placement, &w);
    let mut rng = Rng::new(9);
    let all = tokens(&mut rng, t, case.skewed);
    let x = ShardedArray::replicated(Array::from_slice(&all, &[t as i32, D as i32]), group);
    let out = moe.forward(&x, &s).expect("forward");
    let mut keep = keeper(&case, t);
    let want: Vec<f32> = all
        .chunks(D)
        .flat_map(|tok| w.token(tok, &mut keep))
        .collect();
    let err = max_relative_error(&host(out.tokens.local(), &s), &want);
    let what = format!("{case:?}, {}, {t} tokens, {n} ranks", placement.as_str());
    assert!(err <= 1e-4, "{what}: relative error {err}");

    // The losses over all tokens (the balancing loss as defined on softmax
    // probabilities: sigmoid routing balances by its bias instead).
    if matches!(case.gating, Gating::SigmoidGroups { .. }) {
        return;
    }
    let e = case.experts;
    let (mut chosen, mut probs, mut z) = (vec![0f32; e], vec![0f32; e], 0f32);
    for tok in all.chunks(D) {
        let logits = w.logits(tok);
        let max = logits.iter().cloned().fold(f32::MIN, f32::max);
        let sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
        let lse = max + sum.ln();
        z += lse * lse;
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|a, b| logits[*b].total_cmp(&logits[*a]));
        for &c in &order[..case.k] {
            chosen[c] += 1.0;
        }
        for c in 0..e {
            probs[c] += (logits[c] - lse).exp();
        }
    }
    let tf = t as f32;
    let aux: f32 = (0..e)
        .map(|c| chosen[c] / (tf * case.k as f32) * probs[c] / tf)
        .sum::<f32>()
        * e as f32;
    assert!(
        (out.aux_loss - aux).abs() <= 1e-4 * aux.max(1.0),
        "{what}: balancing loss {} vs {aux}",
        out.aux_loss
    );
    assert!(
        (out.z_loss - z / tf).abs() <= 1e-4 * (z / tf).max(1.0),
        "{what}: z-loss {} vs {}",
        out.z_loss,
        z / tf
    );
}

/// Group-limited routing to the best of 5 groups under a skewed router:
/// every token goes to the last group, so the other ranks' experts get no
/// token.
fn skewed_groups() -> Case {
    Case {
        gating: Gating::SigmoidGroups {
            groups: 5,
            topk_group: 1,
            normalize: true,
        },
        skewed: true,
        ..Case::new(10, 2)
    }
}

fn all_cases(group: &Group) {
    let mixtral = Gating::TopKSoftmax;
    let qwen2 = Gating::SoftmaxTopK { normalize: false };
    for k in [1, 2] {
        for skewed in [false, true] {
            let case = Case {
                skewed,
                ..Case::new(10, k)
            };
            check_rows(group, case);
            // A tight capacity drops slots, most of all when skewed.
            check_rows(
                group,
                Case {
                    capacity: Some(0.5),
                    ..case
                },
            );
        }
    }
    // Top-k = E.
    check_rows(group, Case::new(10, 10));
    // Fewer experts than ranks at 4.
    check_rows(group, Case::new(3, 2));
    check_rows(group, skewed_groups());
    check_rows(
        group,
        Case {
            matmul: ExpertMatmul::PerExpert,
            ..Case::new(10, 2)
        },
    );
    for placement in [
        ExpertPlacement::ExpertParallel,
        ExpertPlacement::ExpertTensorParallel,
    ] {
        let cases = [
            Case::new(10, 2),
            Case {
                gating: mixtral,
                ..Case::new(10, 2)
            },
            Case {
                gating: qwen2,
                scaling: 2.5,
                shared: true,
                ..Case::new(10, 4)
            },
            Case {
                skewed: true,
                ..Case::new(3, 1)
            },
            // GLM-4-MoE's and DeepSeek-V3's routing: 2 of 5 groups, a
            // correction bias, scaled, beside a shared expert; and
            // without groups or renormalising.
            Case {
                gating: Gating::SigmoidGroups {
                    groups: 5,
                    topk_group: 2,
                    normalize: true,
                },
                bias: true,
                scaling: 2.5,
                shared: true,
                ..Case::new(10, 3)
            },
            Case {
                gating: Gating::SigmoidGroups {
                    groups: 1,
                    topk_group: 1,
                    normalize: false,
                },
                ..Case::new(10, 2)
            },
            Case {
                matmul: ExpertMatmul::PerExpert,
                shared: true,
                ..Case::new(10, 3)
            },
            skewed_groups(),
        ];
        for case in cases {
            check_replicated(group, case, placement, 7);
        }
        // One token: with experts split, most ranks compute nothing.
        check_replicated(group, Case::new(10, 2), placement, 1);
        // On replicated tokens every rank routes all of them, so the
        // capacity limit is over all of them.
        check_replicated(
            group,
            Case {
                capacity: Some(0.5),
                skewed: true,
                ..Case::new(10, 2)
            },
            placement,
            7,
        );
    }
}

#[test]
fn moe_matches_dense_at_1_to_4_ranks() {
    for ranks in [1, 2, 3, 4] {
        Ranks::new(ranks)
            .run_test(all_cases)
            .unwrap_or_else(|e| panic!("{ranks} ranks: {e}"));
    }
}

/// Qwen3-MoE's shape of routing: 8 of 64 experts.
#[test]
fn top_8_of_64_experts_matches_dense() {
    for ranks in [2, 4] {
        Ranks::new(ranks)
            .run_test(|group| {
                let case = Case::new(64, 8);
                check_rows(group, case);
                for placement in [
                    ExpertPlacement::ExpertParallel,
                    ExpertPlacement::ExpertTensorParallel,
                ] {
                    check_replicated(group, case, placement, 5);
                }
            })
            .unwrap_or_else(|e| panic!("{ranks} ranks: {e}"));
    }
}

#[test]
fn bad_routing_settings_are_named() {
    Ranks::new(2)
        .run_test(|group| {
            let s = cpu();
            let zeros = |shape: &[i32]| {
                Array::from_slice(&vec![0f32; shape.iter().product::<i32>() as usize], shape)
            };
            let build = |config: MoeConfig| {
                Moe::from_full(
                    group,
                    config,
                    zeros(&[4, 3]),
                    zeros(&[3, 4, 2]),
                    zeros(&[3, 4, 2]),
                    zeros(&[3, 2, 4]),
                    &s,
                )
            };
            assert_eq!(
                build(MoeConfig::new(4)).unwrap_err().to_string(),
                "top_k is 4; with 3 experts it must be 1 to 3"
            );
            let etp = build(
                MoeConfig::new(1).with_placement(ExpertPlacement::ExpertTensorParallel),
            )
            .unwrap();
            let rows = ShardedArray::<Ragged>::from_local(zeros(&[2, 4]), group, &[2, 4]).unwrap();
            assert_eq!(
                etp.forward_rows(&rows, &s).unwrap_err().to_string(),
                "an expert-tensor-parallel MoE runs every token on every rank: call `forward` with replicated tokens, not `forward_rows`"
            );
        })
        .unwrap();
}
