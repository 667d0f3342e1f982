//! Latent attention over a [`SlotCache`](super::SlotCache): DeepSeek-V3 in
//! a server's batch, every sequence in a slot at its own position.
//!
//! A slot keeps what the per-sequence cache keeps: each position's normed
//! latent (`r` values, the slot layer's keys, one "head") and its rotated
//! RoPE key (`rope` values, its values), the same on every rank. All the
//! batch's rows are projected, normed and rotated at once (one `rope` call
//! with a position per row) and written with one scatter; the single-token
//! rows (the decoding sequences) attend in one absorbed call, each over
//! its own slot's positions through a mask; a row block of several tokens
//! (a prompt chunk) expands its slot's latents and attends on its own,
//! causally, as a prompt does on its own cache.

use safemlx::ops::indexing::TryIndexOp;
use safemlx::{Array, Stream};

use super::mla::{causal, MlaAttention};
use super::slot_cache::{in_batch_order, int, positions, SlotLayer, SlotRows};
use crate::error::Result;
use crate::runtime::slice_axis;
use crate::typed::{Replicated, ShardedArray};

impl MlaAttention {
    /// Causal self-attention of the replicated tokens `x` `[T, D]`, the
    /// rows of `rows` in order, each sequence at its positions `start..start
    /// + len` of its slot in `layer` (of `slots` slots), where its latents
    /// are written. The same numbers as [`forward`](Self::forward) with one
    /// cache per sequence. Cost: one `all_sum` of `[T, D]`.
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
        self.around_heads(x, total, s, |q, kv, norm, kv_b| {
            self.attend_slots(q, self.latent(kv, norm, s)?, kv_b, (layer, rows, slots), s)
        })
    }

    /// The heads' output `[T, heads v]` of the batch's queries `q` `[T,
    /// heads (nope + rope)]`, its latents and RoPE keys `[1, 1, T, r]` and
    /// `[1, 1, T, rope]`, written to the slots first.
    fn attend_slots(
        &self,
        q: &Array,
        [latent, k_rope]: [Array; 2],
        kv_b: &Array,
        (layer, rows, slots): (&mut SlotLayer, &[SlotRows], usize),
        s: &Stream,
    ) -> Result<Array> {
        let c = self.config();
        let t = q.shape()[0];
        let heads = self.split().query.1 as i32;
        if heads == 0 {
            // No query reads this rank's latents: it keeps none (the slot
            // cache counts the positions).
            return Ok(safemlx::ops::zeros_dtype(&[t, 0], q.dtype(), s)?);
        }
        let (nope, rope, r) = (c.nope_dim, c.rope_dim, c.kv_lora_rank as i32);
        let positions = positions(rows)?;
        // Every row as its own group, [T, heads, 1, nope + rope].
        let q = q.reshape(&[t, heads, 1, (nope + rope) as i32], s)?;
        let q_nope = slice_axis(&q, 3, 0, nope, s)?;
        let q_rope = c
            .rope
            .apply_at(&slice_axis(&q, 3, nope, rope, s)?, &positions, s)?;
        let k_rope = k_rope.reshape(&[t, 1, 1, rope as i32], s)?;
        let k_rope = c.rope.apply_at(&k_rope, &positions, s)?;
        // [slots, 1, capacity, r] and [slots, 1, capacity, rope]
        let (latents, k_ropes) = layer.write(
            rows,
            slots,
            [
                &latent.reshape(&[t, 1, r], s)?,
                &k_rope.reshape(&[t, 1, rope as i32], s)?,
            ],
            s,
        )?;
        let width = heads * c.v_dim as i32;
        let (mut pieces, mut order) = (Vec::new(), Vec::new());
        let (mut singles, mut at) = (Vec::new(), 0);
        for row in rows {
            if row.len == 1 {
                singles.push((int(at)?, int(row.slot)?, int(row.start + 1)?));
            } else {
                let (from, len, end) = (int(at)?, int(row.len)?, int(row.start + row.len)?);
                let slot = int(row.slot)?;
                // [len, heads, 1, d] -> [1, heads, len, d]
                let block = |x: &Array| -> Result<Array> {
                    Ok(x.try_index_device(from..from + len, s)?
                        .swap_axes(0, 2, s)?)
                };
                let seen = |b: &Array| b.try_index_device((slot..slot + 1, .., 0..end), s);
                let allowed = causal(row.len, row.start + row.len, row.start)?;
                let out = self.attend_latents(
                    [&block(&q_nope)?, &block(&q_rope)?],
                    [&seen(&latents)?, &seen(&k_ropes)?],
                    Some(allowed),
                    kv_b,
                    s,
                )?;
                // [1, heads, len, v] -> [len, heads v]
                pieces.push(out.swap_axes(1, 2, s)?.reshape(&[len, width], s)?);
                order.extend(from..from + len);
            }
            at += row.len;
        }
        if !singles.is_empty() {
            let out =
                self.attend_singles(&singles, [&q_nope, &q_rope], [&latents, &k_ropes], kv_b, s)?;
            pieces.insert(0, out.reshape(&[int(singles.len())?, width], s)?);
            order.splice(0..0, singles.iter().map(|row| row.0));
        }
        in_batch_order(&pieces, &order, s)
    }

    /// The single-token rows' heads, `[B, heads, 1, v]`: `singles` holds
    /// each row's place in the batch, slot and end (its position + 1); the
    /// queries are every row's `[T, heads, 1, d]`; the slots' latents and
    /// RoPE keys are gathered for the batch's slots up to the longest end,
    /// and each row sees its slot's positions before its end.
    fn attend_singles(
        &self,
        singles: &[(i32, i32, i32)],
        [q_nope, q_rope]: [&Array; 2],
        [latents, k_ropes]: [&Array; 2],
        kv_b: &Array,
        s: &Stream,
    ) -> Result<Array> {
        let b = int(singles.len())?;
        let longest = singles.iter().map(|&(_, _, end)| end).max().unwrap_or(1);
        let column = |pick: fn(&(i32, i32, i32)) -> i32| {
            Array::from_slice(&singles.iter().map(pick).collect::<Vec<_>>(), &[b])
        };
        let (at, slot, end) = (column(|r| r.0), column(|r| r.1), column(|r| r.2));
        let seen = |buffer: &Array| -> Result<Array> {
            Ok(buffer
                .take_axis(&slot, 0, s)?
                .try_index_device((.., .., 0..longest), s)?)
        };
        let positions =
            safemlx::ops::arange::<_, i32>(0, longest, 1, s)?.reshape(&[1, longest], s)?;
        let allowed = positions
            .lt(end.reshape(&[b, 1], s)?, s)?
            .reshape(&[b, 1, 1, longest], s)?;
        self.attend_latents(
            [&q_nope.take_axis(&at, 0, s)?, &q_rope.take_axis(&at, 0, s)?],
            [&seen(latents)?, &seen(k_ropes)?],
            Some(allowed),
            kv_b,
            s,
        )
    }
}
