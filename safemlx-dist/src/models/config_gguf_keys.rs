//! A GGUF file's metadata keys, read with errors that name the key and
//! the file, and the `config.json` keys every family shares, translated:
//! a family whose GGUF metadata maps onto its Hugging Face configuration
//! (DeepSeek-V3's `deepseek2`) is read by the same code as its
//! `config.json`.

use serde_json::{Map, Value};

use crate::checkpoint::{GgufFile, GgufValue};
use crate::error::{Error, Result};

/// A GGUF file's metadata under its architecture's prefix
/// (`deepseek2.block_count`).
pub(super) struct GgufKeys<'a> {
    pub(super) file: &'a GgufFile,
    pub(super) arch: &'a str,
}

impl GgufKeys<'_> {
    /// An error about this file.
    pub(super) fn fail(&self, message: String) -> Error {
        Error::Model {
            path: self.file.path().display().to_string(),
            message,
        }
    }

    /// The full name of the architecture's key `key`.
    pub(super) fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.arch)
    }

    fn value(&self, full: &str) -> Option<&GgufValue> {
        self.file.metadata().get(full)
    }

    /// A whole number under the full name `full`, if it is there.
    pub(super) fn int_at(&self, full: &str) -> Result<Option<usize>> {
        match self.value(full) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .map(Some)
                .ok_or_else(|| self.fail(format!("{full} is {v:?}, not a whole number"))),
        }
    }

    /// The architecture's whole number `key`, if it is there.
    pub(super) fn int(&self, key: &str) -> Result<Option<usize>> {
        self.int_at(&self.key(key))
    }

    /// The architecture's whole number `key`, above 0, that must be there.
    pub(super) fn need(&self, key: &str) -> Result<usize> {
        self.int(key)?
            .filter(|v| *v > 0)
            .ok_or_else(|| self.fail(format!("has no positive {}", self.key(key))))
    }

    /// The architecture's number `key`, if it is there.
    pub(super) fn float(&self, key: &str) -> Result<Option<f64>> {
        let full = self.key(key);
        match self.value(&full) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.fail(format!("{full} is {v:?}, not a number"))),
        }
    }

    /// The architecture's boolean `key`, if it is there.
    pub(super) fn flag(&self, key: &str) -> Result<Option<bool>> {
        let full = self.key(key);
        match self.value(&full) {
            None => Ok(None),
            Some(GgufValue::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.fail(format!("{full} is {v:?}, not true or false"))),
        }
    }

    /// The architecture's string `key`, if it is there.
    pub(super) fn text(&self, key: &str) -> Option<&str> {
        self.value(&self.key(key)).and_then(GgufValue::as_str)
    }

    /// The vocabulary's size: `vocab_size`, else the tokenizer's tokens.
    pub(super) fn vocab_size(&self) -> Result<usize> {
        let tokens = self
            .value("tokenizer.ggml.tokens")
            .and_then(GgufValue::as_array)
            .map(<[GgufValue]>::len);
        match self.int("vocab_size")?.or(tokens) {
            Some(v) if v > 0 => Ok(v),
            _ => Err(self.fail(format!(
                "has no {} and no tokenizer.ggml.tokens",
                self.key("vocab_size")
            ))),
        }
    }

    /// The `config.json` keys every family has, from the file: sizes,
    /// norm epsilon, RoPE base, context, tied embeddings (no
    /// `output.weight`), and the BOS/EOS ids.
    pub(super) fn hf_base(&self, model_type: &str) -> Result<Map<String, Value>> {
        let mut c = Map::new();
        c.insert("model_type".into(), model_type.into());
        c.insert("vocab_size".into(), self.vocab_size()?.into());
        for (hf, gguf) in [
            ("hidden_size", "embedding_length"),
            ("num_hidden_layers", "block_count"),
            ("num_attention_heads", "attention.head_count"),
            ("intermediate_size", "feed_forward_length"),
        ] {
            c.insert(hf.into(), self.need(gguf)?.into());
        }
        let floats = [
            ("rms_norm_eps", "attention.layer_norm_rms_epsilon"),
            ("rope_theta", "rope.freq_base"),
        ];
        for (hf, gguf) in floats {
            if let Some(v) = self.float(gguf)? {
                c.insert(hf.into(), v.into());
            }
        }
        if let Some(n) = self.int("context_length")? {
            c.insert("max_position_embeddings".into(), n.into());
        }
        let tied = !self.file.tensors().contains_key("output.weight");
        c.insert("tie_word_embeddings".into(), tied.into());
        for (hf, gguf) in [
            ("bos_token_id", "tokenizer.ggml.bos_token_id"),
            ("eos_token_id", "tokenizer.ggml.eos_token_id"),
        ] {
            if let Some(id) = self.int_at(gguf)? {
                c.insert(hf.into(), id.into());
            }
        }
        Ok(c)
    }

    /// The keys of DeepSeek-V3's and GLM-4-MoE's grouped sigmoid experts
    /// (GLM's `moe_settings`), into `c`: llama.cpp's gating function 2 is
    /// sigmoid, and the multi-token-prediction layers it counts in
    /// `block_count` (`nextn_predict_layers`) are left out of
    /// `num_hidden_layers`.
    ///
    /// # Errors
    /// An ill-typed key, a gating function other than softmax (1) or
    /// sigmoid (2), or prediction layers that leave no layer.
    pub(super) fn grouped_experts(&self, c: &mut Map<String, Value>) -> Result<()> {
        let layers = self.need("block_count")?;
        let mtp = self.int("nextn_predict_layers")?.unwrap_or(0);
        if mtp >= layers {
            return Err(self.fail(format!(
                "{} ({mtp}) leaves none of the {} ({layers}) layers",
                self.key("nextn_predict_layers"),
                self.key("block_count")
            )));
        }
        c.insert("num_hidden_layers".into(), (layers - mtp).into());
        let scoring = match self.int("expert_gating_func")? {
            None | Some(2) => "sigmoid",
            Some(1) => "softmax",
            Some(other) => {
                return Err(self.fail(format!(
                    "{} is {other}; supported: 1 (softmax), 2 (sigmoid)",
                    self.key("expert_gating_func")
                )))
            }
        };
        c.insert("scoring_func".into(), scoring.into());
        c.insert("topk_method".into(), "noaux_tc".into());
        let ints = [
            ("moe_intermediate_size", "expert_feed_forward_length"),
            ("n_routed_experts", "expert_count"),
            ("num_experts_per_tok", "expert_used_count"),
            ("n_shared_experts", "expert_shared_count"),
            ("first_k_dense_replace", "leading_dense_block_count"),
            ("n_group", "expert_group_count"),
            ("topk_group", "expert_group_used_count"),
        ];
        for (hf, gguf) in ints {
            if let Some(v) = self.int(gguf)? {
                c.insert(hf.into(), v.into());
            }
        }
        if let Some(v) = self.float("expert_weights_scale")? {
            c.insert("routed_scaling_factor".into(), v.into());
        }
        if let Some(v) = self.flag("expert_weights_norm")? {
            c.insert("norm_topk_prob".into(), v.into());
        }
        Ok(())
    }
}
