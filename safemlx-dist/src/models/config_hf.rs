//! A Llama-family configuration from a Hugging Face `config.json`.

use serde_json::Value;

use super::config::{ExpertLayout, Family, LlamaConfig, MoeSettings, RopeScaling};
use super::config_keys::Keys;
use crate::error::Result;
use crate::nn::{ExpertActivation, ExpertMatmul, ExpertPlacement, Gating};

impl LlamaConfig {
    /// Reads a Hugging Face `config.json` (`path` is for messages).
    ///
    /// # Errors
    /// An unsupported `model_type`, a missing or ill-typed key, or values
    /// that do not fit together (e.g. heads that do not divide the model
    /// dimension without a `head_dim`); the message names the key.
    pub fn from_hf(json: &Value, path: &str) -> Result<Self> {
        let keys = Keys { json, path };
        let fail = |message: String| keys.fail(message);
        let model_type = json
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| fail("config.json has no \"model_type\"".to_owned()))?;
        let family = Family::MODEL_TYPES
            .iter()
            .find(|(name, _)| *name == model_type)
            .map(|(_, f)| *f)
            .ok_or_else(|| {
                fail(format!(
                    "model_type \"{model_type}\" is not a Llama-family model read here; supported: {}",
                    Family::MODEL_TYPES.map(|(n, _)| n).join(", ")
                ))
            })?;
        let int = |k: &str| keys.int(k);
        let need = |k: &str| keys.need(k);
        let flag = |k: &str| keys.flag(k);
        let float = |k: &str, within: &Value| keys.float(k, within);
        let hidden_size = need("hidden_size")?;
        let heads = need("num_attention_heads")?;
        let mla = match family {
            Family::DeepseekV3 => Some(super::deepseek_v3::mla_settings(&keys)?),
            _ => None,
        };
        // Latent attention has a key and a value head per query head.
        let kv_heads = match mla {
            Some(_) => heads,
            None => int("num_key_value_heads")?.unwrap_or(heads),
        };
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(fail(format!(
                "num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})"
            )));
        }
        let head_dim = match (mla, int("head_dim")?) {
            (Some(m), _) => m.nope_dim + m.rope_dim,
            (None, Some(d)) => d,
            (None, None) if hidden_size % heads == 0 => hidden_size / heads,
            (None, None) => {
                return Err(fail(format!(
                    "hidden_size ({hidden_size}) is not a multiple of num_attention_heads ({heads}) and there is no \"head_dim\""
                )))
            }
        };
        if head_dim % 2 != 0 {
            return Err(fail(format!(
                "head_dim is {head_dim}; RoPE rotates pairs, so it must be even"
            )));
        }
        if flag("mlp_bias")? == Some(true) {
            return Err(fail(
                "\"mlp_bias\" is true; MLP biases are not supported".to_owned(),
            ));
        }
        check_activation(json, &fail)?;
        check_quant_method(json, &fail)?;
        // Transformers 5 keeps rope_theta and the scaling in "rope_parameters".
        for key in ["rope_parameters", "rope_scaling"] {
            match json.get(key) {
                None | Some(Value::Null | Value::Object(_)) => {}
                Some(v) => {
                    return Err(fail(format!(
                        "\"{key}\" is {v}, not an object such as {{\"rope_type\": \"linear\", \"factor\": 2.0}} (or null for none)"
                    )))
                }
            }
        }
        let rope = json
            .get("rope_parameters")
            .filter(|v| v.is_object())
            .or_else(|| json.get("rope_scaling").filter(|v| v.is_object()));
        let rope_theta = match rope.map(|r| float("rope_theta", r)).transpose()?.flatten() {
            Some(theta) => theta,
            None => float("rope_theta", json)?.unwrap_or(10_000.0),
        };
        let rope_scaling = match rope {
            None => RopeScaling::None,
            Some(r) => rope_scaling(r, &keys)?,
        };
        let eos_token_ids = match json.get("eos_token_id") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|v| v.as_u64().and_then(|v| u32::try_from(v).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| {
                    fail("\"eos_token_id\" has an entry that is not a token id".to_owned())
                })?,
            Some(v) => vec![v
                .as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| fail(format!("\"eos_token_id\" is {v}, not a token id")))?],
        };
        let bos_token_id = int("bos_token_id")?.and_then(|v| u32::try_from(v).ok());
        let layers = need("num_hidden_layers")?;
        let sliding = match (layer_types(json, layers, &fail)?, family) {
            (None, Family::GptOss) => Some(super::gpt_oss::default_layer_types(layers)),
            (kinds, _) => kinds,
        };
        if int("sliding_window")? == Some(0) {
            return Err(fail(
                "\"sliding_window\" is 0: a window must hold at least one position (null for none)"
                    .to_owned(),
            ));
        }
        let sliding_window = match (family, &sliding) {
            (Family::Mistral | Family::Mixtral, _) => int("sliding_window")?,
            (_, Some(kinds)) if kinds.iter().any(|&s| s) => Some(need("sliding_window")?),
            _ => None,
        };
        let full_attention_layers: Vec<usize> = match &sliding {
            Some(kinds) => (0..layers).filter(|&i| !kinds[i]).collect(),
            None => Vec::new(),
        };
        let moe = match family {
            Family::Mixtral => Some(MoeSettings::top_k_softmax(
                (
                    need("num_local_experts")?,
                    need("num_experts_per_tok")?,
                    need("intermediate_size")?,
                ),
                "block_sparse_moe.",
                ExpertLayout::PerExpert(super::llama::MIXTRAL_EXPERTS),
            )),
            Family::Qwen2Moe | Family::Qwen3Moe => {
                let mlp_only_layers = match json.get("mlp_only_layers") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(layers)) => layers
                        .iter()
                        .map(|v| v.as_u64().and_then(|v| usize::try_from(v).ok()))
                        .collect::<Option<Vec<usize>>>()
                        .ok_or_else(|| {
                            fail(
                                "\"mlp_only_layers\" has an entry that is not a layer index"
                                    .to_owned(),
                            )
                        })?,
                    Some(v) => {
                        return Err(fail(format!(
                            "\"mlp_only_layers\" is {v}, not a list of layer indices"
                        )))
                    }
                };
                Some(MoeSettings {
                    experts: need("num_experts")?,
                    top_k: need("num_experts_per_tok")?,
                    hidden: need("moe_intermediate_size")?,
                    gating: Gating::SoftmaxTopK {
                        normalize: flag("norm_topk_prob")?.unwrap_or(false),
                    },
                    routed_scaling: 1.0,
                    first_dense: 0,
                    shared_hidden: match family {
                        Family::Qwen2Moe => {
                            int("shared_expert_intermediate_size")?.filter(|h| *h > 0)
                        }
                        _ => None,
                    },
                    sparse_step: int("decoder_sparse_step")?.unwrap_or(1).max(1),
                    mlp_only_layers,
                    block: "mlp.",
                    layout: ExpertLayout::PerExpert(super::llama::QWEN_EXPERTS),
                    activation: ExpertActivation::Swiglu,
                    placement: ExpertPlacement::ExpertParallel,
                    expert_matmul: ExpertMatmul::Auto,
                })
            }
            Family::Glm4Moe => Some(super::glm4_moe::moe_settings(&keys, "GLM-4-MoE")?),
            Family::DeepseekV3 => super::deepseek_v3::moe_settings(&keys)?,
            Family::GptOss => Some(super::gpt_oss::moe_settings(&keys)?),
            _ => None,
        };
        if let Some(m) = &moe {
            if m.top_k > m.experts {
                return Err(fail(format!(
                    "num_experts_per_tok ({}) exceeds the {} experts",
                    m.top_k, m.experts
                )));
            }
        }
        let config = Self {
            family,
            vocab_size: need("vocab_size")?,
            hidden_size,
            intermediate_size: need("intermediate_size")?,
            layers,
            heads,
            kv_heads,
            head_dim,
            rotary_dim: match family {
                // Transformers' default factors: GLM-4-MoE 0.5, Phi-3 1.
                Family::Glm4Moe => super::config_rope::partial_rotary_dim(&keys, head_dim, 0.5)?,
                Family::Phi3 => super::config_rope::partial_rotary_dim(&keys, head_dim, 1.0)?,
                _ => mla.map_or(head_dim, |m| m.rope_dim),
            },
            rms_norm_eps: float("rms_norm_eps", json)?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            tie_word_embeddings: flag("tie_word_embeddings")?.unwrap_or(false),
            qkv_bias: matches!(family, Family::Qwen2 | Family::Qwen2Moe)
                || flag("attention_bias")?.unwrap_or(false),
            // mlx-lm's and Transformers' Llama put attention_bias on o too.
            o_bias: matches!(family, Family::Llama | Family::Mistral | Family::GptOss)
                && flag("attention_bias")?.unwrap_or(false),
            attention_sinks: family == Family::GptOss,
            qk_norm: matches!(family, Family::Qwen3 | Family::Qwen3Moe)
                || (family == Family::Glm4Moe && flag("use_qk_norm")?.unwrap_or(false)),
            max_position_embeddings: match int("max_position_embeddings")? {
                Some(n) if n < 2 => {
                    return Err(fail(format!(
                        "\"max_position_embeddings\" is {n}: a context must hold a prompt token and a generated one"
                    )))
                }
                n => n.unwrap_or(0),
            },
            sliding_window,
            full_attention_layers,
            eos_token_ids,
            bos_token_id,
            moe,
            mla,
        };
        config.check_values(
            [
                "rope_theta",
                "rms_norm_eps",
                "rope_scaling",
                "eos_token_id",
                "bos_token_id",
            ],
            &fail,
        )?;
        Ok(config)
    }
}

/// The activations the MLPs compute: SiLU (SwiGLU), under its names.
const ACTIVATIONS: [&str; 2] = ["silu", "swish"];

/// `hidden_act` (Gemma's spelling `hidden_activation` too), when the file
/// has it, must be SiLU: every family read here gates its MLP with SiLU,
/// and another activation would run as SiLU and give other numbers.
fn check_activation(json: &Value, fail: &dyn Fn(String) -> crate::error::Error) -> Result<()> {
    for key in ["hidden_act", "hidden_activation"] {
        match json.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(act)) if ACTIVATIONS.contains(&act.as_str()) => {}
            Some(v) => {
                return Err(fail(format!(
                    "\"{key}\" is {v}; supported: {}",
                    ACTIVATIONS.map(|a| format!("\"{a}\"")).join(", ")
                )))
            }
        }
    }
    Ok(())
}

/// The `quantization_config` methods whose tensors are read: block-scaled
/// FP8 (DeepSeek's and Kimi K2's releases) and gpt-oss's MXFP4 experts.
/// (mlx-lm's own `quantization` has no method: MLX affine.)
const QUANT_METHODS: [&str; 2] = ["fp8", "mxfp4"];

/// `quantization_config.quant_method`, when the file has one, is a method
/// whose tensors are read: another (Kimi-K2-Thinking's
/// `compressed-tensors` INT4 experts, `gptq`, `awq`, `bitsandbytes`) names
/// tensors no family here reads, and is refused by name before any is.
fn check_quant_method(json: &Value, fail: &dyn Fn(String) -> crate::error::Error) -> Result<()> {
    let method = json
        .get("quantization_config")
        .and_then(|q| q.get("quant_method"));
    match method {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if QUANT_METHODS.contains(&m.as_str()) => Ok(()),
        Some(v) => Err(fail(format!(
            "\"quantization_config\" has \"quant_method\" {v}, whose tensors are not read here; supported: {} (and mlx-community's MLX-quantized directories); load the float or FP8 release, or quantize the float model with mlx_lm.convert -q",
            QUANT_METHODS.map(|m| format!("\"{m}\"")).join(", ")
        ))),
    }
}

/// `layer_types`, when the file has it: whether each layer is a sliding
/// one (`sliding_attention`) rather than `full_attention`.
///
/// # Errors
/// Not a list of those two names, or not one entry per layer.
fn layer_types(
    json: &Value,
    layers: usize,
    fail: &dyn Fn(String) -> crate::error::Error,
) -> Result<Option<Vec<bool>>> {
    let list = match json.get("layer_types") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(v) => return Err(fail(format!("\"layer_types\" is {v}, not a list"))),
    };
    if list.len() != layers {
        return Err(fail(format!(
            "\"layer_types\" has {} entries for {layers} layers (\"num_hidden_layers\"); give one per layer",
            list.len()
        )));
    }
    list.iter()
        .map(|v| match v.as_str() {
            Some("sliding_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            _ => Err(fail(format!(
                "\"layer_types\" has the entry {v}; supported: \"sliding_attention\", \"full_attention\""
            ))),
        })
        .collect::<Result<Vec<bool>>>()
        .map(Some)
}

fn rope_scaling(r: &Value, keys: &Keys) -> Result<RopeScaling> {
    let float = |k: &str, within: &Value| keys.float(k, within);
    let fail = |m: String| keys.fail(m);
    let kind = r
        .get("rope_type")
        .or_else(|| r.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = || -> Result<f32> {
        float("factor", r)?
            .ok_or_else(|| fail(format!("rope scaling \"{kind}\" has no \"factor\"")))
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: factor()? }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: float("low_freq_factor", r)?.unwrap_or(1.0),
            high_freq_factor: float("high_freq_factor", r)?.unwrap_or(4.0),
            original_max_position_embeddings: float("original_max_position_embeddings", r)?
                .unwrap_or(8192.0),
        }),
        // mlx-lm reads DeepSeek's name for YaRN as YaRN.
        "yarn" | "deepseek_yarn" => Ok(RopeScaling::Yarn {
            factor: factor()?,
            original_max_position_embeddings: float("original_max_position_embeddings", r)?
                .unwrap_or(4096.0),
            beta_fast: float("beta_fast", r)?.unwrap_or(32.0),
            beta_slow: float("beta_slow", r)?.unwrap_or(1.0),
            mscale: float("mscale", r)?.unwrap_or(1.0),
            mscale_all_dim: float("mscale_all_dim", r)?.unwrap_or(0.0),
            truncate: match r.get("truncate") {
                None | Some(Value::Null) => true,
                Some(Value::Bool(b)) => *b,
                Some(v) => {
                    return Err(fail(format!(
                        "rope scaling \"truncate\" is {v}, not true or false"
                    )))
                }
            },
        }),
        "longrope" | "su" => long_rope(r, keys),
        other => Err(fail(format!(
            "rope scaling \"{other}\" is not supported; supported: default, linear, llama3, yarn, longrope"
        ))),
    }
}

/// Phi-3's LongRoPE (see [`RopeScaling::LongRope`]): its `long_factor`
/// list, and `long_mscale` or the factor from the context lengths
/// (`max_position_embeddings`, `original_max_position_embeddings` at the
/// top level or in the scaling).
fn long_rope(r: &Value, keys: &Keys) -> Result<RopeScaling> {
    let fail = |m: String| keys.fail(m);
    let long_factor = r
        .get("long_factor")
        .and_then(Value::as_array)
        .ok_or_else(|| fail("rope scaling \"longrope\" has no \"long_factor\" list".to_owned()))?
        .iter()
        .map(|v| v.as_f64().map(|f| f as f32))
        .collect::<Option<Vec<f32>>>()
        .ok_or_else(|| {
            fail("rope scaling \"long_factor\" holds a value that is not a number".to_owned())
        })?;
    let context = |key: &str| -> Result<Option<f32>> {
        match keys.float(key, r)? {
            Some(v) => Ok(Some(v)),
            None => keys.float(key, keys.json),
        }
    };
    let mscale = match keys.float("long_mscale", r)? {
        Some(m) => m,
        None => {
            let max = context("max_position_embeddings")?.unwrap_or(4096.0);
            let original = context("original_max_position_embeddings")?.unwrap_or(max);
            match max / original {
                ratio if ratio <= 1.0 => 1.0,
                ratio => (1.0 + ratio.ln() / original.ln()).sqrt(),
            }
        }
    };
    Ok(RopeScaling::LongRope {
        long_factor,
        mscale,
    })
}
