//! A sliding-window layer's cache: only the last `window` positions'
//! keys and values are kept (Mistral, gpt-oss's and Gemma's sliding
//! layers), so a sequence of any length holds at most about twice the
//! window per layer.
//!
//! The positions held are one buffer, written in place like
//! [`LayerCache`](super::LayerCache)'s; when the buffer would hold more than
//! twice the window, the last `window - 1` positions move to its front
//! (one copy every `window` or so positions, not one per step). Attention
//! reads what is held, from [`LayerKv::first_held`] on, and masks the
//! positions outside each query's window.

use safemlx::ops::indexing::TryIndexOp;
use safemlx::{Array, Stream};

use super::kv_cache::{write_at, LayerKv};
use crate::error::{Error, Result};

/// One sliding-window layer's keys and values on this rank.
#[derive(Debug)]
pub struct WindowCache {
    window: usize,
    keys: Option<Array>,
    values: Option<Array>,
    /// The position of the buffers' first entry.
    first: usize,
    /// Positions seen (the next one's index).
    len: usize,
}

impl WindowCache {
    /// An empty cache keeping the last `window` positions (at least 1).
    pub fn new(window: usize) -> Self {
        Self {
            window: window.max(1),
            keys: None,
            values: None,
            first: 0,
            len: 0,
        }
    }

    /// Before `t` more positions: the first position to keep when the
    /// buffers would otherwise pass twice the window (all but the last
    /// `window - 1`, which the next queries can still see). The same on
    /// every rank, whether it holds keys or only counts positions.
    fn next_first(&self, t: usize) -> Option<usize> {
        (self.len - self.first + t > 2 * self.window)
            .then(|| self.len.saturating_sub(self.window - 1).max(self.first))
    }

    /// Moves the positions from `from` on to the buffers' front.
    fn compact(&mut self, from: usize, s: &Stream) -> Result<()> {
        let (start, end) = (to_i32(from - self.first)?, to_i32(self.len - self.first)?);
        for buffer in [&mut self.keys, &mut self.values] {
            if let Some(b) = buffer.take() {
                *buffer = Some(b.try_index_device((.., .., start..end, ..), s)?);
            }
        }
        self.first = from;
        Ok(())
    }
}

impl LayerKv for WindowCache {
    fn len(&self) -> usize {
        self.len
    }

    fn nbytes(&self) -> usize {
        [&self.keys, &self.values]
            .iter()
            .filter_map(|a| a.as_ref())
            .map(Array::nbytes)
            .sum()
    }

    fn skip(&mut self, t: usize) {
        if let Some(first) = self.next_first(t) {
            self.first = first;
        }
        self.len += t;
    }

    /// # Errors
    /// See [`can_truncate`](LayerKv::can_truncate).
    fn truncate(&mut self, len: usize) -> Result<()> {
        self.can_truncate(len)?;
        self.len = self.len.min(len);
        Ok(())
    }

    /// # Errors
    /// A `len` whose window starts before the first position still held:
    /// those keys are gone.
    fn can_truncate(&self, len: usize) -> Result<()> {
        if len < self.len && len.saturating_sub(self.window - 1) < self.first {
            return Err(Error::Shape(format!(
                "a sliding-window cache holding positions {}..{} cannot be cut back to {len}: the positions before {} are no longer held",
                self.first, self.len, self.first
            )));
        }
        Ok(())
    }

    fn first_held(&self) -> usize {
        self.first
    }

    /// The held positions and the new ones, from
    /// [`first_held`](LayerKv::first_held) on.
    fn append(&mut self, k: &Array, v: &Array, s: &Stream) -> Result<(Array, Array)> {
        let t = usize::try_from(k.shape().get(2).copied().unwrap_or(0)).unwrap_or(0);
        if let Some(first) = self.next_first(t) {
            self.compact(first, s)?;
        }
        let start = self.len - self.first;
        let (keys, values) = write_at(
            [&mut self.keys, &mut self.values],
            [k, v],
            to_i32(start)?,
            s,
        )?;
        self.len += t;
        Ok((keys, values))
    }
}

/// Which keys each query sees under a sliding window of `w`: `[T, S]`,
/// true where key position `p` (the keys `[1, _, S, _]` start at position
/// `first`) is at most the query's position `q` (`offset..offset + T`)
/// and `q - p < w`.
///
/// # Errors
/// Positions beyond `i32`.
pub(super) fn window_mask(
    (offset, t): (usize, i32),
    (first, keys): (usize, &Array),
    w: usize,
) -> Result<Array> {
    let held = usize::try_from(keys.shape()[2]).unwrap_or(0);
    let rows = usize::try_from(t).unwrap_or(0);
    let allowed: Vec<bool> = (0..rows)
        .flat_map(|i| {
            let q = offset + i;
            (0..held).map(move |j| first + j <= q && q - (first + j).min(q) < w)
        })
        .collect();
    Ok(Array::from_slice(&allowed, &[t, to_i32(held)?]))
}

fn to_i32(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::ShapeOverflow { value: v })
}
