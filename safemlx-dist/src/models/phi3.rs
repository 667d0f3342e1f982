//! Phi-3 (`model_type` `phi3`, the 4k-context form with plain RoPE): the
//! Llama decoder (`models/llama.rs`, which calls this file's loaders) with
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
//! fused tensors are split exactly as the separate ones are. LongRoPE
//! (`rope_scaling` of type `longrope` or `su`, the 128k form) is refused
//! by the configuration reader with the supported scalings named.

use safemlx::Stream;
use serde_json::Value;

use crate::checkpoint::Weights;
use crate::error::Result;
use crate::nn::{GqaAttention, GqaConfig, Mlp};

/// What a Phi-3 `config.json` may say that the Llama reader does not
/// read: a rotation of part of each head.
///
/// # Errors
/// A `partial_rotary_factor` other than 1, named with its value.
pub(super) fn check_config(json: &Value) -> std::result::Result<(), String> {
    match json.get("partial_rotary_factor").and_then(Value::as_f64) {
        Some(f) if f != 1.0 => Err(format!(
            "\"partial_rotary_factor\" is {f}; Phi-3 is read with whole heads rotated (1.0)"
        )),
        _ => Ok(()),
    }
}

/// This rank's heads of the layer's attention: its rows of each third of
/// `qkv_proj.weight`, its columns of `o_proj.weight`.
///
/// # Errors
/// As [`GqaAttention::load_fused`].
pub(super) fn attention(w: &Weights, config: &GqaConfig, s: &Stream) -> Result<GqaAttention> {
    GqaAttention::load_fused(w, "qkv_proj.weight", config, s)
}

/// This rank's hidden columns of the layer's MLP: its rows of each half of
/// `gate_up_proj.weight`, its columns of `down_proj.weight`.
///
/// # Errors
/// As [`Mlp::load_fused`].
pub(super) fn mlp(w: &Weights, dims: (usize, usize), s: &Stream) -> Result<Mlp> {
    Mlp::load_fused(w, "gate_up_proj.weight", dims, s)
}
