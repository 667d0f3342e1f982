//! Collectives composed of MLX's own `send`/`recv` between ring neighbours.
//!
//! Sends run on one dedicated CPU stream and receives on another, so every
//! rank's send of a step overlaps with its receive of the same step and no
//! rank waits on a send that nobody receives.
//!
//! Each step is evaluated when it is built. MLX orders the work of one
//! stream by its own graph traversal, not by program order, so two lazy
//! receives from the same peer could run in either order and a receive
//! whose data depends on an earlier one would wait forever. Evaluating step
//! by step fixes the order on every rank; the cost is that these lowerings
//! evaluate their input at the call (the final combine stays lazy). The
//! `native` lowering keeps every collective fully lazy.
//!
//! Chunks are indexed the same way on every rank and have the same shapes
//! there (the input shapes of these collectives agree across ranks), so each
//! receive knows its shape without any extra message.

use safemlx::{Array, Stream};

use super::group::Group;
use super::native::{self, Unary};
use super::p2p_streams::P2pStreams;
use crate::error::Result;

/// How two partial results combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Combine {
    Sum,
    Max,
    Min,
}

impl Combine {
    pub(crate) fn of(op: Unary) -> Option<Self> {
        match op {
            Unary::AllSum => Some(Self::Sum),
            Unary::AllMax => Some(Self::Max),
            Unary::AllMin => Some(Self::Min),
            Unary::AllGather | Unary::SumScatter => None,
        }
    }

    pub(crate) fn apply(self, a: &Array, b: &Array, stream: &Stream) -> Result<Array> {
        Ok(match self {
            Self::Sum => a.add(b, stream)?,
            Self::Max => safemlx::ops::maximum(a, b, stream)?,
            Self::Min => safemlx::ops::minimum(a, b, stream)?,
        })
    }
}

/// A ring exchange between this rank and its two neighbours.
struct Ring<'g> {
    group: &'g Group,
    streams: &'g P2pStreams,
    next: i32,
    prev: i32,
}

impl<'g> Ring<'g> {
    fn new(group: &'g Group) -> Self {
        let (r, n) = (group.rank(), group.size());
        // Ranks are below the group size, which MLX reports as an i32.
        let peer = |p: usize| i32::try_from(p).unwrap_or(i32::MAX);
        Self {
            group,
            streams: group.p2p_streams(),
            next: peer((r + 1) % n),
            prev: peer((r + n - 1) % n),
        }
    }

    /// Sends `outgoing` to the next rank while receiving an array shaped
    /// like `like` from the previous one; both complete before it returns.
    fn step(&self, outgoing: &Array, like: &Array) -> Result<Array> {
        let native = self.group.native()?;
        let sent = native::send(outgoing, self.next, native, &self.streams.send)?;
        let received = native::recv_like(like, self.prev, native, &self.streams.recv)?;
        super::eval(&[&sent, &received])?;
        Ok(received)
    }

    /// Reduce-scatter: returns chunk `rank` combined over all ranks.
    ///
    /// At step `k`, rank `r` sends its partial chunk `(r - k - 1) mod n` and
    /// folds the received partial of chunk `(r - k - 2) mod n` into its own;
    /// after `n - 1` steps it holds chunk `r` complete.
    fn reduce_scatter(&self, chunks: &[Array], combine: Combine, s: &Stream) -> Result<Array> {
        let (r, n) = (self.group.rank(), self.group.size());
        let mut outgoing = chunks[(r + n - 1) % n].clone();
        for k in 0..n - 1 {
            let index = (r + 2 * n - k - 2) % n;
            let incoming = self.step(&outgoing, &chunks[index])?;
            outgoing = combine.apply(&chunks[index], &incoming, s)?;
        }
        Ok(outgoing)
    }

    /// All-gather: every rank's `own` chunk (shaped like `chunks[rank]`), in rank order.
    fn all_gather(&self, own: Array, chunks: &[Array]) -> Result<Vec<Array>> {
        let (r, n) = (self.group.rank(), self.group.size());
        let mut gathered: Vec<Option<Array>> = vec![None; n];
        let mut outgoing = own.clone();
        gathered[r] = Some(own);
        for k in 0..n - 1 {
            let index = (r + n - k - 1) % n;
            let incoming = self.step(&outgoing, &chunks[index])?;
            gathered[index] = Some(incoming.clone());
            outgoing = incoming;
        }
        Ok(gathered.into_iter().flatten().collect())
    }
}

/// `n` chunks of the flattened input, sizes differing by at most one element.
fn flat_chunks(input: &Array, n: usize, s: &Stream) -> Result<Vec<Array>> {
    let len = input.size();
    let (base, extra) = (len / n, len % n);
    // Boundaries fit i32: they are at most the element count of an MLX array.
    let bounds: Vec<i32> = (1..n)
        .map(|c| i32::try_from(c * base + c.min(extra)).unwrap_or(i32::MAX))
        .collect();
    Ok(input.reshape(&[-1], s)?.split_axis(&bounds, 0, s)?)
}

/// All-reduce as ring reduce-scatter + ring all-gather; about `2 (n-1)/n`
/// of the input's bytes sent and received per rank.
pub(crate) fn all_reduce(
    input: &Array,
    combine: Combine,
    group: &Group,
    s: &Stream,
) -> Result<Array> {
    // The input first: MLX's ring polls its sockets while a receive is
    // posted, so posting one before this rank's compute is done would take
    // a core from that compute.
    super::eval(&[input])?;
    let chunks = flat_chunks(input, group.size(), s)?;
    let ring = Ring::new(group);
    let own = ring.reduce_scatter(&chunks, combine, s)?;
    let all = ring.all_gather(own, &chunks)?;
    let flat = safemlx::ops::concatenate_axis(&all, 0, s)?;
    Ok(flat.reshape(input.shape(), s)?)
}

/// Sum-scatter along axis 0 as a ring reduce-scatter; about `(n-1)/n` of the
/// input's bytes sent and received per rank.
pub(crate) fn sum_scatter(input: &Array, group: &Group, s: &Stream) -> Result<Array> {
    super::eval(&[input])?;
    let n = i32::try_from(group.size()).unwrap_or(i32::MAX);
    let chunks = input.split(n, 0, s)?;
    Ring::new(group).reduce_scatter(&chunks, Combine::Sum, s)
}

/// Sum-scatter along axis 0 as MLX's `all_sum`, then this rank's chunk.
pub(crate) fn all_sum_then_slice(input: &Array, group: &Group, s: &Stream) -> Result<Array> {
    let sum = match group.path() {
        // A subgroup of send/recv: its sum's gradient rule is ours.
        Some(_) => super::all_sum(input, group, s)?,
        None => native::unary(Unary::AllSum, input, group.native()?, s)?,
    };
    // Each rank keeps a different slice: the gradient of the sum is the
    // sum of the ranks' padded slices (identity outside a gradient).
    let sum = super::gradient_sum::sum_gradients(&sum, group, s)?;
    let n = i32::try_from(group.size()).unwrap_or(i32::MAX);
    let mut chunks = sum.split(n, 0, s)?;
    Ok(chunks.swap_remove(group.rank()))
}
