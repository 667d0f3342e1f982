//! Llama-family models whose weights stay quantized, at 1, 2, 3 and 4
//! ranks: mlx-community directories (quantized by mlx-lm) give mlx-lm's
//! logits of its quantized layers, a Q4_1/Q8_0 GGUF gives mlx-lm's logits
//! for the gguf package's dequantized values (goldens made by
//! `tests/golden/make_quantized_goldens.py`); each rank holds and reads
//! only its quantized part, with uneven splits of the MLP's groups.

use std::path::{Path, PathBuf};

use safemlx_dist::checkpoint::{Dequantized, GgufFile, HfDirectory, TensorSource, Weights};
use safemlx_dist::launch::Ranks;
use safemlx_dist::models::{Llama, LlamaConfig};
use safemlx_dist::nn::{load_columns, Mlp};
use safemlx_dist::packing::PackedFormat;
use safemlx_dist::{Backend, Group};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::host;
use safemlx_dist_tests::models::{check_logits, golden};

fn golden_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden/quantized")
        .join(name)
}

/// The mlx-community cases: (directory, group size, bits).
const CASES: [(&str, usize, usize); 2] = [("llama-tied-q4", 32, 4), ("qwen3-q8", 64, 8)];

fn mlx_community(group: &Group, (case, group_size, bits): (&str, usize, usize)) {
    let s = cpu();
    let (n, rank) = (group.size(), group.rank());
    let what = format!("{case} at rank {rank} of {n}");
    let dir = HfDirectory::open(golden_path(case)).expect("opens");
    let (prompt, want) = golden(&golden_path(case).join("golden.safetensors"), &s);
    let q_proj = "model.layers.0.self_attn.q_proj.weight";
    assert_eq!(
        dir.quantization(q_proj),
        Some(PackedFormat::affine(group_size, bits))
    );
    assert_eq!(dir.shape(q_proj).unwrap()[1], 128, "the logical [out, in]");

    let model = Llama::from_hf(group, &dir, &s).expect("loads");
    assert!(model.is_quantized(), "{what}");
    let total: u64 = dir.names().map(|t| dir.info(t).unwrap().nbytes()).sum();
    if n > 1 {
        let read = dir.bytes_read();
        assert!(read < total * 3 / 4, "{what}: read {read} of {total} bytes");
    }
    check_logits(&model, &prompt, &want, &what);

    // The same file dequantized: the same logits, 32 / bits times the bytes.
    let config = LlamaConfig::from_hf(dir.config(), case).unwrap();
    let float = Llama::load(&Weights::new(&Dequantized(&dir), group), config, &s).expect("loads");
    assert!(!float.is_quantized());
    check_logits(&float, &prompt, &want, &format!("{what}, dequantized"));
    let ratio = float.weight_bytes() as f64 / model.weight_bytes() as f64;
    assert!(ratio > 0.5 * 32.0 / bits as f64, "{what}: ratio {ratio}");

    // The MLP's hidden groups by the chunk rule: 3 groups over 2 ranks are
    // 2 + 1, over 4 ranks 1 + 1 + 1 + 0.
    let mlp = Mlp::load(
        &Weights::new(&dir, group).pp("model.layers.1.mlp"),
        &safemlx_dist::models::llama::MLP,
        (128, 3 * group_size),
        &s,
    )
    .expect("loads");
    let groups = [[3, 0, 0, 0], [2, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]][n - 1][rank];
    let first = [[0, 0, 0, 0], [0, 2, 0, 0], [0, 1, 2, 0], [0, 1, 2, 3]][n - 1][rank];
    assert_eq!(
        mlp.hidden(),
        (first * group_size, groups * group_size),
        "{what}"
    );
    assert!(mlp.down.is_quantized());

    // dequantize(this rank's rows) equals those rows of the dequantized whole.
    let rows = (rank * 8, 8);
    let part = dir.read_quantized_rows(q_proj, &[rows], &s).unwrap();
    let whole = host(&TensorSource::read(&dir, q_proj, &s).unwrap(), &s);
    let want_rows = &whole[rows.0 * 128..(rows.0 + 8) * 128];
    assert_eq!(host(&part.dequantize(&s).unwrap(), &s), want_rows);
}

fn gguf(group: &Group) {
    let s = cpu();
    let what = format!(
        "llama-q4_1.gguf at rank {} of {}",
        group.rank(),
        group.size()
    );
    let file = GgufFile::open(golden_path("llama-q4_1.gguf")).expect("opens");
    let total: u64 = file.tensors().values().map(|t| t.nbytes()).sum();
    let (prompt, want) = golden(&golden_path("llama-q4_1.safetensors"), &s);
    let (model, weights) = Llama::from_gguf(group, file, &s).expect("loads");
    assert!(model.is_quantized(), "{what}");
    assert_eq!(
        weights.quantization("model.layers.0.self_attn.k_proj.weight"),
        Some(PackedFormat::affine(32, 4))
    );
    assert_eq!(
        weights.quantization("model.embed_tokens.weight"),
        Some(PackedFormat::affine(32, 8))
    );
    assert_eq!(weights.quantization("model.norm.weight"), None);
    if group.size() > 1 {
        let read = weights.bytes_read();
        assert!(read < total * 3 / 4, "{what}: read {read} of {total} bytes");
    }
    check_logits(&model, &prompt, &want, &what);
}

fn all_cases(group: &Group) {
    for case in CASES {
        mlx_community(group, case);
    }
    gguf(group);
}

#[test]
fn quantized_models_equal_mlx_lm_at_one_to_four_ranks() {
    for n in 1..=4 {
        Ranks::new(n)
            .backend(Backend::Ring)
            .run_test(all_cases)
            .unwrap_or_else(|e| panic!("{n} ring ranks: {e}"));
    }
}

#[test]
fn quantized_models_equal_mlx_lm_under_mpi() {
    Ranks::new(2)
        .backend(Backend::Mpi)
        .run_test(all_cases)
        .unwrap_or_else(|e| panic!("2 MPI ranks: {e}"));
}

#[test]
fn a_column_range_that_cuts_a_group_is_an_error_naming_the_tensor() {
    let s = cpu();
    let dir = HfDirectory::open(golden_path("llama-tied-q4")).expect("opens");
    let name = "model.layers.0.self_attn.o_proj.weight";
    let group = safemlx_dist::init(false, Backend::Any).expect("singleton");
    let weights = Weights::new(&dir, &group);
    let error = load_columns(&weights, name, [128, 128], &[48, 80], &s).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "checkpoint {}: tensor `{name}` is quantized in groups of 32 columns; columns 0..48 cut a group (split it over ranks whose parts are whole groups: fewer ranks or another --tensor-split; or load it as floats: --weights float)",
            golden_path("llama-tied-q4").display()
        )
    );
    let error = dir
        .read_quantized_rows("model.norm.weight", &[(0, 1)], &s)
        .unwrap_err();
    assert!(
        error
            .to_string()
            .ends_with("tensor `model.norm.weight` is not stored quantized; read it as floats"),
        "{error}"
    );
}
