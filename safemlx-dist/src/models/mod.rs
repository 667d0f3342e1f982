//! Real models, written with the parallel layers of [`nn`](crate::nn):
//! one file per family, each reading like its math.
//!
//! - [`llama`]: Llama 2/3, Mistral, Qwen2, Qwen3 and SmolLM2, from Hugging
//!   Face directories and GGUF files (see [`load`]).
//!
//! Every rank loads only its part of each tensor (heads, MLP columns,
//! vocabulary rows); the logits equal those of the whole model computed in
//! one process (tested at 1 to 4 ranks, and against `mlx-lm`'s logits for
//! the same weights).

pub mod config;
pub mod llama;

use std::path::Path;

use safemlx::Stream;

pub use config::{Family, LlamaConfig, RopeScaling};
pub use llama::Llama;

use crate::checkpoint::{GgufFile, HfDirectory, TensorSource};
use crate::error::Result;
use crate::tokenizer::Tokenizer;
use crate::Group;

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

/// Loads this rank's part of the model at `path`: a Hugging Face
/// directory (`config.json`, safetensors, `tokenizer.json`) or a `.gguf`
/// file (tensors dequantized to `float32`).
///
/// # Errors
/// Those of the format's reader, the configuration and the tokenizer; the
/// message names the file and what is wrong.
pub fn load(group: &Group, path: &Path, s: &Stream) -> Result<Loaded> {
    if path.is_dir() {
        let dir = HfDirectory::open(path)?;
        let tokenizer = Tokenizer::from_hf_dir(path)?;
        let model = Llama::from_hf(group, &dir, s)?;
        return Ok(Loaded {
            model,
            weights: Box::new(dir),
            tokenizer,
        });
    }
    let file = GgufFile::open(path)?;
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let (model, weights) = Llama::from_gguf(group, file, s)?;
    Ok(Loaded {
        model,
        weights: Box::new(weights),
        tokenizer,
    })
}
