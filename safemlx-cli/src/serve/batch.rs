//! The cache slots and one step's batch, the same on every rank.

use safemlx::Stream;
use safemlx_dist::models::Llama;
use safemlx_dist::nn::{gather_logits, KvCache};

use super::plan::Plan;

/// One KV cache per slot; a slot without a sequence holds none.
#[derive(Debug)]
pub struct Slots {
    caches: Vec<Option<KvCache>>,
}

impl Slots {
    /// `n` empty slots.
    pub fn new(n: usize) -> Self {
        Self {
            caches: (0..n).map(|_| None).collect(),
        }
    }

    /// Runs `plan` on this rank: drops the freed slots' caches, starts or
    /// cuts back each fed slot's cache to the work's start, then feeds the
    /// batch in one forward pass. Returns the logits of each
    /// sequence's last token (one row of the vocabulary each, in batch
    /// order) when `rows` is set; every rank takes part in the gather.
    ///
    /// # Errors
    /// A plan that names a slot without a sequence, or the model's error.
    pub fn run(
        &mut self,
        model: &Llama,
        plan: &Plan,
        rows: bool,
        s: &Stream,
    ) -> Result<Vec<Vec<f32>>, String> {
        for &slot in &plan.free {
            if let Some(cache) = self.caches.get_mut(slot) {
                *cache = None;
            }
        }
        if plan.work.is_empty() {
            return Ok(Vec::new());
        }
        for w in &plan.work {
            let cache = self
                .caches
                .get_mut(w.slot)
                .ok_or_else(|| format!("the plan names slot {}, beyond the slots", w.slot))?;
            match cache {
                _ if w.start == 0 => *cache = Some(model.new_cache()),
                Some(held) if w.start <= held.len() => held.truncate(w.start),
                held => {
                    return Err(format!(
                        "the plan feeds slot {} at position {}, but its cache holds {} positions",
                        w.slot,
                        w.start,
                        held.as_ref().map_or(0, KvCache::len)
                    ))
                }
            }
        }
        let mut by_slot: Vec<Option<&mut KvCache>> =
            self.caches.iter_mut().map(Option::as_mut).collect();
        let mut batch: Vec<(&[u32], &mut KvCache)> = Vec::with_capacity(plan.work.len());
        for w in &plan.work {
            let cache = by_slot
                .get_mut(w.slot)
                .and_then(Option::take)
                .ok_or_else(|| format!("the plan names slot {} twice", w.slot))?;
            batch.push((&w.tokens, cache));
        }
        let err = |e: safemlx_dist::Error| e.to_string();
        let logits = model.forward_last_batch(&mut batch, s).map_err(err)?;
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
