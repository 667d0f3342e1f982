//! What a model's load says once: the checkpoint's layers it does not
//! read (multi-token prediction) and how it holds packed experts.

use super::{FeedForward, Llama};
use crate::checkpoint::HfDirectory;
use crate::models::deepseek_v3;
use crate::runtime::Group;

impl Llama {
    /// How the packed experts of a checkpoint that has them (MXFP4,
    /// affine quantized) are held: kept as stored, or dequantized and why
    /// (the layers counted; the first reason given).
    pub fn packed_note(&self) -> Option<String> {
        let storage: Vec<_> = self
            .layers
            .iter()
            .filter_map(|l| match &l.mlp {
                FeedForward::Moe(m) => m.packed_storage(),
                FeedForward::Dense(_) => None,
            })
            .collect();
        let (format, _) = storage.first()?;
        let (what, mode) = (format.label(), format!("{:?}", format.mode).to_lowercase());
        let kept = storage.iter().filter(|(_, k)| k.is_ok()).count();
        let dropped = storage
            .iter()
            .find_map(|(f, k)| k.as_ref().err().map(|why| (f, why)));
        let mut keeping = format!(
            "keeping the {what} experts of {kept} layers as stored (MLX's {mode} quantized matmuls)"
        );
        let floats: Vec<usize> = self
            .layers
            .iter()
            .filter_map(|l| match &l.mlp {
                FeedForward::Moe(m) => Some(m.float_projections()).filter(|&n| n > 0),
                FeedForward::Dense(_) => None,
            })
            .collect();
        if !floats.is_empty() {
            keeping += &format!(
                ", but for {} projections of {} layers stored without a packed form, held as float32",
                floats.iter().sum::<usize>(),
                floats.len()
            );
        }
        let Some((format, why)) = dropped else {
            return Some(keeping);
        };
        let dequantizing = format!(
            "the experts of {} layers to float32 as they are read (about {:.1} times their stored bytes): {why}",
            storage.len() - kept,
            32.0 / format.stored_bits()
        );
        Some(match kept {
            0 => format!("dequantizing the {what} {}", &dequantizing[4..]),
            _ => format!("{keeping}; dequantizing {dequantizing}"),
        })
    }
}

/// Refuses weights of layers past `config.layers` in a family without
/// multi-token-prediction layers (only GLM-4-MoE's and DeepSeek-V3's
/// checkpoints hold those, skipped with a warning): config.json and the
/// weights disagree, and which one is right is the user's to say.
///
/// # Errors
/// The first such tensor and the layer count, named.
pub(in crate::models) fn check_layers(
    dir: &HfDirectory,
    config: &crate::models::LlamaConfig,
) -> crate::error::Result<()> {
    use crate::models::Family;
    if matches!(config.family, Family::DeepseekV3 | Family::Glm4Moe) {
        return Ok(());
    }
    match deepseek_v3::layers_past(dir.names(), config.layers).first() {
        None => Ok(()),
        Some((layer, name)) => Err(crate::error::Error::Model {
            path: dir.path().display().to_string(),
            message: format!(
                "the weights hold layer {layer} (`{name}`) but \"num_hidden_layers\" is {}: config.json and the weights disagree; fix the one that is wrong",
                config.layers
            ),
        }),
    }
}

/// On rank 0, one warning on stderr naming the layers after the last one
/// that `dir` holds (GLM-4-MoE's and DeepSeek-V3's multi-token
/// prediction), which `model` does not read; and one line on how it holds
/// MXFP4 experts (gpt-oss).
pub(in crate::models) fn load_notes(group: &Group, dir: &HfDirectory, model: &Llama) {
    if group.rank() != 0 {
        return;
    }
    let path = dir.path().display();
    if let Some(warning) = deepseek_v3::mtp_warning(dir.names(), model.config.layers) {
        eprintln!("warning: model {path}: {warning}");
    }
    if let Some(note) = model.packed_note() {
        eprintln!("model {path}: {note}");
    }
}

impl Llama {
    /// What this rank holds, for its startup line: its stage and layers
    /// (in a pipeline), query and KV heads, MLP columns and experts, e.g.
    /// `stage 1 of 2, layers 15..30; query heads 0..5 (head 4 shared by
    /// rows), KV heads 0..2, MLP columns 0..768`.
    pub fn holds(&self) -> String {
        let stage = &self.stage;
        let layers = if stage.is_whole() {
            String::new()
        } else {
            format!(
                "stage {} of {}, layers {}..{}; ",
                stage.index, stage.count, stage.layers.start, stage.layers.end
            )
        };
        let heads = self
            .head_split()
            .map(|h| {
                let shared = h
                    .shared
                    .map(|sh| format!(" (head {} shared by rows)", sh.head))
                    .unwrap_or_default();
                format!(
                    "query heads {}..{}{shared}, KV heads {}..{}",
                    h.query.0,
                    h.query.0 + h.query.1,
                    h.kv.0,
                    h.kv.0 + h.kv.1
                )
            })
            .unwrap_or_default();
        let hidden = self
            .mlp_hidden()
            .map(|(first, count)| format!(", MLP columns {first}..{}", first + count))
            .unwrap_or_default();
        let experts = self
            .held_experts()
            .map(|(first, count)| format!(", experts {first}..{}", first + count))
            .unwrap_or_default();
        format!("{layers}{heads}{hidden}{experts}")
    }
}
