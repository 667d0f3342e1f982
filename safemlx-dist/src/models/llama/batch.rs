//! Running a batch: sequences of any lengths in one pass, on one cache
//! per sequence ([`KvCache`]) or on the slots of a server's batch
//! ([`SlotCache`]), and the logits of each sequence's last token.

use safemlx::{Array, Stream};

use super::{Attention, Llama};
use crate::error::{Error, Result};
use crate::nn::{KvCache, LayerKv, SlotCache};
use crate::typed::{Replicated, Sharded, ShardedArray};

impl Llama {
    /// As [`forward_batch`](Self::forward_batch), but the logits of each
    /// sequence's last position only, `[B, V]`, one row per sequence.
    ///
    /// # Errors
    /// See [`forward_batch`](Self::forward_batch).
    pub fn forward_last_batch(
        &self,
        batch: &mut [(&[u32], &mut KvCache)],
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<1>>> {
        let lens: Vec<usize> = batch.iter().map(|(t, _)| t.len()).collect();
        let x = self.hidden(batch, s)?;
        self.last_logits(&x, &lens, s)
    }

    /// As [`forward_last_batch`](Self::forward_last_batch), on the slots
    /// of `cache` (made with [`new_slots`](Self::new_slots)): each
    /// `(slot, tokens)` at positions `cache.len(slot)..`, the decoding
    /// sequences' attention in one call per layer (see [`SlotCache`]).
    ///
    /// # Errors
    /// No sequence, a slot out of range or named twice, a sequence
    /// without tokens, a cache made for another model, a token outside the
    /// vocabulary, or an MLX error.
    pub fn forward_last_slots(
        &self,
        batch: &[(usize, &[u32])],
        cache: &mut SlotCache,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<1>>> {
        let x = self.forward_stage_slots(batch, None, cache, s)?;
        self.last_slot_logits(&x, batch, s)
    }

    /// One step of a server's batch through this rank's layers (a
    /// pipeline stage's, or all of them) on the slots of `cache`, as
    /// [`forward_last_slots`](Self::forward_last_slots) runs them: the
    /// first stage embeds the batch's tokens (`hidden` is `None`), a later
    /// stage takes the previous stage's output, one row per token of the
    /// batch in order. Returns this stage's output rows, `[T, D]`.
    ///
    /// # Errors
    /// Those of [`forward_last_slots`](Self::forward_last_slots); hidden
    /// rows on the first stage or none on another, or rows that are not
    /// one per token of the batch, `[T, D]`.
    pub fn forward_stage_slots(
        &self,
        batch: &[(usize, &[u32])],
        hidden: Option<ShardedArray<Replicated>>,
        cache: &mut SlotCache,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        if batch.is_empty() || cache.layers() != self.layers.len() {
            return Err(Error::Shape(format!(
                "the model of {} layers got {} sequences on a slot cache of {} layers",
                self.layers.len(),
                batch.len(),
                cache.layers()
            )));
        }
        // Sliding layers mask their window; the slots keep every position.
        let rows = cache.rows(batch, None)?;
        let all: Vec<u32> = batch.iter().flat_map(|(_, t)| t.iter().copied()).collect();
        let x = match (hidden, self.stage.is_first()) {
            (None, true) => self.embed_tokens(&all, s)?,
            (Some(x), false) => {
                let want = [all.len(), self.config.hidden_size];
                let shape: Vec<usize> = x.global_shape().iter().map(|&d| d as usize).collect();
                if shape != want {
                    return Err(Error::Shape(format!(
                        "stage {} got hidden rows of shape {shape:?} for a batch of {} tokens; it takes {want:?}",
                        self.stage.index,
                        all.len()
                    )));
                }
                x
            }
            (hidden, _) => {
                return Err(Error::Shape(format!(
                    "stage {} of {} {}",
                    self.stage.index,
                    self.stage.count,
                    match hidden {
                        Some(_) => "embeds the batch's tokens; it got hidden rows",
                        None => "takes the previous stage's rows; it got none",
                    }
                )))
            }
        };
        let slots = cache.slots();
        let x = self.layers_with(x, s, |i, attention, x| match attention {
            Attention::Gqa(a) => a.forward_slots(x, cache.layer_mut(i), &rows, slots, s),
            Attention::Mla(a) => a.forward_slots(x, cache.layer_mut(i), &rows, slots, s),
        })?;
        cache.advance(&rows);
        Ok(x)
    }

    /// On the last stage, the logits of each sequence's last token of a
    /// step's output rows `x` (what
    /// [`forward_stage_slots`](Self::forward_stage_slots) returned for
    /// `batch`), `[B, V]`: this rank's vocabulary columns.
    ///
    /// # Errors
    /// A stage other than the last, or an MLX error.
    pub fn last_slot_logits(
        &self,
        x: &ShardedArray<Replicated>,
        batch: &[(usize, &[u32])],
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<1>>> {
        let lens: Vec<usize> = batch.iter().map(|(_, t)| t.len()).collect();
        self.last_logits(x, &lens, s)
    }

    /// `slots` empty slots for [`forward_last_slots`](Self::forward_last_slots).
    pub fn new_slots(&self, slots: usize) -> SlotCache {
        SlotCache::new(self.layers.len(), slots)
    }

    /// The logits of each sequence's last row of `x` (`lens` rows each).
    pub(super) fn last_logits(
        &self,
        x: &ShardedArray<Replicated>,
        lens: &[usize],
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<1>>> {
        let last = self.last_rows(x, lens, s)?;
        self.head()?
            .logits(&self.final_norm()?.forward(&last, s)?, s)
    }

    /// Each sequence's last row of `x` (`lens` rows each, at least one),
    /// `[lens.len(), D]`.
    pub(super) fn last_rows(
        &self,
        x: &ShardedArray<Replicated>,
        lens: &[usize],
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        let mut end = 0;
        let last: Vec<i32> = lens
            .iter()
            .map(|len| {
                end += len;
                i32::try_from(end - 1).map_err(|_| Error::ShapeOverflow { value: end })
            })
            .collect::<Result<_>>()?;
        let rows =
            i32::try_from(last.len()).map_err(|_| Error::ShapeOverflow { value: last.len() })?;
        let picked = x
            .local()
            .take_axis(Array::from_slice(&last, &[rows]), 0, s)?;
        let d = x.global_shape()[1];
        ShardedArray::from_local(picked, x.comm(), &[rows, d])
    }

    /// The residual stream after the last layer, before the final norm:
    /// the batch's rows.
    pub(super) fn hidden(
        &self,
        batch: &mut [(&[u32], &mut KvCache)],
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        if batch.is_empty() {
            return Err(Error::Shape("the model got no sequences".to_owned()));
        }
        for (i, (tokens, cache)) in batch.iter().enumerate() {
            self.check_sequence(i, tokens.len(), cache)?;
        }
        let all: Vec<u32> = batch.iter().flat_map(|(t, _)| t.iter().copied()).collect();
        let x = self.embed_tokens(&all, s)?;
        self.layers_with(x, s, |i, attention, x| {
            // Each sequence's rows and its cache of this layer.
            let mut caches: Vec<(usize, &mut dyn LayerKv)> = batch
                .iter_mut()
                .map(|(tokens, cache)| (tokens.len(), cache.layers[i].as_mut() as &mut dyn LayerKv))
                .collect();
            attention.forward(x, &mut caches, s)
        })
    }

    /// `x` through every layer this rank holds, attention layer `i` (of
    /// this rank's) run by `attend(i, attention, normed x)`.
    pub(super) fn layers_with(
        &self,
        mut x: ShardedArray<Replicated>,
        s: &Stream,
        mut attend: impl FnMut(
            usize,
            &Attention,
            &ShardedArray<Replicated>,
        ) -> Result<ShardedArray<Replicated>>,
    ) -> Result<ShardedArray<Replicated>> {
        for (i, layer) in self.layers.iter().enumerate() {
            let normed = layer.input_norm.forward(&x, s)?;
            x = x.add(&attend(i, &layer.attention, &normed)?, s)?;
            let mlp = layer
                .mlp
                .forward(&layer.post_attention_norm.forward(&x, s)?, s)?;
            x = x.add(&mlp, s)?;
        }
        Ok(x)
    }

    /// The embedding of `tokens` (the first stage's).
    pub(super) fn embed_tokens(
        &self,
        tokens: &[u32],
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        match (&self.embed, self.stage.is_first()) {
            (Some(embed), true) => embed.forward(tokens, s),
            _ => Err(self.not_here("the embedding")),
        }
    }

    /// Sequence `i` of a batch, `tokens` new tokens on `cache`: some
    /// tokens, a cache of this model's layers.
    pub(super) fn check_sequence(&self, i: usize, tokens: usize, cache: &KvCache) -> Result<()> {
        if tokens == 0 {
            return Err(Error::Shape(format!(
                "sequence {i} of the batch has no tokens"
            )));
        }
        if cache.layers.len() != self.layers.len() {
            return Err(Error::Shape(format!(
                "sequence {i} of the batch has a cache of {} layers for a model of {}; make it with `new_cache()`",
                cache.layers.len(),
                self.layers.len()
            )));
        }
        Ok(())
    }
}
