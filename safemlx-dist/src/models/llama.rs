//! The Llama family (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM2) and its
//! mixture-of-experts members (Mixtral, Qwen2-MoE, Qwen3-MoE; GLM-4-MoE,
//! DeepSeek-V3 and gpt-oss with their family files' settings), tensor
//! parallel over a group.
//!
//! ```text
//! x       = E[tokens]                              vocabulary-parallel lookup, all_sum
//! for each layer:
//!   x     = x + Attention(RMSNorm(x))              heads split, all_sum
//!   x     = x + down(silu(gate(n)) * up(n)),  n = RMSNorm(x)
//!                                                  hidden split, all_sum
//!     or  x + sum_j g_j Expert_ej(n) (+ shared)    MoE layers: experts split
//!                                                  (all_to_all_v) or sliced (all_sum)
//! logits  = RMSNorm(x) W^T                         vocabulary columns per rank
//! ```
//!
//! `W` is the LM head, or `E` itself with tied embeddings (SmolLM2). Each
//! rank reads only its part of every tensor from the checkpoint; tensors
//! the checkpoint stores quantized (GGUF `Q8_0`/`Q4_0`/`Q4_1`,
//! mlx-community directories) stay quantized unless the source is wrapped
//! in [`Dequantized`](crate::checkpoint::Dequantized).

mod attention;
mod batch;
mod notes;
mod stage;

pub(in crate::models) use notes::{check_layers, load_notes};
pub use stage::StageInput;

use safemlx::{Array, Stream};

use super::config::{ExpertLayout, Family, LlamaConfig};
use super::stages::Stage;
use super::{deepseek_v3, phi3};
use crate::checkpoint::{GgufFile, GgufWeights, HfDirectory, OneDtype, Weights};
use crate::error::{Error, Result};
use crate::grad::Parameters;
use crate::nn::{
    AttentionNames, Embedding, ExpertNames, GateUp, GqaAttention, GqaConfig, HeadSplit, KvCache,
    MlaAttention, MlaConfig, Mlp, MlpNames, Moe, MoeConfig, Qkv, RmsNorm, Rope,
};
use crate::runtime::Group;
use crate::typed::{Replicated, Sharded, ShardedArray};
use attention::Attention;

/// One decoder layer on this rank.
#[derive(Debug, Parameters)]
struct DecoderLayer {
    input_norm: RmsNorm,
    attention: Attention,
    post_attention_norm: RmsNorm,
    mlp: FeedForward,
}

/// The feed-forward half of a layer: the MLP (float or quantized
/// weights), or a mixture of experts.
#[derive(Debug, Parameters)]
enum FeedForward {
    Dense(Box<Mlp>),
    Moe(Box<Moe>),
}

impl FeedForward {
    fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        match self {
            Self::Dense(m) => m.forward(x, s),
            Self::Moe(m) => Ok(m.forward(x, s)?.tokens),
        }
    }

    fn nbytes(&self) -> usize {
        match self {
            Self::Dense(m) => m.nbytes(),
            Self::Moe(m) => m.nbytes(),
        }
    }
}

/// A Llama-family model, this rank's part of it. Its parameters are the
/// float weights in order (the embedding, each layer's norms, attention and
/// MLP, the final norm, and the LM head when it is not tied: a tied head
/// is the embedding, one parameter whose gradient sums both uses);
/// quantized weights stay frozen.
#[derive(Debug, Parameters)]
pub struct Llama {
    #[parameters(skip)]
    config: LlamaConfig,
    #[parameters(skip)]
    path: String,
    /// The layers this rank holds: all of them, or a pipeline stage's.
    #[parameters(skip)]
    stage: Stage,
    /// On the first stage, and on the last with tied embeddings.
    embed: Option<Embedding>,
    layers: Vec<DecoderLayer>,
    /// On the last stage.
    norm: Option<RmsNorm>,
    /// On the last stage, without tied embeddings (the LM head is then
    /// `embed`).
    lm_head: Option<Embedding>,
}

impl Llama {
    /// Loads this rank's part of a Hugging Face model directory
    /// (`config.json` and safetensors with Hugging Face tensor names).
    ///
    /// # Errors
    /// An unsupported or inconsistent configuration, a missing tensor or
    /// one whose shape disagrees with the configuration; the message names
    /// the directory, the key or the tensor.
    pub fn from_hf(group: &Group, dir: &HfDirectory, s: &Stream) -> Result<Self> {
        let config = LlamaConfig::from_hf(dir.config(), &dir.path().display().to_string())?;
        check_layers(dir, &config)?;
        let one = OneDtype::of(dir);
        let model = Self::load(&Weights::new(OneDtype::or(&one, dir), group), config, s)?;
        load_notes(group, dir, &model);
        Ok(model)
    }

    /// Loads this rank's part of a GGUF file: `Q8_0`, `Q4_0` and `Q4_1`
    /// tensors stay quantized, the others are read as `float32`; returns
    /// the model and the weights it read them through (for
    /// [`TensorSource::bytes_read`](crate::checkpoint::TensorSource::bytes_read)). [`load`](Self::load) with
    /// [`Dequantized`](crate::checkpoint::Dequantized) reads every tensor
    /// as `float32`.
    ///
    /// # Errors
    /// Those of [`LlamaConfig::from_gguf`] and [`load`](Self::load), and
    /// tensors in the file that the model does not read.
    pub fn from_gguf(group: &Group, file: GgufFile, s: &Stream) -> Result<(Self, GgufWeights)> {
        let (config, weights) = Self::gguf_weights(file, s)?;
        let model = Self::load(&Weights::new(&weights, group), config, s)?;
        weights.check_all_read(model.config.layers)?;
        Ok((model, weights))
    }

    /// The configuration of a GGUF file and its tensors under Hugging Face
    /// names, for [`load`](Self::load) (e.g. through
    /// [`Dequantized`](crate::checkpoint::Dequantized)).
    ///
    /// # Errors
    /// Those of [`LlamaConfig::from_gguf`].
    pub fn gguf_weights(file: GgufFile, s: &Stream) -> Result<(LlamaConfig, GgufWeights)> {
        let config = LlamaConfig::from_gguf(&file, s)?;
        // llama.cpp reorders the q/k rows of `llama` models only (Mixtral
        // is one).
        let permuted = matches!(config.family, Family::Llama | Family::Mixtral).then_some((
            config.heads,
            config.kv_heads,
            config.head_dim,
        ));
        let renames = config.gguf_renames();
        Ok((config, GgufWeights::new(file, permuted).renamed(renames)))
    }

    /// Loads this rank's part of the tensors of `w` (Hugging Face names)
    /// for the model `config` describes.
    ///
    /// # Errors
    /// A missing tensor or one whose shape disagrees with the
    /// configuration; the message names it.
    pub fn load(w: &Weights, config: LlamaConfig, s: &Stream) -> Result<Self> {
        let stage = Stage::whole(config.layers);
        Self::load_stage(w, config, stage, s)
    }

    /// As [`load`](Self::load), the layers of one pipeline stage only:
    /// the embedding on the first stage, the final norm and LM head on the
    /// last (a tied LM head is the embedding, read there too). Nothing
    /// else is read.
    ///
    /// # Errors
    /// Those of [`load`](Self::load), or a stage whose layers are not
    /// within the model's.
    pub fn load_stage(w: &Weights, config: LlamaConfig, stage: Stage, s: &Stream) -> Result<Self> {
        let path = w.source().path().display().to_string();
        if stage.layers.is_empty() || stage.layers.end > config.layers {
            return Err(Error::Model {
                path,
                message: format!(
                    "stage {} holds layers {:?}, not within the model's {} layers",
                    stage.index, stage.layers, config.layers
                ),
            });
        }
        let c = &config;
        let d = c.hidden_size;
        let gqa = GqaConfig {
            dim: d,
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            qkv_bias: c.qkv_bias,
            o_bias: c.o_bias,
            sinks: c.attention_sinks,
            qk_norm: c.qk_norm,
            norm_eps: c.rms_norm_eps,
            rope: rope(c),
            window: None,
        };
        let mla = c.mla.map(|m| MlaConfig {
            dim: d,
            heads: c.heads,
            q_lora_rank: m.q_lora_rank,
            kv_lora_rank: m.kv_lora_rank,
            nope_dim: m.nope_dim,
            rope_dim: m.rope_dim,
            v_dim: m.v_dim,
            scale: c.attention_scale(),
            norm_eps: 1e-6,
            rope: rope(c),
        });
        let norm = |w: &Weights| RmsNorm::load(w, d, c.rms_norm_eps, s);
        let (attention_names, mlp_names) = match c.family {
            Family::Phi3 => (&phi3::ATTENTION, &phi3::MLP),
            _ => (&ATTENTION, &MLP),
        };
        // The embedding first: its shape says whether this is the model
        // the configuration describes.
        let embeds = stage.is_first() || (stage.is_last() && c.tie_word_embeddings);
        let embed = embeds
            .then(|| Embedding::load(&w.pp("model.embed_tokens"), (c.vocab_size, d), s))
            .transpose()?;
        let layers = stage
            .layers
            .clone()
            .map(|i| {
                let w = w.pp(&format!("model.layers.{i}"));
                let mlp = match &c.moe {
                    Some(m) if m.is_moe_layer(i) => FeedForward::Moe(Box::new(moe(&w, c, m, s)?)),
                    _ => FeedForward::Dense(Box::new(Mlp::load(
                        &w.pp("mlp"),
                        mlp_names,
                        (d, c.intermediate_size),
                        s,
                    )?)),
                };
                let a = w.pp("self_attn");
                let attention = match &mla {
                    Some(mla) => {
                        let mla = MlaAttention::load(&a, &deepseek_v3::ATTENTION, mla, s)?;
                        Attention::Mla(Box::new(mla))
                    }
                    None => {
                        let gqa = GqaConfig {
                            window: c.window(i),
                            ..gqa.clone()
                        };
                        Attention::Gqa(Box::new(GqaAttention::load(&a, attention_names, &gqa, s)?))
                    }
                };
                Ok(DecoderLayer {
                    input_norm: norm(&w.pp("input_layernorm"))?,
                    attention,
                    post_attention_norm: norm(&w.pp("post_attention_layernorm"))?,
                    mlp,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // Tied models may still ship an lm_head copy; read it only when untied.
        let lm_head = (stage.is_last() && !c.tie_word_embeddings)
            .then(|| Embedding::load(&w.pp("lm_head"), (c.vocab_size, d), s))
            .transpose()?;
        let norm = stage
            .is_last()
            .then(|| norm(&w.pp("model.norm")))
            .transpose()?;
        Ok(Self {
            norm,
            config,
            path,
            stage,
            embed,
            layers,
            lm_head,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// This rank's heads of layer 0 (every layer splits alike).
    pub fn head_split(&self) -> Option<HeadSplit> {
        self.layers.first().map(|l| l.attention.split())
    }

    /// This rank's hidden columns `(first, count)` of the first layer with
    /// a dense MLP (every dense layer splits alike); `None` without one.
    pub fn mlp_hidden(&self) -> Option<(usize, usize)> {
        self.layers.iter().find_map(|l| match &l.mlp {
            FeedForward::Dense(m) => Some(m.hidden()),
            FeedForward::Moe(_) => None,
        })
    }

    /// The experts this rank holds of the first MoE layer (every MoE
    /// layer splits alike; see [`Moe::held_experts`]); `None` without one.
    pub fn held_experts(&self) -> Option<(usize, usize)> {
        self.layers.iter().find_map(|l| match &l.mlp {
            FeedForward::Moe(m) => Some(m.held_experts()),
            FeedForward::Dense(_) => None,
        })
    }

    /// An empty KV cache for this rank's heads: sliding-window layers keep
    /// only their window.
    pub fn new_cache(&self) -> KvCache {
        let windows: Vec<Option<usize>> = self
            .stage
            .layers
            .clone()
            .map(|i| self.config.window(i))
            .collect();
        KvCache::with_windows(&windows)
    }

    /// The logits of `tokens` at positions `cache.len()..`, appending their
    /// keys and values to `cache`: `[T, V]`, this rank's vocabulary columns
    /// (see [`gather_logits`](crate::nn::gather_logits) for full rows).
    /// Cost: `2 L + 1` all_sums of `[T, D]`.
    ///
    /// # Errors
    /// See [`forward_batch`](Self::forward_batch).
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<1>>> {
        self.forward_batch(&mut [(tokens, cache)], s)
    }

    /// A batch of sequences in one pass: each `(tokens, cache)` at its own
    /// positions `cache.len()..`, its keys and values appended to its own
    /// cache (made with [`new_cache`](Self::new_cache)). Sequences of any
    /// lengths mix: prompts, continued prompts and single decode tokens.
    /// The logits of every token, `[Σ T, V]` (this rank's vocabulary
    /// columns), the sequences' rows in batch order. Cost: `2 L + 1`
    /// all_sums of `[Σ T, D]` for the whole batch.
    ///
    /// # Errors
    /// No sequence, a sequence without tokens, a cache made for another
    /// model, a token outside the vocabulary, or an MLX error.
    pub fn forward_batch(
        &self,
        batch: &mut [(&[u32], &mut KvCache)],
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<1>>> {
        let x = self.hidden(batch, s)?;
        self.head()?.logits(&self.final_norm()?.forward(&x, s)?, s)
    }

    /// As [`forward`](Self::forward), but the logits of the last position
    /// only, `[1, V]`: what generation samples from. The LM head (`V x D`
    /// per token) then runs once instead of once per prompt token.
    ///
    /// # Errors
    /// See [`forward_batch`](Self::forward_batch).
    pub fn forward_last(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<1>>> {
        self.forward_last_batch(&mut [(tokens, cache)], s)
    }

    /// Whether any weight stays quantized.
    pub fn is_quantized(&self) -> bool {
        self.embed.as_ref().is_some_and(Embedding::is_quantized)
            || self.lm_head.as_ref().is_some_and(Embedding::is_quantized)
            || self.layers.iter().any(|l| {
                let mlp = match &l.mlp {
                    FeedForward::Dense(m) => m.is_quantized(),
                    FeedForward::Moe(m) => m.is_quantized(),
                };
                mlp || l.attention.is_quantized()
            })
    }

    /// Bytes of this rank's weights.
    pub fn weight_bytes(&self) -> usize {
        let norms = |n: &RmsNorm| n.weight.local().nbytes();
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                norms(&l.input_norm)
                    + norms(&l.post_attention_norm)
                    + l.attention.nbytes()
                    + l.mlp.nbytes()
            })
            .sum();
        let head = self.lm_head.as_ref().map_or(0, Embedding::nbytes);
        let embed = self.embed.as_ref().map_or(0, Embedding::nbytes);
        embed + layers + self.norm.as_ref().map_or(0, norms) + head
    }
}

/// The Llama family's attention tensors under `self_attn`.
pub const ATTENTION: AttentionNames = AttentionNames {
    qkv: Qkv::Separate(["q_proj", "k_proj", "v_proj"]),
    o: "o_proj",
    q_norm: "q_norm",
    k_norm: "k_norm",
    sinks: "sinks",
};

/// The Llama family's MLP tensors under `mlp` (and Qwen2-MoE's shared
/// expert under `mlp.shared_expert`).
pub const MLP: MlpNames = MlpNames {
    gate_up: GateUp::Separate(["gate_proj", "up_proj"]),
    down: "down_proj",
};

/// Mixtral's `block_sparse_moe.experts.{e}.w1` (gate), `w3` (up), `w2`
/// (down).
pub(super) const MIXTRAL_EXPERTS: ExpertNames = ExpertNames {
    router: "gate.weight",
    router_bias: "gate.e_score_correction_bias",
    experts: "experts",
    stacked: ("experts.gate_up_proj", "experts.down_proj"),
    switch: "switch_mlp",
    gate: "w1",
    up: "w3",
    down: "w2",
    shared: ("shared_expert", MLP),
    shared_gate: "shared_expert_gate",
};

/// Qwen2-MoE's and Qwen3-MoE's `mlp.experts.{e}.gate_proj`, `up_proj`,
/// `down_proj`, and Qwen2-MoE's shared expert.
pub(super) const QWEN_EXPERTS: ExpertNames = ExpertNames {
    gate: "gate_proj",
    up: "up_proj",
    down: "down_proj",
    ..MIXTRAL_EXPERTS
};

/// The MoE block of a layer (`w` at `model.layers.{i}`): Mixtral's
/// `block_sparse_moe`, or `mlp` (Qwen's, and Mixtral's in Transformers 5).
fn moe(w: &Weights, c: &LlamaConfig, m: &super::MoeSettings, s: &Stream) -> Result<Moe> {
    let block = if w.contains(&format!("{}gate.weight", m.block)) {
        m.block
    } else {
        "mlp."
    };
    let w = w.pp(block);
    let config = MoeConfig::new(m.top_k)
        .with_gating(m.gating)
        .with_routed_scaling(m.routed_scaling)
        .with_placement(m.placement)
        .with_activation(m.activation)
        .with_expert_matmul(m.expert_matmul);
    let dims = (c.hidden_size, m.hidden, m.experts);
    let names = match &m.layout {
        ExpertLayout::Interleaved(names) => {
            return Moe::load_interleaved(&w, names, dims, config, s)
        }
        ExpertLayout::PerExpert(names) => names,
    };
    Moe::load_hf(&w, names, dims, m.shared_hidden, config, s)
}

/// The rotation the configuration asks for.
fn rope(c: &LlamaConfig) -> Rope {
    let freqs = c.rope_freqs();
    let scale = match c.rope_scaling {
        super::config::RopeScaling::Linear { factor } => 1.0 / factor,
        _ => 1.0,
    };
    Rope {
        dims: c.rotary_dim as i32,
        // DeepSeek's checkpoints rotate interleaved pairs.
        traditional: c.mla.is_some(),
        base: freqs.is_none().then_some(c.rope_theta),
        scale,
        freqs: freqs.map(|f| Array::from_slice(&f, &[f.len() as i32])),
        mscale: c.rope_mscale(),
    }
}
