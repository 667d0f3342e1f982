//! Llama-family models from Hugging Face directories at 1, 2, 3 and 4
//! ranks: the prompt's logits equal mlx-lm's for the same weights (goldens
//! made by `tests/golden/make_llama_goldens.py` and, for Phi-3,
//! `make_phi3_goldens.py`), decoding with the KV
//! cache equals the whole-sequence logits, every rank reads only its part
//! of the weights and holds its chunk of the query heads (KV heads shared
//! where query heads of one fall on two ranks); the same for GGUF copies
//! of five of the models.

use std::path::{Path, PathBuf};

use safemlx::Stream;
use safemlx_dist::checkpoint::{GgufFile, HfDirectory, TensorSource};
use safemlx_dist::launch::Ranks;
use safemlx_dist::models::Llama;
use safemlx_dist::typed::chunk;
use safemlx_dist::{Backend, Group};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::models::check_logits;

/// Every case of the golden scripts: (directory, what it covers).
const CASES: [(&str, &str); 10] = [
    ("llama-tied-kv3", "tied embeddings, 3 KV heads"),
    (
        "llama3-kv1-sharded",
        "1 KV head, Llama 3 RoPE scaling, 2 shards",
    ),
    ("mistral-kv2", "Mistral"),
    ("qwen2-bias", "q/k/v biases"),
    ("llama-bias", "Llama's attention_bias: q/k/v and o biases"),
    ("qwen3-qknorm", "q/k norms, head_dim 16"),
    ("qwen3-yarn", "YaRN RoPE scaling"),
    (
        "llama-window",
        "sliding-window layers of 3 around a full one, a prompt of 9",
    ),
    (
        "phi3-fused",
        "Phi-3: fused qkv_proj and gate_up_proj (make_phi3_goldens.py)",
    ),
    (
        "phi4-mini-longrope",
        "Phi-4-mini: 3/4 of each head rotated, LongRoPE, tied embeddings",
    ),
];

fn golden_dir(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden/llama")
        .join(case)
}

/// The prompt and mlx-lm's logits `[T, V]` (row-major).
fn golden(case: &str, s: &Stream) -> (Vec<u32>, Vec<f32>) {
    safemlx_dist_tests::models::golden(&golden_dir(case).join("golden.safetensors"), s)
}

/// Total tensor bytes of a model directory.
fn model_bytes(dir: &HfDirectory) -> u64 {
    dir.names()
        .map(|n| dir.info(n).expect("info").nbytes())
        .sum()
}

fn check_case(group: &Group, case: &str, about: &str) {
    let s = cpu();
    let dir = HfDirectory::open(golden_dir(case)).expect("opens");
    let model = Llama::from_hf(group, &dir, &s).expect("loads");
    let total = model_bytes(&dir);
    check_model(group, &model, (dir.bytes_read(), total), case, about);
}

/// The GGUF copy of `case` (F32, q/k rows in llama.cpp's order for `llama`).
fn check_gguf_case(group: &Group, case: &str, about: &str) {
    let s = cpu();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("golden/gguf/{case}.gguf"));
    let file = GgufFile::open(&path).expect("opens");
    let total: u64 = file.tensors().values().map(|t| t.nbytes()).sum();
    let (model, weights) = Llama::from_gguf(group, file, &s).expect("loads");
    let about = format!("GGUF, {about}");
    check_model(group, &model, (weights.bytes_read(), total), case, &about);
}

fn check_model(group: &Group, model: &Llama, (read, total): (u64, u64), case: &str, about: &str) {
    let s = cpu();
    let (n, rank) = (group.size(), group.rank());
    let what = format!("{case} ({about}) at rank {rank} of {n}");
    let (prompt, want) = golden(case, &s);
    if n > 1 {
        assert!(read < total * 3 / 4, "{what}: read {read} of {total} bytes");
    }
    // Query heads by the chunk rule (6 over 2 ranks: 3 + 3, where KV
    // heads would give 4 + 2), with the KV heads they read; a rank with
    // the one extra head shares it by rows with the next rank when that
    // rank holds its KV head (4 over 3 ranks with 1 KV head: 0..2, 1..3
    // and 3..4, head 1 shared).
    let (heads, kv_heads) = (model.config().heads, model.config().kv_heads);
    let split = model.head_split().expect("a layer");
    let mut query = chunk(heads, rank, n);
    let group = heads / kv_heads;
    let counts: Vec<usize> = (0..n).map(|r| chunk(heads, r, n).1).collect();
    let most = counts.iter().max().copied().unwrap_or(0);
    let single_most = counts.iter().filter(|&&c| c == most).count() == 1;
    let shares = |r: usize| {
        let owner = chunk(heads, r, n);
        let next = (owner.0 + owner.1, counts.get(r + 1).copied().unwrap_or(0));
        single_most && counts[r] == most && next.1 + 1 == most && next.0 % group != 0
    };
    if rank > 0 && shares(rank - 1) {
        query = (query.0 - 1, query.1 + 1);
    }
    assert_eq!(split.query, query, "{what}: query heads");
    assert_eq!(
        split.shared.is_some(),
        shares(rank) || (rank > 0 && shares(rank - 1)),
        "{what}: a head shared by rows"
    );
    if query.1 > 0 {
        let kv = (
            query.0 / group,
            (query.0 + query.1 - 1) / group + 1 - query.0 / group,
        );
        assert_eq!(split.kv, kv, "{what}: KV heads");
    }
    check_logits(model, &prompt, &want, &what);
}

fn all_cases(group: &Group) {
    for (case, about) in CASES {
        check_case(group, case, about);
    }
    for (case, about) in GGUF_CASES {
        check_gguf_case(group, case, about);
    }
}

/// The cases also written as GGUF by `tests/golden/make_gguf_goldens.py`.
const GGUF_CASES: [(&str, &str); 5] = [
    ("llama-tied-kv3", "llama.cpp's q/k row order"),
    ("llama3-kv1-sharded", "Llama 3 scaling as rope_freqs.weight"),
    ("mistral-kv2", "Mistral as llama"),
    ("qwen2-bias", "qwen2 biases"),
    ("qwen3-qknorm", "qwen3"),
];

#[test]
fn llama_family_logits_equal_mlx_lm_at_one_to_four_ranks() {
    for n in 1..=4 {
        Ranks::new(n)
            .backend(Backend::Ring)
            .run_test(all_cases)
            .unwrap_or_else(|e| panic!("{n} ring ranks: {e}"));
    }
}

#[test]
fn llama_family_logits_equal_mlx_lm_under_mpi() {
    Ranks::new(2)
        .backend(Backend::Mpi)
        .run_test(all_cases)
        .unwrap_or_else(|e| panic!("2 MPI ranks: {e}"));
}

/// A copy of a golden model directory, with `edit` applied to its files.
fn damaged_dir(case: &str, tag: &str, edit: impl FnOnce(&Path)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("safemlx-model-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(golden_dir(case)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    edit(&dir);
    dir
}

fn load_error(dir: &Path) -> String {
    // Ring: no MPI_Init, which another test of this binary may be running.
    let group = safemlx_dist::init(false, Backend::Ring).unwrap();
    let error = HfDirectory::open(dir)
        .and_then(|d| Llama::from_hf(&group, &d, &cpu()))
        .expect_err("a damaged model")
        .to_string();
    std::fs::remove_dir_all(dir).ok();
    error.replace(&dir.display().to_string(), "DIR")
}

/// Float bytes a safetensors header labels `I32` are refused where a
/// layer reads them as float weights, instead of being converted.
#[test]
fn a_weight_labelled_as_integers_is_refused() {
    let dir = damaged_dir("llama-tied-kv3", "i32", |d| {
        let path = d.join("model.safetensors");
        let mut bytes = std::fs::read(&path).unwrap();
        let key = br#""model.layers.0.self_attn.q_proj.weight":{"dtype":"F32""#;
        let at = bytes.windows(key.len()).position(|w| w == key).unwrap();
        // Same length: the header's size and offsets stay as they are.
        bytes[at + key.len() - 4..at + key.len() - 1].copy_from_slice(b"I32");
        std::fs::write(path, bytes).unwrap();
    });
    assert_eq!(
        load_error(&dir),
        "model DIR: tensor `model.layers.0.self_attn.q_proj.weight` is stored as I32 but is read as float weights: a weight is F32, F16 or BF16 (U32 only for a quantized weight beside its scales and biases)"
    );
}

/// Configuration values a model cannot run with are named with their key
/// when the directory is read (before, they ran until "the logits hold no
/// finite value").
#[test]
fn configuration_values_that_cannot_run_are_named() {
    let llama = "llama-tied-kv3";
    let cases: [(&str, &str, serde_json::Value, &str); 10] = [
        (
            llama,
            "rope_theta",
            0.0.into(),
            "rope_theta is 0: the RoPE base must be a finite number above 0",
        ),
        (
            llama,
            "rms_norm_eps",
            (-1.0).into(),
            "rms_norm_eps is -1: the RMSNorm epsilon must be above 0 and at most 0.1",
        ),
        (
            llama,
            "rms_norm_eps",
            1000.0.into(),
            "rms_norm_eps is 1000: the RMSNorm epsilon must be above 0 and at most 0.1",
        ),
        (
            llama,
            "rope_scaling",
            serde_json::json!({"rope_type": "linear", "factor": -2.0}),
            "rope_scaling (factor) is -2: a RoPE scaling factor must be a finite number above 0",
        ),
        (
            llama,
            "eos_token_id",
            67.into(),
            "eos_token_id is 67, outside the vocabulary of 67 tokens",
        ),
        (
            "llama-window",
            "layer_types",
            serde_json::json!(["sliding_attention", "full_attention"]),
            "\"layer_types\" has 2 entries for 3 layers (\"num_hidden_layers\"); give one per layer",
        ),
        (
            "llama-window",
            "layer_types",
            serde_json::json!(["sliding_attention", "chunked_attention", "full_attention"]),
            "\"layer_types\" has the entry \"chunked_attention\"; supported: \"sliding_attention\", \"full_attention\"",
        ),
        // Phi-3's part of each head rotated, and LongRoPE: head_dim 8.
        (
            "phi3-fused",
            "partial_rotary_factor",
            0.2.into(),
            "\"partial_rotary_factor\" 0.2 of head_dim 8 rotates 1 dimensions; RoPE rotates pairs, so it must be an even number above 0",
        ),
        (
            "phi3-fused",
            "rope_scaling",
            serde_json::json!({"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}),
            "rope_scaling (long_factor) has 1 values; it needs one per rotated pair, 4 (8 rotated dimensions)",
        ),
        (
            "phi3-fused",
            "rope_scaling",
            serde_json::json!({"type": "su", "short_factor": [1.0]}),
            "rope scaling \"longrope\" has no \"long_factor\" list",
        ),
    ];
    for (case, key, value, message) in cases {
        let dir = damaged_dir(case, &format!("{case}-{key}"), |d| {
            let path = d.join("config.json");
            let mut json: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            json[key] = value.clone();
            std::fs::write(path, json.to_string()).unwrap();
        });
        assert_eq!(
            load_error(&dir),
            format!("model DIR: {message}"),
            "{case} {key}"
        );
    }
}

#[test]
fn damaged_model_directories_name_the_file_and_the_tensor() {
    let config = |dir: &Path, edit: &dyn Fn(&mut serde_json::Value)| {
        let path = dir.join("config.json");
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut json);
        std::fs::write(path, json.to_string()).unwrap();
    };
    let dir = damaged_dir("llama-tied-kv3", "dim", |d| {
        config(d, &|j| j["intermediate_size"] = 96.into())
    });
    assert_eq!(
        load_error(&dir),
        "model DIR: tensor `model.layers.0.mlp.gate_proj.weight` has shape [80, 48] but the configuration gives [96, 48]"
    );
    let dir = damaged_dir("llama-tied-kv3", "untied", |d| {
        config(d, &|j| j["tie_word_embeddings"] = false.into())
    });
    assert!(
        load_error(&dir).ends_with("has no tensor `lm_head.weight`; it has: model.embed_tokens.weight, model.layers.0.input_layernorm.weight, model.layers.0.mlp.down_proj.weight, model.layers.0.mlp.gate_proj.weight, model.layers.0.mlp.up_proj.weight, model.layers.0.post_attention_layernorm.weight, model.layers.0.self_attn.k_proj.weight, model.layers.0.self_attn.o_proj.weight, model.layers.0.self_attn.q_proj.weight, model.layers.0.self_attn.v_proj.weight, model.layers.1.input_layernorm.weight, model.layers.1.mlp.down_proj.weight, ..."),
    );
    // An index that places a tensor in a shard that does not hold it.
    let dir = damaged_dir("llama3-kv1-sharded", "index", |d| {
        let path = d.join("model.safetensors.index.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let mut index: serde_json::Value = serde_json::from_str(&text).unwrap();
        index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors".into();
        std::fs::write(path, index.to_string()).unwrap();
    });
    let error = load_error(&dir);
    assert!(
        error
            .contains("model-00001-of-00002.safetensors: has no tensor `model.norm.weight`, which")
            && error.ends_with("model.safetensors.index.json places in it"),
        "{error}"
    );
    // A truncated shard.
    let dir = damaged_dir("qwen2-bias", "truncated", |d| {
        let path = d.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    });
    let error = load_error(&dir);
    assert!(error.contains("the file may be truncated"), "{error}");
    let dir = damaged_dir("qwen2-bias", "nocfg", |d| {
        std::fs::remove_file(d.join("config.json")).unwrap()
    });
    assert!(load_error(&dir).starts_with("checkpoint DIR/config.json: cannot read it ("));
}
