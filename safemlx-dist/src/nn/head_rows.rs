//! How the ranks divide an attention layer's heads into rows of its
//! projections: this rank's rows of q (and k, v), every rank's row
//! counts, and the copies of heads held by several ranks (KV heads read by
//! query heads of several ranks; a query head two ranks share by rows).

use safemlx::Stream;

use super::head_split::HeadSplit;
use super::load_linear::load_row_block;
use crate::checkpoint::Weights;
use crate::error::{Error, Result};
use crate::typed::{LinearWeight, Placement, QuantizedPlacement, Sharded, ShardedArray};

/// One kind of head (query or KV) as the ranks divide it: this rank's rows
/// `(first, count)` of the projection, every rank's row count, and, when
/// some KV head is held by several ranks, this rank's KV heads as blocks
/// `(first, slots, block, holders)` (see [`ShardedArray::blocks_of`]);
/// the same for query heads when one is shared by rows.
pub(super) struct HeadRows {
    pub(super) mine: (usize, usize),
    pub(super) split: Vec<usize>,
    copies: Option<(usize, usize, usize, Vec<usize>)>,
}

impl HeadRows {
    /// The query rows and the KV rows of rank `rank`, every rank's heads
    /// `all` of `heads` query heads over `kv_heads` KV heads of `hd`
    /// dimensions.
    pub(super) fn of(
        (heads, kv_heads, hd): (usize, usize, usize),
        all: &[HeadSplit],
        rank: usize,
    ) -> Result<[Self; 2]> {
        let rows = |(first, count): (usize, usize)| (first * hd, count * hd);
        let split = all.get(rank).ok_or_else(|| {
            Error::Shape(format!(
                "rank {rank} of a head split over {} ranks",
                all.len()
            ))
        })?;
        let copies = |holders: Vec<usize>, (first, count): (usize, usize)| {
            holders.iter().any(|&h| h > 1).then(|| {
                let mine = holders[first..first + count].to_vec();
                (first, holders.len(), hd, mine)
            })
        };
        Ok([
            Self {
                mine: rows(split.query),
                split: all.iter().map(|h| h.query.1 * hd).collect(),
                copies: copies(HeadSplit::query_holders(all, heads), split.query),
            },
            Self {
                mine: rows(split.kv),
                split: all.iter().map(|h| h.kv.1 * hd).collect(),
                copies: copies(HeadSplit::kv_holders(all, kv_heads), split.kv),
            },
        ])
    }

    /// `w`, this rank's heads of a weight split along its sharded axis
    /// `per_head` entries a head, with the heads other ranks hold too
    /// declared copies (an output projection's columns).
    pub(super) fn columns<P: QuantizedPlacement>(
        &self,
        w: LinearWeight<P>,
        per_head: usize,
    ) -> Result<LinearWeight<P>> {
        match &self.copies {
            Some((first, slots, _, holders)) => w.blocks_of(*first, *slots, per_head, holders),
            None => Ok(w),
        }
    }

    /// `x` as [`columns`](Self::columns) declares a weight's (the sinks,
    /// one entry a head).
    pub(super) fn entries<P: Placement>(
        &self,
        x: ShardedArray<P>,
        per_head: usize,
    ) -> Result<ShardedArray<P>> {
        match &self.copies {
            Some((first, slots, _, holders)) => x.blocks_of(*first, *slots, per_head, holders),
            None => Ok(x),
        }
    }

    /// This rank's rows of the `[out, D]` weight `name` of shape `shape`,
    /// whose heads start at row `offset` (a fused q/k/v tensor).
    pub(super) fn weight(
        &self,
        w: &Weights,
        (name, offset): (&str, usize),
        shape: [usize; 2],
        s: &Stream,
    ) -> Result<LinearWeight<Sharded<0>>> {
        let (first, count) = self.mine;
        let weight = load_row_block(w, name, shape, (offset + first, count), &self.split, s)?;
        match &self.copies {
            Some((first, slots, block, holders)) => {
                weight.blocks_of(*first, *slots, *block, holders)
            }
            None => Ok(weight),
        }
    }

    /// This rank's entries of the bias `name` of `len` values, whose heads
    /// start at `offset`.
    pub(super) fn bias(
        &self,
        w: &Weights,
        (name, offset): (&str, usize),
        len: usize,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<0>>> {
        let (first, count) = self.mine;
        let local = w.rows(name, &[len], &[(offset + first, count)], s)?;
        let rows = self.split.iter().sum::<usize>();
        let rows = i32::try_from(rows).map_err(|_| Error::ShapeOverflow { value: rows })?;
        let bias = ShardedArray::from_local_split(local, w.comm(), &[rows], &self.split)?;
        match &self.copies {
            Some((first, slots, block, holders)) => bias.blocks_of(*first, *slots, *block, holders),
            None => Ok(bias),
        }
    }
}
