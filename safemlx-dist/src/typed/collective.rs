//! The lowering interface of the typed layer.

use safemlx::{Array, Dtype, Stream};

use crate::error::{Error, Result};
use crate::runtime::{slice_axis, Group};

/// What the typed layer needs from a group: rank, size and the collectives
/// along any axis, for even and uneven chunks. [`Group`] (size known at run
/// time) and [`Mesh<N>`](super::Mesh) (size known at compile time)
/// implement it; generic code (layers, `#[sharded]` output) is written
/// against it.
///
/// Axis-aware operations move the axis to the front, use the runtime's
/// axis-0 collective and move it back; uneven chunks (lengths from
/// [`chunk_lengths`](super::chunk_lengths)) are padded to the longest chunk
/// for a gather and reduced with `all_sum` plus a slice for a scatter.
pub trait Collective: Clone {
    /// Per-peer counts: `[usize]` on a [`Group`], `[usize; N]` on a
    /// [`Mesh<N>`](super::Mesh), where a count array of another length does
    /// not compile.
    type Counts: AsRef<[usize]> + ?Sized;

    /// The runtime group underneath.
    fn group(&self) -> &Group;

    /// This process's rank.
    fn rank(&self) -> usize {
        self.group().rank()
    }

    /// The number of ranks.
    fn size(&self) -> usize {
        self.group().size()
    }

    /// Element-wise sum over ranks. Cost: an all-reduce of `x`.
    fn all_sum(&self, x: &Array, s: &Stream) -> Result<Array> {
        crate::runtime::all_sum(x, self.group(), s)
    }

    /// Every rank's chunk along `axis` (rank `r`'s is `lengths[r]` long),
    /// concatenated in rank order. Cost: each rank receives the other
    /// ranks' chunks (padded to the longest when lengths differ).
    fn all_gather(&self, x: &Array, axis: usize, lengths: &[usize], s: &Stream) -> Result<Array> {
        gather(self.group(), x, axis, lengths, s)
    }

    /// Sum over ranks, then rank `r` keeps its chunk along `axis` (length
    /// `lengths[r]`). Cost: a reduce-scatter when lengths are equal, an
    /// all-reduce otherwise.
    fn sum_scatter(&self, x: &Array, axis: usize, lengths: &[usize], s: &Stream) -> Result<Array> {
        scatter(self.group(), x, axis, lengths, s)
    }

    /// Variable-row exchange (see [`all_to_all_v`](crate::runtime::all_to_all_v)).
    fn all_to_all_v(
        &self,
        x: &Array,
        send_counts: &Self::Counts,
        recv_counts: &Self::Counts,
        s: &Stream,
    ) -> Result<Array> {
        crate::runtime::all_to_all_v(
            x,
            send_counts.as_ref(),
            recv_counts.as_ref(),
            self.group(),
            s,
        )
    }

    /// A lazy send to `destination` (see [`send`](crate::runtime::send)).
    fn send(&self, x: &Array, destination: usize, s: &Stream) -> Result<Array> {
        crate::runtime::send(x, destination, self.group(), s)
    }

    /// A lazy receive from `source` (see [`recv`](crate::runtime::recv)).
    fn recv(&self, shape: &[i32], dtype: Dtype, source: usize, s: &Stream) -> Result<Array> {
        crate::runtime::recv(shape, dtype, source, self.group(), s)
    }
}

impl Collective for Group {
    type Counts = [usize];

    fn group(&self) -> &Group {
        self
    }
}

fn as_i32(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::ShapeOverflow { value: v })
}

/// `x` with `axis` moved to the front (a view: no copy until needed).
fn to_front(x: &Array, axis: usize, s: &Stream) -> Result<Array> {
    if axis == 0 {
        return Ok(x.clone());
    }
    Ok(x.move_axis(as_i32(axis)?, 0, s)?)
}

fn from_front(x: Array, axis: usize, s: &Stream) -> Result<Array> {
    if axis == 0 {
        return Ok(x);
    }
    Ok(x.move_axis(0, as_i32(axis)?, s)?)
}

fn gather(group: &Group, x: &Array, axis: usize, lengths: &[usize], s: &Stream) -> Result<Array> {
    let front = to_front(x, axis, s)?;
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let mine = lengths.get(group.rank()).copied().unwrap_or(0);
    if lengths.iter().all(|&l| l == longest) {
        return from_front(crate::runtime::all_gather(&front, group, s)?, axis, s);
    }
    // Uneven: pad every chunk to the longest, gather, keep each rank's rows.
    let padded = if mine < longest {
        let mut shape = front.shape().to_vec();
        shape[0] = as_i32(longest - mine)?;
        let zeros = safemlx::ops::zeros_dtype(&shape, front.dtype(), s)?;
        safemlx::ops::concatenate_axis(&[&front, &zeros], 0, s)?
    } else {
        front
    };
    let all = crate::runtime::all_gather(&padded, group, s)?;
    let pieces = lengths
        .iter()
        .enumerate()
        .map(|(r, &len)| slice_axis(&all, 0, r * longest, len, s))
        .collect::<Result<Vec<_>>>()?;
    from_front(safemlx::ops::concatenate_axis(&pieces, 0, s)?, axis, s)
}

fn scatter(group: &Group, x: &Array, axis: usize, lengths: &[usize], s: &Stream) -> Result<Array> {
    let even = lengths.windows(2).all(|w| w[0] == w[1]);
    if even {
        let front = to_front(x, axis, s)?;
        return from_front(crate::runtime::sum_scatter(&front, group, s)?, axis, s);
    }
    let sum = crate::runtime::all_sum(x, group, s)?;
    let sum = crate::runtime::sum_gradients(&sum, group, s)?;
    let offset: usize = lengths[..group.rank()].iter().sum();
    slice_axis(&sum, axis, offset, lengths[group.rank()], s)
}
