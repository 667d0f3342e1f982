//! Weighted tensor-parallel splits (`LoadOptions::tensor_split`,
//! `generate --tensor-split 3:1`): each rank takes attention heads and
//! hidden columns and experts (or, every expert sliced, their hidden
//! columns) in proportion to its weight, KV heads shared where one's query
//! heads fall on two ranks. The prompt's logits and each decode step equal
//! mlx-lm's (a SmolLM2-shaped model, 9 query heads over 3 KV heads; the
//! tiny Mixtral, gpt-oss, DeepSeek-V3 and GLM-4-MoE in both expert
//! placements) at 2 and 3 ring ranks and 2 MPI ranks; the loss and
//! gradient norm equal mlx-lm's; a split with the wrong number of parts or
//! a zero part is refused with its fix.

use std::path::{Path, PathBuf};

use safemlx_dist::checkpoint::{HfDirectory, Weights};
use safemlx_dist::launch::Ranks;
use safemlx_dist::models::{Llama, LlamaConfig};
use safemlx_dist::nn::ExpertPlacement;
use safemlx_dist::{Backend, Group};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::golden_gradients::check_against_golden;
use safemlx_dist_tests::models::{check_logits, golden};

fn golden_dir(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden")
        .join(case)
}

/// The model of a golden directory (no tokenizer) as `load_with` loads it
/// with `LoadOptions::tensor_split`: through `Weights::with_shares`.
fn load(
    group: &Group,
    dir: &Path,
    shares: &[u32],
    placement: ExpertPlacement,
) -> safemlx_dist::Result<Llama> {
    let dir = HfDirectory::open(dir)?;
    let mut config = LlamaConfig::from_hf(dir.config(), "golden")?;
    if let Some(moe) = &mut config.moe {
        moe.placement = placement;
    }
    Llama::load(
        &Weights::new(&dir, group).with_shares(shares)?,
        config,
        &cpu(),
    )
}

/// What each rank should hold, in rank order: query heads, dense MLP
/// hidden columns (empty without a dense MLP) and, split by expert,
/// experts (empty otherwise).
struct Held<'a> {
    heads: &'a [usize],
    hidden: &'a [usize],
    experts: &'a [usize],
}

/// `case` split by `shares` holds what `held` says on each rank, and its
/// logits equal mlx-lm's.
fn check_case(group: &Group, case: &str, shares: &[u32], placement: ExpertPlacement, held: Held) {
    let dir = golden_dir(case);
    let what = format!(
        "{case} split {shares:?} ({placement:?}) at rank {}",
        group.rank()
    );
    let model = load(group, &dir, shares, placement).expect("loads");
    let part = |lengths: &[usize]| {
        let first = || lengths[..group.rank()].iter().sum::<usize>();
        (!lengths.is_empty()).then(|| (first(), lengths[group.rank()]))
    };
    let split = model.head_split().expect("a layer");
    assert_eq!(Some(split.query), part(held.heads), "{what}: query heads");
    assert_eq!(
        model.mlp_hidden(),
        part(held.hidden),
        "{what}: hidden columns"
    );
    if placement == ExpertPlacement::ExpertParallel {
        assert_eq!(model.held_experts(), part(held.experts), "{what}: experts");
    }
    let (prompt, want) = golden(&dir.join("golden.safetensors"), &cpu());
    check_logits(&model, &prompt, &want, &what);
}

const SMOLLM2: &str = "llama/smollm2-5layers";

/// A dense model's heads and hidden columns.
fn dense<'a>(heads: &'a [usize], hidden: &'a [usize]) -> Held<'a> {
    Held {
        heads,
        hidden,
        experts: &[],
    }
}
const EP: ExpertPlacement = ExpertPlacement::ExpertParallel;
const ETP: ExpertPlacement = ExpertPlacement::ExpertTensorParallel;

fn at_2_and_3_ranks(group: &Group) {
    let config = std::fs::read_to_string(golden_dir(SMOLLM2).join("config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    let h = config["intermediate_size"].as_u64().unwrap() as usize;
    assert_eq!(h % 4, 0, "a hidden size 3:1 divides exactly");
    if group.size() == 3 {
        let (heads, hidden) = ([5, 2, 2], [h / 2, h / 4, h / 4]);
        return check_case(group, SMOLLM2, &[2, 1, 1], EP, dense(&heads, &hidden));
    }
    let (three_one, one_three) = ([h * 3 / 4, h / 4], [h / 4, h * 3 / 4]);
    check_case(group, SMOLLM2, &[3, 1], EP, dense(&[7, 2], &three_one));
    check_case(group, SMOLLM2, &[1, 3], EP, dense(&[2, 7], &one_three));
    // The MoE families in both placements: 4 query heads 3 + 1; 6
    // experts 5 + 1, 8 experts 6 + 2; DeepSeek-V3's and GLM-4-MoE's dense
    // first layer 64 columns 48 + 16.
    for placement in [EP, ETP] {
        let moe = |experts, hidden| Held {
            heads: &[3, 1],
            hidden,
            experts,
        };
        check_case(group, "moe/mixtral", &[3, 1], placement, moe(&[5, 1], &[]));
        check_case(group, "moe/gpt-oss", &[3, 1], placement, moe(&[5, 1], &[]));
        check_case(
            group,
            "moe/deepseek-v3",
            &[3, 1],
            placement,
            moe(&[6, 2], &[48, 16]),
        );
        check_case(
            group,
            "moe/glm4-moe",
            &[3, 1],
            placement,
            moe(&[6, 2], &[48, 16]),
        );
    }
    // 9:1 leaves rank 1 none of the 3 MXFP4 blocks of gpt-oss's hidden
    // dimension (and no query head): its experts are dequantized instead
    // of multiplied as an empty quantized matrix (a SIGFPE in MLX's CPU
    // kernel before).
    let held = Held {
        heads: &[4, 0],
        hidden: &[],
        experts: &[],
    };
    check_case(group, "moe/gpt-oss", &[9, 1], ETP, held);
    let model = load(group, &golden_dir("moe/gpt-oss"), &[9, 1], ETP).expect("loads");
    assert!(!model.is_quantized(), "MXFP4 kept with an empty rank");
}

#[test]
fn weighted_head_and_column_splits_equal_mlx_lm() {
    for n in [2, 3] {
        Ranks::new(n)
            .run_test(at_2_and_3_ranks)
            .unwrap_or_else(|e| panic!("{n} ring ranks: {e}"));
    }
    Ranks::new(2)
        .backend(Backend::Mpi)
        .run_test(at_2_and_3_ranks)
        .unwrap_or_else(|e| panic!("2 MPI ranks: {e}"));
}

/// 6 query heads over 3 KV heads at 3:1 are 5 + 1, KV head 2 on both
/// ranks: the loss and the gradient's norm (the shared head counted once)
/// equal mlx-lm's, and a step lowers the loss.
#[test]
fn weighted_splits_train_as_mlx_lm() {
    Ranks::new(2)
        .run_test(|group| {
            let dir = golden_dir("llama/llama-tied-kv3");
            let model = load(group, &dir, &[3, 1], EP).expect("loads");
            let split = model.head_split().expect("a layer");
            let want = [((0, 5), (0, 3)), ((5, 1), (2, 1))][group.rank()];
            assert_eq!((split.query, split.kv), want, "heads at 3:1");
            let what = format!("llama-tied-kv3 at 3:1, rank {}", group.rank());
            check_against_golden(&model, &dir, &what, group, &cpu());
        })
        .unwrap_or_else(|e| panic!("2 ring ranks: {e}"));
}

#[test]
fn splits_with_the_wrong_parts_are_refused() {
    Ranks::new(2)
        .run_test(|group| {
            let dir = golden_dir("llama/llama-tied-kv3");
            let error = |shares: &[u32]| load(group, &dir, shares, EP).unwrap_err().to_string();
            assert_eq!(
                error(&[3, 1, 1]),
                "--tensor-split 3:1:1 has 3 parts for 2 tensor-parallel ranks; give one weight per rank"
            );
            assert_eq!(
                error(&[1, 0]),
                "--tensor-split 1:0: part 2 is 0; every rank needs a positive weight"
            );
        })
        .unwrap_or_else(|e| panic!("2 ring ranks: {e}"));
}

/// `generate --tensor-split memory` on a launch whose ranks report 3 and 1
/// GiB (`SAFEMLX_DIST_MEMORY`): DeepSeek-V3's 4 heads go 3 + 1, its 8
/// experts 6 + 2, and the tokens and logits equal one process's.
#[test]
fn generate_splits_tensors_by_the_memory_each_rank_offers() {
    safemlx_dist_tests::check_generate_by_memory(
        "3GiB,1GiB",
        &["--tensor-split", "memory"],
        &[
            "--tensor-split memory: rank 0's tensor group offers [3072, 1024] MiB",
            "rank 0/2: query heads 0..3, KV heads 0..3, MLP columns 0..48, experts 0..6;",
            "rank 1/2: query heads 3..4, KV heads 3..4, MLP columns 48..64, experts 6..8;",
            "rank 0/2: --check against one process",
        ],
    );
}
