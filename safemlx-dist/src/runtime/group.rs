//! Owned MLX distributed groups.

use std::cell::{Cell, OnceCell, RefCell};
use std::fmt;
use std::rc::Rc;

use safemlx::Array;

use super::backend::Backend;
use super::chain::Chain;
use super::lowering::Lowering;
use super::native::{self, NativeGroup};
use super::p2p_streams::P2pStreams;
use crate::error::{Error, Result};

/// An owned MLX distributed group: this process's rank among `size` ranks.
///
/// Cloning shares one native handle, freed when the last clone drops. A
/// `Group` is neither `Send` nor `Sync`: not every MLX backend documents
/// use from several threads. Rank and size are read once, at creation.
#[derive(Clone)]
pub struct Group {
    /// `None` for [`Group::local`], which never reaches MLX, and for a
    /// subgroup composed of `send`/`recv` (`path`).
    native: Option<Rc<NativeGroup>>,
    /// A subgroup of ring neighbours (see `path.rs`).
    path: Option<Rc<Chain>>,
    rank: usize,
    size: usize,
    backend: Backend,
    lowering: Lowering,
    p2p: Rc<OnceCell<P2pStreams>>,
    /// Collectives entered on this group so far (shared by clones).
    entered: Rc<Cell<u64>>,
    /// Point-to-point operations recorded so far (shared by clones).
    p2p_entered: Rc<Cell<u64>>,
    /// Which group this is in progress records (`contract::Record`): its
    /// counts are compared only with the same group's.
    label: std::sync::Arc<str>,
    /// The output of the last collective, which the next one's input
    /// depends on (see [`Group::in_order`]).
    last: Rc<RefCell<Option<Array>>>,
}

impl Group {
    pub(super) fn from_native(
        native: NativeGroup,
        backend: Backend,
        lowering: Lowering,
    ) -> Result<Self> {
        let (rank, size) = native.rank_and_size();
        let invalid = || Error::InvalidNativeGroup { rank, size };
        let size_ok = usize::try_from(size).ok().filter(|&s| s > 0);
        let size = size_ok.ok_or_else(invalid)?;
        let rank_ok = usize::try_from(rank).ok().filter(|&r| r < size);
        let rank = rank_ok.ok_or_else(invalid)?;
        Ok(Self {
            native: Some(Rc::new(native)),
            path: None,
            rank,
            size,
            backend,
            lowering,
            p2p: Rc::default(),
            entered: Rc::default(),
            p2p_entered: Rc::default(),
            label: super::contract::WORLD.into(),
            last: Rc::default(),
        })
    }

    /// A group of this process alone (rank 0 of 1), beside whatever group
    /// the process has joined: the tensor-parallel axis of a pipeline stage
    /// that has one rank. Every collective on it is the identity, and
    /// point-to-point operations are refused ([`Error::PeerOnSingleton`]),
    /// so it never reaches MLX.
    ///
    /// ```
    /// use safemlx::{Array, Device, DeviceType, Stream};
    /// use safemlx_dist::{all_sum, Group};
    ///
    /// let s = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));
    /// let local = Group::local();
    /// assert_eq!((local.rank(), local.size()), (0, 1));
    /// let x = Array::from_slice(&[1.0f32, 2.0], &[2]);
    /// let y = all_sum(&x, &local, &s)?;
    /// assert_eq!(y.evaluated()?.try_to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    /// # Ok::<(), safemlx_dist::Error>(())
    /// ```
    pub fn local() -> Self {
        Self {
            native: None,
            path: None,
            rank: 0,
            size: 1,
            backend: Backend::Any,
            lowering: Lowering::Native,
            p2p: Rc::default(),
            entered: Rc::default(),
            p2p_entered: Rc::default(),
            label: super::contract::OWN_COUNT.into(),
            last: Rc::default(),
        }
    }

    /// The subgroup of `members` (this group's ranks, by subgroup rank)
    /// as member `me`, for a backend that cannot split: its collectives
    /// are composed of `send`/`recv` between ring neighbours along the
    /// members, consecutive on the ring (`path.rs`), or, when `relayed`,
    /// go through this group's `all_to_all_v` (`relay.rs`). `None` for one
    /// member or all of them.
    pub(super) fn subgroup(&self, members: Vec<usize>, me: usize, relayed: bool) -> Option<Self> {
        let native = self.native.clone()?;
        let label = members_label(&self.label, &members).into();
        let chain = Chain::new(native, self.size, self.p2p.clone(), members, relayed)?;
        Some(Self {
            native: None,
            rank: me,
            size: chain.len(),
            backend: self.backend,
            lowering: self.lowering,
            p2p: Rc::default(),
            entered: Rc::default(),
            p2p_entered: Rc::default(),
            label,
            last: Rc::default(),
            path: Some(Rc::new(chain)),
        })
    }

    /// How this group carries its collectives: `"mlx"` (an MLX group: a
    /// world, or a split on MPI or NCCL), `"local"` ([`Group::local`]),
    /// `"chain"` (a mesh axis on ring whose ranks are neighbours:
    /// `send`/`recv` along them) or `"relay"` (a mesh axis on ring through
    /// the world's `all_to_all_v`).
    pub fn route(&self) -> &'static str {
        match (&self.native, self.path.as_deref()) {
            (Some(_), _) => "mlx",
            (None, Some(chain)) if chain.is_relayed() => "relay",
            (None, Some(_)) => "chain",
            (None, None) => "local",
        }
    }

    /// The ring-neighbour subgroup this group is, if it is one.
    pub(crate) fn path(&self) -> Option<&Chain> {
        self.path.as_deref()
    }

    /// Counts a collective `op` on this group (see `progress.rs`).
    pub(crate) fn enter(&self, op: &'static str, input: &Array) {
        let seq = self.entered.get() + 1;
        self.entered.set(seq);
        super::progress::enter(op, seq, &self.label, self.size, input);
    }

    /// This group (split from `parent`) as `parent`'s subgroup of
    /// `members`, for progress records.
    pub(crate) fn labelled_as_subgroup_of(mut self, parent: &Group, members: &[usize]) -> Self {
        self.label = members_label(&parent.label, members).into();
        self
    }

    /// Records a point-to-point `op` (a pipeline stage's send or receive)
    /// as this rank's current wait: the evaluation that performs it is then
    /// bounded by `SAFEMLX_DIST_TIMEOUT`, and a timeout names it. Not
    /// counted in [`collectives_entered`](Self::collectives_entered).
    pub(crate) fn enter_point_to_point(&self, op: &'static str, input: &Array) {
        let seq = self.p2p_entered.get() + 1;
        self.p2p_entered.set(seq);
        let own: std::sync::Arc<str> = super::contract::OWN_COUNT.into();
        super::progress::enter(op, seq, &own, self.size, input);
    }

    /// Runs the collective `run` on `input` made to depend on the output of
    /// the previous collective on this group, so that every rank's graph
    /// performs its collectives in the order the program issued them.
    ///
    /// Without this MLX may schedule two independent collectives in either
    /// order: a rank whose contribution does not depend on the previous
    /// collective (zeros from a rank with no attention head) ran the next
    /// `all_sum` first and swapped the two sums' operands across ranks.
    pub(crate) fn in_order(
        &self,
        input: &Array,
        run: impl FnOnce(&Array) -> Result<Array>,
    ) -> Result<Array> {
        let last = self.last.borrow().clone();
        let input = match last {
            Some(last) => safemlx::transforms::depends([input], [&last])?
                .pop()
                .unwrap_or_else(|| input.clone()),
            None => input.clone(),
        };
        let out = run(&input)?;
        *self.last.borrow_mut() = Some(out.clone());
        Ok(out)
    }

    /// How many collectives (all_sum, all_max, all_min, all_gather,
    /// sum_scatter, all_to_all_v) this process has entered on this group;
    /// point-to-point sends and receives are not counted.
    pub fn collectives_entered(&self) -> u64 {
        self.entered.get()
    }

    /// This process's zero-based rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether this is a one-process group (every collective is then the identity).
    pub fn is_singleton(&self) -> bool {
        self.size == 1
    }

    /// The backend the group was initialised with ([`Backend::Any`] when MLX chose).
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// How this group lowers collectives.
    pub fn lowering(&self) -> Lowering {
        self.lowering
    }

    /// Splits the group by `color`; ranks of a new group are ordered by `key`
    /// (`None` or a negative key: the current rank). The new group keeps
    /// this group's backend and lowering.
    ///
    /// Support depends on the backend (MLX 0.32: MPI and NCCL split; ring,
    /// JACCL and singleton groups return an error from MLX).
    pub fn split(&self, color: i32, key: Option<i32>) -> Result<Self> {
        let key = key.filter(|k| *k >= 0).unwrap_or(-1);
        let native = native::split(self.native()?, color, key)?;
        let mut group = Self::from_native(native, self.backend, self.lowering)?;
        group.label = format!("{}:split-{color}", self.label).into();
        Ok(group)
    }

    /// The same group with another lowering, unchecked (see
    /// `Group::with_lowering`).
    pub(super) fn relowered(&self, lowering: Lowering) -> Self {
        Self {
            lowering,
            ..self.clone()
        }
    }

    /// MLX's group; an error for [`Group::local`], whose collectives all
    /// return before reaching MLX.
    pub(crate) fn native(&self) -> Result<&NativeGroup> {
        let message = if self.path.is_some() {
            "a mesh axis on a backend that cannot split (ring, JACCL) is composed of send/recv and has no MLX group: splitting it needs MPI or NCCL"
        } else {
            "a local group (Group::local) has no MLX group"
        };
        self.native.as_deref().ok_or(Error::Native {
            operation: "mlx_distributed_group",
            message: message.to_owned(),
        })
    }

    /// The send and receive streams of the composed lowerings, made on first use.
    pub(crate) fn p2p_streams(&self) -> &P2pStreams {
        self.p2p.get_or_init(P2pStreams::new)
    }
}

/// The progress-record label of the subgroup of `members` (ranks of the
/// group labelled `parent`): world ranks where the parent's are known
/// (`0,2`), else the parent's label and the members.
fn members_label(parent: &str, members: &[usize]) -> String {
    let known: Option<Vec<usize>> = if parent == super::contract::WORLD {
        Some(members.to_vec())
    } else {
        let ranks: Option<Vec<usize>> = parent.split(',').map(|r| r.parse().ok()).collect();
        ranks.and_then(|ranks| members.iter().map(|&m| ranks.get(m).copied()).collect())
    };
    let join = |ranks: &[usize], by: &str| {
        ranks
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(by)
    };
    match known {
        Some(ranks) => join(&ranks, ","),
        None => format!("{parent}:{}", join(members, ".")),
    }
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}
