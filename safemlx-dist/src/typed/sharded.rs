//! `ShardedArray<P, C>`: a rank's local array, its group and the logical shape.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use safemlx::{Array, Dtype};

use super::placement::{chunk, Placement};
use super::Collective;
use crate::error::{Error, Result};
use crate::runtime::Group;

/// A logical array laid out across the ranks of `C` as placement `P`.
///
/// It holds this rank's local `safemlx::Array`, the group, and the logical
/// (global) shape; for `Sharded<AXIS>` the chunk lengths follow from the
/// logical dimension by the rule on [`Sharded`](super::Sharded), so 10 rows
/// over 3 ranks is a legal layout (4, 3, 3).
///
/// Placement transitions ([`redistribute`](Self::redistribute)) and ops
/// (see `ops.rs`) are checked by the compiler: a nonlinear function of a
/// `Partial`, a product of two `Partial`s or a matmul without a placement
/// rule do not compile. [`local`](Self::local) and
/// [`from_local`](Self::from_local) are the escape hatches for everything
/// the typed layer does not cover.
pub struct ShardedArray<P: Placement, C: Collective = Group> {
    local: Array,
    comm: C,
    global: Vec<i32>,
    /// While a gradient is traced: `local` through the identity whose
    /// gradient is summed over the ranks, made once and shared by clones,
    /// so a replicated value entering several rank-dependent ops (the gate
    /// and up projections of an MLP) costs one `all_sum` backwards.
    summed: Arc<Mutex<Option<Array>>>,
    /// For `Sharded<AXIS>`: every rank's length along `AXIS` when they are
    /// not the chunk rule's (a split by heads or by quantization groups;
    /// see [`from_local_split`](Self::from_local_split)).
    split: Option<Arc<[usize]>>,
    /// When this rank's part is one of several identical copies (see
    /// [`copy_of`](Self::copy_of)).
    copies: Option<Arc<Copies>>,
    /// For a `Partial` sum kept in float32 (see `wide_sum`): the dtype
    /// its reduced sum is rounded to.
    rounds_to: Option<Dtype>,
    _placement: PhantomData<P>,
}

/// This rank's part of a `Sharded` array as blocks of `block` entries
/// along the sharded axis, blocks `first..first + holders.len()` of
/// `slots` distinct blocks, block `first + i` held (as identical copies)
/// by `holders[i]` ranks: KV heads held by every rank whose query heads
/// read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Copies {
    first: usize,
    slots: usize,
    block: usize,
    holders: Arc<[usize]>,
}

impl<P: Placement, C: Collective> Clone for ShardedArray<P, C> {
    fn clone(&self) -> Self {
        Self {
            local: self.local.clone(),
            comm: self.comm.clone(),
            global: self.global.clone(),
            summed: Arc::clone(&self.summed),
            split: self.split.clone(),
            copies: self.copies.clone(),
            rounds_to: self.rounds_to,
            _placement: PhantomData,
        }
    }
}

impl<P: Placement, C: Collective> fmt::Debug for ShardedArray<P, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedArray")
            .field("placement", &P::name())
            .field("rank", &self.comm.rank())
            .field("size", &self.comm.size())
            .field("global_shape", &self.global)
            .field("local_shape", &self.local.shape())
            .finish()
    }
}

/// The local shape rank `rank` of `size` holds of `global` under `P`.
pub(crate) fn local_shape<P: Placement>(
    global: &[i32],
    rank: usize,
    size: usize,
) -> Result<Vec<i32>> {
    let mut shape = global.to_vec();
    if let Some(axis) = P::AXIS {
        let Some(dim) = shape.get_mut(axis) else {
            return Err(Error::Shape(format!(
                "{} needs an array with at least {} dimensions, got shape {global:?}",
                P::name(),
                axis + 1
            )));
        };
        let (_, len) = chunk(usize::try_from(*dim).unwrap_or(0), rank, size);
        *dim = i32::try_from(len).map_err(|_| Error::ShapeOverflow { value: len })?;
    }
    Ok(shape)
}

impl<C: Collective> ShardedArray<super::Partial, C> {
    /// A share of nothing: zeros of the logical shape `global`, what a
    /// rank that holds no part of a layer (no hidden column, no head)
    /// adds to the sum.
    ///
    /// # Errors
    /// A shape MLX cannot make.
    pub fn zeros(
        comm: &C,
        global: &[i32],
        dtype: safemlx::Dtype,
        s: &safemlx::Stream,
    ) -> Result<Self> {
        let local = safemlx::ops::zeros_dtype(global, dtype, s)?;
        Ok(Self::new_unchecked(local, comm.clone(), global.to_vec()))
    }
}

impl<P: Placement, C: Collective> ShardedArray<P, C> {
    /// Wraps this rank's `local` array as placement `P` of a logical array
    /// of shape `global`.
    ///
    /// # Errors
    /// When `local`'s shape is not what this rank holds of `global` under
    /// `P` (for `Sharded<AXIS>`, its chunk along `AXIS`; for the others, the
    /// whole shape), with both shapes in the message.
    pub fn from_local(local: Array, comm: &C, global: &[i32]) -> Result<Self> {
        if P::RAGGED {
            // Ragged rows are known only at run time: the trailing shape must agree.
            if local.ndim() == 0 || local.shape().get(1..) != global.get(1..) {
                return Err(Error::Shape(format!(
                    "a Ragged local array needs leading rows and the trailing shape of {global:?}; it has shape {:?}",
                    local.shape()
                )));
            }
        } else {
            let expected = local_shape::<P>(global, comm.rank(), comm.size())?;
            if local.shape() != expected.as_slice() {
                return Err(Error::Shape(format!(
                    "rank {} of {} holds {:?} of a {} array of global shape {global:?}, but the local array has shape {:?}",
                    comm.rank(),
                    comm.size(),
                    expected,
                    P::name(),
                    local.shape()
                )));
            }
        }
        let mut global = global.to_vec();
        if P::RAGGED {
            if let Some(rows) = global.first_mut() {
                *rows = -1;
            }
        }
        Ok(Self::new_unchecked(local, comm.clone(), global))
    }

    /// Wraps this rank's `local` array as `Sharded<AXIS>` of a logical
    /// array of shape `global` whose sharded axis is divided as `split`
    /// says: rank `r` holds `split[r]` elements (possibly none), in rank
    /// order, instead of the chunk rule's. Splits by heads (attention)
    /// and by quantization groups are of this kind; ops check that the
    /// splits of arrays they combine agree.
    ///
    /// # Errors
    /// A placement that shards no axis, a `split` without one length per
    /// rank or whose lengths do not add up to the axis, or a `local` array
    /// whose shape is not this rank's part, each named.
    pub fn from_local_split(
        local: Array,
        comm: &C,
        global: &[i32],
        split: &[usize],
    ) -> Result<Self> {
        let Some(axis) = P::AXIS else {
            return Err(Error::Shape(format!(
                "an explicit split is for a Sharded placement, not {}",
                P::name()
            )));
        };
        let n = comm.size();
        let dim = global.get(axis).and_then(|&d| usize::try_from(d).ok());
        if split.len() != n || dim != Some(split.iter().sum()) {
            return Err(Error::Shape(format!(
                "a split {split:?} of axis {axis} of global shape {global:?} over {n} ranks: it needs one length per rank, adding up to the axis"
            )));
        }
        let mut expected = global.to_vec();
        expected[axis] = i32::try_from(split[comm.rank()]).map_err(|_| Error::ShapeOverflow {
            value: split[comm.rank()],
        })?;
        if local.shape() != expected.as_slice() {
            return Err(Error::Shape(format!(
                "rank {} of {n} holds {expected:?} of a {} array of global shape {global:?} split {split:?}, but the local array has shape {:?}",
                comm.rank(),
                P::name(),
                local.shape()
            )));
        }
        Ok(
            Self::new_unchecked(local, comm.clone(), global.to_vec())
                .with_split(Some(split.into())),
        )
    }

    pub(crate) fn new_unchecked(local: Array, comm: C, global: Vec<i32>) -> Self {
        Self {
            local,
            comm,
            global,
            summed: Arc::new(Mutex::new(None)),
            split: None,
            copies: None,
            rounds_to: None,
            _placement: PhantomData,
        }
    }

    /// The dtype a wide partial sum is rounded to once reduced.
    pub(crate) fn rounds_to(&self) -> Option<Dtype> {
        self.rounds_to
    }

    /// The same array, rounded to `dtype` once it is reduced.
    pub(crate) fn with_rounds_to(mut self, dtype: Option<Dtype>) -> Self {
        self.rounds_to = dtype;
        self
    }

    /// The same array with every rank's lengths along the sharded axis
    /// set to `split` (`None`: the chunk rule). Unchecked: callers derive
    /// it from an array whose local shape it describes.
    pub(crate) fn with_split(mut self, split: Option<Arc<[usize]>>) -> Self {
        self.split = split.filter(|_| P::AXIS.is_some());
        self
    }

    /// The explicit split along the sharded axis, if any.
    pub(crate) fn split(&self) -> Option<&Arc<[usize]>> {
        self.split.as_ref()
    }

    /// Every rank's length along the sharded axis (the chunk rule unless
    /// the array was made with an explicit split), or `None` when the
    /// placement shards no axis.
    pub fn axis_split(&self) -> Option<Vec<usize>> {
        P::AXIS.map(|axis| self.axis_lengths(axis))
    }

    /// This rank's local array as rank-dependent computation should use
    /// it: while a gradient is traced on several ranks, through
    /// [`sum_gradients`](crate::runtime::sum_gradients), made once per array
    /// (and its clones) so that every use shares one sum.
    pub(crate) fn summed_local(&self, s: &safemlx::Stream) -> Result<Array> {
        self.summed_once(|x| crate::runtime::sum_gradients(x, self.comm.group(), s))
    }

    /// `sum` of the local array, made once per array and its clones while
    /// a gradient is traced on several ranks; the local array otherwise.
    fn summed_once(&self, sum: impl FnOnce(&Array) -> Result<Array>) -> Result<Array> {
        if !crate::runtime::is_tracing() || self.comm.size() == 1 {
            return Ok(self.local.clone());
        }
        let mut summed = self.summed_cell();
        if let Some(a) = summed.as_ref() {
            return Ok(a.clone());
        }
        let a = sum(&self.local)?;
        *summed = Some(a.clone());
        Ok(a)
    }

    /// The shared sum's cell. The Option is valid whatever a panicking
    /// holder did: no poison.
    fn summed_cell(&self) -> std::sync::MutexGuard<'_, Option<Array>> {
        self.summed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The same array, its part declared one of `holders` identical copies
    /// held by the ranks that pass the same `slot` of `slots` distinct
    /// parts: a KV head replicated on the ranks that share it, in a
    /// `Sharded<0>` weight of every rank's heads (each copy counted as a
    /// row block). The one-block case of [`blocks_of`](Self::blocks_of).
    ///
    /// # Errors
    /// As [`blocks_of`](Self::blocks_of).
    pub fn copy_of(self, slot: usize, slots: usize, holders: usize) -> Result<Self> {
        let block = self.local_axis_len();
        self.blocks_of(slot, slots, block, &[holders])
    }

    /// The same array, its part declared blocks `first..first +
    /// holders.len()` of `slots` distinct blocks of `block` entries along
    /// the sharded axis, block `first + i` held as identical copies by
    /// `holders[i]` ranks: the KV heads of a balanced head split, each on
    /// every rank whose query heads read it, in a `Sharded<0>` weight of
    /// every rank's heads (each rank's blocks counted as its rows). Every
    /// rank of the group must declare it alike (same `slots` and `block`;
    /// a rank holding none declares no holders). While a gradient is
    /// traced, each block's gradient is summed over the ranks holding it
    /// where the part enters computation, and `grad::Parameter` counts the
    /// copies once.
    ///
    /// # Errors
    /// A placement that shards no axis, blocks past `slots`, a block held
    /// by no rank, or a part whose length along the axis is not its blocks'.
    pub fn blocks_of(
        mut self,
        first: usize,
        slots: usize,
        block: usize,
        holders: &[usize],
    ) -> Result<Self> {
        if P::AXIS.is_none() {
            return Err(Error::Shape(format!(
                "a {} array declared copies held by {holders:?} ranks: copies are parts of a Sharded array (a {} one is whole on every rank already)",
                P::name(),
                P::name()
            )));
        }
        let len = self.local_axis_len();
        if first + holders.len() > slots || holders.contains(&0) || len != block * holders.len() {
            return Err(Error::Shape(format!(
                "a {} part of {len} entries declared blocks {first}..{} of {slots} blocks of {block} entries held by {holders:?} ranks: the blocks must lie below the count, each held by at least one rank, the part as long as its blocks",
                P::name(),
                first + holders.len()
            )));
        }
        self.copies = Some(Arc::new(Copies {
            first,
            slots,
            block,
            holders: holders.into(),
        }));
        Ok(self)
    }

    /// This rank's length along the sharded axis (0 for no axis).
    fn local_axis_len(&self) -> usize {
        let axis = P::AXIS.and_then(|a| self.local.shape().get(a).copied());
        usize::try_from(axis.unwrap_or(0)).unwrap_or(0)
    }

    /// Ranks holding this rank's local array: the group's size for a
    /// `Replicated` array, the holders of a copy (see
    /// [`copy_of`](Self::copy_of)), else 1; 1 too for a part whose blocks
    /// have different holders ([`block_holders`](Self::block_holders)).
    pub fn holders(&self) -> usize {
        match &self.copies {
            _ if P::REPLICATED => self.comm.size(),
            Some(c) => match *c.holders {
                [first, ref rest @ ..] if rest.iter().all(|&h| h == first) => first,
                _ => 1,
            },
            None => 1,
        }
    }

    /// For a part whose blocks are held by different numbers of ranks (see
    /// [`blocks_of`](Self::blocks_of)): the sharded axis and each block's
    /// holders.
    pub fn block_holders(&self) -> Option<(usize, &[usize])> {
        let copies = self.copies.as_deref()?;
        let axis = P::AXIS?;
        let uneven = copies.holders.windows(2).any(|w| w[0] != w[1]);
        uneven.then_some((axis, &copies.holders[..]))
    }

    /// The same array keeping this one's copy declaration (a transpose of
    /// a copied weight is the same copy).
    pub(crate) fn with_copies_of<Q: Placement>(mut self, other: &ShardedArray<Q, C>) -> Self {
        self.copies.clone_from(&other.copies);
        self
    }

    /// This rank's local array as computation uses it: a `Replicated` one
    /// meeting rank-dependent computation (`meets_shards`) through
    /// [`summed_local`](Self::summed_local); a declared copy, while a
    /// gradient is traced on several ranks, through the sum of its
    /// gradient over the ranks of its slot (made once per array and its
    /// clones); else the local array.
    pub(crate) fn operand_local(&self, meets_shards: bool, s: &safemlx::Stream) -> Result<Array> {
        if P::REPLICATED {
            return if meets_shards {
                self.summed_local(s)
            } else {
                Ok(self.local.clone())
            };
        }
        let Some(copies) = self.copies.as_deref() else {
            return Ok(self.local.clone());
        };
        self.summed_once(|x| {
            let (axis, width) = (P::AXIS.unwrap_or(0), x.shape().len());
            // Values per block: its entries along the axis times the rest.
            let across: usize = (0..width)
                .filter(|&d| d != axis)
                .map(|d| usize::try_from(x.shape()[d]).unwrap_or(0))
                .product();
            let at = crate::runtime::SharedSlots {
                first: copies.first,
                count: copies.holders.len(),
                slots: copies.slots,
                len: copies.block * across,
            };
            // The blocks contiguous: the sharded axis first.
            let front = |a: &Array| -> Result<Array> {
                Ok(match axis {
                    0 => a.clone(),
                    _ => a.move_axis(axis as i32, 0, s)?,
                })
            };
            let group = self.comm.group();
            let (_, shared) =
                crate::runtime::sum_gradients_together(&[], &[&front(x)?], at, group, s)?;
            match (axis, shared.into_iter().next()) {
                (0, Some(a)) => Ok(a),
                (_, Some(a)) => Ok(a.move_axis(0, axis as i32, s)?),
                (_, None) => Ok(x.clone()),
            }
        })
    }

    /// Whether this array's gradient sum was made (see
    /// [`summed_local`](Self::summed_local)).
    pub(crate) fn has_summed(&self) -> bool {
        self.summed_cell().is_some()
    }

    /// Records `a` as this array's local through its gradient sum (made
    /// jointly with other arrays'), for every later use.
    pub(crate) fn set_summed(&self, a: Array) {
        *self.summed_cell() = Some(a);
    }

    /// Checks that `other` divides the sharded axis as this array does.
    pub(crate) fn check_same_split<Q: Placement>(
        &self,
        other: &ShardedArray<Q, C>,
        op: &str,
    ) -> Result<()> {
        let (mine, theirs) = (self.axis_split(), other.axis_split());
        if mine == theirs {
            return Ok(());
        }
        Err(Error::Shape(format!(
            "{op} of {} {:?} split {:?} and {} {:?} split {:?}: the ranks hold different parts; both operands must divide the axis alike",
            P::name(),
            self.global_shape(),
            mine.unwrap_or_default(),
            Q::name(),
            other.global_shape(),
            theirs.unwrap_or_default()
        )))
    }

    /// This rank's local array.
    pub fn local(&self) -> &Array {
        &self.local
    }

    /// This rank's local array, by value.
    pub fn into_local(self) -> Array {
        self.local
    }

    /// The group the array is laid out over.
    pub fn comm(&self) -> &C {
        &self.comm
    }

    /// The logical (global) shape. For `Ragged` the leading dimension is
    /// `-1`: each rank holds a run-time number of rows
    /// ([`gather_rows`](Self::gather_rows) learns the total).
    pub fn global_shape(&self) -> &[i32] {
        &self.global
    }

    /// This rank's chunk lengths of the sharded axis, for every rank.
    pub(crate) fn axis_lengths(&self, axis: usize) -> Vec<usize> {
        if let (Some(split), Some(sharded)) = (&self.split, P::AXIS) {
            if sharded == axis {
                return split.to_vec();
            }
        }
        let dim = self.global.get(axis).copied().unwrap_or(0);
        super::chunk_lengths(usize::try_from(dim).unwrap_or(0), self.comm.size())
    }
}
