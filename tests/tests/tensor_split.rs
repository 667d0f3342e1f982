//! Weighted tensor-parallel splits (`LoadOptions::tensor_split`,
//! `generate --tensor-split 3:1`): each rank takes attention heads and
//! hidden columns in proportion to its weight, KV heads shared where one's
//! query heads fall on two ranks. The prompt's logits and each decode step
//! equal mlx-lm's (a SmolLM2-shaped model, 9 query heads over 3 KV heads,
//! and the tiny Mixtral, whose experts stay even) at 2 and 3 ring ranks and
//! 2 MPI ranks; the loss and gradient norm equal mlx-lm's; a split with the
//! wrong number of parts or a zero part is refused with its fix.

use std::path::{Path, PathBuf};

use safemlx_dist::checkpoint::{HfDirectory, Weights};
use safemlx_dist::launch::Ranks;
use safemlx_dist::models::{Llama, LlamaConfig};
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
fn load(group: &Group, dir: &Path, shares: &[u32]) -> safemlx_dist::Result<Llama> {
    let dir = HfDirectory::open(dir)?;
    let config = LlamaConfig::from_hf(dir.config(), "golden")?;
    Llama::load(
        &Weights::new(&dir, group).with_shares(shares)?,
        config,
        &cpu(),
    )
}

/// `case` split by `shares`: each rank's query heads (`heads`, in rank
/// order) and dense MLP hidden columns (`hidden`, in rank order; empty for
/// a model without a dense MLP), then the logits against mlx-lm's.
fn check_case(group: &Group, case: &str, shares: &[u32], [heads, hidden]: [&[usize]; 2]) {
    let dir = golden_dir(case);
    let what = format!("{case} split {shares:?} at rank {}", group.rank());
    let model = load(group, &dir, shares).expect("loads");
    let split = model.head_split().expect("a layer");
    let part = |lengths: &[usize]| {
        let first: usize = lengths[..group.rank()].iter().sum();
        (first, lengths[group.rank()])
    };
    assert_eq!(split.query, part(heads), "{what}: query heads");
    let columns = (!hidden.is_empty()).then(|| part(hidden));
    assert_eq!(model.mlp_hidden(), columns, "{what}: hidden columns");
    let (prompt, want) = golden(&dir.join("golden.safetensors"), &cpu());
    check_logits(&model, &prompt, &want, &what);
}

const SMOLLM2: &str = "llama/smollm2-5layers";

fn smollm2_and_mixtral(group: &Group) {
    let config = std::fs::read_to_string(golden_dir(SMOLLM2).join("config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    let hidden = config["intermediate_size"].as_u64().unwrap() as usize;
    assert_eq!(hidden % 4, 0, "a hidden size 3:1 divides exactly");
    match group.size() {
        2 => {
            check_case(
                group,
                SMOLLM2,
                &[3, 1],
                [&[7, 2], &[hidden * 3 / 4, hidden / 4]],
            );
            check_case(
                group,
                SMOLLM2,
                &[1, 3],
                [&[2, 7], &[hidden / 4, hidden * 3 / 4]],
            );
            check_case(group, "moe/mixtral", &[3, 1], [&[3, 1], &[]]);
        }
        _ => check_case(
            group,
            SMOLLM2,
            &[2, 1, 1],
            [&[5, 2, 2], &[hidden / 2, hidden / 4, hidden / 4]],
        ),
    }
}

#[test]
fn weighted_head_and_column_splits_equal_mlx_lm() {
    for n in [2, 3] {
        Ranks::new(n)
            .run_test(smollm2_and_mixtral)
            .unwrap_or_else(|e| panic!("{n} ring ranks: {e}"));
    }
    Ranks::new(2)
        .backend(Backend::Mpi)
        .run_test(smollm2_and_mixtral)
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
            let model = load(group, &dir, &[3, 1]).expect("loads");
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
            let error = |shares: &[u32]| load(group, &dir, shares).unwrap_err().to_string();
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
