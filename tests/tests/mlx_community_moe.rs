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
    /// How the experts are packed: bits per value, and how loading names
    /// them.
    bits: usize,
    label: &'static str,
    /// Whole groups of each expert's hidden dimension.
    hidden_groups: usize,
    /// Layers with routed experts.
    moe_layers: usize,
    /// How far above the quantized share of the float32 bytes a rank's
    /// weights may be (DeepSeek-V3's `kv_b` is held as floats).
    slack: f64,
    /// The most ranks its quantized attention splits over in whole groups.
    max_ranks: usize,
}

/// Qwen3-MoE's 64 hidden columns are one group of 64, Mixtral's 96 three
/// of 32, DeepSeek-V3's 64 two of 32 (its layer 0 is dense, and mlx-lm
/// splits its `kv_b_proj` into per-head `embed_q` and `unembed_out`),
/// gpt-oss's 96 three MXFP4 blocks of 32 (mlx-lm's de-interleaved
/// experts with biases; float attention, or affine 4-bit by per-module
/// entries beside the top-level `mxfp4` mode, the router at 8 bits).
const CASES: [Case; 6] = [
    Case {
        name: "qwen3-moe-4bit",
        bits: 4,
        label: "4-bit affine (groups of 64)",
        hidden_groups: 1,
        moe_layers: 2,
        slack: 1.5,
        max_ranks: 4,
    },
    Case {
        name: "mixtral-8bit",
        bits: 8,
        label: "8-bit affine (groups of 32)",
        hidden_groups: 3,
        moe_layers: 2,
        slack: 1.5,
        max_ranks: 4,
    },
    Case {
        name: "deepseek-v3-4bit",
        bits: 4,
        label: "4-bit affine (groups of 32)",
        hidden_groups: 2,
        moe_layers: 1,
        slack: 3.0,
        max_ranks: 4,
    },
    Case {
        name: "gpt-oss-mxfp4",
        bits: 4,
        label: "MXFP4",
        hidden_groups: 3,
        moe_layers: 3,
        slack: 3.0,
        max_ranks: 4,
    },
    Case {
        name: "gpt-oss-mxfp4-q4",
        bits: 4,
        label: "MXFP4",
        hidden_groups: 3,
        moe_layers: 3,
        slack: 2.0,
        // Heads 16 wide, groups of 32: 4 ranks would cut a group.
        max_ranks: 2,
    },
    // Every layer in MLX's mxfp4 mode: the dense ones read as floats.
    Case {
        name: "gpt-oss-all-mxfp4",
        bits: 4,
        label: "MXFP4",
        hidden_groups: 3,
        moe_layers: 3,
        slack: 3.0,
        max_ranks: 4,
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
        let placed = load_layout(group, &dir, options, &Layout::default(), &s);
        if n > c.max_ranks {
            let e = placed.err().map(|e| e.to_string()).unwrap_or_default();
            let name = "model.layers.0.self_attn.o_proj.weight";
            let want = format!("tensor `{name}` is quantized in groups of 32 columns; columns 0..16 cut a group (split it over ranks whose parts are whole groups");
            assert!(rank != 0 || e.contains(&want), "{what}: {e}");
            continue;
        }
        let placed = placed.unwrap_or_else(|e| panic!("{what}: {e}"));
        let model = &placed.loaded.model;
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
        // gpt-oss-mxfp4's attention is float (as mlx-lm converts OpenAI's
        // release), gpt-oss-all-mxfp4's read as floats: nothing is packed
        // once their experts are dequantized.
        let floats_only = !kept && ["gpt-oss-mxfp4", "gpt-oss-all-mxfp4"].contains(&case);
        assert_eq!(model.is_quantized(), !floats_only, "{what}");
        let (label, layers) = (c.label, c.moe_layers);
        let mode = if label == "MXFP4" { "mxfp4" } else { "affine" };
        let note = model.packed_note().unwrap_or_default();
        let want_note = match kept {
            true => format!("keeping the {label} experts of {layers} layers as stored (MLX's {mode} quantized matmuls)"),
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
            // Expert parallel: its experts (6 over 4 ranks are 2 + 2 + 1 + 1).
            let experts = model.config().moe.as_ref().map_or(1, |m| m.experts);
            let mine = model.held_experts().map_or(1, |h| h.1) as f64 / experts as f64;
            let held = match (tp, n, groups) {
                (true, 2, 3) => [2.0, 1.0][rank] / 3.0,
                (true, 2, 1) => 1.0,
                (false, ..) => mine,
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

/// A directory `mlx_lm.convert -q --q-mode nvfp4` writes: refused before
/// native code, naming the first tensor, its mode and what is read.
#[test]
fn other_quantization_modes_are_refused_by_name() {
    let s = cpu();
    let dir = golden_dir("gpt-oss-all-nvfp4");
    let options = LoadOptions {
        weights: Storage::AsStored,
        ..LoadOptions::default()
    };
    let got = load_layout(&Group::local(), &dir, options, &Layout::default(), &s)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_eq!(
        got,
        format!(
            "checkpoint {}: tensor `model.embed_tokens.weight` is quantized in mode `nvfp4` (4 bits in groups of 16); read here: `affine`, and `mxfp4` (4 bits in groups of 32)",
            dir.display()
        )
    );
}

/// `--weights float` (every tensor dequantized as it is read) of mlx-lm's
/// MXFP4 gpt-oss experts: mlx-lm's logits at 1 and 2 ranks, both
/// placements.
#[test]
fn mxfp4_experts_read_as_floats_give_mlx_lms_logits() {
    Ranks::new(2)
        .run_test(|group| {
            let s = cpu();
            let dir = golden_dir("gpt-oss-mxfp4");
            let (prompt, want) = golden(&dir.join("golden.safetensors"), &s);
            for experts in [
                ExpertPlacement::ExpertParallel,
                ExpertPlacement::ExpertTensorParallel,
            ] {
                let options = LoadOptions {
                    weights: Storage::Dequantized,
                    experts,
                    tensor_split: None,
                };
                let what = format!("{}, rank {}", experts.as_str(), group.rank());
                let placed = load_layout(group, &dir, options, &Layout::default(), &s)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(!placed.loaded.model.is_quantized(), "{what}");
                check_logits(&placed.loaded.model, &prompt, &want, &what);
            }
        })
        .unwrap();
}
