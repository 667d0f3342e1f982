//! gpt-oss (`model_type` `gpt_oss`: gpt-oss-20b, gpt-oss-120b): the
//! Llama decoder (`models/llama.rs`, which reads this file's settings and
//! names) with, as mlx-lm's `gpt_oss.py` and Transformers'
//! `modeling_gpt_oss.py` compute it:
//!
//! ```text
//! attention: q, k, v and o with biases; a learned sink logit per query
//!            head joins each softmax (a key with no value); sliding
//!            layers see their last sliding_window positions, full layers
//!            all (layer_types; sliding and full alternate without it);
//!            YaRN RoPE
//! experts:   logits = x R + b                     router.weight, router.bias
//!            gates  = softmax of the top-k logits
//!            gate, up = interleaved rows of gate_up_proj x + its bias
//!            h = (clip(up, ±limit) + 1) * g * sigmoid(1.702 g),
//!                g = min(gate, limit)             limit: swiglu_limit, 7
//!            y = sum_j gate_j (down_j h + down bias_j)
//! ```
//!
//! The experts split across ranks or are sliced (both placements); their
//! MXFP4 weights (`*_blocks`, `*_scales`, as OpenAI ships them) stay as
//! stored where MLX multiplies that mode, else are dequantized to float32
//! (`Moe::packed_storage`; loading says which in one line); a float copy in
//! Transformers' layout reads as well, and so does an mlx-community
//! directory (mlx-lm's names: the experts de-interleaved into
//! `experts.gate_proj` / `up_proj` / `down_proj`, MXFP4 in MLX's `mxfp4`
//! mode or affine, the other layers affine by per-module entries).

use serde_json::Value;

use super::config::{ExpertLayout, MoeSettings};
use super::config_gguf_keys::GgufKeys;
use super::config_keys::Keys;
use crate::error::Result;
use crate::nn::{ExpertActivation, InterleavedNames};

/// A layer's MoE tensors under `mlp`.
pub(super) const EXPERTS: InterleavedNames = InterleavedNames {
    router: "router",
    gate_up: "experts.gate_up_proj",
    down: "experts.down_proj",
    mlx_lm: "experts",
};

/// The sigmoid's slope in gpt-oss's SwiGLU (not in its `config.json`).
const ALPHA: f32 = 1.702;

/// The experts of a gpt-oss `config.json`, checked.
///
/// # Errors
/// A missing or ill-typed key, or a `swiglu_limit` that is not a finite
/// number above 0; the message names the key and the file.
pub(super) fn moe_settings(keys: &Keys) -> Result<MoeSettings> {
    let limit = keys.float("swiglu_limit", keys.json)?.unwrap_or(7.0);
    if !(limit.is_finite() && limit > 0.0) {
        return Err(keys.fail(format!(
            "\"swiglu_limit\" is {limit}; it must be a finite number above 0"
        )));
    }
    let dims = (
        keys.need("num_local_experts")?,
        keys.need("num_experts_per_tok")?,
        keys.need("intermediate_size")?,
    );
    Ok(MoeSettings {
        activation: ExpertActivation::ClampedSwiglu {
            alpha: ALPHA,
            limit,
        },
        ..MoeSettings::top_k_softmax(dims, "mlp.", ExpertLayout::Interleaved(EXPERTS))
    })
}

/// llama.cpp's names in a `gpt-oss` GGUF that differ from the other
/// architectures': the norm before the MLP.
pub(super) const GGUF_RENAMES: &[(&str, &str)] = &[("ffn_norm", "post_attention_norm")];

/// A `gpt-oss` GGUF's metadata (llama.cpp's converter's names) as the
/// `config.json` of the same model, which
/// [`LlamaConfig::from_hf`](super::LlamaConfig::from_hf) reads: the head
/// width `key_length`, the experts `expert_count`, `expert_used_count`
/// and `expert_feed_forward_length`, `sliding_window`, YaRN from
/// `rope.scaling.*` (llama.cpp's converter writes no other scaling for
/// gpt-oss); sliding and full layers alternate from layer 0, as llama.cpp
/// runs them, and the SwiGLU limit is gpt-oss's 7 (neither is in the
/// metadata).
///
/// # Errors
/// A missing or ill-typed key, or a RoPE scaling other than YaRN (named).
pub(super) fn config_from_gguf(g: &GgufKeys) -> Result<Value> {
    let mut c = g.hf_base("gpt_oss")?;
    let heads = g.need("attention.head_count")?;
    let head_dim = match g.int("attention.key_length")? {
        Some(d) => d,
        None => g.need("embedding_length")? / heads,
    };
    let has = |t: &str| g.file.tensors().contains_key(t);
    let mut put = |k: &str, v: Value| {
        c.insert(k.into(), v);
    };
    put("head_dim", head_dim.into());
    let kv = g.int("attention.head_count_kv")?.unwrap_or(heads);
    put("num_key_value_heads", kv.into());
    put("num_local_experts", g.need("expert_count")?.into());
    put("num_experts_per_tok", g.need("expert_used_count")?.into());
    if let Some(h) = g.int("expert_feed_forward_length")? {
        put("intermediate_size", h.into());
    }
    if let Some(w) = g.int("attention.sliding_window")? {
        put("sliding_window", w.into());
    }
    put("attention_bias", has("blk.0.attn_q.bias").into());
    match g.text("rope.scaling.type") {
        None | Some("none") => {}
        Some("yarn") => {
            let factor = g.float("rope.scaling.factor")?.ok_or_else(|| {
                g.fail(format!(
                    "has YaRN scaling but no {}",
                    g.key("rope.scaling.factor")
                ))
            })?;
            let original = g.need("rope.scaling.original_context_length")?;
            put(
                "rope_scaling",
                serde_json::json!({
                    "rope_type": "yarn",
                    "factor": factor,
                    "original_max_position_embeddings": original,
                    "beta_fast": g.float("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                    "beta_slow": g.float("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
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

/// Whether each layer slides when `config.json` has no `layer_types`:
/// sliding and full alternate from a sliding layer 0, as mlx-lm reads it.
pub(super) fn default_layer_types(layers: usize) -> Vec<bool> {
    (0..layers).map(|i| i % 2 == 0).collect()
}

#[cfg(test)]
mod tests {
    use super::super::config::{Family, LlamaConfig};
    use crate::nn::{ExpertActivation, Gating};
    use serde_json::{json, Value};

    /// gpt-oss-20b's `config.json` (its shape and switches).
    fn gpt_oss_20b() -> Value {
        let mut types = Vec::new();
        for _ in 0..12 {
            types.extend(["sliding_attention", "full_attention"]);
        }
        json!({
            "model_type": "gpt_oss", "vocab_size": 201088,
            "hidden_size": 2880, "intermediate_size": 2880,
            "num_hidden_layers": 24, "num_attention_heads": 64,
            "num_key_value_heads": 8, "head_dim": 64,
            "num_local_experts": 32, "num_experts_per_tok": 4,
            "sliding_window": 128, "layer_types": types,
            "attention_bias": true, "swiglu_limit": 7.0,
            "rope_theta": 150000, "rms_norm_eps": 1e-5,
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0,
                             "beta_fast": 32.0, "beta_slow": 1.0,
                             "original_max_position_embeddings": 4096},
            "tie_word_embeddings": false,
            "quantization_config": {"quant_method": "mxfp4"}
        })
    }

    #[test]
    fn a_gpt_oss_config_reads_its_attention_and_experts() {
        let c = LlamaConfig::from_hf(&gpt_oss_20b(), "m").unwrap();
        assert_eq!(c.family, Family::GptOss);
        assert!(c.qkv_bias && c.o_bias && c.attention_sinks);
        assert_eq!(c.sliding_window, Some(128));
        assert_eq!(c.window(0), Some(128));
        assert_eq!(c.window(1), None);
        let m = c.moe.unwrap();
        assert_eq!((m.experts, m.top_k, m.hidden), (32, 4, 2880));
        assert_eq!(m.gating, Gating::TopKSoftmax);
        assert_eq!(
            m.activation,
            ExpertActivation::ClampedSwiglu {
                alpha: 1.702,
                limit: 7.0
            }
        );
        assert!((0..24).all(|i| m.is_moe_layer(i)));
        // Without layer_types: sliding and full alternate.
        let mut j = gpt_oss_20b();
        j.as_object_mut().unwrap().remove("layer_types");
        let c = LlamaConfig::from_hf(&j, "m").unwrap();
        assert_eq!(
            (c.window(0), c.window(1), c.window(2)),
            (Some(128), None, Some(128))
        );
    }

    #[test]
    fn bad_gpt_oss_keys_are_named() {
        let cases = [
            ("swiglu_limit", json!(0.0), "model m: \"swiglu_limit\" is 0; it must be a finite number above 0"),
            ("layer_types", json!(["full_attention"]), "model m: \"layer_types\" has 1 entries for 24 layers (\"num_hidden_layers\"); give one per layer"),
            ("num_local_experts", json!(null), "model m: config.json has no \"num_local_experts\""),
        ];
        for (key, value, want) in cases {
            let mut j = gpt_oss_20b();
            j[key] = value;
            let got = LlamaConfig::from_hf(&j, "m").unwrap_err().to_string();
            assert_eq!(got, want, "{key}");
        }
    }

    #[test]
    fn yarn_with_truncate_false_keeps_the_ramp_ends_unrounded() {
        // Transformers' `_compute_yarn_parameters` for gpt-oss-20b's
        // rotation (head_dim 64, theta 150000, factor 32 over 4096): the
        // ramp runs from pair 8.0928 to 17.398, or from 8 to 18 rounded;
        // wavelength divisors of pairs 8, 12 and 17 (computed in Python).
        let freqs = |truncate: Option<bool>| {
            let mut j = gpt_oss_20b();
            if let Some(t) = truncate {
                j["rope_scaling"]["truncate"] = json!(t);
            }
            let f = LlamaConfig::from_hf(&j, "m").unwrap().rope_freqs().unwrap();
            [f[8], f[12], f[17]]
        };
        let close = |got: [f32; 3], want: [f64; 3]| {
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (f64::from(*g) / w - 1.0).abs() < 1e-5,
                    "{got:?} vs {want:?}"
                );
            }
        };
        close(freqs(Some(false)), [19.679897, 147.167912, 7732.833615]);
        close(freqs(None), [19.679897, 142.537169, 4386.969378]);
        close(freqs(Some(true)), [19.679897, 142.537169, 4386.969378]);
        let mut j = gpt_oss_20b();
        j["rope_scaling"]["truncate"] = json!("no");
        assert_eq!(
            LlamaConfig::from_hf(&j, "m").unwrap_err().to_string(),
            "model m: rope scaling \"truncate\" is \"no\", not true or false"
        );
    }
}
