//! The cache slots and one step's batch, the same on every rank of a
//! stage.
//!
//! Through pipeline stages (`--mesh pp=P`) one step runs as a wave: the
//! first stage embeds the batch's tokens and runs its layers, each later
//! stage runs its layers on the rows the one before sent, and the last
//! stage sends the logits of each sequence's last token back to the first
//! (the ring closes), whose rank 0 samples them. Every stage knows the
//! plan (slots, positions, token counts) from rank 0's broadcast, so each
//! keeps its layers' slots in step without another message.

use safemlx::{Dtype, Stream};
use safemlx_dist::models::Llama;
use safemlx_dist::nn::{gather_logits, SlotCache};
use safemlx_dist::typed::{StageLink, StageMessage};

use super::plan::Plan;

/// Every slot's KV cache in one [`SlotCache`]: the decoding sequences of a
/// step attend in one call per layer, however many they are.
#[derive(Debug)]
pub struct Slots {
    cache: SlotCache,
}

impl Slots {
    /// `n` empty slots for `model`.
    pub fn new(model: &Llama, n: usize) -> Self {
        Self {
            cache: model.new_slots(n),
        }
    }

    /// Runs `plan` on this rank: empties the freed slots, cuts each fed
    /// slot back to the work's start (0 for a new sequence), then feeds the
    /// batch in one forward pass (through the stages `link` joins, if
    /// any). Returns the logits of each sequence's last token (one row of
    /// the vocabulary each, in batch order) when `rows` is set (rank 0);
    /// every rank of the last stage takes part in the gather.
    ///
    /// # Errors
    /// A plan that starts a slot beyond what it holds, a boundary's
    /// error, or the model's.
    pub fn run(
        &mut self,
        model: &Llama,
        plan: &Plan,
        (rows, link): (bool, Option<&StageLink>),
        s: &Stream,
    ) -> Result<Vec<Vec<f32>>, String> {
        for &slot in &plan.free {
            self.cache.truncate(slot, 0);
        }
        if plan.work.is_empty() {
            return Ok(Vec::new());
        }
        for w in &plan.work {
            let held = self.cache.len(w.slot);
            if w.start > held {
                return Err(format!(
                    "the plan feeds slot {} at position {}, but its cache holds {held} positions",
                    w.slot, w.start
                ));
            }
            self.cache.truncate(w.slot, w.start);
        }
        let batch: Vec<(usize, &[u32])> = plan
            .work
            .iter()
            .map(|w| (w.slot, w.tokens.as_slice()))
            .collect();
        let err = |e: safemlx_dist::Error| e.to_string();
        let config = model.config();
        let stage = model.stage();
        let receive = |width: usize| -> Result<_, String> {
            let link = link.ok_or("a pipeline stage without its link")?;
            match link.receive(width, Dtype::Float32, s).map_err(err)? {
                StageMessage::Hidden { rows, .. } | StageMessage::Logits(rows) => Ok(rows),
                _ => Err("the server's pipeline got a message of the wrong kind".to_owned()),
            }
        };
        let hidden = match stage.is_first() {
            true => None,
            false => Some(receive(config.hidden_size)?),
        };
        let x = model
            .forward_stage_slots(&batch, hidden, &mut self.cache, s)
            .map_err(err)?;
        let b = plan.work.len();
        let full = if stage.is_last() {
            let logits = model.last_slot_logits(&x, &batch, s).map_err(err)?;
            let full = gather_logits(&logits, 0..b, s).map_err(err)?;
            if let (Some(link), false) = (link, stage.is_whole()) {
                link.send_logits(&full, s).map_err(err)?;
            }
            full
        } else {
            let link = link.ok_or("a pipeline stage without its link")?;
            link.send_hidden(&x, true, s).map_err(err)?;
            if !stage.is_first() {
                return Ok(Vec::new());
            }
            // The last stage's logits come back to the first.
            let logits = receive(config.vocab_size)?;
            if logits.global_shape()[0] as usize != b {
                return Err(format!(
                    "the last stage sent logits of {} rows for a batch of {b} sequences",
                    logits.global_shape()[0]
                ));
            }
            logits
        };
        let full = full
            .into_local()
            .contiguous(false, s)
            .map_err(|e| e.to_string())?;
        safemlx_dist::eval(&[&full]).map_err(err)?;
        if !rows {
            return Ok(Vec::new());
        }
        let values = full
            .into_evaluated()
            .map_err(|e| e.to_string())?
            .try_to_vec::<f32>()
            .map_err(|e| format!("cannot read the logits: {e}"))?;
        let v = values.len() / b;
        Ok(values.chunks(v.max(1)).map(<[f32]>::to_vec).collect())
    }
}
