//! Real models, written with the parallel layers of [`nn`](crate::nn):
//! one file per family, each reading like its math.
//!
//! - [`llama`]: Llama 2/3, Mistral, Qwen2, Qwen3 and SmolLM2, from Hugging
//!   Face directories (float or mlx-community quantized) and GGUF files
//!   (see [`load`]); quantized weights stay quantized. Its MoE members,
//!   Mixtral, Qwen2-MoE and Qwen3-MoE, from Hugging Face directories,
//!   experts split across ranks or sliced ([`LoadOptions::experts`]).
//! - `phi3`: Phi-3, Llama's decoder with fused `qkv_proj` and
//!   `gate_up_proj` tensors, from Hugging Face directories.
//! - `glm4_moe` and `deepseek_v3`: GLM-4-MoE (partial RoPE, grouped
//!   sigmoid routing) and DeepSeek-V3 (latent attention with a latent KV
//!   cache, the same routing), Llama's decoder with their settings.
//!
//! Every rank loads only its part of each tensor (heads, MLP columns,
//! vocabulary rows); the logits equal those of the whole model computed in
//! one process (tested at 1 to 4 ranks, and against `mlx-lm`'s logits for
//! the same weights).

pub mod config;
mod config_check;
mod config_gguf;
mod config_gguf_keys;
mod config_hf;
mod config_keys;
mod config_rope;
mod deepseek_v3;
mod glm4_moe;
mod gpt_oss;
mod layout;
pub mod llama;
mod phi3;
mod stage_memory;
mod stages;

use std::path::{Path, PathBuf};

use safemlx::Stream;

pub use config::{ExpertLayout, Family, LlamaConfig, MlaSettings, MoeSettings, RopeScaling};
pub use layout::{load_layout, Layout, Placed, StageSplit, TensorSplit};
pub use llama::{Llama, StageInput};
pub use stage_memory::{
    available_memory, memory_reports, parse_memory, split_by_memory, MEMORY_ENV,
};
pub use stages::{parse_weights, LayerSplit, Stage};

use crate::checkpoint::{Dequantized, GgufFile, HfDirectory, OneDtype, TensorSource, Weights};
use crate::error::Result;
use crate::nn::ExpertPlacement;
use crate::runtime::Group;
use crate::tokenizer::Tokenizer;

/// A model loaded on this rank, with what it was read from.
#[derive(Debug)]
pub struct Loaded {
    /// This rank's part of the model.
    pub model: Llama,
    /// The tensors it was read from (see [`TensorSource::bytes_read`]).
    pub weights: Box<dyn TensorSource>,
    /// Its tokenizer and chat template.
    pub tokenizer: Tokenizer,
}

/// How quantized tensors are loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Storage {
    /// As the checkpoint stores them: quantized ones (GGUF `Q8_0`, `Q4_0`,
    /// `Q4_1`; mlx-community directories) stay quantized.
    #[default]
    AsStored,
    /// Every tensor dequantized to floats (`--dequantize`), to compare.
    Dequantized,
    /// Dequantized when the whole model in float32
    /// ([`LlamaConfig::float_bytes`]) takes at most this many bytes, else as
    /// stored: decided from the configuration, before any weight is read.
    FloatUpTo(u64),
}

impl Storage {
    /// Whether quantized tensors of the model `config` describes stay
    /// quantized.
    pub fn keeps_quantized(self, config: &LlamaConfig) -> bool {
        match self {
            Self::AsStored => true,
            Self::Dequantized => false,
            Self::FloatUpTo(limit) => config.float_bytes() > limit,
        }
    }
}

/// How a model is loaded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoadOptions {
    /// Quantized tensors kept or dequantized.
    pub weights: Storage,
    /// Where an MoE model's experts go (expert parallel by default).
    pub experts: ExpertPlacement,
    /// Each tensor-parallel rank's weight for the attention heads and
    /// hidden columns it takes (`--tensor-split 3:1`; see
    /// [`Weights::with_shares`]); `None`: the chunk rule.
    pub tensor_split: Option<Vec<u32>>,
}

/// The model `cargo xtask demo` fetches: the default of the `safemlx`
/// command and of the `generate` example.
pub const DEFAULT_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where `cargo xtask` keeps [`DEFAULT_MODEL`]: under
/// `$XDG_CACHE_HOME/safemlx-dist/models`, else `~/.cache/safemlx-dist/models`.
pub fn default_model_path() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("safemlx-dist")
        .join("models")
        .join(DEFAULT_MODEL)
}

/// Loads this rank's part of the model at `path`, quantized tensors kept
/// quantized, experts split across ranks: see [`load_with`].
///
/// # Errors
/// Those of [`load_with`].
pub fn load(group: &Group, path: &Path, s: &Stream) -> Result<Loaded> {
    load_with(group, path, LoadOptions::default(), s)
}

/// Loads this rank's part of the model at `path`: a Hugging Face
/// directory (`config.json`, safetensors, `tokenizer.json`) or a `.gguf`
/// file, as `options` say.
///
/// # Errors
/// Those of the format's reader, the configuration and the tokenizer; the
/// message names the file and what is wrong.
pub fn load_with(group: &Group, path: &Path, options: LoadOptions, s: &Stream) -> Result<Loaded> {
    load_part(group, path, options, None, s)
}

/// Loads stage `stage` of the pipeline `split` makes of the model at
/// `path` (a Hugging Face directory or a GGUF file), tensor parallel over
/// `tensor` (the stage's ranks; [`Group::local`] for one rank per stage):
/// only that stage's layers (and the embedding on the first stage, the
/// final norm and LM head on the last) are read.
///
/// # Errors
/// Those of [`load_with`] and of [`LayerSplit::ranges`] for the model's
/// layer count, or a stage past the last.
pub fn load_stage(
    tensor: &Group,
    path: &Path,
    options: LoadOptions,
    split: &LayerSplit,
    stage: usize,
    s: &Stream,
) -> Result<Loaded> {
    load_part(tensor, path, options, Some((split, stage)), s)
}

fn load_part(
    group: &Group,
    path: &Path,
    options: LoadOptions,
    stage: Option<(&LayerSplit, usize)>,
    s: &Stream,
) -> Result<Loaded> {
    let load = |source: &dyn TensorSource, config: LlamaConfig| {
        let dequantize = !options.weights.keeps_quantized(&config);
        let stage = match stage {
            Some((split, index)) => Stage::of(split, index, config.layers)?,
            None => Stage::whole(config.layers),
        };
        let dequantized = Dequantized(source);
        let source: &dyn TensorSource = if dequantize { &dequantized } else { source };
        // float32 sinks, norms and biases beside 16-bit weights: one dtype.
        let one = OneDtype::of(source);
        let mut w = Weights::new(OneDtype::or(&one, source), group);
        if let Some(shares) = &options.tensor_split {
            w = w.with_shares(shares)?;
        }
        Llama::load_stage(&w, config, stage, s)
    };
    let (model, source, tokenizer): (_, Box<dyn TensorSource>, _) = if path.is_dir() {
        let dir = HfDirectory::open(path)?;
        let tokenizer = Tokenizer::from_hf_dir(path)?;
        let mut config = LlamaConfig::from_hf(dir.config(), &path.display().to_string())?;
        if let Some(moe) = &mut config.moe {
            moe.placement = options.experts;
        }
        llama::check_layers(&dir, &config)?;
        let keeps = options.weights.keeps_quantized(&config);
        let note = dir.dequantized_note().filter(|_| keeps);
        if let Some(note) = note.filter(|_| group.rank() == 0) {
            eprintln!("model {}: {note}", path.display());
        }
        let model = load(&dir, config)?;
        llama::load_notes(group, &dir, &model);
        (model, Box::new(dir), tokenizer)
    } else {
        let file = GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let (mut config, source) = Llama::gguf_weights(file, s)?;
        if let Some(moe) = &mut config.moe {
            moe.placement = options.experts;
        }
        let keeps = options.weights.keeps_quantized(&config);
        let note = source.dequantized_note().filter(|_| keeps);
        if let Some(note) = note.filter(|_| group.rank() == 0) {
            eprintln!("model {}: {note}", path.display());
        }
        let model = load(&source, config)?;
        if let Some(note) = model.packed_note().filter(|_| group.rank() == 0) {
            eprintln!("model {}: {note}", path.display());
        }
        // A stage reads only its own tensors.
        if model.stage().is_whole() {
            let past = source.check_all_read(model.config().layers)?;
            if past > 0 && group.rank() == 0 {
                eprintln!(
                    "warning: model {}: skipping {past} tensors of the layers from blk.{} on (llama.cpp's multi-token-prediction layers): generation does not use them",
                    path.display(),
                    model.config().layers
                );
            }
        }
        (model, Box::new(source), tokenizer)
    };
    Ok(Loaded {
        model,
        weights: source,
        tokenizer,
    })
}
