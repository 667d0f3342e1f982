//! The KV cache of a batch of slots: what a server's continuous batching
//! runs on.
//!
//! [`KvCache`](super::KvCache) keeps one buffer per sequence, so a batch
//! of `B` decoding sequences costs `B` attention calls per layer, each a
//! dozen MLX operations: on a CPU stream those operations' overhead, not
//! the arithmetic, then sets the step's time (measured: a 16-sequence
//! SmolLM2 decode step took 248 ms, a 1-sequence one 65 ms). A
//! [`SlotCache`] keeps every slot's keys and values of a layer in one
//! buffer, `[slots × capacity, kv_heads × head_dim]` on this rank (row
//! `slot × capacity + position`), so the batch's single-token rows are
//! written with one scatter and attend in one call, whatever `B`; a row
//! block of several tokens (a prompt chunk) is written and attends on its
//! own. Each slot has its own length; [`SlotCache::truncate`] cuts one
//! back (0 starts a new sequence), and positions past a length are never
//! read.

use safemlx::ops::indexing::{TryIndexMutOp, TryIndexOp};
use safemlx::{Array, Dtype, Stream};

use super::kv_cache::STEP;
use crate::error::{Error, Result};

/// Every layer's buffers for `slots` sequences, and each slot's length.
#[derive(Debug)]
pub struct SlotCache {
    layers: Vec<SlotLayer>,
    lens: Vec<usize>,
}

/// One layer's keys and values of every slot, with the capacity (in
/// positions per slot) they were made for.
#[derive(Debug, Default)]
pub struct SlotLayer {
    buffers: Option<(Array, Array)>,
    capacity: usize,
}

/// One sequence of a step: its slot, its first position, its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRows {
    /// The slot.
    pub slot: usize,
    /// The position of its first token (the slot's length before it).
    pub start: usize,
    /// Its tokens this step.
    pub len: usize,
}

impl SlotCache {
    /// Empty slots for a model of `layers` layers.
    pub fn new(layers: usize, slots: usize) -> Self {
        Self {
            layers: (0..layers).map(|_| SlotLayer::default()).collect(),
            lens: vec![0; slots],
        }
    }

    /// The number of slots.
    pub fn slots(&self) -> usize {
        self.lens.len()
    }

    /// Layers the cache was made for.
    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    /// Positions `slot` holds (0 for a slot beyond the cache).
    pub fn len(&self, slot: usize) -> usize {
        self.lens.get(slot).copied().unwrap_or(0)
    }

    /// Keeps only `slot`'s first `len` positions (0: a new sequence).
    pub fn truncate(&mut self, slot: usize, len: usize) {
        if let Some(held) = self.lens.get_mut(slot) {
            *held = (*held).min(len);
        }
    }

    /// Bytes of every layer's buffers on this rank.
    pub fn nbytes(&self) -> usize {
        self.layers
            .iter()
            .filter_map(|l| l.buffers.as_ref())
            .map(|(k, v)| k.nbytes() + v.nbytes())
            .sum()
    }

    /// The batch's rows, checked: slots in range and distinct, tokens in
    /// each, positions within `limit` (the model's window, if any).
    ///
    /// # Errors
    /// The first bad sequence, named by its place in the batch.
    pub fn rows(&self, batch: &[(usize, &[u32])], limit: Option<usize>) -> Result<Vec<SlotRows>> {
        let mut rows: Vec<SlotRows> = Vec::with_capacity(batch.len());
        for (i, &(slot, tokens)) in batch.iter().enumerate() {
            let bad = |what: String| Err(Error::Shape(format!("sequence {i} of the batch {what}")));
            if slot >= self.slots() {
                return bad(format!("names slot {slot} of {}", self.slots()));
            }
            if rows.iter().any(|r| r.slot == slot) {
                return bad(format!("names slot {slot} again"));
            }
            if tokens.is_empty() {
                return bad("has no tokens".to_owned());
            }
            let start = self.lens[slot];
            if let Some(limit) = limit.filter(|&l| start + tokens.len() > l) {
                return bad(format!(
                    "reaches position {}, beyond the model's {limit}",
                    start + tokens.len()
                ));
            }
            rows.push(SlotRows {
                slot,
                start,
                len: tokens.len(),
            });
        }
        Ok(rows)
    }

    /// Layer `i`'s buffers.
    pub(crate) fn layer_mut(&mut self, i: usize) -> &mut SlotLayer {
        &mut self.layers[i]
    }

    /// Counts the rows fed, once every layer has them.
    pub fn advance(&mut self, rows: &[SlotRows]) {
        for r in rows {
            self.lens[r.slot] = r.start + r.len;
        }
    }
}

impl SlotLayer {
    /// Makes room for `end` positions per slot (`width` = kv heads × head
    /// dim values each), growing by whole [`STEP`]s; returns the capacity.
    fn reserve(
        &mut self,
        slots: usize,
        end: usize,
        width: i32,
        dtype: Dtype,
        s: &Stream,
    ) -> Result<usize> {
        if end <= self.capacity {
            return Ok(self.capacity);
        }
        let step = STEP as usize;
        let capacity = end.div_ceil(step) * step;
        let int = |v: usize| i32::try_from(v).map_err(|_| Error::ShapeOverflow { value: v });
        let (n, old_cap, cap) = (int(slots)?, int(self.capacity)?, int(capacity)?);
        let grow = |old: Option<Array>| -> Result<Array> {
            let more = safemlx::ops::zeros_dtype(&[n, cap - old_cap, width], dtype, s)?;
            let whole = match old {
                Some(old) => {
                    let old = old.reshape(&[n, old_cap, width], s)?;
                    safemlx::ops::concatenate_axis(&[&old, &more], 1, s)?
                }
                None => more,
            };
            Ok(whole.reshape(&[n * cap, width], s)?)
        };
        let (k, v) = match self.buffers.take() {
            Some((k, v)) => (Some(k), Some(v)),
            None => (None, None),
        };
        self.buffers = Some((grow(k)?, grow(v)?));
        self.capacity = capacity;
        Ok(capacity)
    }

    /// Writes this layer's new keys and values, `k` and `v` `[T, width]`
    /// (the batch's rows in order), at each sequence's positions; returns
    /// the buffers `[slots × capacity, width]` and the capacity.
    ///
    /// # Errors
    /// An MLX error, or positions beyond `i32`.
    pub(crate) fn write(
        &mut self,
        rows: &[SlotRows],
        slots: usize,
        [k, v]: [&Array; 2],
        s: &Stream,
    ) -> Result<(Array, Array, usize)> {
        let width = k.shape()[1];
        let end = rows.iter().map(|r| r.start + r.len).max().unwrap_or(0);
        let cap = self.reserve(slots, end, width, k.dtype(), s)?;
        let int = |v: usize| i32::try_from(v).map_err(|_| Error::ShapeOverflow { value: v });
        let Some((mut keys, mut values)) = self.buffers.take() else {
            return Err(Error::Shape("the slot cache has no buffers".to_owned()));
        };
        // Single-token rows: one scatter; blocks: a slice update each.
        let (mut singles, mut at) = (Vec::new(), 0);
        for r in rows {
            let first = int(r.slot * cap + r.start)?;
            if r.len == 1 {
                singles.push((int(at)?, first));
            } else {
                let (from, to) = (int(at)?, int(at + r.len)?);
                let place = first..first + int(r.len)?;
                keys.try_index_mut_device(
                    (place.clone(), ..),
                    k.try_index_device(from..to, s)?,
                    s,
                )?;
                values.try_index_mut_device((place, ..), v.try_index_device(from..to, s)?, s)?;
            }
            at += r.len;
        }
        if !singles.is_empty() {
            let b = int(singles.len())?;
            let (src, dst): (Vec<i32>, Vec<i32>) = singles.into_iter().unzip();
            let (src, dst) = (Array::from_slice(&src, &[b]), Array::from_slice(&dst, &[b]));
            let scatter = |buffer: &Array, x: &Array| -> Result<Array> {
                let updates = x.take_axis(&src, 0, s)?.reshape(&[b, 1, width], s)?;
                Ok(buffer.scatter(&dst, &updates, 0, s)?)
            };
            keys = scatter(&keys, k)?;
            values = scatter(&values, v)?;
        }
        self.buffers = Some((keys.clone(), values.clone()));
        Ok((keys, values, cap))
    }
}
