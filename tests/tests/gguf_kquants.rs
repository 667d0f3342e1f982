//! GGUF files quantized by llama.cpp itself (`llama_model_quantize`:
//! Q4_K_M, Q5_K_M and Q6_K of a tiny `llama`, made by
//! `tests/golden/make_kquant_goldens.py`) give mlx-lm's logits of the same
//! model with every tensor dequantized by the `gguf` package, at 1, 2 and
//! 4 ranks and at a 3:1 split: Q4_K and Q5_K tensors stay quantized (MLX
//! affine, groups of 32, 4 and 5 bits), Q6_K ones are dequantized as they
//! are read, and each rank reads about its share of the file.

use std::path::PathBuf;

use safemlx_dist::launch::Ranks;
use safemlx_dist::models::{load_layout, Layout, LoadOptions, Storage};
use safemlx_dist::Group;
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::models::{check_logits, golden, golden_dir};

fn file(name: &str) -> PathBuf {
    golden_dir("gguf").join(name)
}

/// llama.cpp's file types, and whether some of their weights stay
/// quantized (Q6_K's are all dequantized).
const FTYPES: [(&str, bool); 3] = [("Q4_K_M", true), ("Q5_K_M", true), ("Q6_K", false)];

fn check(group: &Group, split: Option<Vec<u32>>) {
    let s = cpu();
    let (n, rank) = (group.size(), group.rank());
    for (ftype, quantized) in FTYPES {
        let path = file(&format!("kquant-{ftype}.gguf"));
        let (prompt, want) = golden(&file(&format!("kquant-{ftype}.safetensors")), &s);
        let what = format!("{ftype}, split {split:?}, rank {rank} of {n}");
        let options = LoadOptions {
            weights: Storage::AsStored,
            tensor_split: split.clone(),
            ..LoadOptions::default()
        };
        let placed = load_layout(group, &path, options, &Layout::default(), &s)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let model = &placed.loaded.model;
        assert_eq!(model.is_quantized(), quantized, "{what}");
        check_logits(model, &prompt, &want, &what);
        let size = std::fs::metadata(&path).unwrap().len();
        if n > 1 {
            // This rank's share (3:1 gives rank 0 three quarters) of the
            // tensors split by rows, and whole super-blocks of 256 values
            // where its columns cut one: here the output and down
            // projections' rows are one super-block, which every rank
            // reads (about a third of the file).
            let share = split.as_ref().map_or(1.0 / n as f64, |w| {
                f64::from(w[rank]) / f64::from(w.iter().sum::<u32>())
            });
            let read = placed.loaded.weights.bytes_read() as f64;
            assert!(
                read <= size as f64 * (share + 0.35),
                "{what}: read {read} of {size} bytes"
            );
        }
    }
}

#[test]
fn llama_cpp_k_quants_give_the_dequantized_models_logits_at_one_two_and_four_ranks() {
    for n in [1, 2, 4] {
        Ranks::new(n)
            .run_test(|group| check(group, None))
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}

#[test]
fn a_weighted_split_reads_whole_super_blocks() {
    Ranks::new(2)
        .run_test(|group| check(group, Some(vec![3, 1])))
        .unwrap();
}

/// A Phi-4-mini as llama.cpp's converter writes it (`phi3`: `attn_qkv`
/// and `ffn_up` fused, 3/4 of each head rotated, LongRoPE factors as
/// tensors; made by `tests/golden/make_gguf_phi3_goldens.py`, whose F32
/// form gives llama.cpp's own logits) and quantized to Q4_K_M by
/// llama.cpp (Q4_K, Q5_K and Q6_K tensors) gives mlx-lm's logits of the
/// same model dequantized, at 1, 2 and 4 ranks.
#[test]
fn a_llama_cpp_phi4_mini_gives_the_dequantized_models_logits() {
    for n in [1, 2, 4] {
        Ranks::new(n)
            .run_test(|group| {
                let s = cpu();
                let path = file("phi4-mini-Q4_K_M.gguf");
                let (prompt, want) = golden(&file("phi4-mini-Q4_K_M.safetensors"), &s);
                let what = format!(
                    "phi4-mini Q4_K_M, rank {} of {}",
                    group.rank(),
                    group.size()
                );
                let options = LoadOptions {
                    weights: Storage::AsStored,
                    ..LoadOptions::default()
                };
                let placed = load_layout(group, &path, options, &Layout::default(), &s)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(placed.loaded.model.is_quantized(), "{what}");
                check_logits(&placed.loaded.model, &prompt, &want, &what);
            })
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}
