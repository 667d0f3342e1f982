//! GLM-4-MoE (`model_type` `glm4_moe`: GLM-4.5, GLM-4.5-Air, GLM-4.6):
//! the Llama decoder (`models/llama.rs`, which reads this file's settings
//! and names) with, as mlx-lm's `glm4_moe.py` and Transformers'
//! `modeling_glm4_moe.py` compute it:
//!
//! ```text
//! q, k  = RoPE of the first head_dim * partial_rotary_factor dimensions
//!         of each head (after per-head q/k RMSNorms with use_qk_norm);
//!         q, k and v with biases (attention_bias), o without
//! layers < first_k_dense_replace: a dense MLP of intermediate_size
//! then: scores = sigmoid(x R)                          R: gate.weight
//!       chosen = top-k of scores + e_score_correction_bias, among the
//!                topk_group of n_group expert groups whose two best
//!                biased scores sum highest
//!       y = routed_scaling_factor * sum_j g_j Expert_j(x) + shared(x)
//!           g = scores[chosen] (/ their sum with norm_topk_prob)
//!           shared: one SwiGLU of n_shared_experts * moe_intermediate_size
//! ```
//!
//! The experts split across ranks or are sliced (both placements), the
//! shared experts' hidden dimension splits like an MLP's. The
//! multi-token-prediction layer a checkpoint may hold after the last
//! layer (`model.layers.{num_hidden_layers}`) is not read.

use serde_json::Value;

use super::config::{ExpertLayout, MoeSettings};
use super::config_gguf_keys::GgufKeys;
use super::config_keys::Keys;
use super::llama::{MLP, QWEN_EXPERTS};
use crate::error::Result;
use crate::nn::{ExpertActivation, ExpertMatmul, ExpertNames, ExpertPlacement, Gating};

/// A layer's MoE tensors under `mlp`: Qwen's expert names, the router's
/// `gate.e_score_correction_bias`, and `shared_experts.{gate,up,down}_proj`
/// without a gate.
pub(super) const EXPERTS: ExpertNames = ExpertNames {
    shared: ("shared_experts", MLP),
    ..QWEN_EXPERTS
};

/// llama.cpp's names in a `glm4moe` GGUF that differ from the other
/// architectures': the norm before the MLP.
pub(super) const GGUF_RENAMES: &[(&str, &str)] = &[("ffn_norm", "post_attention_norm")];

/// A `glm4moe` GGUF's metadata (llama.cpp's converter's names for
/// GLM-4.5 and 4.6) as the `config.json` of the same model, which
/// [`LlamaConfig::from_hf`](super::LlamaConfig::from_hf) reads: the head
/// width `key_length`, the rotated part `rope.dimension_count` (as
/// `partial_rotary_factor`), q/k norms and attention biases where the
/// file has their tensors, the experts as
/// [`GgufKeys::grouped_experts`] reads them.
///
/// # Errors
/// A missing or ill-typed key (named).
pub(super) fn config_from_gguf(g: &GgufKeys) -> Result<Value> {
    let mut c = g.hf_base("glm4_moe")?;
    g.grouped_experts(&mut c)?;
    let heads = g.need("attention.head_count")?;
    let head_dim = match g.int("attention.key_length")? {
        Some(d) => d,
        None => g.need("embedding_length")? / heads,
    };
    let rotated = g.int("rope.dimension_count")?.unwrap_or(head_dim);
    let has = |t: &str| g.file.tensors().contains_key(t);
    let kv = g.int("attention.head_count_kv")?.unwrap_or(heads);
    c.insert("num_key_value_heads".into(), kv.into());
    c.insert("head_dim".into(), head_dim.into());
    let factor = rotated as f64 / head_dim as f64;
    c.insert("partial_rotary_factor".into(), factor.into());
    c.insert("use_qk_norm".into(), has("blk.0.attn_q_norm.weight").into());
    c.insert("attention_bias".into(), has("blk.0.attn_q.bias").into());
    Ok(Value::Object(c))
}

/// The experts of a GLM-4-MoE `config.json` (and of DeepSeek-V3's, the
/// same keys; `family` names the model in messages), checked.
///
/// # Errors
/// A missing or ill-typed key, a scoring or top-k method other than
/// `sigmoid` / `noaux_tc`, a routed scaling factor that is not a finite
/// number above 0, `n_group` not dividing `n_routed_experts`, `topk_group`
/// outside `1..=n_group`, or `num_experts_per_tok` above the experts of
/// `topk_group` groups; the message names the keys and the file.
pub(super) fn moe_settings(keys: &Keys, family: &str) -> Result<MoeSettings> {
    for (key, supported) in [("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")] {
        match keys.json.get(key).and_then(|v| v.as_str()) {
            Some(v) if v != supported => {
                return Err(keys.fail(format!(
                    "\"{key}\" is \"{v}\"; {family} is read with \"{supported}\""
                )))
            }
            _ => {}
        }
    }
    let experts = keys.need("n_routed_experts")?;
    let top_k = keys.need("num_experts_per_tok")?;
    let hidden = keys.need("moe_intermediate_size")?;
    let groups = keys.int("n_group")?.unwrap_or(1);
    let topk_group = keys.int("topk_group")?.unwrap_or(groups);
    if groups == 0 || experts % groups != 0 {
        return Err(keys.fail(format!(
            "\"n_group\" is {groups}; it must divide \"n_routed_experts\" ({experts})"
        )));
    }
    if topk_group == 0 || topk_group > groups {
        return Err(keys.fail(format!(
            "\"topk_group\" is {topk_group}; it must be 1 to \"n_group\" ({groups})"
        )));
    }
    let open = topk_group * (experts / groups);
    if top_k > open {
        return Err(keys.fail(format!(
            "\"num_experts_per_tok\" is {top_k}, more than the {open} experts of \"topk_group\" ({topk_group}) groups of {} (\"n_routed_experts\" / \"n_group\")",
            experts / groups
        )));
    }
    let routed_scaling = keys
        .float("routed_scaling_factor", keys.json)?
        .unwrap_or(1.0);
    if !(routed_scaling.is_finite() && routed_scaling > 0.0) {
        return Err(keys.fail(format!(
            "\"routed_scaling_factor\" is {routed_scaling}; it must be a finite number above 0"
        )));
    }
    let shared = keys.int("n_shared_experts")?.unwrap_or(0);
    Ok(MoeSettings {
        experts,
        top_k,
        hidden,
        gating: Gating::SigmoidGroups {
            groups,
            topk_group,
            normalize: keys.flag("norm_topk_prob")?.unwrap_or(true),
        },
        routed_scaling,
        first_dense: keys.int("first_k_dense_replace")?.unwrap_or(0),
        shared_hidden: (shared > 0).then_some(shared * hidden),
        sparse_step: 1,
        mlp_only_layers: Vec::new(),
        block: "mlp.",
        layout: ExpertLayout::PerExpert(EXPERTS),
        activation: ExpertActivation::Swiglu,
        placement: ExpertPlacement::ExpertParallel,
        expert_matmul: ExpertMatmul::Auto,
    })
}

#[cfg(test)]
mod tests {
    use super::super::config::{Family, LlamaConfig};
    use crate::nn::Gating;
    use serde_json::{json, Value};

    fn glm() -> Value {
        json!({
            "model_type": "glm4_moe", "vocab_size": 320, "hidden_size": 48,
            "intermediate_size": 64, "moe_intermediate_size": 24,
            "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16,
            "partial_rotary_factor": 0.5, "n_routed_experts": 8,
            "num_experts_per_tok": 3, "n_group": 4, "topk_group": 2,
            "n_shared_experts": 1, "first_k_dense_replace": 1,
            "routed_scaling_factor": 2.5, "norm_topk_prob": true,
            "use_qk_norm": true, "attention_bias": true
        })
    }

    fn error(j: &Value) -> String {
        LlamaConfig::from_hf(j, "m").unwrap_err().to_string()
    }

    #[test]
    fn a_glm4_moe_config_reads_its_routing_and_rotation() {
        let c = LlamaConfig::from_hf(&glm(), "m").unwrap();
        assert_eq!(c.family, Family::Glm4Moe);
        assert_eq!((c.head_dim, c.rotary_dim), (16, 8));
        assert!(c.qkv_bias && c.qk_norm);
        let m = c.moe.unwrap();
        assert_eq!(
            m.gating,
            Gating::SigmoidGroups {
                groups: 4,
                topk_group: 2,
                normalize: true
            }
        );
        assert_eq!((m.routed_scaling, m.first_dense), (2.5, 1));
        assert_eq!(m.shared_hidden, Some(24));
        assert!(!m.is_moe_layer(0) && m.is_moe_layer(1) && m.is_moe_layer(2));
        // float32 bytes: embedding and head 2 x 320 x 48, attention 9216
        // per layer, layer 0's dense MLP 3 x 48 x 64, layers 1-2's experts
        // and shared expert (8 + 1) x 24 x 3 x 48.
        let want = 4 * (2 * 320 * 48 + 3 * 9216 + 3 * 48 * 64 + 2 * 9 * 24 * 3 * 48);
        assert_eq!(
            LlamaConfig::from_hf(&glm(), "m").unwrap().float_bytes(),
            want
        );
    }

    #[test]
    fn bad_glm4_moe_routing_and_rotation_name_the_key() {
        let cases = [
            ("n_group", json!(3), "model m: \"n_group\" is 3; it must divide \"n_routed_experts\" (8)"),
            ("topk_group", json!(5), "model m: \"topk_group\" is 5; it must be 1 to \"n_group\" (4)"),
            ("num_experts_per_tok", json!(5), "model m: \"num_experts_per_tok\" is 5, more than the 4 experts of \"topk_group\" (2) groups of 2 (\"n_routed_experts\" / \"n_group\")"),
            ("partial_rotary_factor", json!(0.0), "model m: \"partial_rotary_factor\" is 0; it must be above 0 and at most 1"),
            ("partial_rotary_factor", json!(0.1875), "model m: \"partial_rotary_factor\" 0.1875 of head_dim 16 rotates 3 dimensions; RoPE rotates pairs, so it must be an even number above 0"),
            ("scoring_func", json!("softmax"), "model m: \"scoring_func\" is \"softmax\"; GLM-4-MoE is read with \"sigmoid\""),
            ("routed_scaling_factor", json!(-1.0), "model m: \"routed_scaling_factor\" is -1; it must be a finite number above 0"),
        ];
        for (key, value, want) in cases {
            let mut j = glm();
            j[key] = value;
            assert_eq!(error(&j), want, "{key}");
        }
    }
}
