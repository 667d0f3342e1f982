//! Grouped-query attention over a [`SlotCache`]: a server's batch, where
//! every sequence sits in a slot at its own position.
//!
//! All the batch's rows are normed and rotated at once (one `rope` call
//! with a position per row); the single-token rows (the decoding
//! sequences) are written with one scatter and attend in one call, each
//! over its own slot's positions through a mask; a row block of several
//! tokens (a prompt chunk) is written and attends on its own, causally.

use safemlx::fast::ScaledDotProductAttentionMask;
use safemlx::ops::indexing::TryIndexOp;
use safemlx::{Array, Stream};

use super::gqa::{GqaAttention, Rope};
use super::grouped_sdpa;
use super::slot_cache::{in_batch_order, int, positions, SlotLayer, SlotRows};
use super::window_cache::window_mask;
use crate::error::Result;
use crate::typed::{Replicated, ShardedArray};

impl GqaAttention {
    /// Causal self-attention of the replicated tokens `x` `[T, D]`, the
    /// rows of `rows` in order, each sequence at its positions
    /// `start..start + len` of its slot in `layer` (of `slots` slots),
    /// where its keys and values are written. The same numbers as
    /// [`forward`](Self::forward) with one cache per sequence. Cost: one
    /// `all_sum` of `[T, D]`.
    ///
    /// # Errors
    /// `x` is not `[T, D]`, or an MLX error.
    pub fn forward_slots(
        &self,
        x: &ShardedArray<Replicated>,
        layer: &mut SlotLayer,
        rows: &[SlotRows],
        slots: usize,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        let total: usize = rows.iter().map(|r| r.len).sum();
        self.around_heads(x, total, s, |qkv, sinks, norms| {
            self.attend_slots(qkv, (sinks.as_ref(), &norms), layer, rows, slots, s)
        })
    }

    fn attend_slots(
        &self,
        [q, k, v]: [Array; 3],
        (sinks, norms): (Option<&Array>, &[Array]),
        layer: &mut SlotLayer,
        rows: &[SlotRows],
        slots: usize,
        s: &Stream,
    ) -> Result<Array> {
        let config = self.config();
        let t = q.shape()[0];
        let hd = config.head_dim as i32;
        let split = self.split();
        let (heads, kv) = (split.query.1 as i32, split.kv.1 as i32);
        if heads == 0 {
            // No query reads this rank's keys: it keeps none (the slot
            // cache counts the positions).
            return Ok(safemlx::ops::zeros_dtype(&[t, 0], q.dtype(), s)?);
        }
        // Every row as its own batch entry, [T, heads, 1, hd], rotated at
        // its own position.
        let positions = positions(rows)?;
        let (mut q, mut k) = (
            q.reshape(&[t, heads, 1, hd], s)?,
            k.reshape(&[t, kv, 1, hd], s)?,
        );
        if let [q_norm, k_norm] = norms {
            q = safemlx::fast::rms_norm(&q, q_norm, config.norm_eps, s)?;
            k = safemlx::fast::rms_norm(&k, k_norm, config.norm_eps, s)?;
        }
        let q = config.rope.apply_at(&q, &positions, s)?;
        let k = config
            .rope
            .apply_at(&k, &positions, s)?
            .reshape(&[t, kv, hd], s)?;
        let v = v.reshape(&[t, kv, hd], s)?;
        // [slots, kv, capacity, hd]
        let (keys, values) = layer.write(rows, slots, [&k, &v], s)?;
        let scale = 1.0 / (config.head_dim as f32).sqrt();
        let sinks = sinks.map(|a| a.reshape(&[heads], s)).transpose()?;
        // The pieces of the output and the rows each covers.
        let (mut pieces, mut order) = (Vec::new(), Vec::new());
        let (mut singles, mut at) = (Vec::new(), 0);
        for r in rows {
            if r.len == 1 {
                singles.push((int(at)?, int(r.slot)?, int(r.start + 1)?));
            } else {
                let (from, len, end) = (int(at)?, int(r.len)?, int(r.start + r.len)?);
                let slot = int(r.slot)?;
                // [len, heads, 1, hd] -> [1, heads, len, hd]
                let q = q
                    .try_index_device(from..from + len, s)?
                    .reshape(&[1, len, heads, hd], s)?
                    .transpose_axes(&[0, 2, 1, 3], s)?;
                let seen = |b: &Array| b.try_index_device((slot..slot + 1, .., 0..end), s);
                let seen_keys = seen(&keys)?;
                // A sliding layer's window, when a query's reaches past it.
                let window = match config.window {
                    Some(w) if r.start + r.len > w => {
                        Some(window_mask((r.start, len), (0, &seen_keys), w)?)
                    }
                    _ => None,
                };
                let mask = match &window {
                    Some(allowed) => ScaledDotProductAttentionMask::Array(allowed),
                    None => ScaledDotProductAttentionMask::Causal,
                };
                let out = grouped_sdpa::attention(
                    self.runs(),
                    [&q, &seen_keys, &seen(&values)?],
                    scale,
                    Some(&mask),
                    sinks.as_ref(),
                    s,
                )?;
                pieces.push(
                    out.transpose_axes(&[0, 2, 1, 3], s)?
                        .reshape(&[len, heads * hd], s)?,
                );
                order.extend(from..from + len);
            }
            at += r.len;
        }
        if !singles.is_empty() {
            let buffers = [&keys, &values];
            let out = self.attend_singles(&singles, (&q, sinks.as_ref()), buffers, slots, s)?;
            pieces.insert(0, out);
            order.splice(0..0, singles.iter().map(|row| row.0));
        }
        in_batch_order(&pieces, &order, s)
    }

    /// The single-token rows' attention, `[B, heads × hd]`: `singles` holds
    /// each row's place in the batch, slot and end (its position + 1); `q`
    /// is every row's rotated query `[T, heads, 1, hd]`; `buffers` the
    /// layer's keys and values `[slots, kv, capacity, hd]`. With half the
    /// slots or more in the batch, every slot attends where its keys lie
    /// (a slot outside the batch on a zero query over its first position,
    /// thrown away); with fewer, the batch's slots are gathered first
    /// (whole, which copies blocks; a gather from a strided view goes
    /// element by element). Each row sees its slot's positions before its
    /// end; `sinks` `[heads]` join each softmax.
    fn attend_singles(
        &self,
        singles: &[(i32, i32, i32)],
        (q, sinks): (&Array, Option<&Array>),
        [keys, values]: [&Array; 2],
        slots: usize,
        s: &Stream,
    ) -> Result<Array> {
        let split = self.split();
        let (heads, hd) = (split.query.1 as i32, self.config().head_dim as i32);
        let scale = 1.0 / (self.config().head_dim as f32).sqrt();
        let (b, n) = (int(singles.len())?, int(slots)?);
        let longest = singles.iter().map(|&(_, _, end)| end).max().unwrap_or(1);
        let at: Vec<i32> = singles.iter().map(|row| row.0).collect();
        let slot = Array::from_slice(&singles.iter().map(|row| row.1).collect::<Vec<_>>(), &[b]);
        let q = q.take_axis(Array::from_slice(&at, &[b]), 0, s)?;
        let every = 2 * singles.len() >= slots;
        let (q, end, rows) = if every {
            let (mut row_of, mut end) = (vec![b; slots], vec![1; slots]);
            for (i, &(_, k, until)) in singles.iter().enumerate() {
                row_of[k as usize] = int(i)?;
                end[k as usize] = until;
            }
            let zero = safemlx::ops::zeros_dtype(&[1, heads, 1, hd], q.dtype(), s)?;
            let q = safemlx::ops::concatenate_axis(&[&q, &zero], 0, s)?.take_axis(
                Array::from_slice(&row_of, &[n]),
                0,
                s,
            )?;
            (q, end, n)
        } else {
            (q, singles.iter().map(|row| row.2).collect(), b)
        };
        let seen = |buffer: &Array| -> Result<Array> {
            let buffer = if every {
                buffer.clone()
            } else {
                buffer.take_axis(&slot, 0, s)?
            };
            Ok(buffer.try_index_device((.., .., 0..longest), s)?)
        };
        let positions =
            safemlx::ops::arange::<_, i32>(0, longest, 1, s)?.reshape(&[1, longest], s)?;
        let mut mask = positions.lt(Array::from_slice(&end, &[rows, 1]), s)?;
        if let Some(w) = self.config().window {
            // A sliding layer: each row sees its last `w` positions.
            let w = int(w)?;
            let first: Vec<i32> = end.iter().map(|&e| (e - w).max(0)).collect();
            let inside = positions.ge(Array::from_slice(&first, &[rows, 1]), s)?;
            mask = mask.logical_and(&inside, s)?;
        }
        let mask = mask.reshape(&[rows, 1, 1, longest], s)?;
        let out = grouped_sdpa::attention(
            self.runs(),
            [&q, &seen(keys)?, &seen(values)?],
            scale,
            Some(&ScaledDotProductAttentionMask::Array(&mask)),
            sinks,
            s,
        )?;
        let out = if every {
            out.take_axis(&slot, 0, s)?
        } else {
            out
        };
        Ok(out.reshape(&[b, heads * hd], s)?)
    }
}

impl Rope {
    /// `x` `[T, heads, 1, hd]` with row `i` rotated at `positions[i]`.
    pub(super) fn apply_at(&self, x: &Array, positions: &Array, s: &Stream) -> Result<Array> {
        let x = self.prescale(x, s)?;
        Ok(safemlx::fast::rope_dynamic(
            &x,
            self.dims,
            self.traditional,
            self.base,
            self.scale,
            positions,
            self.freqs.as_ref(),
            s,
        )?)
    }
}
