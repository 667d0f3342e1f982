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
use super::slot_cache::{SlotLayer, SlotRows};
use crate::error::{Error, Result};
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
        self.around_heads(x, total, s, |qkv, norms| {
            self.attend_slots(qkv, &norms, layer, rows, slots, s)
        })
    }

    fn attend_slots(
        &self,
        [q, k, v]: [Array; 3],
        norms: &[Array],
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
        let int = |v: usize| i32::try_from(v).map_err(|_| Error::ShapeOverflow { value: v });
        // Every row as its own batch entry, [T, heads, 1, hd], rotated at
        // its own position.
        let positions = rows
            .iter()
            .flat_map(|r| r.start..r.start + r.len)
            .map(int)
            .collect::<Result<Vec<i32>>>()?;
        let positions = Array::from_slice(&positions, &[t]);
        let (mut q, mut k) = (
            q.reshape(&[t, heads, 1, hd], s)?,
            k.reshape(&[t, kv, 1, hd], s)?,
        );
        if let [q_norm, k_norm] = norms {
            q = safemlx::fast::rms_norm(&q, q_norm, config.norm_eps, s)?;
            k = safemlx::fast::rms_norm(&k, k_norm, config.norm_eps, s)?;
        }
        let q = rotate(&config.rope, &q, &positions, s)?;
        let k = rotate(&config.rope, &k, &positions, s)?.reshape(&[t, kv * hd], s)?;
        let (keys, values, cap) = layer.write(rows, slots, [&k, &v], s)?;
        let scale = 1.0 / (config.head_dim as f32).sqrt();
        let (n, cap) = (int(slots)?, int(cap)?);
        // The pieces of the output and the rows each covers.
        let (mut pieces, mut order) = (Vec::new(), Vec::new());
        let (mut singles, mut at) = (Vec::new(), 0);
        for r in rows {
            if r.len == 1 {
                singles.push((int(at)?, int(r.slot)?, int(r.start + 1)?));
            } else {
                let (from, len, end) = (int(at)?, int(r.len)?, int(r.start + r.len)?);
                let first = int(r.slot)? * cap;
                // [len, heads, 1, hd] -> [1, heads, len, hd]
                let q = q
                    .try_index_device(from..from + len, s)?
                    .reshape(&[1, len, heads, hd], s)?
                    .transpose_axes(&[0, 2, 1, 3], s)?;
                let seen = |b: &Array| -> Result<Array> {
                    Ok(b.try_index_device(first..first + end, s)?
                        .reshape(&[1, end, kv, hd], s)?
                        .transpose_axes(&[0, 2, 1, 3], s)?)
                };
                let mask = Some(ScaledDotProductAttentionMask::Causal);
                let out = safemlx::fast::scaled_dot_product_attention(
                    &q,
                    &seen(&keys)?,
                    &seen(&values)?,
                    scale,
                    mask,
                    None,
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
            let b = int(singles.len())?;
            let longest = singles.iter().map(|&(_, _, end)| end).max().unwrap_or(1);
            let pick = |i: usize| singles.iter().map(move |row| [row.0, row.1, row.2][i]);
            let at: Vec<i32> = pick(0).collect();
            let (in_batch, slot, end) = (
                Array::from_slice(&at, &[b]),
                Array::from_slice(&pick(1).collect::<Vec<_>>(), &[b]),
                Array::from_slice(&pick(2).collect::<Vec<_>>(), &[b, 1]),
            );
            // Each row's slot, positions 0..longest: [B, kv, longest, hd].
            let seen = |buffer: &Array| -> Result<Array> {
                Ok(buffer
                    .reshape(&[n, cap, kv * hd], s)?
                    .try_index_device((.., 0..longest), s)?
                    .take_axis(&slot, 0, s)?
                    .reshape(&[b, longest, kv, hd], s)?
                    .transpose_axes(&[0, 2, 1, 3], s)?)
            };
            // A row sees its slot's positions before its end.
            let mask = safemlx::ops::arange::<_, i32>(0, longest, 1, s)?
                .reshape(&[1, longest], s)?
                .lt(&end, s)?
                .reshape(&[b, 1, 1, longest], s)?;
            let q = q
                .take_axis(&in_batch, 0, s)?
                .reshape(&[b, heads, 1, hd], s)?;
            let out = safemlx::fast::scaled_dot_product_attention(
                &q,
                &seen(&keys)?,
                &seen(&values)?,
                scale,
                Some(ScaledDotProductAttentionMask::Array(&mask)),
                None,
                s,
            )?;
            pieces.insert(0, out.reshape(&[b, heads * hd], s)?);
            order.splice(0..0, at);
        }
        let out = safemlx::ops::concatenate_axis(&pieces, 0, s)?;
        if order.iter().enumerate().all(|(i, &r)| i as i32 == r) {
            return Ok(out);
        }
        // Back to the batch's order.
        let mut back = vec![0i32; order.len()];
        for (i, &r) in order.iter().enumerate() {
            back[r as usize] = int(i)?;
        }
        Ok(out.take_axis(Array::from_slice(&back, &[t]), 0, s)?)
    }
}

/// `x` `[T, heads, 1, hd]` with row `i` rotated at `positions[i]`.
fn rotate(rope: &Rope, x: &Array, positions: &Array, s: &Stream) -> Result<Array> {
    Ok(safemlx::fast::rope_dynamic(
        x,
        rope.dims,
        rope.traditional,
        rope.base,
        rope.scale,
        positions,
        rope.freqs.as_ref(),
        s,
    )?)
}
