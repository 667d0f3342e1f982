//! Subgroups whose members are not consecutive on the ring: their
//! collectives travel through the world's own `all_to_all_v`, which relays
//! between ranks that are not neighbours (ranks outside the subgroup
//! carry the bytes).
//!
//! Every world rank takes part in that exchange, so a relayed axis's
//! collectives are collectives of the whole world: every rank calls them
//! at the same time, each for its own subgroup of that axis, as SPMD code
//! calls an axis reduction (JAX's `psum` over an axis). Counts outside a
//! rank's subgroup are zero, so each rank's bytes reach only its members.
//!
//! ```text
//! all_to_all_v   the world's, counts scattered to the members' world ranks
//! all_gather     every member sends its rows to every member
//! reduce         a gather, folded in subgroup-rank order: the same bits on
//!                every member
//! sum_scatter    chunk j to member j, the k chunks received summed
//! ```

use safemlx::{Array, Stream};

use super::chain::Chain;
use super::composed::Combine;
use super::exchange::reduce_blocks;
use super::native;
use crate::error::Result;

/// Counts per member (subgroup order) as counts per world rank.
fn world_counts(chain: &Chain, per_member: &[i64]) -> Vec<i64> {
    let mut counts = vec![0; chain.world_size()];
    for (&m, &c) in chain.members().iter().zip(per_member) {
        counts[m] = c;
    }
    counts
}

/// The members' subgroup ranks in world-rank order.
fn world_order(chain: &Chain) -> Vec<usize> {
    let mut order: Vec<usize> = (0..chain.len()).collect();
    order.sort_by_key(|&j| chain.members()[j]);
    order
}

/// Rows of `x` in blocks of `counts[j]` (block `j` in position `from[j]`'s
/// order) put in the order `to` lists: `x` holds the blocks of members
/// `from[0], from[1], ...`; the result holds those of `to[0], to[1], ...`.
fn reorder(x: &Array, counts: &[i64], from: &[usize], to: &[usize], s: &Stream) -> Result<Array> {
    if from == to {
        return Ok(x.clone());
    }
    let rows = |j: usize| usize::try_from(counts[j]).unwrap_or(0);
    let mut offsets = vec![0; counts.len()];
    let mut at = 0;
    for &j in from {
        offsets[j] = at;
        at += rows(j);
    }
    let blocks: Vec<Array> = to
        .iter()
        .filter(|&&j| rows(j) > 0)
        .map(|&j| super::slice_axis(x, 0, offsets[j], rows(j), s))
        .collect::<Result<_>>()?;
    if blocks.is_empty() {
        return Ok(x.clone());
    }
    Ok(safemlx::ops::concatenate_axis(&blocks, 0, s)?)
}

/// `all_to_all_v` among the members: `input` in destination subgroup
/// order, the result in source subgroup order.
pub(super) fn all_to_all_v(
    chain: &Chain,
    input: &Array,
    send_counts: &[i64],
    recv_counts: &[i64],
    s: &Stream,
) -> Result<Array> {
    let ranks: Vec<usize> = (0..chain.len()).collect();
    let by_world = world_order(chain);
    let input = reorder(input, send_counts, &ranks, &by_world, s)?;
    let (send, recv) = (
        world_counts(chain, send_counts),
        world_counts(chain, recv_counts),
    );
    let received = native::all_to_all_v(&input, &send, &recv, chain.world(), s)?;
    reorder(&received, recv_counts, &by_world, &ranks, s)
}

/// Every member's `input` concatenated along axis 0 in subgroup order (a
/// scalar counts as one row).
pub(super) fn all_gather(chain: &Chain, input: &Array, s: &Stream) -> Result<Array> {
    let input = if input.ndim() == 0 {
        input.reshape(&[1], s)?
    } else {
        input.clone()
    };
    let k = chain.len();
    let copies: Vec<&Array> = (0..k).map(|_| &input).collect();
    let outgoing = safemlx::ops::concatenate_axis(&copies, 0, s)?;
    let counts = vec![i64::from(input.shape()[0]); k];
    all_to_all_v(chain, &outgoing, &counts, &counts, s)
}

/// Every member's `input` combined in subgroup-rank order.
pub(super) fn all_reduce(
    chain: &Chain,
    input: &Array,
    combine: Combine,
    s: &Stream,
) -> Result<Array> {
    let gathered = all_gather(chain, &input.reshape(&[1, -1], s)?, s)?;
    let total = reduce_blocks(&gathered, combine, chain.len(), s)?;
    Ok(total.reshape(input.shape(), s)?)
}

/// Sum over the members, then this member's chunk of axis 0.
pub(super) fn sum_scatter(chain: &Chain, input: &Array, s: &Stream) -> Result<Array> {
    let k = chain.len();
    let rows = i64::from(input.shape()[0]) / k as i64;
    let counts = vec![rows; k];
    let received = all_to_all_v(chain, input, &counts, &counts, s)?;
    reduce_blocks(&received, Combine::Sum, k, s)
}

#[cfg(test)]
mod tests {
    use safemlx::{Array, Device, DeviceType, Stream};

    use super::reorder;

    #[test]
    fn blocks_move_between_orders_and_back() {
        let s = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));
        // Members 0, 1, 2 hold 1, 0 and 3 rows; x has them in order 0, 1, 2.
        let x = Array::from_slice(&[10i32, 20, 21, 22], &[4, 1]);
        let counts = [1, 0, 3];
        let moved = reorder(&x, &counts, &[0, 1, 2], &[2, 0, 1], &s).unwrap();
        let values = |a: &Array| a.evaluated().unwrap().try_to_vec::<i32>().unwrap();
        assert_eq!(values(&moved), [20, 21, 22, 10]);
        let back = reorder(&moved, &counts, &[2, 0, 1], &[0, 1, 2], &s).unwrap();
        assert_eq!(values(&back), [10, 20, 21, 22]);
    }
}
