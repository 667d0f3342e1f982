//! A Llama-family configuration from a GGUF file's metadata.

use super::config::{ExpertLayout, Family, LlamaConfig, MoeSettings, RopeScaling};
use super::config_gguf_keys::GgufKeys;
use crate::checkpoint::{GgufFile, GgufValue};
use crate::error::{Error, Result};
use crate::nn::Gating;

impl LlamaConfig {
    /// Reads a GGUF file's metadata (`general.architecture` `llama`,
    /// `qwen2`, `qwen3`, `qwen2moe`, `qwen3moe`, or `deepseek2`, `glm4moe`,
    /// `phi3` and `gpt-oss`, whose metadata is read as their `config.json`; llama.cpp stores
    /// Mistral as `llama`, and Mixtral as `llama` with `expert_count`).
    /// Tied embeddings are a file without `output.weight`; Llama 3's RoPE
    /// scaling is the `rope_freqs.weight` tensor.
    ///
    /// # Errors
    /// An unsupported architecture, or a missing or ill-typed key (named).
    pub fn from_gguf(file: &GgufFile, s: &safemlx::Stream) -> Result<Self> {
        let path = file.path().display().to_string();
        let fail = |message: String| Error::Model {
            path: path.clone(),
            message,
        };
        let meta = file.metadata();
        let arch = meta
            .get("general.architecture")
            .and_then(GgufValue::as_str)
            .ok_or_else(|| fail("has no general.architecture".to_owned()))?;
        let keys = GgufKeys { file, arch };
        match arch {
            "deepseek2" => {
                return Self::from_hf(&super::deepseek_v3::config_from_gguf(&keys)?, &path)
            }
            "glm4moe" => return Self::from_hf(&super::glm4_moe::config_from_gguf(&keys)?, &path),
            "phi3" => return Self::from_hf(&super::phi3::config_from_gguf(&keys, s)?, &path),
            "gpt-oss" => return Self::from_hf(&super::gpt_oss::config_from_gguf(&keys)?, &path),
            _ => {}
        }
        let family = match arch {
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "qwen2moe" => Family::Qwen2Moe,
            "qwen3moe" => Family::Qwen3Moe,
            other => {
                return Err(fail(format!(
                    "general.architecture is \"{other}\", which is not a model read here; supported: llama (and Mistral, Mixtral), qwen2, qwen3, qwen2moe, qwen3moe, deepseek2, glm4moe, phi3, gpt-oss"
                )))
            }
        };
        let key = |k: &str| keys.key(k);
        let float = |k: &str| -> Result<Option<f32>> { Ok(keys.float(k)?.map(|v| v as f32)) };
        let hidden_size = keys.need("embedding_length")?;
        let heads = keys.need("attention.head_count")?;
        let kv_heads = keys.int("attention.head_count_kv")?.unwrap_or(heads);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(fail(format!(
                "{} ({heads}) is not a multiple of {} ({kv_heads})",
                key("attention.head_count"),
                key("attention.head_count_kv")
            )));
        }
        let head_dim = match keys.int("attention.key_length")? {
            Some(d) => d,
            None if hidden_size % heads == 0 => hidden_size / heads,
            None => {
                return Err(fail(format!(
                    "{} ({hidden_size}) is not a multiple of {} ({heads}) and there is no {}",
                    key("embedding_length"),
                    key("attention.head_count"),
                    key("attention.key_length")
                )))
            }
        };
        if let Some(n) = keys.int("rope.dimension_count")? {
            if n != head_dim {
                return Err(fail(format!(
                    "{} is {n} but the head dimension is {head_dim}: rotating part of each head is not supported (llama.cpp refuses it too: \"invalid n_rot\")",
                    key("rope.dimension_count")
                )));
            }
        }
        let vocab_size = keys.vocab_size()?;
        let rope_theta = float("rope.freq_base")?.unwrap_or(10_000.0);
        let rope_scaling = if file.tensors().contains_key("rope_freqs.weight") {
            let factors = file.read("rope_freqs.weight", s)?;
            let factors = factors
                .into_evaluated()
                .map_err(Error::from)?
                .try_to_vec::<f32>()
                .map_err(|e| fail(format!("rope_freqs.weight: {e}")))?;
            if factors.len() != head_dim / 2 {
                return Err(fail(format!(
                    "rope_freqs.weight has {} values for a head_dim of {head_dim} ({} expected)",
                    factors.len(),
                    head_dim / 2
                )));
            }
            RopeScaling::Factors(factors)
        } else {
            match keys.text("rope.scaling.type") {
                None | Some("none") => RopeScaling::None,
                Some("linear") => RopeScaling::Linear {
                    factor: float("rope.scaling.factor")?.unwrap_or(1.0),
                },
                Some(other) => {
                    return Err(fail(format!(
                        "{} is \"{other}\"; supported: none, linear",
                        key("rope.scaling.type")
                    )))
                }
            }
        };
        let id = |k: &str| -> Result<Option<u32>> {
            Ok(keys.int_at(k)?.and_then(|v| u32::try_from(v).ok()))
        };
        let experts = keys.int("expert_count")?.unwrap_or(0);
        let family = match family {
            Family::Llama if experts > 0 => Family::Mixtral,
            Family::Qwen2Moe | Family::Qwen3Moe if experts == 0 => {
                return Err(fail(format!("is {arch} but has no positive {}", key("expert_count"))))
            }
            f if experts > 0 && f != Family::Qwen2Moe && f != Family::Qwen3Moe => {
                return Err(fail(format!(
                    "{} is {experts}: a mixture of experts in a {arch} file is not read here; supported: llama (Mixtral), qwen2moe, qwen3moe",
                    key("expert_count")
                )))
            }
            f => f,
        };
        let moe = match family {
            Family::Mixtral | Family::Qwen2Moe | Family::Qwen3Moe => {
                let top_k = keys.need("expert_used_count")?;
                if top_k > experts {
                    return Err(fail(format!(
                        "{} ({top_k}) exceeds the {experts} experts",
                        key("expert_used_count")
                    )));
                }
                Some(moe_settings(family, (experts, top_k), &keys)?)
            }
            _ => None,
        };
        let bias = file.tensors().contains_key("blk.0.attn_q.bias");
        if bias && family == Family::Llama {
            return Err(fail(
                "a llama GGUF with attention biases (blk.0.attn_q.bias) is not supported: llama.cpp's q/k row order for it is not handled".to_owned(),
            ));
        }
        let config = Self {
            family,
            vocab_size,
            hidden_size,
            intermediate_size: keys.need("feed_forward_length")?,
            layers: keys.need("block_count")?,
            heads,
            kv_heads,
            head_dim,
            rotary_dim: head_dim,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            tie_word_embeddings: !file.tensors().contains_key("output.weight"),
            qkv_bias: matches!(family, Family::Qwen2 | Family::Qwen2Moe) || bias,
            o_bias: false,
            attention_sinks: false,
            qk_norm: matches!(family, Family::Qwen3 | Family::Qwen3Moe),
            max_position_embeddings: match keys.int("context_length")? {
                Some(n) if n < 2 => {
                    return Err(fail(format!(
                        "{} is {n}: a context must hold a prompt token and a generated one",
                        key("context_length")
                    )))
                }
                n => n.unwrap_or(0),
            },
            sliding_window: None,
            full_attention_layers: Vec::new(),
            eos_token_ids: id("tokenizer.ggml.eos_token_id")?.into_iter().collect(),
            bos_token_id: id("tokenizer.ggml.bos_token_id")?,
            moe,
            mla: None,
        };
        config.check_values(
            [
                &key("rope.freq_base"),
                &key("attention.layer_norm_rms_epsilon"),
                &key("rope.scaling.factor"),
                "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.bos_token_id",
            ],
            &fail,
        )?;
        Ok(config)
    }
}

impl LlamaConfig {
    /// llama.cpp's names of a layer's tensors that this family's GGUF
    /// architecture gives its own way (`(usual, its own)`; GLM's
    /// `post_attention_norm`).
    pub fn gguf_renames(&self) -> &'static [(&'static str, &'static str)] {
        match self.family {
            Family::Glm4Moe => super::glm4_moe::GGUF_RENAMES,
            Family::GptOss => super::gpt_oss::GGUF_RENAMES,
            _ => &[],
        }
    }
}

/// The experts of a GGUF MoE, as llama.cpp runs them: Mixtral's top-k
/// then softmax over its `feed_forward_length` experts; Qwen's softmax
/// then top-k over `expert_feed_forward_length` experts, renormalised for
/// `qwen3moe` (not `qwen2moe`, beside its gated shared expert of
/// `expert_shared_feed_forward_length`). Every layer is an MoE; the
/// experts are stacked (`ffn_*_exps`), read as mlx-lm's `switch_mlp`.
fn moe_settings(
    family: Family,
    (experts, top_k): (usize, usize),
    g: &GgufKeys,
) -> Result<MoeSettings> {
    let names = super::llama::QWEN_EXPERTS;
    if family == Family::Mixtral {
        return Ok(MoeSettings::top_k_softmax(
            (experts, top_k, g.need("feed_forward_length")?),
            "mlp.",
            ExpertLayout::PerExpert(names),
        ));
    }
    let mut m = MoeSettings::top_k_softmax(
        (experts, top_k, g.need("expert_feed_forward_length")?),
        "mlp.",
        ExpertLayout::PerExpert(names),
    );
    m.gating = Gating::SoftmaxTopK {
        normalize: family == Family::Qwen3Moe,
    };
    if family == Family::Qwen2Moe {
        m.shared_hidden = g
            .int("expert_shared_feed_forward_length")?
            .filter(|h| *h > 0);
    }
    Ok(m)
}
