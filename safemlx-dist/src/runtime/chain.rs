//! The members of a subgroup of ring neighbours, in ring order: what a
//! [`Group`](super::Group) composed of `send`/`recv` holds (its
//! collectives are in `path.rs`).

use std::cell::OnceCell;
use std::rc::Rc;

use super::native::NativeGroup;
use super::p2p_streams::P2pStreams;
use crate::error::{Error, Result};

/// A subgroup whose members are consecutive on the world's ring.
#[derive(Debug)]
pub(crate) struct Chain {
    world: Rc<NativeGroup>,
    world_size: usize,
    p2p: Rc<OnceCell<P2pStreams>>,
    /// World ranks of the members, by subgroup rank.
    members: Vec<usize>,
    /// Subgroup ranks in ring order: consecutive entries are neighbours;
    /// empty when the members are not consecutive on the ring (a relayed
    /// subgroup, `relay.rs`).
    order: Vec<usize>,
}

/// `members` (world ranks) by subgroup rank in ring order, when they are
/// consecutive on a ring of `n` ranks.
fn ring_order(members: &[usize], n: usize) -> Option<Vec<usize>> {
    // The chain starts at the member whose ring predecessor is not one.
    let start = (0..members.len()).find(|&i| !members.contains(&((members[i] + n - 1) % n)))?;
    (0..members.len())
        .map(|step| {
            let world_rank = (members[start] + step) % n;
            members.iter().position(|&m| m == world_rank)
        })
        .collect()
}

/// Whether `members` (world ranks) are consecutive on a ring of `n`.
pub(super) fn is_consecutive(members: &[usize], n: usize) -> bool {
    members.len() >= n || ring_order(members, n).is_some()
}

impl Chain {
    /// The subgroup of `members` (world ranks, by subgroup rank) of a world
    /// of `world_size` ranks: a chain when they are consecutive on its
    /// ring and `relayed` is false, relayed otherwise; `None` for one rank
    /// or all of them.
    pub(super) fn new(
        world: Rc<NativeGroup>,
        world_size: usize,
        p2p: Rc<OnceCell<P2pStreams>>,
        members: Vec<usize>,
        relayed: bool,
    ) -> Option<Self> {
        let (n, k) = (world_size, members.len());
        if k < 2 || k >= n || members.iter().any(|&m| m >= n) {
            return None;
        }
        let order = if relayed {
            Vec::new()
        } else {
            ring_order(&members, n).unwrap_or_default()
        };
        Some(Self {
            world,
            world_size,
            p2p,
            members,
            order,
        })
    }

    /// The number of members.
    pub(super) fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the members are not consecutive on the ring, so that their
    /// collectives go through the world's (`relay.rs`).
    pub(crate) fn is_relayed(&self) -> bool {
        self.order.is_empty()
    }

    /// World ranks of the members, by subgroup rank.
    pub(super) fn members(&self) -> &[usize] {
        &self.members
    }

    /// The world's size.
    pub(super) fn world_size(&self) -> usize {
        self.world_size
    }

    /// The world group the members' messages travel on.
    pub(super) fn world(&self) -> &NativeGroup {
        &self.world
    }

    /// The world group's send and receive streams.
    pub(super) fn streams(&self) -> &P2pStreams {
        self.p2p.get_or_init(P2pStreams::new)
    }

    /// Member `member`'s place in the chain.
    pub(super) fn place(&self, member: usize) -> usize {
        self.order.iter().position(|&c| c == member).unwrap_or(0)
    }

    /// The world rank at `place` in the chain.
    pub(super) fn at(&self, place: usize) -> i32 {
        i32::try_from(self.members[self.order[place]]).unwrap_or(i32::MAX)
    }

    /// The world rank of subgroup rank `peer` for a `send`/`recv` of member
    /// `me`: only a ring neighbour.
    pub(super) fn neighbour(&self, me: usize, peer: usize) -> Result<i32> {
        let n = self.world_size;
        let (from, to) = (self.members[me], self.members[peer]);
        if (from + 1) % n == to || (to + 1) % n == from {
            Ok(i32::try_from(to).unwrap_or(i32::MAX))
        } else {
            Err(Error::Setting(format!(
                "send/recv between subgroup ranks {me} and {peer} (world ranks {from} and {to} of {n}): MLX's ring reaches only neighbours; use all_to_all_v on this subgroup"
            )))
        }
    }
}
