//! Parallel layers on the typed layer.
//!
//! The models are built from [`Mlp`], [`GqaAttention`], [`MlaAttention`], [`Embedding`],
//! [`RmsNorm`] and [`Moe`], whose weights are read from a checkpoint as
//! stored (float or quantized, `[out, in]`), each rank reading only its
//! part. (The `#[sharded]` attribute's demonstration layers, a SwiGLU MLP,
//! linear layers, attention and a transformer block for small models, are
//! in the examples crate, `safemlx_dist_examples::layers`.) Every layer is built on
//! every rank from the full weights (`from_full`, each rank keeping its
//! part) or a weight source, and gives, through its forward, the same
//! numbers as the dense single-process layer (tested at 1 to 4 ranks).

mod embedding;
mod gqa;
mod gqa_slots;
mod grouped_sdpa;
mod head_rows;
mod head_split;
pub mod kv_cache;
mod load_linear;
mod mla;
mod mla_kv_b;
mod mla_slots;
mod mlp;
mod moe;
mod norm;
mod shared_head;
mod slot_cache;
mod window_cache;

pub use embedding::{gather_logits, Embedding};
pub use gqa::{AttentionNames, GqaAttention, GqaConfig, Qkv, Rope};
pub use head_split::{HeadSegment, HeadSplit};
pub use kv_cache::{KvCache, LayerCache, LayerKv};
pub use load_linear::{
    load_column_block, load_columns, load_replicated, load_row_block, load_rows,
};
pub use mla::{MlaAttention, MlaConfig, MlaNames};
pub use mlp::{GateUp, Mlp, MlpNames};
pub use moe::{
    ExpertActivation, ExpertBiases, ExpertMatmul, ExpertNames, ExpertPlacement, ExpertSlices,
    ExpertWeights, Gating, InterleavedNames, Moe, MoeConfig, MoeOutput, Packed, PackedExperts,
    PackedFormat, PackedMatrices, Projection, SharedExperts,
};
pub use norm::RmsNorm;
pub use shared_head::SharedHead;
pub use slot_cache::{SlotCache, SlotLayer, SlotRows};
pub use window_cache::WindowCache;
