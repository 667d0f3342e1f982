//! Placement transitions and the collective each one lowers to.
//!
//! | from -> to | lowering | bytes received per rank (logical array of `B` bytes, `n` ranks) |
//! |---|---|---|
//! | `Replicated` -> `Sharded<A>` | local slice | 0 |
//! | `Sharded<A>` -> `Replicated` | all_gather along `A` | `B (n-1)/n` |
//! | `Partial` -> `Replicated` | all_sum | ~`2 B (n-1)/n` sent and received |
//! | `Partial` -> `Sharded<A>` | sum_scatter along `A` | ~`B (n-1)/n` |
//! | `Sharded<A>` -> `Sharded<B>` | all_to_all (all_to_all_v, equal counts) | `B (n-1)/n²` |
//! | `X` -> `X` | none | 0 |

use safemlx::{Array, Stream};

use super::placement::{chunk, Partial, Placement, Ragged, Replicated, Sharded};
use super::sharded::{local_shape, ShardedArray};
use super::wide_sum::rounded;
use super::Collective;
use crate::error::{Error, Result};
use crate::runtime::slice_axis;

/// A placement transition with a rule. Implemented for the rows of the table
/// above and nothing else, so a transition without a rule does not compile.
#[diagnostic::on_unimplemented(
    message = "there is no redistribution from `{Self}` to `{To}`",
    label = "no rule turns `{Self}` into `{To}`",
    note = "the rules: Replicated -> Sharded<A> (slice), Sharded<A> -> Replicated (all_gather), Partial -> Replicated (all_sum), Partial -> Sharded<A> (sum_scatter), Sharded<A> -> Sharded<B> (all_to_all)",
    note = "a `Partial` array is only produced by a row-parallel matmul (`Sharded<1>` x `Sharded<0>`), never by redistribution"
)]
pub trait RedistributeTo<To: Placement>: Placement {
    /// Performs the transition.
    fn apply<C: Collective>(x: ShardedArray<Self, C>, s: &Stream) -> Result<ShardedArray<To, C>>;
}

fn rewrap<From: Placement, To: Placement, C: Collective>(
    x: ShardedArray<From, C>,
    local: Array,
) -> ShardedArray<To, C> {
    let (comm, global) = (x.comm().clone(), x.global_shape().to_vec());
    ShardedArray::new_unchecked(local, comm, global)
}

/// Identity rows.
macro_rules! identity {
    ($($p:ty),*) => {$(
        impl RedistributeTo<$p> for $p {
            fn apply<C: Collective>(x: ShardedArray<Self, C>, _: &Stream) -> Result<ShardedArray<$p, C>> {
                Ok(x)
            }
        }
    )*};
}
identity!(Replicated, Partial, Ragged);

impl<const A: usize> RedistributeTo<Sharded<A>> for Replicated {
    fn apply<C: Collective>(
        x: ShardedArray<Self, C>,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<A>, C>> {
        let comm = x.comm().clone();
        local_shape::<Sharded<A>>(x.global_shape(), comm.rank(), comm.size())?;
        let dim = usize::try_from(x.global_shape()[A]).unwrap_or(0);
        let (offset, len) = chunk(dim, comm.rank(), comm.size());
        // Each rank keeps a different slice (see `grad`).
        let whole = x.summed_local(s)?;
        let local = slice_axis(&whole, A, offset, len, s)?;
        Ok(rewrap(x, local))
    }
}

impl<const A: usize> RedistributeTo<Replicated> for Sharded<A> {
    fn apply<C: Collective>(
        x: ShardedArray<Self, C>,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated, C>> {
        let lengths = x.axis_lengths(A);
        let local = x.comm().all_gather(x.local(), A, &lengths, s)?;
        Ok(rewrap(x, local))
    }
}

impl RedistributeTo<Replicated> for Partial {
    fn apply<C: Collective>(
        x: ShardedArray<Self, C>,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated, C>> {
        let local = rounded(&x, x.comm().all_sum(x.local(), s)?, s)?;
        Ok(rewrap(x, local))
    }
}

impl<const A: usize> RedistributeTo<Sharded<A>> for Partial {
    fn apply<C: Collective>(
        x: ShardedArray<Self, C>,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<A>, C>> {
        // Fails with a clear message when the array has no axis A.
        local_shape::<Sharded<A>>(x.global_shape(), 0, 1)?;
        let lengths = x.axis_lengths(A);
        let local = x.comm().sum_scatter(x.local(), A, &lengths, s)?;
        let local = rounded(&x, local, s)?;
        Ok(rewrap(x, local))
    }
}

impl<const A: usize, const B: usize> RedistributeTo<Sharded<B>> for Sharded<A> {
    fn apply<C: Collective>(
        x: ShardedArray<Self, C>,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<B>, C>> {
        if A == B || x.comm().size() == 1 {
            // The same axis keeps its split (one rank holds everything).
            let split = (A == B).then(|| x.split().cloned()).flatten();
            let local = x.local().clone();
            return Ok(rewrap(x, local).with_split(split));
        }
        // Fails with a clear message when the array has no axis B.
        local_shape::<Sharded<B>>(x.global_shape(), 0, 1)?;
        let local = all_to_all(&x, A, B, s)?;
        Ok(rewrap(x, local))
    }
}

/// `Sharded<A>` -> `Sharded<B>`: rank `r` sends to rank `d` the part of its
/// chunk (along `A`) that falls in `d`'s chunk along `B`. The pieces go as
/// flat element runs through one `all_to_all_v`, so uneven chunks on either
/// axis need no padding; each received piece is reshaped and the pieces are
/// concatenated along `A`.
fn all_to_all<P: Placement, C: Collective>(
    x: &ShardedArray<P, C>,
    a: usize,
    b: usize,
    s: &Stream,
) -> Result<Array> {
    let comm = x.comm();
    let (rank, n) = (comm.rank(), comm.size());
    let along_a = x.axis_lengths(a);
    let along_b = x.axis_lengths(b);
    let offsets_b: Vec<usize> = (0..n).map(|d| along_b[..d].iter().sum()).collect();
    let local = x.local();
    let mut pieces = Vec::with_capacity(n);
    let mut send = Vec::with_capacity(n);
    for d in 0..n {
        let piece = slice_axis(local, b, offsets_b[d], along_b[d], s)?;
        send.push(piece.size());
        pieces.push(piece.reshape(&[-1], s)?);
    }
    let piece_shape = |src: usize| {
        let mut shape = local.shape().to_vec();
        shape[a] = along_a[src] as i32;
        shape[b] = along_b[rank] as i32;
        shape
    };
    let recv: Vec<usize> = (0..n)
        .map(|src| piece_shape(src).iter().map(|&d| d as usize).product())
        .collect();
    let flat = safemlx::ops::concatenate_axis(&pieces, 0, s)?;
    let exchanged = crate::runtime::all_to_all_v(&flat, &send, &recv, comm.group(), s)?;
    let bounds: Vec<i32> = (1..n)
        .map(|k| {
            i32::try_from(recv[..k].iter().sum::<usize>())
                .map_err(|_| Error::ShapeOverflow { value: k })
        })
        .collect::<Result<_>>()?;
    let received = exchanged.split_axis(&bounds, 0, s)?;
    let shaped = received
        .iter()
        .enumerate()
        .map(|(src, piece)| Ok(piece.reshape(&piece_shape(src), s)?))
        .collect::<Result<Vec<_>>>()?;
    Ok(safemlx::ops::concatenate_axis(&shaped, a as i32, s)?)
}

impl<P: Placement, C: Collective> ShardedArray<P, C> {
    /// Changes the placement to `To`, with the collective of the table in
    /// this module's documentation. A transition without a rule (e.g. to
    /// `Partial`) does not compile.
    pub fn redistribute<To: Placement>(self, s: &Stream) -> Result<ShardedArray<To, C>>
    where
        P: RedistributeTo<To>,
    {
        P::apply(self, s)
    }
}

impl<C: Collective> ShardedArray<Replicated, C> {
    /// The same array on every rank (each rank passes its copy).
    pub fn replicated(full: Array, comm: &C) -> Self {
        let global = full.shape().to_vec();
        Self::new_unchecked(full, comm.clone(), global)
    }

    /// Keeps this rank's chunk along `AXIS`: a local slice, no communication.
    pub fn shard<const AXIS: usize>(self, s: &Stream) -> Result<ShardedArray<Sharded<AXIS>, C>> {
        self.redistribute(s)
    }
}

impl<const A: usize, C: Collective> ShardedArray<Sharded<A>, C> {
    /// Gathers the chunks along `A` onto every rank (all_gather).
    pub fn all_gather(self, s: &Stream) -> Result<ShardedArray<Replicated, C>> {
        self.redistribute(s)
    }
}

impl<C: Collective> ShardedArray<Partial, C> {
    /// Sums the partial sums onto every rank (all_sum).
    pub fn all_sum(self, s: &Stream) -> Result<ShardedArray<Replicated, C>> {
        self.redistribute(s)
    }

    /// Sums the partial sums and keeps this rank's chunk along `AXIS` (sum_scatter).
    pub fn sum_scatter<const AXIS: usize>(
        self,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<AXIS>, C>> {
        self.redistribute(s)
    }
}
