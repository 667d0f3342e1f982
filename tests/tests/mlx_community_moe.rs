//! MoE directories as mlx-community ships them, made by `mlx_lm.convert
//! -q` (`tests/golden/make_mlx_community_goldens.py`): mlx-lm's tensor
//! names (experts stacked as `switch_mlp`), every linear layer affine
//! quantized, the router at 8 bits by a per-module entry (Qwen3), and
//! DeepSeek-V3's `kv_b_proj` split per head into `embed_q` and
//! `unembed_out`, quantized too (read as floats). Loaded as stored
//! at 1, 2 and 4 ranks in both expert placements (and a weighted 3:1
//! split), the experts stay quantized, each rank reads only its experts or
//! its whole groups of every expert (and of 2 expert-parallel ranks each
//! holds at most 0.6 of one process's weight bytes), and the logits are
//! mlx-lm's.

use std::path::{Path, PathBuf};

use safemlx_dist::checkpoint::HfDirectory;
use safemlx_dist::launch::Ranks;
use safemlx_dist::models::{load_layout, Layout, LoadOptions, Storage};
use safemlx_dist::nn::ExpertPlacement;
use safemlx_dist::Group;
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::models::{check_logits, golden};

fn golden_dir(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden/mlx-community")
        .join(case)
}

/// A directory of the goldens.
struct Case {
    name: &'static str,
    /// Bits per value and values per group.
    bits: usize,
    group_size: usize,
    /// Whole groups of each expert's hidden dimension.
    hidden_groups: usize,
    /// Layers with routed experts.
    moe_layers: usize,
    /// How far above the quantized share of the float32 bytes a rank's
    /// weights may be (DeepSeek-V3's `kv_b` is held as floats).
    slack: f64,
}

/// Qwen3-MoE's 64 hidden columns are one group of 64, Mixtral's 96 three
/// of 32, DeepSeek-V3's 64 two of 32 (its layer 0 is dense, and mlx-lm
/// splits its `kv_b_proj` into per-head `embed_q` and `unembed_out`).
const CASES: [Case; 3] = [
    Case {
        name: "qwen3-moe-4bit",
        bits: 4,
        group_size: 64,
        hidden_groups: 1,
        moe_layers: 2,
        slack: 1.5,
    },
    Case {
        name: "mixtral-8bit",
        bits: 8,
        group_size: 32,
        hidden_groups: 3,
        moe_layers: 2,
        slack: 1.5,
    },
    Case {
        name: "deepseek-v3-4bit",
        bits: 4,
        group_size: 32,
        hidden_groups: 2,
        moe_layers: 1,
        slack: 3.0,
    },
];

fn load_and_check(group: &Group, c: &Case, split: Option<Vec<u32>>) {
    let (case, bits) = (c.name, c.bits);
    let s = cpu();
    let (n, rank) = (group.size(), group.rank());
    let dir = golden_dir(case);
    let (prompt, want) = golden(&dir.join("golden.safetensors"), &s);
    let total: u64 = {
        let d = HfDirectory::open(&dir).expect("opens");
        d.names().map(|t| d.info(t).unwrap().nbytes()).sum()
    };
    for experts in [
        ExpertPlacement::ExpertParallel,
        ExpertPlacement::ExpertTensorParallel,
    ] {
        let what = format!(
            "{case}, {}, split {split:?}, rank {rank} of {n}",
            experts.as_str()
        );
        let options = LoadOptions {
            weights: Storage::AsStored,
            experts,
            tensor_split: split.clone(),
        };
        let placed = load_layout(group, &dir, options, &Layout::default(), &s)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let model = &placed.loaded.model;
        assert!(model.is_quantized(), "{what}");
        if n == 2 && split.is_none() && experts == ExpertPlacement::ExpertParallel {
            // Each of 2 ranks holds at most 0.6 of one process's weights.
            let whole = load_layout(
                &Group::local(),
                &dir,
                LoadOptions {
                    weights: Storage::AsStored,
                    ..LoadOptions::default()
                },
                &Layout::default(),
                &s,
            )
            .expect("loads whole");
            let (mine, all) = (model.weight_bytes(), whole.loaded.model.weight_bytes());
            assert!(
                mine as f64 <= 0.6 * all as f64,
                "{what}: holds {mine} of one process's {all} bytes"
            );
        }
        // Expert tensor parallel keeps them packed only when every rank
        // gets a whole group of the hidden dimension.
        let groups = c.hidden_groups;
        let shares = split.as_ref().map_or(vec![1; n], |s| s.clone());
        let share = f64::from(shares[rank]) / f64::from(shares.iter().sum::<u32>());
        let tp = experts == ExpertPlacement::ExpertTensorParallel;
        let kept = !tp || groups >= n;
        let label = format!("{bits}-bit affine (groups of {})", c.group_size);
        let layers = c.moe_layers;
        let note = model.packed_note().unwrap_or_default();
        let want_note = match kept {
            true => format!("keeping the {label} experts of {layers} layers as stored (MLX's affine quantized matmuls)"),
            false => format!("dequantizing the {label} experts of {layers} layers to float32 as they are read"),
        };
        assert!(note.starts_with(&want_note), "{what}: {note}");
        if kept {
            // Quantized experts: far below the float32 model's bytes.
            let float32 = model.config().float_bytes() as f64 * share;
            let held = model.weight_bytes() as f64;
            assert!(
                held < float32 * (bits as f64 + 2.0) / 32.0 * c.slack,
                "{what}: holds {held}"
            );
        }
        // Each rank reads its share of the split tensors, and the small
        // replicated ones (norms, routers) whole; dequantized experts'
        // down projections in whole groups, which the ranks share.
        if n > 1 {
            let read = placed.loaded.weights.bytes_read();
            // Expert tensor parallel: the experts (most of the bytes) by
            // whole groups, 3 over 2 ranks 2 + 1 (evenly and at 3:1).
            let held = match (tp, n, groups) {
                (true, 2, 3) => [2.0, 1.0][rank] / 3.0,
                (true, 2, 1) => 1.0,
                _ => share,
            };
            let slack = if kept { 0.1 } else { 0.25 };
            assert!(
                read as f64 <= total as f64 * (held.max(share) + slack),
                "{what}: read {read} of {total} bytes"
            );
        }
        check_logits(model, &prompt, &want, &what);
    }
}

#[test]
fn mlx_community_moe_directories_load_quantized_at_one_two_and_four_ranks() {
    for n in [1, 2, 4] {
        Ranks::new(n)
            .run_test(|group| {
                for case in &CASES {
                    load_and_check(group, case, None);
                }
            })
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}

/// Mixtral's: its heads (32 wide) and groups of 32 split 3:1 in whole
/// groups (Qwen3's groups of 64 hold two heads, which 3:1 would cut).
#[test]
fn a_weighted_split_keeps_whole_groups() {
    Ranks::new(2)
        .run_test(|group| load_and_check(group, &CASES[1], Some(vec![3, 1])))
        .unwrap();
}
