//! The KV cache: each rank keeps the keys and values of its own KV heads.
//!
//! [`LayerKv`] is one layer's cache of one sequence, as attention uses it:
//! positions held, append, and what it holds. [`LayerCache`], the per-head
//! cache below, keeps every position; a sliding-window layer's
//! [`WindowCache`](super::WindowCache) keeps only its window (a pipeline
//! stage's cache, only its layers, would be another). Latent attention
//! (DeepSeek) keeps its latent and RoPE key in a [`LayerCache`] as one
//! "head" of keys and values of different widths. A sequence's cache,
//! [`KvCache`], is one per layer; a batch is one per sequence.
//!
//! Each [`LayerCache`] is a buffer `[1, kv_heads, capacity, head_dim]` that
//! grows by [`STEP`] positions at a time; new positions are written into it
//! with a slice update (MLX updates in place when nothing else holds the
//! buffer), so a decode step does not copy the whole cache.

use safemlx::ops::indexing::{TryIndexMutOp, TryIndexOp};
use safemlx::{Array, Stream};

use crate::error::{Error, Result};

/// Positions added to a layer's buffers when they are full.
pub const STEP: i32 = 256;

/// One layer's cache of one sequence on this rank.
pub trait LayerKv: std::fmt::Debug + Send {
    /// Positions cached.
    fn len(&self) -> usize;

    /// Whether nothing is cached yet.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held.
    fn nbytes(&self) -> usize;

    /// Counts `t` positions without keeping keys or values: what a rank
    /// that holds no query head does (no query of its reads them), so that
    /// its positions agree with the other ranks'.
    fn skip(&mut self, t: usize);

    /// Keeps only the first `len` positions (no-op when it holds fewer):
    /// the next append writes at `len`. A server reuses a finished
    /// sequence's cache for a new prompt that starts the same way.
    ///
    /// # Errors
    /// A cache that no longer holds what `len` needs (a sliding window
    /// that has moved past it).
    fn truncate(&mut self, len: usize) -> Result<()>;

    /// Whether [`truncate`](Self::truncate) to `len` would succeed.
    ///
    /// # Errors
    /// The error it would return.
    fn can_truncate(&self, len: usize) -> Result<()> {
        let _ = len;
        Ok(())
    }

    /// The position of the first key [`append`](Self::append) returns: 0,
    /// or where a sliding window's held positions start.
    fn first_held(&self) -> usize {
        0
    }

    /// Appends `k` and `v` (`[1, kv_heads, T, head_dim]`; the values may
    /// have another last dimension than the keys); returns the keys and
    /// values attention reads, `[1, kv_heads, S, _]`.
    ///
    /// # Errors
    /// `k` and `v` of other shapes than the cached ones, or an MLX error.
    fn append(&mut self, k: &Array, v: &Array, s: &Stream) -> Result<(Array, Array)>;
}

/// One layer's keys and values on this rank: every position, per KV head.
#[derive(Debug, Default)]
pub struct LayerCache {
    keys: Option<Array>,
    values: Option<Array>,
    len: usize,
}

impl LayerKv for LayerCache {
    fn len(&self) -> usize {
        self.len
    }

    /// The buffers' capacity, not just what is filled.
    fn nbytes(&self) -> usize {
        [&self.keys, &self.values]
            .iter()
            .filter_map(|a| a.as_ref())
            .map(Array::nbytes)
            .sum()
    }

    fn skip(&mut self, t: usize) {
        self.len += t;
    }

    /// Positions past `len` stay in the buffers until overwritten; reads
    /// stop at the length.
    fn truncate(&mut self, len: usize) -> Result<()> {
        self.len = self.len.min(len);
        Ok(())
    }

    /// Every cached position's keys and values.
    fn append(&mut self, k: &Array, v: &Array, s: &Stream) -> Result<(Array, Array)> {
        let start =
            i32::try_from(self.len).map_err(|_| Error::ShapeOverflow { value: self.len })?;
        let out = write_at([&mut self.keys, &mut self.values], [k, v], start, s)?;
        self.len += usize::try_from(k.shape()[2]).unwrap_or(0);
        Ok(out)
    }
}

/// Writes `k` and `v` (`[1, heads, T, _]`, the values' last dimension may
/// differ from the keys') at buffer index `start` of `buffers`; returns
/// both buffers' entries `0..start + T`.
///
/// # Errors
/// `k` and `v` of other shapes than the buffers hold, or an MLX error.
pub(super) fn write_at(
    [keys, values]: [&mut Option<Array>; 2],
    [k, v]: [&Array; 2],
    start: i32,
    s: &Stream,
) -> Result<(Array, Array)> {
    let shape = k.shape().to_vec();
    let &[1, _, t, _] = shape.as_slice() else {
        return Err(Error::Shape(format!(
            "the KV cache takes keys [1, kv_heads, T, head_dim], got {shape:?}"
        )));
    };
    // Keys and values may differ in width only (a latent cache keeps
    // DeepSeek's latent as its keys and the RoPE key as its values).
    if v.ndim() != 4 || v.shape()[..3] != shape[..3] {
        return Err(Error::Shape(format!(
            "the KV cache got keys {shape:?} and values {:?}",
            v.shape()
        )));
    }
    let end = start + t;
    Ok((
        write(keys, k, start, end, s)?,
        write(values, v, start, end, s)?,
    ))
}

/// Writes `x` (`[1, heads, T, hd]`) at positions `start..end` of `buffer`,
/// growing it by whole [`STEP`]s when full; returns positions `0..end`.
fn write(buffer: &mut Option<Array>, x: &Array, start: i32, end: i32, s: &Stream) -> Result<Array> {
    let (heads, hd) = (x.shape()[1], x.shape()[3]);
    let capacity = match buffer.as_ref() {
        Some(b) if b.shape()[1] != heads || b.shape()[3] != hd => {
            return Err(Error::Shape(format!(
                "the KV cache holds [1, {}, _, {}] but got {:?}",
                b.shape()[1],
                b.shape()[3],
                x.shape()
            )));
        }
        Some(b) => b.shape()[2],
        None => 0,
    };
    let mut full = match buffer.take() {
        Some(old) if end <= capacity => old,
        old => {
            let grow = (end - capacity + STEP - 1) / STEP * STEP;
            let more = safemlx::ops::zeros_dtype(&[1, heads, grow, hd], x.dtype(), s)?;
            match old {
                Some(old) => safemlx::ops::concatenate_axis(&[&old, &more], 2, s)?,
                None => more,
            }
        }
    };
    full.try_index_mut_device((.., .., start..end, ..), x, s)?;
    let filled = full.try_index_device((.., .., 0..end, ..), s)?;
    *buffer = Some(full);
    Ok(filled)
}

/// One sequence's cache on this rank: one [`LayerKv`] per layer.
#[derive(Debug, Default)]
pub struct KvCache {
    /// One per layer, in order.
    pub layers: Vec<Box<dyn LayerKv>>,
}

impl KvCache {
    /// An empty per-head cache ([`LayerCache`]) for `layers` layers.
    pub fn new(layers: usize) -> Self {
        Self::with_windows(&vec![None; layers])
    }

    /// An empty cache of one layer per entry of `windows`: a
    /// [`WindowCache`](super::WindowCache) keeping the last `w` positions
    /// for `Some(w)`, a [`LayerCache`] keeping every position for `None`.
    pub fn with_windows(windows: &[Option<usize>]) -> Self {
        Self {
            layers: windows
                .iter()
                .map(|w| match w {
                    Some(w) => Box::new(super::WindowCache::new(*w)) as Box<dyn LayerKv>,
                    None => Box::new(LayerCache::default()) as Box<dyn LayerKv>,
                })
                .collect(),
        }
    }

    /// Positions cached (those of the first layer).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.len())
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps only the first `len` positions of every layer
    /// ([`LayerKv::truncate`]).
    ///
    /// # Errors
    /// A sliding-window layer that no longer holds what `len` needs (then
    /// no layer is cut).
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        for layer in &self.layers {
            layer.can_truncate(len)?;
        }
        for layer in &mut self.layers {
            layer.truncate(len)?;
        }
        Ok(())
    }

    /// Bytes of every layer's cache on this rank.
    pub fn nbytes(&self) -> usize {
        self.layers.iter().map(|l| l.nbytes()).sum()
    }
}
