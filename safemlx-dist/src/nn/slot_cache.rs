//! The KV cache of a batch of slots: what a server's continuous batching
//! runs on.
//!
//! [`KvCache`](super::KvCache) keeps one buffer per sequence, so a batch
//! of `B` decoding sequences costs `B` attention calls per layer, each a
//! dozen MLX operations: on a CPU stream those operations' overhead, not
//! the arithmetic, then sets the step's time (measured: a 16-sequence
//! SmolLM2 decode step took 248 ms, a 1-sequence one 65 ms). A
//! [`SlotCache`] keeps every slot's keys and values of a layer in one
//! buffer, `[slots × kv_heads × capacity, head_dim]` on this rank (row
//! `(slot × kv_heads + head) × capacity + position`, so that a slot's
//! heads read as `[kv_heads, positions, head_dim]` without a copy): the
//! batch's new keys are written with one scatter, and its single-token
//! rows attend in one call, whatever `B`; a row block of several tokens (a
//! prompt chunk) attends on its own. Each slot has its own length; [`SlotCache::truncate`] cuts one
//! back (0 starts a new sequence), and positions past a length are never
//! read.

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
    /// Makes room for `end` positions per slot (`[slots × kv, capacity,
    /// hd]`, keys and values each with their own `hd`), growing by whole
    /// [`STEP`]s; returns the capacity.
    fn reserve(
        &mut self,
        slots: usize,
        end: usize,
        [kv, k_hd, v_hd]: [i32; 3],
        dtype: Dtype,
        s: &Stream,
    ) -> Result<usize> {
        if end <= self.capacity {
            return Ok(self.capacity);
        }
        let step = STEP as usize;
        let capacity = end.div_ceil(step) * step;
        let (n, old_cap, cap) = (int(slots)? * kv, int(self.capacity)?, int(capacity)?);
        let grow = |old: Option<Array>, hd: i32| -> Result<Array> {
            let more = safemlx::ops::zeros_dtype(&[n, cap - old_cap, hd], dtype, s)?;
            let whole = match old {
                Some(old) => {
                    let old = old.reshape(&[n, old_cap, hd], s)?;
                    safemlx::ops::concatenate_axis(&[&old, &more], 1, s)?
                }
                None => more,
            };
            Ok(whole.reshape(&[n * cap, hd], s)?)
        };
        let (k, v) = match self.buffers.take() {
            Some((k, v)) => (Some(k), Some(v)),
            None => (None, None),
        };
        self.buffers = Some((grow(k, k_hd)?, grow(v, v_hd)?));
        self.capacity = capacity;
        Ok(capacity)
    }

    /// Writes this layer's new keys and values, `k` `[T, kv, hd]` and `v`
    /// `[T, kv, hd_v]` (the batch's rows in order; latent attention keeps
    /// its latent as the keys and its rotated key as the values), at each
    /// sequence's positions with one scatter each; returns the buffers as
    /// `[slots, kv, capacity, hd]` and `[slots, kv, capacity, hd_v]`.
    ///
    /// # Errors
    /// An MLX error, or positions beyond `i32`.
    pub(crate) fn write(
        &mut self,
        rows: &[SlotRows],
        slots: usize,
        [k, v]: [&Array; 2],
        s: &Stream,
    ) -> Result<(Array, Array)> {
        let (t, kv, hd, v_hd) = (k.shape()[0], k.shape()[1], k.shape()[2], v.shape()[2]);
        let end = rows.iter().map(|r| r.start + r.len).max().unwrap_or(0);
        let cap = self.reserve(slots, end, [kv, hd, v_hd], k.dtype(), s)?;
        let Some((keys, values)) = self.buffers.take() else {
            return Err(Error::Shape("the slot cache has no buffers".to_owned()));
        };
        // Row (slot × kv + head) × capacity + position of each new
        // (token, head), in the order of k's rows.
        let mut at = Vec::with_capacity(rows.iter().map(|r| r.len).sum::<usize>() * kv as usize);
        for r in rows {
            for p in r.start..r.start + r.len {
                for h in 0..kv as usize {
                    at.push(int((r.slot * kv as usize + h) * cap + p)?);
                }
            }
        }
        let at = Array::from_slice(&at, &[t * kv]);
        let scatter = |buffer: &Array, x: &Array, hd: i32| -> Result<Array> {
            Ok(buffer.scatter(&at, x.reshape(&[t * kv, 1, hd], s)?, 0, s)?)
        };
        let (keys, values) = (scatter(&keys, k, hd)?, scatter(&values, v, v_hd)?);
        self.buffers = Some((keys.clone(), values.clone()));
        let shape = |hd: i32| -> Result<[i32; 4]> { Ok([int(slots)?, kv, int(cap)?, hd]) };
        Ok((
            keys.reshape(&shape(hd)?, s)?,
            values.reshape(&shape(v_hd)?, s)?,
        ))
    }
}

/// `v` as an MLX index or shape, or the overflow named.
pub(super) fn int(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::ShapeOverflow { value: v })
}

/// Each row's position in its sequence (`[T]`, one per token of the
/// batch, in the order of [`SlotRows`]).
pub(super) fn positions(rows: &[SlotRows]) -> Result<Array> {
    let at = rows
        .iter()
        .flat_map(|r| r.start..r.start + r.len)
        .map(int)
        .collect::<Result<Vec<i32>>>()?;
    let t = int(at.len())?;
    Ok(Array::from_slice(&at, &[t]))
}

/// The pieces of a step's attention output (`[rows, width]` each, the
/// single-token rows first, then each block), whose rows are the batch's
/// rows `order`, put back in the batch's order: `[T, width]`.
pub(super) fn in_batch_order(pieces: &[Array], order: &[i32], s: &Stream) -> Result<Array> {
    let out = safemlx::ops::concatenate_axis(pieces, 0, s)?;
    if order.iter().enumerate().all(|(i, &r)| i as i32 == r) {
        return Ok(out);
    }
    let mut back = vec![0i32; order.len()];
    for (i, &r) in order.iter().enumerate() {
        back[usize::try_from(r).unwrap_or(0)] = int(i)?;
    }
    let t = int(order.len())?;
    Ok(out.take_axis(Array::from_slice(&back, &[t]), 0, s)?)
}
