//! The real models' gradients (`Llama::loss` through the typed layer):
//! the loss and the global gradient norm of the Llama-family and MoE
//! golden models equal mlx-lm's at 1 to 4 ring ranks and on MPI, in both
//! expert placements; a rank that holds no query head still joins its
//! peers' gradient sums. The layers' own gradients are in `gradients.rs`.

use safemlx::{Array, Stream};
use safemlx_dist::checkpoint::{HfDirectory, Weights};
use safemlx_dist::grad::Parameters;
use safemlx_dist::launch::Ranks;
use safemlx_dist::models::{Llama, LlamaConfig};
use safemlx_dist::nn::ExpertPlacement;
use safemlx_dist::{Backend, Group};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{host, random};
use safemlx_dist_tests::golden_gradients::{check_against_golden, model_loss_and_norm};
use safemlx_dist_tests::typed::Rng;

/// The golden models: tied embeddings with 3 KV heads, q/k/v biases, q/k
/// norms, and one KV head shared by every rank (untied, two files).
const MODEL_CASES: [&str; 4] = [
    "llama-tied-kv3",
    "qwen2-bias",
    "qwen3-qknorm",
    "llama3-kv1-sharded",
];

/// Every float weight of a real Llama-family model (tied embeddings and 3
/// KV heads, q/k/v biases, q/k norms): the loss and the global norm of its
/// gradient equal mlx-lm's, at every rank count up to the KV heads; the
/// norm counts each rank's chunks and each replicated gradient once, so a
/// missing or doubled sum over ranks shows.
fn check_models(group: &Group) {
    let s = cpu();
    for case in MODEL_CASES {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("golden/llama")
            .join(case);
        let model = Llama::from_hf(group, &HfDirectory::open(&dir).unwrap(), &s).unwrap();
        let what = format!("{case} at {} ranks", group.size());
        check_against_golden(&model, &dir, &what, group, &s);
    }
}

/// The MoE models (Mixtral's gating; Qwen3-MoE renormalised with a dense
/// layer; Qwen2-MoE with a gated shared expert), experts split across
/// ranks and sliced.
/// Then DeepSeek-V3 (latent attention, grouped sigmoid routing, a shared
/// expert), GLM-4-MoE (partial rotary embedding, q/k norms, biases) and
/// gpt-oss (sinks, q/k/v/o biases, a biased router, expert biases; its
/// MXFP4 experts frozen, as mlx-lm freezes quantized layers).
const MOE_CASES: [&str; 6] = [
    "mixtral",
    "qwen3-moe",
    "qwen2-moe",
    "deepseek-v3",
    "glm4-moe",
    "gpt-oss",
];

fn check_moe_models(group: &Group) {
    let s = cpu();
    for case in MOE_CASES {
        for placement in [
            ExpertPlacement::ExpertParallel,
            ExpertPlacement::ExpertTensorParallel,
        ] {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("golden/moe")
                .join(case);
            let hf = HfDirectory::open(&dir).unwrap();
            let mut config = LlamaConfig::from_hf(hf.config(), case).unwrap();
            config.moe.as_mut().expect("an MoE model").placement = placement;
            let model = Llama::load(&Weights::new(&hf, group), config, &s).unwrap();
            let what = format!("{case}, {}, at {} ranks", placement.as_str(), group.size());
            check_against_golden(&model, &dir, &what, group, &s);
        }
    }
}

/// The loss and gradient norm of `model` equal mlx-lm's (the
/// `gradients.safetensors` of `dir`), and one AdamW step lowers the loss.
#[test]
fn moe_model_gradients_match_mlx_lm_at_1_to_4_ranks() {
    for ranks in [1, 2, 3, 4] {
        Ranks::new(ranks)
            .run_test(check_moe_models)
            .unwrap_or_else(|e| panic!("{ranks} ring ranks: {e}"));
    }
    Ranks::new(2)
        .backend(Backend::Mpi)
        .run_test(check_moe_models)
        .unwrap_or_else(|e| panic!("2 MPI ranks: {e}"));
}

#[test]
fn model_gradients_match_mlx_lm_at_1_to_4_ranks() {
    for ranks in [1, 2, 3, 4] {
        Ranks::new(ranks)
            .run_test(check_models)
            .unwrap_or_else(|e| panic!("{ranks} ring ranks: {e}"));
    }
}

#[test]
fn model_gradients_match_mlx_lm_on_mpi() {
    Ranks::new(3)
        .backend(Backend::Mpi)
        .run_test(check_models)
        .unwrap_or_else(|e| panic!("3 MPI ranks: {e}"));
}

/// A one-layer Llama with 2 query heads over 1 KV head, written by each
/// rank to its own directory (the same bytes): at 2 and 3 ranks the KV
/// head is on ranks 0 and 1, and at 3 rank 2 holds no head.
fn few_heads_model(group: &Group, s: &Stream) -> Llama {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "gqa-few-heads-{}-of-{}",
        group.rank(),
        group.size()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (v, d, h, hd) = (72, 16, 24, 8);
    let config = serde_json::json!({
        "model_type": "llama", "vocab_size": v, "hidden_size": d,
        "intermediate_size": h, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": hd,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": true, "torch_dtype": "float32",
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut rng = Rng::new(23);
    let mut w = |shape: &[i32]| random(&mut rng, shape, 0.05);
    let ones = Array::from_slice(&[1.0f32; 16], &[d]);
    let tensors = vec![
        ("model.embed_tokens.weight", w(&[v, d])),
        ("model.norm.weight", ones.clone()),
        ("model.layers.0.input_layernorm.weight", ones.clone()),
        ("model.layers.0.post_attention_layernorm.weight", ones),
        ("model.layers.0.self_attn.q_proj.weight", w(&[2 * hd, d])),
        ("model.layers.0.self_attn.k_proj.weight", w(&[hd, d])),
        ("model.layers.0.self_attn.v_proj.weight", w(&[hd, d])),
        ("model.layers.0.self_attn.o_proj.weight", w(&[d, 2 * hd])),
        ("model.layers.0.mlp.gate_proj.weight", w(&[h, d])),
        ("model.layers.0.mlp.up_proj.weight", w(&[h, d])),
        ("model.layers.0.mlp.down_proj.weight", w(&[d, h])),
    ];
    safemlx_dist::checkpoint::save(dir.join("model.safetensors"), &tensors, s).unwrap();
    Llama::from_hf(group, &HfDirectory::open(&dir).unwrap(), s).unwrap()
}

/// With a rank that holds no head (it computes zeros, yet joins its
/// peers' gradient sums), 2 and 3 ranks give the 1-rank loss and gradient
/// norm; the KV weights' gradients are equal on the two ranks that hold
/// the head (each gets the head's whole gradient).
#[test]
fn a_kv_head_shared_by_ranks_without_query_heads_trains() {
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("gqa-few-heads.json");
    Ranks::new(1)
        .run_test(|group| {
            let s = cpu();
            let model = few_heads_model(group, &s);
            let (loss, norm, _) = model_loss_and_norm(&model, group, &s);
            std::fs::write(&out, serde_json::to_string(&[loss, norm]).unwrap()).unwrap();
        })
        .unwrap();
    for ranks in [2, 3] {
        Ranks::new(ranks)
            .run_test(|group| {
                let s = cpu();
                let want: Vec<f32> =
                    serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
                let model = few_heads_model(group, &s);
                let split = model.head_split().unwrap();
                if group.size() == 3 {
                    assert_eq!(split.query.1, usize::from(group.rank() < 2));
                }
                let (loss, norm, grads) = model_loss_and_norm(&model, group, &s);
                let relative = |a: f32, b: f32| (a - b).abs() / b.abs().max(1e-6);
                assert!(
                    relative(loss, want[0]) <= 1e-4,
                    "loss {loss} vs 1 rank {}",
                    want[0]
                );
                assert!(
                    relative(norm, want[1]) <= 1e-4,
                    "norm {norm} vs 1 rank {}",
                    want[1]
                );
                // The k and v weights (after the embedding, the norm and q):
                // on the two ranks with a query head, equal; none on a third.
                let params = grads.parameters();
                let holds = usize::from(group.rank() < 2);
                for (i, name) in [(3, "k"), (4, "v")] {
                    let mine = host(&params[i].local, &s);
                    assert_eq!(
                        params[i].local.shape()[0] as usize,
                        holds * 8,
                        "{name} rows"
                    );
                    let copies = if holds == 1 { 2 } else { 1 };
                    assert_eq!(params[i].copies, copies, "{name} copies");
                    // The same length from every rank (zeros from one without).
                    let sent = match holds {
                        1 => params[i].local.reshape(&[1, -1], &s).unwrap(),
                        _ => Array::from_slice(&[0f32; 128], &[1, 128]),
                    };
                    let all = safemlx_dist::all_gather(&sent, group, &s).unwrap();
                    let all = host(&all, &s);
                    if holds == 1 {
                        for other in all.chunks(mine.len()).take(2) {
                            assert_eq!(
                                other,
                                mine.as_slice(),
                                "{name}: ranks hold different gradients"
                            );
                        }
                    }
                }
            })
            .unwrap_or_else(|e| panic!("{ranks} ring ranks: {e}"));
    }
}
