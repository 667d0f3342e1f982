//! A layer's attention, grouped-query or latent, and what its cache holds
//! per position.

use safemlx::Stream;

use super::Llama;
use crate::error::Result;
use crate::grad::Parameters;
use crate::nn::{GqaAttention, HeadSplit, LayerKv, MlaAttention};
use crate::typed::{Replicated, ShardedArray};

/// The attention half of a layer: grouped-query heads, or DeepSeek's
/// latent attention.
#[derive(Debug, Parameters)]
pub(super) enum Attention {
    Gqa(Box<GqaAttention>),
    Mla(Box<MlaAttention>),
}

impl Attention {
    pub(super) fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        batch: &mut [(usize, &mut dyn LayerKv)],
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        match self {
            Self::Gqa(a) => a.forward(x, batch, s),
            Self::Mla(a) => a.forward(x, batch, s),
        }
    }

    pub(super) fn split(&self) -> HeadSplit {
        match self {
            Self::Gqa(a) => a.split(),
            Self::Mla(a) => a.split(),
        }
    }

    pub(super) fn is_quantized(&self) -> bool {
        match self {
            Self::Gqa(a) => a.is_quantized(),
            Self::Mla(a) => a.is_quantized(),
        }
    }

    pub(super) fn nbytes(&self) -> usize {
        match self {
            Self::Gqa(a) => a.nbytes(),
            Self::Mla(a) => a.nbytes(),
        }
    }
}

impl Llama {
    /// Bytes this rank's cache holds per position, every layer (float32
    /// values): its KV heads' keys and values, or with latent attention
    /// the latent and the RoPE key (the same on every rank), `kv_lora_rank
    /// + qk_rope_head_dim` values per layer.
    pub fn cache_bytes_per_token(&self) -> usize {
        let split = self.head_split().unwrap_or(HeadSplit {
            query: (0, 0),
            kv: (0, 0),
            shared: None,
        });
        let c = &self.config;
        let values = match c.mla {
            Some(m) if split.query.1 > 0 => m.latent_values(),
            Some(_) => 0,
            None => 2 * split.kv.1 * c.head_dim,
        };
        values * 4 * self.layers.len()
    }

    /// What a per-head cache of this rank's heads would hold per position:
    /// [`cache_bytes_per_token`](Self::cache_bytes_per_token) without
    /// latent attention; with it, each head's key (`qk_nope_head_dim +
    /// qk_rope_head_dim`) and value (`v_head_dim`).
    pub fn per_head_cache_bytes_per_token(&self) -> usize {
        match (self.config.mla, self.head_split()) {
            (Some(m), Some(split)) => m.per_head_values(split.query.1) * 4 * self.layers.len(),
            _ => self.cache_bytes_per_token(),
        }
    }
}
