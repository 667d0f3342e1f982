//! The cache slots and one step's batch, the same on every rank.

use safemlx::Stream;
use safemlx_dist::models::Llama;
use safemlx_dist::nn::{gather_logits, SlotCache};

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
    /// batch in one forward pass. Returns the logits of each sequence's
    /// last token (one row of the vocabulary each, in batch order) when
    /// `rows` is set; every rank takes part in the gather.
    ///
    /// # Errors
    /// A plan that starts a slot beyond what it holds, or the model's
    /// error.
    pub fn run(
        &mut self,
        model: &Llama,
        plan: &Plan,
        rows: bool,
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
        let logits = model
            .forward_last_slots(&batch, &mut self.cache, s)
            .map_err(err)?;
        let b = plan.work.len();
        let full = gather_logits(&logits, 0..b, s).map_err(err)?;
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
