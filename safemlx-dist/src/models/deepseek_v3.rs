//! DeepSeek-V3 (`model_type` `deepseek_v3`: DeepSeek-V3, R1; `kimi_k2`; GGUF `deepseek2`):
//! the Llama decoder (`models/llama.rs`, which reads this file's settings
//! and names) with multi-head latent attention
//! ([`MlaAttention`](crate::nn::MlaAttention)) and GLM-4-MoE's routing, as
//! mlx-lm's `deepseek_v3.py` computes it:
//!
//! ```text
//! attention: q = q_b_proj(RMSNorm(q_a_proj x))  (q_proj x without q_lora_rank)
//!            latent, k_rope = kv_a_proj_with_mqa x; latent = RMSNorm(latent)
//!            keys and values of head h from latent kv_b_proj_h
//!            traditional (interleaved) RoPE on qk_rope_head_dim dimensions,
//!            softmax scale 1 / sqrt(qk_nope + qk_rope), times YaRN's
//!            m(mscale_all_dim)^2
//! layers < first_k_dense_replace, or not a multiple of moe_layer_freq:
//!            a dense MLP of intermediate_size
//! then:      GLM-4-MoE's experts (`glm4_moe.rs`): sigmoid scores, the
//!            correction bias, n_group / topk_group, routed scaling,
//!            n_shared_experts shared experts
//! ```
//!
//! The multi-token-prediction layers a checkpoint holds after the last
//! layer (`model.layers.{num_hidden_layers}..`) are not read; loading
//! names them in one warning ([`mtp_warning`]).

use serde_json::Value;

use super::config::{MlaSettings, MoeSettings};
use super::config_gguf_keys::GgufKeys;
use super::config_keys::Keys;
use crate::error::Result;
use crate::nn::MlaNames;

/// A layer's latent-attention tensors under `self_attn`.
pub(super) const ATTENTION: MlaNames = MlaNames {
    q: "q_proj",
    q_a: "q_a_proj",
    q_a_norm: "q_a_layernorm",
    q_b: "q_b_proj",
    kv_a: "kv_a_proj_with_mqa",
    kv_a_norm: "kv_a_layernorm",
    kv_b: "kv_b_proj",
    embed_q: "embed_q",
    unembed_out: "unembed_out",
    o: "o_proj",
};

/// The latent attention of a DeepSeek-V3 `config.json`, checked.
///
/// # Errors
/// A missing or ill-typed key, an odd `qk_rope_head_dim`, or
/// `attention_bias` (biases on the latent projections are not read); the
/// message names the key and the file.
pub(super) fn mla_settings(keys: &Keys) -> Result<MlaSettings> {
    if keys.flag("attention_bias")? == Some(true) {
        return Err(keys.fail(
            "\"attention_bias\" is true; DeepSeek-V3's latent projections are read without biases"
                .to_owned(),
        ));
    }
    let rope_dim = keys.need("qk_rope_head_dim")?;
    if rope_dim % 2 != 0 {
        return Err(keys.fail(format!(
            "\"qk_rope_head_dim\" is {rope_dim}; RoPE rotates pairs, so it must be even"
        )));
    }
    Ok(MlaSettings {
        q_lora_rank: keys.int("q_lora_rank")?,
        kv_lora_rank: keys.need("kv_lora_rank")?,
        nope_dim: keys.need("qk_nope_head_dim")?,
        rope_dim,
        v_dim: keys.need("v_head_dim")?,
    })
}

/// The experts of a DeepSeek-V3 `config.json` (`None` without
/// `n_routed_experts`: every layer dense): GLM-4-MoE's keys, and
/// `moe_layer_freq` (layer `i` from `first_k_dense_replace` on is an MoE
/// layer when `i % moe_layer_freq == 0`).
///
/// # Errors
/// Those of GLM-4-MoE's experts, or a `moe_layer_freq` of 0.
pub(super) fn moe_settings(keys: &Keys) -> Result<Option<MoeSettings>> {
    if keys.int("n_routed_experts")?.is_none() {
        return Ok(None);
    }
    let mut moe = super::glm4_moe::moe_settings(keys, "DeepSeek-V3")?;
    let freq = keys.int("moe_layer_freq")?.unwrap_or(1);
    if freq == 0 {
        return Err(keys.fail("\"moe_layer_freq\" is 0".to_owned()));
    }
    let layers = keys.need("num_hidden_layers")?;
    moe.mlp_only_layers = (0..layers).filter(|i| i % freq != 0).collect();
    Ok(Some(moe))
}

/// A `deepseek2` GGUF's metadata (llama.cpp's converter's names for
/// DeepSeek-V3, R1 and Kimi K2) as the `config.json` of the same model,
/// which [`LlamaConfig::from_hf`](super::LlamaConfig::from_hf) reads:
/// `key_length_mla` / `value_length_mla` are the query head's and value's
/// widths (`key_length` / `value_length` in files without them), the
/// rotated part is `rope.dimension_count`, `yarn_log_multiplier` is `0.1 *
/// mscale_all_dim` (and `mscale` equals it, as in DeepSeek's own
/// configurations); the experts as
/// [`GgufKeys::grouped_experts`] reads them.
///
/// # Errors
/// A missing or ill-typed key, a query head no wider than its rotated
/// part, or a RoPE scaling other than none or YaRN; the key named.
pub(super) fn config_from_gguf(g: &GgufKeys) -> Result<Value> {
    let mut c = g.hf_base("deepseek_v3")?;
    g.grouped_experts(&mut c)?;
    let rope = g.need("rope.dimension_count")?;
    let key = match g.int("attention.key_length_mla")? {
        Some(k) => k,
        None => g.need("attention.key_length")?,
    };
    let value = match g.int("attention.value_length_mla")? {
        Some(v) => v,
        None => g.need("attention.value_length")?,
    };
    if key <= rope {
        return Err(g.fail(format!(
            "the query head's width ({key}) is not above {} ({rope})",
            g.key("rope.dimension_count")
        )));
    }
    let mut put = |k: &str, v: Value| {
        c.insert(k.into(), v);
    };
    put(
        "num_key_value_heads",
        g.need("attention.head_count")?.into(),
    );
    put("kv_lora_rank", g.need("attention.kv_lora_rank")?.into());
    put("qk_rope_head_dim", rope.into());
    put("qk_nope_head_dim", (key - rope).into());
    put("v_head_dim", value.into());
    if let Some(v) = g.int("attention.q_lora_rank")? {
        put("q_lora_rank", v.into());
    }
    match g.text("rope.scaling.type") {
        None | Some("none") => {}
        Some("yarn") => {
            let need_float = |k: &str| -> Result<f64> {
                g.float(k)?
                    .ok_or_else(|| g.fail(format!("has YaRN scaling but no {}", g.key(k))))
            };
            let mscale = g.float("rope.scaling.yarn_log_multiplier")?.unwrap_or(0.0) / 0.1;
            let original = g.need("rope.scaling.original_context_length")?;
            put(
                "rope_scaling",
                serde_json::json!({
                    "type": "yarn",
                    "factor": need_float("rope.scaling.factor")?,
                    "original_max_position_embeddings": original,
                    "beta_fast": g.float("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                    "beta_slow": g.float("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                    "mscale": mscale,
                    "mscale_all_dim": mscale,
                }),
            );
        }
        Some(other) => {
            return Err(g.fail(format!(
                "{} is \"{other}\"; supported: none, yarn",
                g.key("rope.scaling.type")
            )))
        }
    }
    Ok(Value::Object(c))
}

/// The tensors among `names` of layers `layers` and after
/// (`model.layers.{n}.`), with their layer, in order.
pub fn layers_past<'a>(
    names: impl Iterator<Item = &'a str>,
    layers: usize,
) -> Vec<(usize, &'a str)> {
    let mut past: Vec<(usize, &str)> = names
        .filter_map(|name| {
            let rest = name.strip_prefix("model.layers.")?;
            let layer: usize = rest.split('.').next()?.parse().ok()?;
            (layer >= layers).then_some((layer, name))
        })
        .collect();
    past.sort_unstable();
    past
}

/// The warning for tensors of the multi-token-prediction layers (those
/// under `model.layers.{layers}.` and after) among `names`, which
/// generation does not use: `None` when there are none.
pub fn mtp_warning<'a>(names: impl Iterator<Item = &'a str>, layers: usize) -> Option<String> {
    let skipped = layers_past(names, layers);
    let (first, last) = (skipped.first()?.0, skipped.last()?.0);
    let which = match first == last {
        true => format!("layer {first}"),
        false => format!("layers {first}..={last}"),
    };
    Some(format!(
        "skipping the multi-token-prediction {which} ({} tensors, e.g. `{}`): generation does not use them",
        skipped.len(),
        skipped[0].1
    ))
}

#[cfg(test)]
mod tests {
    use super::super::config::{Family, LlamaConfig};
    use serde_json::{json, Value};

    /// DeepSeek-V3's own `config.json` (its shape and routing).
    fn deepseek_v3() -> Value {
        json!({
            "model_type": "deepseek_v3", "vocab_size": 129280,
            "hidden_size": 7168, "intermediate_size": 18432,
            "moe_intermediate_size": 2048, "num_hidden_layers": 61,
            "num_attention_heads": 128, "num_key_value_heads": 128,
            "n_shared_experts": 1, "n_routed_experts": 256,
            "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
            "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "qk_nope_head_dim": 128, "topk_method": "noaux_tc",
            "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
            "moe_layer_freq": 1, "first_k_dense_replace": 3,
            "norm_topk_prob": true, "scoring_func": "sigmoid",
            "rms_norm_eps": 1e-6, "rope_theta": 10000,
            "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
                "mscale": 1.0, "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096, "type": "yarn"},
            "attention_bias": false, "tie_word_embeddings": false,
            "num_nextn_predict_layers": 1, "bos_token_id": 0, "eos_token_id": 1
        })
    }

    #[test]
    fn deepseek_v3_caches_576_latent_values_per_token_and_layer() {
        let c = LlamaConfig::from_hf(&deepseek_v3(), "m").unwrap();
        assert_eq!(c.family, Family::DeepseekV3);
        let m = c.mla.unwrap();
        assert_eq!((c.head_dim, c.rotary_dim, c.kv_heads), (192, 64, 128));
        assert_eq!(m.latent_values(), 576);
        assert_eq!(m.per_head_values(128), 128 * 320);
        // Softmax scale: 1/sqrt(192) times (0.1 ln 40 + 1)^2; the rotation
        // itself is not scaled (mscale / mscale_all_dim = 1).
        let yarn = 0.1 * 40f32.ln() + 1.0;
        assert!((c.attention_scale() - yarn * yarn / 192f32.sqrt()).abs() < 1e-7);
        assert_eq!(c.rope_mscale(), 1.0);
        let moe = c.moe.unwrap();
        assert!(!moe.is_moe_layer(2) && moe.is_moe_layer(3) && moe.is_moe_layer(60));
        assert_eq!(moe.shared_hidden, Some(2048));
    }

    #[test]
    fn moe_layer_freq_and_dense_models() {
        let mut j = deepseek_v3();
        j["moe_layer_freq"] = json!(2);
        let moe = LlamaConfig::from_hf(&j, "m").unwrap().moe.unwrap();
        assert!(!moe.is_moe_layer(3) && moe.is_moe_layer(4) && !moe.is_moe_layer(5));
        j["n_routed_experts"] = Value::Null;
        j["q_lora_rank"] = Value::Null;
        let c = LlamaConfig::from_hf(&j, "m").unwrap();
        assert!(c.moe.is_none() && c.mla.unwrap().q_lora_rank.is_none());
    }

    #[test]
    fn bad_deepseek_configs_name_the_key() {
        let cases = [
            ("qk_rope_head_dim", json!(63), "model m: \"qk_rope_head_dim\" is 63; RoPE rotates pairs, so it must be even"),
            ("kv_lora_rank", Value::Null, "model m: config.json has no \"kv_lora_rank\""),
            ("attention_bias", json!(true), "model m: \"attention_bias\" is true; DeepSeek-V3's latent projections are read without biases"),
            ("moe_layer_freq", json!(0), "model m: \"moe_layer_freq\" is 0"),
            ("n_group", json!(7), "model m: \"n_group\" is 7; it must divide \"n_routed_experts\" (256)"),
            ("scoring_func", json!("softmax"), "model m: \"scoring_func\" is \"softmax\"; DeepSeek-V3 is read with \"sigmoid\""),
        ];
        for (key, value, want) in cases {
            let mut j = deepseek_v3();
            j[key] = value;
            let got = LlamaConfig::from_hf(&j, "m").unwrap_err().to_string();
            assert_eq!(got, want, "{key}");
        }
    }

    #[test]
    fn the_mtp_warning_names_the_skipped_layers() {
        let names = [
            "model.layers.1.mlp.gate.weight",
            "model.layers.2.eh_proj.weight",
            "model.layers.2.enorm.weight",
            "model.norm.weight",
        ];
        assert_eq!(
            super::mtp_warning(names.into_iter(), 2).unwrap(),
            "skipping the multi-token-prediction layer 2 (2 tensors, e.g. `model.layers.2.eh_proj.weight`): generation does not use them"
        );
        assert_eq!(super::mtp_warning(names.into_iter(), 3), None);
    }
}
