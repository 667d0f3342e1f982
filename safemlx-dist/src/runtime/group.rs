//! Owned MLX distributed groups.

use std::cell::{Cell, OnceCell, RefCell};
use std::fmt;
use std::rc::Rc;

use safemlx::{Array, Device, DeviceType, Stream};

use super::backend::Backend;
use super::composed::P2pStreams;
use super::lowering::Lowering;
use super::native::{self, NativeGroup, Unary};
use crate::error::{Error, Result};

/// An owned MLX distributed group: this process's rank among `size` ranks.
///
/// Cloning shares one native handle, freed when the last clone drops. A
/// `Group` is neither `Send` nor `Sync`: not every MLX backend documents
/// use from several threads. Rank and size are read once, at creation.
#[derive(Clone)]
pub struct Group {
    native: Rc<NativeGroup>,
    rank: usize,
    size: usize,
    backend: Backend,
    lowering: Lowering,
    p2p: Rc<OnceCell<P2pStreams>>,
    /// Collectives entered on this group so far (shared by clones).
    entered: Rc<Cell<u64>>,
    /// The output of the last collective, which the next one's input
    /// depends on (see [`Group::in_order`]).
    last: Rc<RefCell<Option<Array>>>,
}

impl Group {
    fn from_native(native: NativeGroup, backend: Backend, lowering: Lowering) -> Result<Self> {
        let (rank, size) = native.rank_and_size();
        let invalid = || Error::InvalidNativeGroup { rank, size };
        let size_ok = usize::try_from(size).ok().filter(|&s| s > 0);
        let size = size_ok.ok_or_else(invalid)?;
        let rank_ok = usize::try_from(rank).ok().filter(|&r| r < size);
        let rank = rank_ok.ok_or_else(invalid)?;
        Ok(Self {
            native: Rc::new(native),
            rank,
            size,
            backend,
            lowering,
            p2p: Rc::default(),
            entered: Rc::default(),
            last: Rc::default(),
        })
    }

    /// Counts a collective `op` on this group (see `progress.rs`).
    pub(crate) fn enter(&self, op: &'static str, input: &Array) {
        let seq = self.entered.get() + 1;
        self.entered.set(seq);
        super::progress::enter(op, seq, self.size, input);
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

    /// Initialises (or reuses: MLX caches backends process-wide) and owns
    /// this process's group for `backend`.
    ///
    /// With `strict == false`, a backend that cannot be established gives a
    /// usable singleton group (rank 0, size 1); with `strict == true`, MLX's
    /// error is returned as [`Error::Native`].
    ///
    /// Joining a group of several ranks checks that each rank holds the
    /// run's secret (`SAFEMLX_DIST_TOKEN`, set by `safemlx-launch`), before
    /// any collective: see the book's launching chapter.
    ///
    /// The group's [`Lowering`] comes from `SAFEMLX_DIST_LOWERING` (`auto`
    /// when unset). Unless it is `native`, every rank checks with one small
    /// `all_max` that all ranks read the same value, since ranks that lower
    /// collectives differently would deadlock.
    pub fn init(strict: bool, backend: Backend) -> Result<Self> {
        super::launcher_watch::watch_launcher();
        let lowering = Lowering::from_env()?;
        super::progress::timeout_from_env()?;
        super::progress::join_timeout_from_env()?;
        if launched_as_rank() {
            // Joining waits on the peers: bounded, and seen by the launcher.
            super::progress::starting();
            super::deadline::watch();
        }
        let group = {
            // Joining, admission included, is bounded by the join timeout.
            let _joining = super::deadline::joining();
            // MPI sets variables of its own here; children must not inherit them.
            let native =
                super::backend_env::recording(|| native::init(strict, backend.native_name()));
            let group = Self::from_native(native?, backend, lowering)?;
            if !group.is_singleton() {
                super::admission::admit(&group.native, group.rank, group.size, backend)?;
            }
            group
        };
        super::progress::joined(group.rank, group.size);
        group.agree_on_lowering()?;
        Ok(group)
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

    /// The same group with another lowering.
    ///
    /// This is a collective call: every rank must make it, with the same
    /// value (checked, except for `native`, as in [`Group::init`]).
    pub fn with_lowering(&self, lowering: Lowering) -> Result<Self> {
        let group = Self {
            lowering,
            ..self.clone()
        };
        group.agree_on_lowering()?;
        Ok(group)
    }

    /// Splits the group by `color`; ranks of a new group are ordered by `key`
    /// (`None` or a negative key: the current rank). The new group keeps
    /// this group's backend and lowering.
    ///
    /// Support depends on the backend (MLX 0.32: MPI and NCCL split; ring,
    /// JACCL and singleton groups return an error from MLX).
    pub fn split(&self, color: i32, key: Option<i32>) -> Result<Self> {
        let key = key.filter(|k| *k >= 0).unwrap_or(-1);
        let native = native::split(&self.native, color, key)?;
        Self::from_native(native, self.backend, self.lowering)
    }

    pub(crate) fn native(&self) -> &NativeGroup {
        &self.native
    }

    /// The send and receive streams of the composed lowerings, made on first use.
    pub(crate) fn p2p_streams(&self) -> &P2pStreams {
        self.p2p.get_or_init(P2pStreams::new)
    }

    /// Checks that every rank uses this rank's lowering: an `all_max` of
    /// `[code, -code]` gives the largest and the smallest code in the group.
    fn agree_on_lowering(&self) -> Result<()> {
        if self.is_singleton() || self.lowering == Lowering::Native {
            return Ok(());
        }
        let stream = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));
        let code = self.lowering.code() as f32;
        let mine = Array::from_slice(&[code, -code], &[2]);
        // Counted and bounded like any collective: ranks of another
        // program (MLX Python) never join it, and the timeout's message
        // then says to set SAFEMLX_DIST_LOWERING=native.
        self.enter(super::progress::AGREEMENT, &mine);
        let both = native::unary(Unary::AllMax, &mine, &self.native, &stream)?;
        super::eval(&[&both])?;
        let both = both.into_evaluated()?;
        let values = both.try_to_vec::<f32>().map_err(|e| Error::Native {
            operation: "lowering agreement",
            message: e.to_string(),
        })?;
        let (highest, lowest) = match values[..] {
            [highest, minus_lowest] => (highest as i32, -minus_lowest as i32),
            _ => (i32::MAX, i32::MIN),
        };
        if highest == lowest {
            return Ok(());
        }
        let name = |code| Lowering::from_code(code).map_or("an unknown value", Lowering::as_str);
        Err(Error::LoweringMismatch {
            this: self.lowering.as_str(),
            lowest: name(lowest),
            highest: name(highest),
        })
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

/// Initialises and owns this process's group; see [`Group::init`].
pub fn init(strict: bool, backend: Backend) -> Result<Group> {
    Group::init(strict, backend)
}

/// Whether this process was started as one rank of several (a ring
/// hostfile, an MPI job of several processes, or a launcher's progress
/// directory), so that joining its group waits on peers.
fn launched_as_rank() -> bool {
    let several = |key: &str| {
        std::env::var(key)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .is_some_and(|n| n > 1)
    };
    std::env::var_os("MLX_HOSTFILE").is_some()
        || std::env::var_os(super::PROGRESS_DIR_ENV).is_some()
        || several("OMPI_COMM_WORLD_SIZE")
}
