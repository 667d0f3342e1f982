//! Phi-3 (`model_type` `phi3`, GGUF `phi3`): the
//! Llama decoder (`models/llama.rs`, which reads this file's names) with
//! two fused tensors per layer, as mlx-lm's `phi3.py` and transformers'
//! `modeling_phi3.py` read them:
//!
//! ```text
//! q, k, v = split(x qkv_projᵀ, [H hd, H_kv hd, H_kv hd])   qkv_proj [(H + 2 H_kv) hd, D]
//! gate, up = split(x gate_up_projᵀ, 2)                     gate_up_proj [2 I, D]
//! ```
//!
//! Everything else (names, norms, RoPE, the tied or untied head) is
//! Llama's. Each rank reads only its heads' rows of each third of
//! `qkv_proj` and its hidden rows of each half of `gate_up_proj`, so the
//! fused tensors are split exactly as the separate ones are. Phi-4-mini
//! and the long-context forms rotate part of each head
//! (`partial_rotary_factor`) with LongRoPE (`rope_scaling` of type
//! `longrope` or `su`: per-pair factors and a factor on q and k, as
//! mlx-lm's `SuScaledRoPE`; see `config_rope.rs`).

use serde_json::{json, Value};

use super::config_gguf_keys::GgufKeys;
use crate::error::{Error, Result};
use crate::nn::{AttentionNames, GateUp, MlpNames, Qkv};

/// A layer's attention under `self_attn`: q, k and v in `qkv_proj`.
pub(super) const ATTENTION: AttentionNames = AttentionNames {
    qkv: Qkv::Fused("qkv_proj"),
    o: "o_proj",
    q_norm: "q_norm",
    k_norm: "k_norm",
    sinks: "sinks",
};

/// A layer's MLP under `mlp`: gate and up in `gate_up_proj`.
pub(super) const MLP: MlpNames = MlpNames {
    gate_up: GateUp::Fused("gate_up_proj"),
    down: "down_proj",
};

/// A `phi3` GGUF's metadata (llama.cpp's converter's names for Phi-3 and
/// Phi-4-mini) as the `config.json` of the same model, which
/// [`LlamaConfig::from_hf`](super::LlamaConfig::from_hf) reads: the
/// rotated part `rope.dimension_count` (as `partial_rotary_factor`), and
/// LongRoPE from the `rope_factors_long.weight` /
/// `rope_factors_short.weight` tensors, `rope.scaling.attn_factor` and
/// `rope.scaling.original_context_length`.
///
/// # Errors
/// A missing or ill-typed key, or a factor tensor that cannot be read
/// (named).
pub(super) fn config_from_gguf(g: &GgufKeys, s: &safemlx::Stream) -> Result<Value> {
    let mut c = g.hf_base("phi3")?;
    let heads = g.need("attention.head_count")?;
    let head_dim = g.need("embedding_length")? / heads;
    let kv = g.int("attention.head_count_kv")?.unwrap_or(heads);
    c.insert("num_key_value_heads".into(), kv.into());
    if let Some(rotated) = g.int("rope.dimension_count")? {
        c.insert(
            "partial_rotary_factor".into(),
            (rotated as f64 / head_dim as f64).into(),
        );
    }
    if let Some(n) = g.int("rope.scaling.original_context_length")? {
        c.insert("original_max_position_embeddings".into(), n.into());
    }
    let factors = |name: &str| -> Result<Option<Vec<f32>>> {
        if !g.file.tensors().contains_key(name) {
            return Ok(None);
        }
        let values = g
            .file
            .read(name, s)?
            .into_evaluated()
            .map_err(Error::from)?;
        values
            .try_to_vec::<f32>()
            .map(Some)
            .map_err(|e| g.fail(format!("{name}: {e}")))
    };
    if let Some(long) = factors("rope_factors_long.weight")? {
        let short = factors("rope_factors_short.weight")?.unwrap_or_else(|| long.clone());
        let mut scaling = json!({
            "type": "longrope",
            "long_factor": long,
            "short_factor": short,
        });
        if let Some(m) = g.float("rope.scaling.attn_factor")? {
            scaling["long_mscale"] = m.into();
        }
        c.insert("rope_scaling".into(), scaling);
    }
    Ok(Value::Object(c))
}
