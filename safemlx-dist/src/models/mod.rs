//! Real models, written with the parallel layers of [`nn`](crate::nn):
//! one file per family, each reading like its math.
//!
//! - [`llama`]: Llama 2/3, Mistral, Qwen2, Qwen3 and SmolLM2, from Hugging
//!   Face directories ([`HfDirectory`](crate::checkpoint::HfDirectory)).
//!
//! Every rank loads only its part of each tensor (heads, MLP columns,
//! vocabulary rows); the logits equal those of the whole model computed in
//! one process (tested at 1 to 4 ranks, and against `mlx-lm`'s logits for
//! the same weights).

pub mod config;
pub mod llama;

pub use config::{Family, LlamaConfig, RopeScaling};
pub use llama::Llama;
