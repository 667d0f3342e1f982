//! Subgroups of ring neighbours: collectives composed of MLX's `send`/`recv`
//! along a chain of consecutive ring ranks, for backends that cannot split a
//! group (ring, JACCL).
//!
//! A mesh places the ranks of each subgroup it needs on the ring so that
//! they follow each other (see `mesh.rs`). The chain is those ranks in ring
//! order: its consecutive members are ring neighbours, the only peers MLX's
//! ring `send`/`recv` reach. Only the members take part, so subgroups of one
//! axis run independently (a pipeline's stages do different work at once).
//! A subgroup that is not consecutive (a relayed one) goes to `relay.rs`.
//!
//! ```text
//! reduce:   c0 -> c1 -> ... -> c(k-1)   partial sums, then the total
//!           c0 <- c1 <- ... <- c(k-1)   travels back: every member gets
//!                                       the same bits
//! gather:   the same two sweeps, the pieces concatenated on the way
//! ```
//!
//! Each step is evaluated when built (as in `composed.rs`): MLX orders one
//! stream's work by its graph, not by program order, and a receive that
//! ran early would wait forever. A step is `2 (k - 1)` hops of latency; at
//! the sizes a mesh of a few machines has (`k` of 2 to 4) that is one
//! all-reduce's latency on a ring of `k`.

use safemlx::{Array, Dtype, Stream};

use super::chain::Chain;
use super::composed::Combine;
use super::native;
use super::relay;
use crate::error::{Error, Result};

fn send(chain: &Chain, x: &Array, place: usize) -> Result<()> {
    let streams = chain.streams();
    let sent = native::send(x, chain.at(place), chain.world(), &streams.send)?;
    super::eval(&[&sent])
}

fn recv(chain: &Chain, shape: &[i32], dtype: Dtype, place: usize) -> Result<Array> {
    let streams = chain.streams();
    let received = native::recv(shape, dtype, chain.at(place), chain.world(), &streams.recv)?;
    super::eval(&[&received])?;
    Ok(received)
}

/// The two sweeps: `grow` folds what arrives from the chain's start
/// into this rank's part; the result at the chain's end comes back.
fn sweep(
    chain: &Chain,
    me: usize,
    own: &Array,
    partial_shape: impl Fn(usize) -> Vec<i32>,
    grow: impl Fn(&Array, &Array) -> Result<Array>,
) -> Result<Array> {
    let (i, k) = (chain.place(me), chain.len());
    super::eval(&[own])?;
    let mut acc = own.clone();
    if i > 0 {
        let before = recv(chain, &partial_shape(i), own.dtype(), i - 1)?;
        acc = grow(&before, own)?;
    }
    if i + 1 < k {
        send(chain, &acc, i + 1)?;
        acc = recv(chain, &partial_shape(k), own.dtype(), i + 1)?;
    }
    if i > 0 {
        send(chain, &acc, i - 1)?;
    }
    Ok(acc)
}

/// Every member's `input` combined; the same bits on every member.
pub(super) fn all_reduce(
    chain: &Chain,
    me: usize,
    input: &Array,
    combine: Combine,
    s: &Stream,
) -> Result<Array> {
    if chain.is_relayed() {
        return relay::all_reduce(chain, input, combine, s);
    }
    let shape = input.shape().to_vec();
    sweep(
        chain,
        me,
        input,
        |_| shape.clone(),
        |before, own| combine.apply(before, own, s),
    )
}

/// Every member's `input` concatenated along axis 0 in subgroup-rank
/// order (a scalar counts as one row).
pub(super) fn all_gather(chain: &Chain, me: usize, input: &Array, s: &Stream) -> Result<Array> {
    if chain.is_relayed() {
        return relay::all_gather(chain, input, s);
    }
    let input = if input.ndim() == 0 {
        input.reshape(&[1], s)?
    } else {
        input.clone()
    };
    let shape = input.shape().to_vec();
    let rows = shape[0];
    let pieces = |count: usize| {
        let mut shape = shape.clone();
        shape[0] = rows * i32::try_from(count).unwrap_or(i32::MAX);
        shape
    };
    let chained = sweep(chain, me, &input, pieces, |before, own| {
        Ok(safemlx::ops::concatenate_axis(&[before, own], 0, s)?)
    })?;
    // The pieces arrive in chain order; put them in rank order.
    let k = chain.len();
    let parts = chained.split(i32::try_from(k).unwrap_or(i32::MAX), 0, s)?;
    let ordered: Vec<&Array> = (0..k).map(|rank| &parts[chain.place(rank)]).collect();
    Ok(safemlx::ops::concatenate_axis(&ordered, 0, s)?)
}

/// Sum over the members, then this member's `k`-th of axis 0.
pub(super) fn sum_scatter(chain: &Chain, me: usize, input: &Array, s: &Stream) -> Result<Array> {
    if chain.is_relayed() {
        return relay::sum_scatter(chain, input, s);
    }
    let sum = all_reduce(chain, me, input, Combine::Sum, s)?;
    let k = i32::try_from(chain.len()).unwrap_or(i32::MAX);
    Ok(sum.split(k, 0, s)?.swap_remove(me))
}

/// `all_to_all_v` as two gathers: every member's send counts, then
/// every member's rows padded to the longest; each member keeps the
/// rows addressed to it. A member's counts that disagree with what this
/// one expects to receive are an error naming both.
pub(super) fn all_to_all_v(
    chain: &Chain,
    me: usize,
    input: &Array,
    send_counts: &[i64],
    recv_counts: &[i64],
    s: &Stream,
) -> Result<Array> {
    if chain.is_relayed() {
        return relay::all_to_all_v(chain, input, send_counts, recv_counts, s);
    }
    let k = chain.len();
    let counts: Vec<i32> = send_counts
        .iter()
        .map(|&c| i32::try_from(c).map_err(|_| Error::ShapeOverflow { value: c as usize }))
        .collect::<Result<_>>()?;
    let counts = Array::from_slice(&counts, &[i32::try_from(k).unwrap_or(i32::MAX)]);
    let table = all_gather(chain, me, &counts, s)?;
    let table = super::read_back::<i32>(&table, "all_to_all_v counts")?;
    let sends = |src: usize| &table[src * k..(src + 1) * k];
    for (src, &want) in recv_counts.iter().enumerate() {
        let got = i64::from(sends(src)[me]);
        if got != want {
            return Err(Error::Shape(format!(
                "all_to_all_v: rank {src} sends {got} rows to rank {me}, which expects {want}"
            )));
        }
    }
    let longest = (0..k)
        .map(|src| sends(src).iter().map(|&c| c.max(0) as usize).sum::<usize>())
        .max()
        .unwrap_or(0);
    let mut rest = input.shape().to_vec();
    let mine = usize::try_from(rest[0]).unwrap_or(0);
    let as_i32 = |v: usize| i32::try_from(v).map_err(|_| Error::ShapeOverflow { value: v });
    if longest == 0 {
        return Ok(input.clone());
    }
    let padded = if mine < longest {
        rest[0] = as_i32(longest - mine)?;
        let padding = safemlx::ops::zeros_dtype(&rest, input.dtype(), s)?;
        safemlx::ops::concatenate_axis(&[input, &padding], 0, s)?
    } else {
        input.clone()
    };
    let all = all_gather(chain, me, &padded, s)?;
    let mut pieces = Vec::new();
    for src in 0..k {
        let before: usize = sends(src)[..me].iter().map(|&c| c.max(0) as usize).sum();
        let count = sends(src)[me].max(0) as usize;
        if count > 0 {
            let at = src * longest + before;
            pieces.push(super::slice_axis(&all, 0, at, count, s)?);
        }
    }
    if pieces.is_empty() {
        rest[0] = 0;
        return Ok(safemlx::ops::zeros_dtype(&rest, input.dtype(), s)?);
    }
    Ok(safemlx::ops::concatenate_axis(&pieces, 0, s)?)
}
