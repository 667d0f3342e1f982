//! Mixture-of-experts models from Hugging Face directories (Mixtral,
//! Qwen3-MoE with a dense first layer, Qwen2-MoE with a gated shared
//! expert, GLM-4-MoE with grouped sigmoid routing and partial RoPE,
//! DeepSeek-V3 with latent attention, gpt-oss with sinks, biases and MXFP4
//! experts) at 1, 2, 3 and 4 ranks, experts split across ranks and experts
//! sliced: the prompt's logits equal mlx-lm's for the same weights (goldens
//! made by `tests/golden/make_moe_goldens.py`), decoding with the KV cache
//! equals the whole-sequence logits, every rank reads only its part; and
//! the `generate` example runs them with `--check`.

use std::path::{Path, PathBuf};
use std::process::Command;

use safemlx_dist::checkpoint::{HfDirectory, Weights};
use safemlx_dist::launch::Ranks;
use safemlx_dist::models::{Llama, LlamaConfig};
use safemlx_dist::nn::{ExpertMatmul, ExpertPlacement};
use safemlx_dist::{Backend, Group};
use safemlx_dist_tests::models::{check_logits, golden};
use safemlx_dist_tests::{built, cpu};

/// Every case of the golden script: (directory, what it covers).
const CASES: [(&str, &str); 8] = [
    ("mixtral", "6 experts, top-2, top-k then softmax"),
    (
        "qwen3-moe",
        "8 experts, top-3 renormalised, dense layer 0, q/k norms",
    ),
    (
        "qwen2-moe",
        "5 experts, top-2, gated shared expert, q/k/v biases",
    ),
    (
        "glm4-moe",
        "8 experts in 4 groups, top-3 of the best 2 groups by sigmoid scores with a correction bias, shared expert, half of each head rotated, dense layer 0",
    ),
    (
        "deepseek-v3",
        "latent attention with a query latent and YaRN, GLM's routing, dense layer 0",
    ),
    (
        "deepseek-v3-lite",
        "latent attention with q_proj, MoE every second layer, 6 experts top-2",
    ),
    (
        "gpt-oss",
        "MXFP4 experts with biases and the clamped SwiGLU, a biased router, attention sinks, q/k/v/o biases, windows of 4 around a full layer",
    ),
    (
        "gpt-oss-float",
        "gpt-oss's experts dequantized in Transformers' float layout",
    ),
];

const PLACEMENTS: [ExpertPlacement; 2] = [
    ExpertPlacement::ExpertParallel,
    ExpertPlacement::ExpertTensorParallel,
];

fn golden_dir(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden/moe")
        .join(case)
}

fn check_case(group: &Group, case: &str, about: &str, placement: ExpertPlacement) {
    let s = cpu();
    let (n, rank) = (group.size(), group.rank());
    let what = format!(
        "{case} ({about}), {}, rank {rank} of {n}",
        placement.as_str()
    );
    let dir = HfDirectory::open(golden_dir(case)).expect("opens");
    let mut config = LlamaConfig::from_hf(dir.config(), &golden_dir(case).display().to_string())
        .expect("config");
    let moe = config.moe.as_mut().expect("an MoE model");
    moe.placement = placement;
    // gpt-oss's experts (with biases, MXFP4 or float) multiply grouped
    // (gather_qmm, gather_mm: a GPU's default) at even rank counts, one
    // expert at a time (the CPU's) at odd ones.
    if case.starts_with("gpt-oss") && n % 2 == 0 {
        moe.expert_matmul = ExpertMatmul::Grouped;
    }
    let model = Llama::load(&Weights::new(&dir, group), config, &s).expect("loads");
    let total: u64 = dir
        .names()
        .map(|name| dir.info(name).expect("info").nbytes())
        .sum();
    if n > 1 {
        let read = dir.bytes_read();
        assert!(read < total * 3 / 4, "{what}: read {read} of {total} bytes");
    }
    let (prompt, want) = golden(&golden_dir(case).join("golden.safetensors"), &s);
    check_logits(&model, &prompt, &want, &what);
    if case == "gpt-oss" {
        // MXFP4 experts stay as stored unless expert tensor parallel
        // leaves a rank without a block of the hidden dimension's three
        // (4 ranks); 2 ranks split them 2 + 1 (64 + 32, not the chunk
        // rule's 48 + 48).
        let whole = placement == ExpertPlacement::ExpertParallel || n <= 3;
        assert_eq!(model.is_quantized(), whole, "{what}");
    }
    if let Some(mla) = model.config().mla {
        // The latent cache: kv_lora_rank + qk_rope_head_dim values per
        // position and layer on every rank, in buffers of STEP positions.
        let mut cache = model.new_cache();
        model.forward(&prompt, &mut cache, &s).expect("forward");
        let values = mla.kv_lora_rank + mla.rope_dim;
        assert_eq!(values, 20, "{what}");
        let layers = model.config().layers;
        let step = safemlx_dist::nn::kv_cache::STEP as usize;
        assert_eq!(cache.nbytes(), layers * step * values * 4, "{what}");
        assert_eq!(model.cache_bytes_per_token(), layers * values * 4, "{what}");
    }
}

fn all_cases(group: &Group) {
    for placement in PLACEMENTS {
        for (case, about) in CASES {
            check_case(group, case, about, placement);
        }
    }
}

#[test]
fn moe_model_logits_equal_mlx_lm_at_one_to_four_ranks() {
    for n in 1..=4 {
        Ranks::new(n)
            .backend(Backend::Ring)
            .run_test(all_cases)
            .unwrap_or_else(|e| panic!("{n} ring ranks: {e}"));
    }
}

#[test]
fn moe_model_logits_equal_mlx_lm_under_mpi() {
    Ranks::new(2)
        .backend(Backend::Mpi)
        .run_test(all_cases)
        .unwrap_or_else(|e| panic!("2 MPI ranks: {e}"));
}

/// Rank 0 writes `case` again in Transformers 5's layout (experts stacked
/// as `mlp.experts.gate_up_proj` `[E, 2H, D]` and `mlp.experts.down_proj`
/// `[E, D, H]`, Mixtral's `block_sparse_moe.` renamed `mlp.`); every rank
/// waits for it and gets its path.
fn stacked_dir(group: &Group, case: &str) -> PathBuf {
    let s = cpu();
    // The ranks are children of one test process: its pid names the copy.
    let dir = std::env::temp_dir().join(format!(
        "safemlx-moe-stacked-{case}-{}-{}",
        group.size(),
        std::os::unix::process::parent_id()
    ));
    if group.rank() == 0 {
        std::fs::create_dir_all(&dir).unwrap();
        let source = HfDirectory::open(golden_dir(case)).expect("opens");
        let config: serde_json::Value = source.config().clone();
        let experts = config["num_local_experts"]
            .as_u64()
            .or(config["num_experts"].as_u64())
            .unwrap() as usize;
        let mut tensors: Vec<(String, safemlx::Array)> = Vec::new();
        let mut names: Vec<String> = source.names().map(str::to_owned).collect();
        names.sort();
        let (gate, up, down) = if case == "mixtral" {
            ("w1", "w3", "w2")
        } else {
            ("gate_proj", "up_proj", "down_proj")
        };
        let mut layers = std::collections::BTreeSet::new();
        for name in &names {
            if let Some((layer, _)) = name.split_once(".experts.") {
                layers.insert(layer.to_owned());
            } else {
                let renamed = name.replace(".block_sparse_moe.", ".mlp.");
                tensors.push((renamed, source.read(name, &s).unwrap()));
            }
        }
        for layer in layers {
            let read = |e: usize, which: &str| {
                source
                    .read(&format!("{layer}.experts.{e}.{which}.weight"), &s)
                    .unwrap()
                    .expand_dims(0, &s)
                    .unwrap()
            };
            let stack = |parts: Vec<safemlx::Array>, axis| {
                safemlx::ops::concatenate_axis(&parts, axis, &s).unwrap()
            };
            let gate_up: Vec<_> = (0..experts)
                .map(|e| stack(vec![read(e, gate), read(e, up)], 1))
                .collect();
            let downs: Vec<_> = (0..experts).map(|e| read(e, down)).collect();
            let layer = layer.replace(".block_sparse_moe", ".mlp");
            tensors.push((format!("{layer}.experts.gate_up_proj"), stack(gate_up, 0)));
            tensors.push((format!("{layer}.experts.down_proj"), stack(downs, 0)));
        }
        safemlx_dist::checkpoint::save(dir.join("model.safetensors"), &tensors, &s).unwrap();
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    }
    let token = safemlx_dist::all_sum(&safemlx::Array::from_f32(1.0), group, &s).unwrap();
    safemlx_dist::eval(&[&token]).unwrap();
    dir
}

/// The stacked copies give the same logits, each rank reading only its
/// experts when they are split.
#[test]
fn stacked_experts_of_transformers_5_give_the_same_logits() {
    for n in [1, 2, 3] {
        Ranks::new(n)
            .run_test(|group| {
                let s = cpu();
                for (case, _) in &CASES[..2] {
                    let dir = stacked_dir(group, case);
                    for placement in PLACEMENTS {
                        let what = format!(
                            "stacked {case}, {}, rank {} of {n}",
                            placement.as_str(),
                            group.rank()
                        );
                        let source = HfDirectory::open(&dir).expect("opens");
                        let mut config =
                            LlamaConfig::from_hf(source.config(), "stacked").expect("config");
                        config.moe.as_mut().unwrap().placement = placement;
                        let model =
                            Llama::load(&Weights::new(&source, group), config, &s).expect("loads");
                        if n > 1 && placement == ExpertPlacement::ExpertParallel {
                            let total: u64 = source
                                .names()
                                .map(|name| source.info(name).expect("info").nbytes())
                                .sum();
                            let read = source.bytes_read();
                            assert!(read < total * 3 / 4, "{what}: read {read} of {total} bytes");
                        }
                        let (prompt, want) =
                            golden(&golden_dir(case).join("golden.safetensors"), &s);
                        check_logits(&model, &prompt, &want, &what);
                    }
                    if group.rank() == 0 {
                        std::fs::remove_dir_all(&dir).ok();
                    }
                }
            })
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}

#[test]
fn generate_runs_mixtral_qwen3_moe_glm4_moe_deepseek_v3_and_gpt_oss_with_check() {
    let (launcher, generate) = (built("safemlx-launch"), built("examples/generate"));
    for case in ["mixtral", "qwen3-moe", "glm4-moe", "deepseek-v3", "gpt-oss"] {
        for (ranks, experts) in [
            (1, "parallel"),
            (2, "parallel"),
            (4, "parallel"),
            (2, "tensor-parallel"),
        ] {
            let out = Command::new(&launcher)
                .args(["-n", &ranks.to_string(), "--timeout", "120", "--"])
                .arg(&generate)
                .arg("--model")
                .arg(golden_dir(case))
                .args(["--prompt", "Hello experts", "--max-tokens", "6"])
                .args(["--experts", experts, "--check"])
                .output()
                .expect("safemlx-launch runs");
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                out.status.success(),
                "{case} at {ranks} ranks, experts {experts}:\n{all}"
            );
            assert!(
                all.contains(&format!("rank 0/{ranks}: --check against one process")),
                "{case} at {ranks} ranks: no check line:\n{all}"
            );
            assert!(
                all.contains("greedy tokens agree"),
                "{case} at {ranks} ranks: greedy tokens differ:\n{all}"
            );
            if case == "deepseek-v3" {
                // 3 layers of 16 + 4 float32 values; 4 heads' keys (8 + 4)
                // and values (12) split over the ranks.
                let per_head = 3 * 4 * 24 * 4 / ranks;
                let line = format!(
                    "(latent: 240 bytes per token; per-head keys and values would take {per_head})"
                );
                assert!(
                    all.contains(&line),
                    "{case} at {ranks} ranks: no `{line}`:\n{all}"
                );
                // One line per load (--check loads a reference too), rank 0's.
                assert!(!all.contains("[rank 1] warning"), "{case}: {all}");
                assert!(all.contains("skipping the multi-token-prediction layer 3 (2 tensors, e.g. `model.layers.3.eh_proj.weight`): generation does not use them"), "{all}");
            }
            if case == "gpt-oss" {
                // Expert tensor parallel over 2 ranks splits the hidden
                // dimension 96 into whole blocks of 32: kept too.
                let note = "gpt-oss: keeping the MXFP4 experts of 3 layers as stored (MLX's mxfp4 quantized matmuls)";
                assert!(all.contains(note), "{case}: no `{note}`:\n{all}");
                assert!(!all.contains("[rank 1] model"), "{case}: {all}");
            }
        }
    }
}

/// A copy of golden model `case` whose `config.json` `edit` changes; the
/// error loading it on one rank, with the directory written `DIR`.
fn error_with_config(case: &str, tag: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let dir = std::env::temp_dir().join(format!("safemlx-moe-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(golden_dir(case)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let path = dir.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(path, json.to_string()).unwrap();
    let group = safemlx_dist::init(false, Backend::Any).unwrap();
    let error = HfDirectory::open(&dir)
        .and_then(|d| Llama::from_hf(&group, &d, &cpu()))
        .expect_err("a damaged model")
        .to_string();
    std::fs::remove_dir_all(&dir).ok();
    error.replace(&dir.display().to_string(), "DIR")
}

#[test]
fn configurations_that_disagree_with_the_experts_name_the_tensor_or_key() {
    // One expert more than the file holds.
    assert!(
        error_with_config("mixtral", "experts", |j| j["num_local_experts"] = 7.into())
            .starts_with("model DIR: tensor `model.layers.0.block_sparse_moe.gate.weight` has shape [6, 48] but the configuration gives [7, 48]"),
    );
    assert_eq!(
        error_with_config("qwen3-moe", "hidden", |j| j["moe_intermediate_size"] = 32.into()),
        "model DIR: tensor `model.layers.1.mlp.experts.0.gate_proj.weight` has shape [24, 48] but the configuration gives [32, 48]"
    );
    assert_eq!(
        error_with_config("qwen2-moe", "topk", |j| j["num_experts_per_tok"] = 6.into()),
        "model DIR: num_experts_per_tok (6) exceeds the 5 experts"
    );
    assert_eq!(
        error_with_config("qwen3-moe", "noexperts", |j| {
            j.as_object_mut().unwrap().remove("num_experts");
        }),
        "model DIR: config.json has no \"num_experts\""
    );
    assert_eq!(
        error_with_config("gpt-oss", "hidden", |j| j["intermediate_size"] = 128.into()),
        "model DIR: tensor `model.layers.0.mlp.experts.gate_up_proj_bias` has shape [6, 192] but the configuration gives [6, 256]"
    );
    assert_eq!(
        error_with_config("gpt-oss", "limit", |j| j["swiglu_limit"] = (-1.0).into()),
        "model DIR: \"swiglu_limit\" is -1; it must be a finite number above 0"
    );
    assert_eq!(
        error_with_config("glm4-moe", "groups", |j| j["n_group"] = 3.into()),
        "model DIR: \"n_group\" is 3; it must divide \"n_routed_experts\" (8)"
    );
}
