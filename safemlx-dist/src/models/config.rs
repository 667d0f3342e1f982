//! The Llama family's configuration: which member, its shape and
//! switches. It is read from a Hugging Face `config.json`
//! (`config_hf.rs`) or a GGUF file's metadata (`config_gguf.rs`), and its
//! values are checked there (`config_check.rs`).

use crate::nn::{
    ExpertActivation, ExpertMatmul, ExpertNames, ExpertPlacement, Gating, InterleavedNames,
};

/// Which member of the Llama family a model is; they differ only in a few
/// switches (see [`LlamaConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Llama 2 and 3 (and SmolLM2, a Llama with tied embeddings).
    Llama,
    /// Mistral: a Llama with a sliding attention window.
    Mistral,
    /// Qwen2: biases on the q, k and v projections.
    Qwen2,
    /// Qwen3: an RMSNorm on each query and key head.
    Qwen3,
    /// Mixtral: Mistral's attention, a mixture of experts in every layer
    /// (`block_sparse_moe`, top-k then softmax).
    Mixtral,
    /// Qwen2-MoE: Qwen2's attention, routed experts beside a gated shared
    /// expert.
    Qwen2Moe,
    /// Qwen3-MoE: Qwen3's attention, routed experts (`norm_topk_prob`).
    Qwen3Moe,
    /// Phi-3: q, k and v in one tensor, the MLP's gate and up in one
    /// (see `models/phi3.rs`).
    Phi3,
    /// GLM-4-MoE (GLM-4.5, 4.6): part of each head rotated, q/k/v biases,
    /// optional q/k norms, dense first layers, then sigmoid-scored routed
    /// experts in groups beside shared experts (see `models/glm4_moe.rs`).
    Glm4Moe,
    /// DeepSeek-V3 (and R1): multi-head latent attention (see
    /// [`MlaSettings`]), dense first layers, then GLM's grouped sigmoid
    /// routing beside shared experts (see `models/deepseek_v3.rs`).
    DeepseekV3,
    /// gpt-oss: attention sinks, q/k/v/o biases, sliding and full layers,
    /// experts with biases behind a biased router, a clamped SwiGLU,
    /// MXFP4 expert weights (see `models/gpt_oss.rs`).
    GptOss,
}

impl Family {
    /// The `model_type` values read, and their family.
    pub const MODEL_TYPES: [(&'static str, Family); 12] = [
        ("llama", Family::Llama),
        ("mistral", Family::Mistral),
        ("qwen2", Family::Qwen2),
        ("qwen3", Family::Qwen3),
        ("mixtral", Family::Mixtral),
        ("qwen2_moe", Family::Qwen2Moe),
        ("qwen3_moe", Family::Qwen3Moe),
        ("phi3", Family::Phi3),
        ("glm4_moe", Family::Glm4Moe),
        ("deepseek_v3", Family::DeepseekV3),
        // Kimi K2: DeepSeek-V3's model (as mlx-lm maps it).
        ("kimi_k2", Family::DeepseekV3),
        ("gpt_oss", Family::GptOss),
    ];
}

/// The mixture of experts of an MoE model's layers.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeSettings {
    /// Routed experts `E` (`num_local_experts`, `num_experts`).
    pub experts: usize,
    /// Experts per token (`num_experts_per_tok`).
    pub top_k: usize,
    /// Each expert's hidden dimension (`moe_intermediate_size`; Mixtral's
    /// `intermediate_size`).
    pub hidden: usize,
    /// How gates are computed (Mixtral: top-k then softmax; Qwen: softmax
    /// then top-k, renormalised with `norm_topk_prob`; GLM-4-MoE: sigmoid
    /// scores in expert groups).
    pub gating: Gating,
    /// A factor on every routed gate (`routed_scaling_factor`; 1 unless
    /// the model says).
    pub routed_scaling: f32,
    /// The first layers keep a dense MLP (`first_k_dense_replace`; 0).
    pub first_dense: usize,
    /// The shared experts' hidden dimension (Qwen2-MoE's
    /// `shared_expert_intermediate_size`; GLM-4-MoE's `n_shared_experts`
    /// times `moe_intermediate_size`), when there are any.
    pub shared_hidden: Option<usize>,
    /// Every `sparse_step`-th layer is an MoE (`decoder_sparse_step`, 1).
    pub sparse_step: usize,
    /// Layers that keep a dense MLP (`mlp_only_layers`).
    pub mlp_only_layers: Vec<usize>,
    /// The tensors' prefix in a layer (`block_sparse_moe.` or `mlp.`) and
    /// their names.
    pub block: &'static str,
    /// How the checkpoint stores the experts, and their names.
    pub layout: ExpertLayout,
    /// The experts' activation.
    pub activation: ExpertActivation,
    /// Where the experts go when loaded (not in the checkpoint: a choice
    /// of the run; expert parallel by default).
    pub placement: ExpertPlacement,
    /// How the local experts multiply (a choice of the run; by device by
    /// default).
    pub expert_matmul: ExpertMatmul,
}

impl MoeSettings {
    /// `experts` experts of hidden size `hidden` in every layer, each
    /// token's `top_k` chosen on the router's logits and gated by their
    /// softmax (Mixtral's and gpt-oss's routing), SwiGLU, expert parallel;
    /// `block` and `layout` place and name the tensors.
    pub(super) fn top_k_softmax(
        (experts, top_k, hidden): (usize, usize, usize),
        block: &'static str,
        layout: ExpertLayout,
    ) -> Self {
        Self {
            experts,
            top_k,
            hidden,
            gating: Gating::TopKSoftmax,
            routed_scaling: 1.0,
            first_dense: 0,
            shared_hidden: None,
            sparse_step: 1,
            mlp_only_layers: Vec::new(),
            block,
            layout,
            activation: ExpertActivation::Swiglu,
            placement: ExpertPlacement::ExpertParallel,
            expert_matmul: ExpertMatmul::Auto,
        }
    }

    /// Whether layer `i` is an MoE layer (the others have a dense MLP of
    /// `intermediate_size`).
    pub fn is_moe_layer(&self, i: usize) -> bool {
        i >= self.first_dense
            && !self.mlp_only_layers.contains(&i)
            && (i + 1) % self.sparse_step == 0
    }
}

/// How a family's checkpoints store the experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertLayout {
    /// One tensor per expert and projection (or Transformers 5's stacked
    /// gate-then-up tensors), with optional shared experts.
    PerExpert(ExpertNames),
    /// gpt-oss's stacked experts, gate and up interleaved, with biases.
    Interleaved(InterleavedNames),
}

/// DeepSeek's multi-head latent attention: queries through a low-rank
/// latent (or one projection), keys and values through one shared latent
/// and a shared RoPE key part (see [`MlaAttention`](crate::nn::MlaAttention)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaSettings {
    /// The queries' latent (`q_lora_rank`); `None`: one `q_proj`.
    pub q_lora_rank: Option<usize>,
    /// The keys' and values' latent (`kv_lora_rank`).
    pub kv_lora_rank: usize,
    /// Each query and key head's dimensions without RoPE (`qk_nope_head_dim`).
    pub nope_dim: usize,
    /// Its rotated dimensions, the key's shared by every head (`qk_rope_head_dim`).
    pub rope_dim: usize,
    /// Each value head's dimensions (`v_head_dim`).
    pub v_dim: usize,
}

impl MlaSettings {
    /// Values one layer's cache holds per position on every rank: the
    /// latent and the RoPE key, `kv_lora_rank + qk_rope_head_dim`.
    pub fn latent_values(&self) -> usize {
        self.kv_lora_rank + self.rope_dim
    }

    /// Values a per-head cache would hold per position and layer for
    /// `heads` heads: each head's key and value, `heads * (qk_nope_head_dim
    /// + qk_rope_head_dim + v_head_dim)`.
    pub fn per_head_values(&self, heads: usize) -> usize {
        heads * (self.nope_dim + self.rope_dim + self.v_dim)
    }
}

/// How positions are scaled before the rotation.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor`.
    Linear {
        /// The factor.
        factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        /// Scale of the low frequencies.
        factor: f32,
        /// Wavelengths above `original / low_freq_factor` are scaled fully.
        low_freq_factor: f32,
        /// Wavelengths below `original / high_freq_factor` are kept.
        high_freq_factor: f32,
        /// The context length the model was trained with.
        original_max_position_embeddings: f32,
    },
    /// Per-pair divisors of the frequencies, as GGUF stores Llama 3's
    /// scaling (the `rope_freqs.weight` tensor).
    Factors(Vec<f32>),
    /// Phi-3's LongRoPE (`longrope`, `su`), as mlx-lm's `SuScaledRoPE`:
    /// each pair's wavelength multiplied by its `long_factor`, and the
    /// rotated part of q and k by `mscale` (`long_mscale`, else `sqrt(1 +
    /// ln(max / original) / ln(original))` of the context lengths). mlx-lm
    /// uses the long factors at every length; Transformers uses the short
    /// ones up to the original context.
    LongRope {
        /// One factor per rotated pair.
        long_factor: Vec<f32>,
        /// The factor on the rotated part of q and k.
        mscale: f32,
    },
    /// YaRN: each pair's frequency blended between interpolation (divided
    /// by `factor`) and extrapolation by a ramp between the pairs that turn
    /// `beta_fast` and `beta_slow` times over the original context, and
    /// the rotated part of q and k scaled by
    /// [`rope_mscale`](LlamaConfig::rope_mscale) (mlx-lm's `YarnRoPE`).
    Yarn {
        /// The context extension.
        factor: f32,
        /// The context the model was trained with.
        original_max_position_embeddings: f32,
        /// Rotations over the original context above which pairs
        /// extrapolate (32).
        beta_fast: f32,
        /// Rotations below which pairs interpolate (1).
        beta_slow: f32,
        /// The numerator's `mscale` (1).
        mscale: f32,
        /// The denominator's `mscale_all_dim` (0).
        mscale_all_dim: f32,
        /// Round the ramp's ends to whole pairs (`truncate`, true; gpt-oss
        /// ships false, which Transformers and OpenAI's reference follow
        /// and mlx-lm 0.32 ignores).
        truncate: bool,
    },
}

/// A Llama-family model's shape and switches.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// The family (`model_type`).
    pub family: Family,
    /// Vocabulary size `V`.
    pub vocab_size: usize,
    /// Model dimension `D`.
    pub hidden_size: usize,
    /// MLP hidden dimension `H`.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: usize,
    /// Dimensions per head.
    pub head_dim: usize,
    /// The leading dimensions of each head that RoPE rotates (`head_dim`
    /// unless a `partial_rotary_factor` says fewer).
    pub rotary_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f32,
    /// RoPE position scaling.
    pub rope_scaling: RopeScaling,
    /// Whether the LM head is the embedding table.
    pub tie_word_embeddings: bool,
    /// Biases on q, k and v (Qwen2 always; Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// A bias on the attention output (Llama's and gpt-oss's
    /// `attention_bias`; not Qwen2's or GLM's).
    pub o_bias: bool,
    /// A learned softmax sink per query head (gpt-oss).
    pub attention_sinks: bool,
    /// Per-head q/k RMSNorm (Qwen3).
    pub qk_norm: bool,
    /// The longest context (informational; not enforced).
    pub max_position_embeddings: usize,
    /// The attention window of the sliding layers (Mistral's every layer),
    /// when the model has one.
    pub sliding_window: Option<usize>,
    /// Layers that see every position despite a window (`layer_types`'
    /// `full_attention` entries).
    pub full_attention_layers: Vec<usize>,
    /// Token ids that end generation.
    pub eos_token_ids: Vec<u32>,
    /// The token that starts a sequence, when the model has one.
    pub bos_token_id: Option<u32>,
    /// The experts of an MoE model (Mixtral, Qwen2-MoE, Qwen3-MoE).
    pub moe: Option<MoeSettings>,
    /// Latent attention (DeepSeek-V3), instead of grouped-query heads of
    /// `head_dim` (which is then the query head's `qk_nope_head_dim +
    /// qk_rope_head_dim`).
    pub mla: Option<MlaSettings>,
}

impl LlamaConfig {
    /// The whole model's weights in float32, in bytes: embeddings, LM head
    /// (unless tied), attention, and the MLP or the experts (norms left
    /// out). What dequantized weights hold, summed over all ranks.
    pub fn float_bytes(&self) -> u64 {
        let (d, v) = (self.hidden_size as u64, self.vocab_size as u64);
        let head = if self.tie_word_embeddings { 0 } else { v * d };
        let (q, kv, hd) = (
            self.heads as u64,
            self.kv_heads as u64,
            self.head_dim as u64,
        );
        let attention = match &self.mla {
            None => d * (q + 2 * kv) * hd + q * hd * d,
            Some(m) => {
                let [r, nope, v_dim] = [m.kv_lora_rank, m.nope_dim, m.v_dim].map(|x| x as u64);
                let queries = match m.q_lora_rank {
                    Some(ql) => d * ql as u64 + ql as u64 * q * hd,
                    None => d * q * hd,
                };
                queries + d * m.latent_values() as u64 + r * q * (nope + v_dim) + q * v_dim * d
            }
        };
        let dense = 3 * d * self.intermediate_size as u64;
        // Each layer's MLP or experts (an MoE model's dense layers too).
        let mlps: u64 = (0..self.layers)
            .map(|i| match &self.moe {
                Some(moe) if moe.is_moe_layer(i) => {
                    (moe.experts as u64 * moe.hidden as u64 + moe.shared_hidden.unwrap_or(0) as u64)
                        * 3
                        * d
                }
                _ => dense,
            })
            .sum();
        4 * (v * d + head + self.layers as u64 * attention + mlps)
    }

    /// Layer `i`'s attention window: [`sliding_window`](Self::sliding_window)
    /// unless the layer is a full-attention one.
    pub fn window(&self, i: usize) -> Option<usize> {
        self.sliding_window
            .filter(|_| !self.full_attention_layers.contains(&i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn smollm2() -> Value {
        serde_json::json!({
            "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
            "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3,
            "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
            "tie_word_embeddings": true, "eos_token_id": 2, "bos_token_id": 1,
            "max_position_embeddings": 8192
        })
    }

    #[test]
    fn smollm2_reads_as_a_tied_llama_with_gqa() {
        let c = LlamaConfig::from_hf(&smollm2(), "config.json").unwrap();
        assert_eq!(
            (c.family, c.heads, c.kv_heads, c.head_dim),
            (Family::Llama, 9, 3, 64)
        );
        assert!(c.tie_word_embeddings && !c.qkv_bias && !c.qk_norm);
        assert_eq!(
            (c.rope_theta, c.eos_token_ids.as_slice()),
            (100000.0, &[2][..])
        );
    }

    #[test]
    fn bad_configs_name_the_key() {
        let mut j = smollm2();
        j["model_type"] = "gpt2".into();
        assert_eq!(
            LlamaConfig::from_hf(&j, "m").unwrap_err().to_string(),
            "model m: model_type \"gpt2\" is not a Llama-family model read here; supported: llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, phi3, glm4_moe, deepseek_v3, kimi_k2, gpt_oss"
        );
        let mut j = smollm2();
        j["num_key_value_heads"] = 2.into();
        assert_eq!(
            LlamaConfig::from_hf(&j, "m").unwrap_err().to_string(),
            "model m: num_attention_heads (9) is not a multiple of num_key_value_heads (2)"
        );
        let mut j = smollm2();
        j["hidden_size"] = "576".into();
        assert_eq!(
            LlamaConfig::from_hf(&j, "m").unwrap_err().to_string(),
            "model m: \"hidden_size\" is \"576\", not a whole number"
        );
        let mut j = smollm2();
        j["rope_scaling"] = serde_json::json!({"rope_type": "dynamic", "factor": 4.0});
        assert_eq!(
            LlamaConfig::from_hf(&j, "m").unwrap_err().to_string(),
            "model m: rope scaling \"dynamic\" is not supported; supported: default, linear, llama3, yarn, longrope"
        );
        let mut j = smollm2();
        j["rope_scaling"] =
            serde_json::json!({"rope_type": "yarn", "factor": 4.0, "beta_fast": 0.0});
        assert_eq!(
            LlamaConfig::from_hf(&j, "m").unwrap_err().to_string(),
            "model m: rope_scaling (beta_fast) is 0: a RoPE scaling factor must be a finite number above 0"
        );
    }

    #[test]
    fn keys_that_change_the_math_are_honoured_or_refused_by_name() {
        let refused = |key: &str, value: Value| {
            let mut j = smollm2();
            j[key] = value;
            LlamaConfig::from_hf(&j, "m").unwrap_err().to_string()
        };
        assert_eq!(
            refused("hidden_act", "relu6".into()),
            "model m: \"hidden_act\" is \"relu6\"; supported: \"silu\", \"swish\""
        );
        // Kimi-K2-Thinking's INT4 experts.
        assert_eq!(
            refused(
                "quantization_config",
                serde_json::json!({"quant_method": "compressed-tensors", "format": "pack-quantized"})
            ),
            "model m: \"quantization_config\" has \"quant_method\" \"compressed-tensors\", whose tensors are not read here; supported: \"fp8\", \"mxfp4\" (and mlx-community's MLX-quantized directories); load the float or FP8 release, or quantize the float model with mlx_lm.convert -q"
        );
        assert_eq!(
            refused("rope_scaling", 5.into()),
            "model m: \"rope_scaling\" is 5, not an object such as {\"rope_type\": \"linear\", \"factor\": 2.0} (or null for none)"
        );
        for n in [0, 1] {
            assert_eq!(
                refused("max_position_embeddings", n.into()),
                format!("model m: \"max_position_embeddings\" is {n}: a context must hold a prompt token and a generated one")
            );
        }
        assert_eq!(
            refused("sliding_window", 0.into()),
            "model m: \"sliding_window\" is 0: a window must hold at least one position (null for none)"
        );
        // What is read as it says.
        let mut j = smollm2();
        j["hidden_act"] = "silu".into();
        j["rope_scaling"] = Value::Null;
        j["sliding_window"] = Value::Null;
        let c = LlamaConfig::from_hf(&j, "m").unwrap();
        assert_eq!((c.max_position_embeddings, c.sliding_window), (8192, None));
    }
}
