//! GGUF MoE files as llama.cpp writes and quantizes them
//! (`tests/golden/make_gguf_moe_goldens.py`: a tiny `qwen3moe`, a
//! `qwen2moe` with its gated shared expert, and Mixtral as `llama` with
//! experts; `make_gguf_deepseek_goldens.py`: a `deepseek2` with latent
//! attention split per head, `attn_k_b` / `attn_v_b`, and YaRN;
//! `make_gguf_glm_goldens.py`: a `glm4moe`; their F32 forms give
//! llama.cpp's own logits): the experts
//! stacked as `ffn_*_exps` are read as mlx-lm's `switch_mlp`, each rank
//! reading only its experts or its whole blocks of every expert. Loaded as
//! stored at 1, 2 and 4 ranks in both expert placements (and a weighted
//! 3:1 split), the logits are mlx-lm's of the same model with every
//! tensor dequantized by the `gguf` package. Q8_0 experts stay quantized
//! in every layer; Q4_K_M keeps layer 0's Q4_K experts packed and
//! dequantizes layer 1's, whose down projections llama.cpp stored in Q6_K.

use std::path::PathBuf;

use safemlx_dist::checkpoint::GgufFile;
use safemlx_dist::launch::Ranks;
use safemlx_dist::models::{load_layout, Layout, Llama, LoadOptions, Storage};
use safemlx_dist::nn::ExpertPlacement;
use safemlx_dist::Group;
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::models::{check_logits, golden, golden_dir};

fn file(name: &str) -> PathBuf {
    golden_dir("gguf").join(name)
}

/// The files, and what their load says about the experts.
const CASES: [(&str, &str); 7] = [
    (
        "moe-deepseek2-Q8_0",
        "keeping the 8-bit affine (groups of 32) experts of 1 layers as stored (MLX's affine quantized matmuls)",
    ),
    // GLM-4-MoE's layer 0 is dense.
    (
        "moe-glm4moe-Q4_K_M",
        "keeping the 4-bit affine (groups of 32) experts of 1 layers as stored (MLX's affine quantized matmuls), but for 1 projections of 1 layers stored without a packed form, held as float32",
    ),
    (
        "moe-qwen3moe-Q8_0",
        "keeping the 8-bit affine (groups of 32) experts of 2 layers as stored (MLX's affine quantized matmuls)",
    ),
    ("moe-qwen3moe-Q4_K_M", MIXED),
    ("moe-qwen2moe-Q4_K_M", MIXED),
    ("moe-mixtral-Q4_K_M", MIXED),
    // gpt-oss quantized by llama.cpp with MXFP4_MOE: its experts MXFP4
    // (type 39), attention Q8_0.
    (
        "gpt-oss-MXFP4_MOE",
        "keeping the MXFP4 experts of 2 layers as stored (MLX's mxfp4 quantized matmuls)",
    ),
];

/// llama.cpp's Q4_K_M keeps layer 1's `down` experts in Q6_K: held as
/// float32 beside the packed gate and up projections.
const MIXED: &str = "keeping the 4-bit affine (groups of 32) experts of 2 layers as stored (MLX's affine quantized matmuls), but for 1 projections of 1 layers stored without a packed form, held as float32";

/// Rank `rank`'s share of `n` ranks, evenly or by `split`'s weights.
fn share(split: &Option<Vec<u32>>, rank: usize, n: usize) -> f64 {
    split.as_ref().map_or(1.0 / n as f64, |w| {
        f64::from(w[rank]) / f64::from(w.iter().sum::<u32>())
    })
}

fn check(group: &Group, split: Option<Vec<u32>>) {
    let s = cpu();
    let (n, rank) = (group.size(), group.rank());
    for (case, note) in CASES {
        let path = file(&format!("{case}.gguf"));
        let (prompt, want) = golden(&file(&format!("{case}.safetensors")), &s);
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
            let placed = load_layout(group, &path, options, &Layout::default(), &s)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let model = &placed.loaded.model;
            assert_eq!(model.packed_note().as_deref(), Some(note), "{what}");
            if n == 1 && note.ends_with("held as float32") {
                // Only the Q6_K projection is float32: the experts hold
                // far less than the float32 model (2.2x the 4-bit bytes
                // when the whole layer was dequantized).
                let held = model.weight_bytes() as f64;
                let float32 = model.config().float_bytes() as f64;
                assert!(held < 0.4 * float32, "{what}: holds {held} of {float32}");
            }
            check_logits(model, &prompt, &want, &what);
            let size = std::fs::metadata(&path).unwrap().len() as f64;
            let read = placed.loaded.weights.bytes_read() as f64;
            if n > 1 && experts == ExpertPlacement::ExpertParallel {
                // The experts are most of the file; a rank reads its
                // share of them and of the split attention and head.
                let share = share(&split, rank, n);
                assert!(
                    read <= size * (share + 0.25),
                    "{what}: read {read} of {size} bytes"
                );
            }
        }
    }
}

#[test]
fn llama_cpp_moe_files_give_the_dequantized_models_logits_at_one_two_and_four_ranks() {
    for n in [1, 2, 4] {
        Ranks::new(n)
            .run_test(|group| check(group, None))
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}

#[test]
fn a_weighted_split_of_moe_experts() {
    Ranks::new(2)
        .run_test(|group| check(group, Some(vec![3, 1])))
        .unwrap();
}

/// llama.cpp counts GLM's and DeepSeek's multi-token-prediction layers in
/// `block_count` (`nextn_predict_layers` of them, last): their tensors are
/// left unread and the layers before them are the model. (The GLM file
/// with `nextn_predict_layers` set to 1: its layer 1 becomes that layer.)
#[test]
fn the_multi_token_prediction_layers_of_a_gguf_are_left_unread() {
    let s = cpu();
    let mut bytes = std::fs::read(file("moe-glm4moe-Q4_K_M.gguf")).unwrap();
    let key = b"glm4moe.nextn_predict_layers";
    // The key, its value type (4 bytes: uint32), then the value.
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4;
    assert_eq!(bytes[at..at + 4], 0u32.to_le_bytes());
    bytes[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
    let patched =
        std::env::temp_dir().join(format!("safemlx-glm-nextn-{}.gguf", std::process::id()));
    std::fs::write(&patched, bytes).unwrap();
    let loaded = Llama::from_gguf(&Group::local(), GgufFile::open(&patched).unwrap(), &s);
    std::fs::remove_file(&patched).ok();
    let (model, _) = loaded.expect("layer 1 is left unread");
    assert_eq!(model.config().layers, 1);
}
