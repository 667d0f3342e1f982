//! One query head two neighbouring ranks share by query rows, so that a
//! head count that does not divide by the ranks still splits the
//! attention's work evenly (SmolLM2's 9 heads over 2 ranks: 4 whole heads
//! each, and head 4 split by rows between them).
//!
//! Both ranks hold the head's q rows and output-projection columns
//! (declared copies, whose gradients are summed over the two) and the KV
//! head it reads (they hold it already: sharing is only offered when they
//! do). Over `t` new queries the first rank (the head's owner) attends
//! rows `0..a` and the second rows `a..t`, each leaving zeros in the
//! other's rows, so the output projection's `Partial` sums of the two add
//! up to the head's whole output in the layer's one `all_sum`. The split
//! point evens the two parts' rows times keys (a causal query row reads
//! the keys up to its own): `a` solves `a (o + a) = (t - a)(o + t)` for
//! `o` positions held before (`a = 316` of `t = 512` from empty). One row
//! (a decode step) is the owner's.

use safemlx::fast::ScaledDotProductAttentionMask;
use safemlx::{Array, Stream};

use crate::error::Result;
use crate::runtime::slice_axis;

/// The query head a rank shares with a neighbour by rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedHead {
    /// The head among the model's query heads.
    pub head: usize,
    /// The head among this rank's query heads: the owner's last, the
    /// sharer's first.
    pub local: usize,
    /// Its KV head among this rank's KV heads.
    pub kv: usize,
    /// The rank that holds it besides this one.
    pub with: usize,
    /// Whether this rank owns it: it attends the first rows (and a
    /// decode step's one); the other rank the rest.
    pub owner: bool,
}

impl SharedHead {
    /// The rows `(from, to)` of `t` new queries, after `offset` positions
    /// held, this rank attends for the head (see the module).
    pub fn rows(&self, offset: usize, t: usize) -> (usize, usize) {
        let a = split_point(offset, t);
        if self.owner {
            (0, a)
        } else {
            (a, t)
        }
    }

    /// [`rows`](Self::rows) of a layer's `t` new queries over its `keys`
    /// `[B, kv, L, hd]` (the last `t` positions the new ones).
    pub(super) fn rows_of(&self, t: usize, keys: &Array) -> (usize, usize) {
        let held = len(keys.shape()[2]);
        self.rows(held.saturating_sub(t), t)
    }

    /// The head's attention output `[B, 1, T, hd]`: `q` `[B, 1, T, hd]`,
    /// its keys and values `[B, 1, L, hd]` (the last `T` positions the
    /// new ones), `mask` as the layer's other heads get it (causal, or an
    /// array whose second-last axis is the `T` queries or 1), `sink`
    /// `[1]`; this rank's rows `(from, to)` (see
    /// [`rows_of`](Self::rows_of)) computed, the other rank's zeros.
    pub(super) fn attend(
        &self,
        [q, keys, values]: [&Array; 3],
        (from, to): (usize, usize),
        scale: f32,
        mask: Option<&ScaledDotProductAttentionMask<'_>>,
        sink: Option<&Array>,
        s: &Stream,
    ) -> Result<Array> {
        let shape = q.shape();
        let (t, held) = (len(shape[2]), len(keys.shape()[2]));
        let zeros = |rows: usize| -> Result<Array> {
            let rows = i32::try_from(rows).unwrap_or(0);
            Ok(safemlx::ops::zeros_dtype(
                &[shape[0], shape[1], rows, shape[3]],
                q.dtype(),
                s,
            )?)
        };
        if from == to {
            return zeros(t);
        }
        let q_rows = slice_axis(q, 2, from, to - from, s)?;
        let out = match mask {
            // Causal: the keys up to the last row's position, which MLX
            // aligns with the last query.
            Some(ScaledDotProductAttentionMask::Causal) => {
                let seen = held - (t - to);
                let [k, v] = [keys, values].map(|a| slice_axis(a, 2, 0, seen, s));
                let causal = Some(ScaledDotProductAttentionMask::Causal);
                safemlx::fast::scaled_dot_product_attention(
                    &q_rows, &k?, &v?, scale, causal, sink, s,
                )?
            }
            Some(ScaledDotProductAttentionMask::Array(m)) => {
                let axis = m.shape().len().saturating_sub(2);
                let rows_of = m.shape().get(axis).copied().map(len);
                let m = match rows_of {
                    Some(r) if r == t && t > 1 => slice_axis(m, axis, from, to - from, s)?,
                    _ => (*m).clone(),
                };
                let mask = Some(ScaledDotProductAttentionMask::Array(&m));
                safemlx::fast::scaled_dot_product_attention(
                    &q_rows, keys, values, scale, mask, sink, s,
                )?
            }
            None => safemlx::fast::scaled_dot_product_attention(
                &q_rows, keys, values, scale, None, sink, s,
            )?,
        };
        let mut parts = Vec::with_capacity(3);
        if from > 0 {
            parts.push(zeros(from)?);
        }
        parts.push(out);
        if to < t {
            parts.push(zeros(t - to)?);
        }
        Ok(match parts.len() {
            1 => parts.remove(0),
            _ => safemlx::ops::concatenate_axis(&parts, 2, s)?,
        })
    }
}

fn len(d: i32) -> usize {
    usize::try_from(d).unwrap_or(0)
}

/// The owner's rows of `t` new queries after `offset` held positions:
/// where the owner's rows times its keys (`a (offset + a)`) equal the
/// sharer's (`(t - a)(offset + t)`), rounded; all of one row.
fn split_point(offset: usize, t: usize) -> usize {
    if t <= 1 {
        return t;
    }
    let (o, tf) = (offset as f64, t as f64);
    let b = 2.0 * o + tf;
    let a = (-b + (b * b + 4.0 * tf * (o + tf)).sqrt()) / 2.0;
    (a.round() as usize).clamp(1, t - 1)
}

#[cfg(test)]
mod tests {
    use super::{split_point, SharedHead};

    #[test]
    fn the_rows_even_out_the_two_parts_keys() {
        // From empty, 512 rows: 316 x 316 keys against 196 x 512.
        assert_eq!(split_point(0, 512), 316);
        // Behind 512 held positions the rows read nearly as many keys
        // each: close to half.
        assert_eq!(split_point(512, 64), 33);
        // A decode step is the owner's; two rows are one each.
        assert_eq!(split_point(100, 1), 1);
        assert_eq!(split_point(0, 2), 1);
        let head = |owner| SharedHead {
            head: 4,
            local: 0,
            kv: 0,
            with: 0,
            owner,
        };
        assert_eq!(head(true).rows(0, 512), (0, 316));
        assert_eq!(head(false).rows(0, 512), (316, 512));
        assert_eq!(head(false).rows(7, 1), (1, 1));
    }
}
