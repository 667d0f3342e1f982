//! The Llama family's configuration, read from a Hugging Face `config.json`.

use serde_json::Value;

use crate::checkpoint::{GgufFile, GgufValue};
use crate::error::{Error, Result};
use crate::nn::{ExpertPlacement, Gating, HfExpertNames};

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
}

impl Family {
    /// The `model_type` values read, and their family.
    pub const MODEL_TYPES: [(&'static str, Family); 7] = [
        ("llama", Family::Llama),
        ("mistral", Family::Mistral),
        ("qwen2", Family::Qwen2),
        ("qwen3", Family::Qwen3),
        ("mixtral", Family::Mixtral),
        ("qwen2_moe", Family::Qwen2Moe),
        ("qwen3_moe", Family::Qwen3Moe),
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
    /// then top-k, renormalised with `norm_topk_prob`).
    pub gating: Gating,
    /// The shared expert's hidden dimension (Qwen2-MoE's
    /// `shared_expert_intermediate_size`), when there is one.
    pub shared_hidden: Option<usize>,
    /// Every `sparse_step`-th layer is an MoE (`decoder_sparse_step`, 1).
    pub sparse_step: usize,
    /// Layers that keep a dense MLP (`mlp_only_layers`).
    pub mlp_only_layers: Vec<usize>,
    /// The tensors' prefix in a layer (`block_sparse_moe.` or `mlp.`) and
    /// their names.
    pub block: &'static str,
    /// The per-expert tensor names.
    pub names: HfExpertNames,
    /// Where the experts go when loaded (not in the checkpoint: a choice
    /// of the run; expert parallel by default).
    pub placement: ExpertPlacement,
}

impl MoeSettings {
    /// Whether layer `i` is an MoE layer (the others have a dense MLP of
    /// `intermediate_size`).
    pub fn is_moe_layer(&self, i: usize) -> bool {
        !self.mlp_only_layers.contains(&i) && (i + 1) % self.sparse_step == 0
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
    /// Per-head q/k RMSNorm (Qwen3).
    pub qk_norm: bool,
    /// The longest context (informational; not enforced).
    pub max_position_embeddings: usize,
    /// Mistral's attention window, when the model has one.
    pub sliding_window: Option<usize>,
    /// Token ids that end generation.
    pub eos_token_ids: Vec<u32>,
    /// The token that starts a sequence, when the model has one.
    pub bos_token_id: Option<u32>,
    /// The experts of an MoE model (Mixtral, Qwen2-MoE, Qwen3-MoE).
    pub moe: Option<MoeSettings>,
}

impl LlamaConfig {
    /// Reads a Hugging Face `config.json` (`path` is for messages).
    ///
    /// # Errors
    /// An unsupported `model_type`, a missing or ill-typed key, or values
    /// that do not fit together (e.g. heads that do not divide the model
    /// dimension without a `head_dim`); the message names the key.
    pub fn from_hf(json: &Value, path: &str) -> Result<Self> {
        let fail = |message: String| Error::Model {
            path: path.to_owned(),
            message,
        };
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
        let int = |key: &str| -> Result<Option<usize>> {
            match json.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|v| usize::try_from(v).ok())
                    .map(Some)
                    .ok_or_else(|| fail(format!("\"{key}\" is {v}, not a whole number"))),
            }
        };
        let need = |key: &str| -> Result<usize> {
            match int(key)? {
                Some(0) => Err(fail(format!("\"{key}\" is 0"))),
                Some(v) => Ok(v),
                None => Err(fail(format!("config.json has no \"{key}\""))),
            }
        };
        let float = |key: &str, within: &Value| -> Result<Option<f32>> {
            match within.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(|v| Some(v as f32))
                    .ok_or_else(|| fail(format!("\"{key}\" is {v}, not a number"))),
            }
        };
        let flag = |key: &str| -> Result<Option<bool>> {
            match json.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_bool()
                    .map(Some)
                    .ok_or_else(|| fail(format!("\"{key}\" is {v}, not true or false"))),
            }
        };
        let hidden_size = need("hidden_size")?;
        let heads = need("num_attention_heads")?;
        let kv_heads = int("num_key_value_heads")?.unwrap_or(heads);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(fail(format!(
                "num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})"
            )));
        }
        let head_dim = match int("head_dim")? {
            Some(d) => d,
            None if hidden_size % heads == 0 => hidden_size / heads,
            None => {
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
        // Transformers 5 keeps rope_theta and the scaling in "rope_parameters".
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
            Some(r) => rope_scaling(r, &float, &fail)?,
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
        let sliding_window = match family {
            Family::Mistral | Family::Mixtral => int("sliding_window")?,
            _ => None,
        };
        let moe = match family {
            Family::Mixtral => Some(MoeSettings {
                experts: need("num_local_experts")?,
                top_k: need("num_experts_per_tok")?,
                hidden: need("intermediate_size")?,
                gating: Gating::TopKSoftmax,
                shared_hidden: None,
                sparse_step: 1,
                mlp_only_layers: Vec::new(),
                block: "block_sparse_moe.",
                names: HfExpertNames::MIXTRAL,
                placement: ExpertPlacement::ExpertParallel,
            }),
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
                    shared_hidden: match family {
                        Family::Qwen2Moe => {
                            int("shared_expert_intermediate_size")?.filter(|h| *h > 0)
                        }
                        _ => None,
                    },
                    sparse_step: int("decoder_sparse_step")?.unwrap_or(1).max(1),
                    mlp_only_layers,
                    block: "mlp.",
                    names: HfExpertNames::QWEN,
                    placement: ExpertPlacement::ExpertParallel,
                })
            }
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
            layers: need("num_hidden_layers")?,
            heads,
            kv_heads,
            head_dim,
            rms_norm_eps: float("rms_norm_eps", json)?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            tie_word_embeddings: flag("tie_word_embeddings")?.unwrap_or(false),
            qkv_bias: matches!(family, Family::Qwen2 | Family::Qwen2Moe)
                || flag("attention_bias")?.unwrap_or(false),
            qk_norm: matches!(family, Family::Qwen3 | Family::Qwen3Moe),
            max_position_embeddings: int("max_position_embeddings")?.unwrap_or(0),
            sliding_window,
            eos_token_ids,
            bos_token_id,
            moe,
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

    /// RoPE frequencies for Llama 3 scaling (`None` for the others): the
    /// wavelength divisor of each rotated pair, as `fast::rope` takes them.
    pub fn rope_freqs(&self) -> Option<Vec<f32>> {
        let dims = self.head_dim as f32;
        let base = |i: usize| self.rope_theta.powf(2.0 * i as f32 / dims);
        if let RopeScaling::Factors(factors) = &self.rope_scaling {
            return Some(
                factors
                    .iter()
                    .enumerate()
                    .map(|(i, f)| base(i) * f)
                    .collect(),
            );
        }
        let RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: original,
        } = self.rope_scaling
        else {
            return None;
        };
        let low_wavelen = original / low_freq_factor;
        let high_wavelen = original / high_freq_factor;
        Some(
            (0..self.head_dim / 2)
                .map(|i| {
                    let freq = base(i);
                    let wavelen = 2.0 * std::f32::consts::PI * freq;
                    if wavelen > low_wavelen {
                        freq * factor
                    } else if wavelen < high_wavelen {
                        freq
                    } else {
                        let smooth = (original / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        freq / ((1.0 - smooth) / factor + smooth)
                    }
                })
                .collect(),
        )
    }
}

impl LlamaConfig {
    /// Reads a GGUF file's metadata (`general.architecture` `llama`, `qwen2`
    /// or `qwen3`; llama.cpp stores Mistral as `llama`). Tied embeddings
    /// are a file without `output.weight`; Llama 3's RoPE scaling is the
    /// `rope_freqs.weight` tensor.
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
        let family = match arch {
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            other => {
                return Err(fail(format!(
                    "general.architecture is \"{other}\", which is not a Llama-family model read here; supported: llama, qwen2, qwen3"
                )))
            }
        };
        let key = |k: &str| format!("{arch}.{k}");
        let int = |k: &str| -> Result<Option<usize>> {
            match meta.get(k) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|v| usize::try_from(v).ok())
                    .map(Some)
                    .ok_or_else(|| fail(format!("{k} is {v:?}, not a whole number"))),
            }
        };
        let need = |k: &str| -> Result<usize> {
            int(k)?
                .filter(|v| *v > 0)
                .ok_or_else(|| fail(format!("has no positive {k}")))
        };
        let float = |k: &str| -> Result<Option<f32>> {
            match meta.get(k) {
                None => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(|v| Some(v as f32))
                    .ok_or_else(|| fail(format!("{k} is {v:?}, not a number"))),
            }
        };
        let hidden_size = need(&key("embedding_length"))?;
        let heads = need(&key("attention.head_count"))?;
        let kv_heads = int(&key("attention.head_count_kv"))?.unwrap_or(heads);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(fail(format!(
                "{} ({heads}) is not a multiple of {} ({kv_heads})",
                key("attention.head_count"),
                key("attention.head_count_kv")
            )));
        }
        let head_dim = match int(&key("attention.key_length"))? {
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
        if let Some(n) = int(&key("rope.dimension_count"))? {
            if n != head_dim {
                return Err(fail(format!(
                    "{} is {n} but the head dimension is {head_dim}: rotating part of each head is not supported (llama.cpp refuses it too: \"invalid n_rot\")",
                    key("rope.dimension_count")
                )));
            }
        }
        let tokens = meta
            .get("tokenizer.ggml.tokens")
            .and_then(GgufValue::as_array)
            .map(<[GgufValue]>::len);
        let vocab_size = match int(&key("vocab_size"))?.or(tokens) {
            Some(v) if v > 0 => v,
            _ => {
                return Err(fail(format!(
                    "has no {} and no tokenizer.ggml.tokens",
                    key("vocab_size")
                )))
            }
        };
        let rope_theta = float(&key("rope.freq_base"))?.unwrap_or(10_000.0);
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
            match meta
                .get(&key("rope.scaling.type"))
                .and_then(GgufValue::as_str)
            {
                None | Some("none") => RopeScaling::None,
                Some("linear") => RopeScaling::Linear {
                    factor: float(&key("rope.scaling.factor"))?.unwrap_or(1.0),
                },
                Some(other) => {
                    return Err(fail(format!(
                        "{} is \"{other}\"; supported: none, linear",
                        key("rope.scaling.type")
                    )))
                }
            }
        };
        let id =
            |k: &str| -> Result<Option<u32>> { Ok(int(k)?.and_then(|v| u32::try_from(v).ok())) };
        if int(&key("expert_count"))?.unwrap_or(0) > 0 {
            return Err(fail(format!(
                "{} is set: mixture-of-experts GGUF files are not read here; use the model's Hugging Face directory",
                key("expert_count")
            )));
        }
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
            intermediate_size: need(&key("feed_forward_length"))?,
            layers: need(&key("block_count"))?,
            heads,
            kv_heads,
            head_dim,
            rms_norm_eps: float(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            tie_word_embeddings: !file.tensors().contains_key("output.weight"),
            qkv_bias: family == Family::Qwen2 || bias,
            qk_norm: family == Family::Qwen3,
            max_position_embeddings: int(&key("context_length"))?.unwrap_or(0),
            sliding_window: None,
            eos_token_ids: id("tokenizer.ggml.eos_token_id")?.into_iter().collect(),
            bos_token_id: id("tokenizer.ggml.bos_token_id")?,
            moe: None,
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

type FloatOf<'a> = dyn Fn(&str, &Value) -> Result<Option<f32>> + 'a;

fn rope_scaling(
    r: &Value,
    float: &FloatOf<'_>,
    fail: &dyn Fn(String) -> Error,
) -> Result<RopeScaling> {
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
        other => Err(fail(format!(
            "rope scaling \"{other}\" is not supported; supported: default, linear, llama3"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            "model m: model_type \"gpt2\" is not a Llama-family model read here; supported: llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe"
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
        j["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
        assert_eq!(
            LlamaConfig::from_hf(&j, "m").unwrap_err().to_string(),
            "model m: rope scaling \"yarn\" is not supported; supported: default, linear, llama3"
        );
    }

    #[test]
    fn llama3_frequencies_scale_only_long_wavelengths() {
        let mut j = smollm2();
        j["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192});
        let c = LlamaConfig::from_hf(&j, "m").unwrap();
        let freqs = c.rope_freqs().unwrap();
        assert_eq!(freqs.len(), 32);
        assert_eq!(freqs[0], 1.0); // the shortest wavelength is kept
        let last = 100000f32.powf(62.0 / 64.0);
        assert!((freqs[31] / last - 8.0).abs() < 1e-4); // the longest is scaled by 8
    }
}
