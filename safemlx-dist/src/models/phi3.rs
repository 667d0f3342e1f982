//! Phi-3 (`model_type` `phi3`, the 4k-context form with plain RoPE): the
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
