//! Joining a group: the backend's connection, bounded and watched, the
//! run's secret, and the agreement on the lowering.

use safemlx::{Array, Device, DeviceType, Stream};

use super::backend::Backend;
use super::group::Group;
use super::lowering::Lowering;
use super::native::{self, Unary};
use crate::error::{Error, Result};

impl Group {
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
            let group = Group::from_native(native?, backend, lowering)?;
            if !group.is_singleton() {
                super::admission::admit(group.native()?, group.rank(), group.size(), backend)?;
            }
            group
        };
        super::progress::joined(group.rank(), group.size());
        if group.size() > 1 {
            super::deadline::watch();
        }
        group.agree_on_lowering()?;
        Ok(group)
    }

    /// The same group with another lowering.
    ///
    /// This is a collective call: every rank must make it, with the same
    /// value (checked, except for `native`, as in [`Group::init`]).
    pub fn with_lowering(&self, lowering: Lowering) -> Result<Self> {
        let group = self.relowered(lowering);
        group.agree_on_lowering()?;
        Ok(group)
    }

    /// Checks that every rank uses this rank's lowering: an `all_max` of
    /// `[code, -code]` gives the largest and the smallest code in the group.
    fn agree_on_lowering(&self) -> Result<()> {
        if self.is_singleton() || self.lowering() == Lowering::Native {
            return Ok(());
        }
        let stream = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));
        let code = self.lowering().code() as f32;
        let mine = Array::from_slice(&[code, -code], &[2]);
        // Counted and bounded like any collective: ranks of another
        // program (MLX Python) never join it, and the timeout's message
        // then says to set SAFEMLX_DIST_LOWERING=native.
        self.enter(super::progress::AGREEMENT, &mine);
        let both = native::unary(Unary::AllMax, &mine, self.native()?, &stream)?;
        let values = super::read_back::<f32>(&both, "lowering agreement")?;
        let (highest, lowest) = match values[..] {
            [highest, minus_lowest] => (highest as i32, -minus_lowest as i32),
            _ => (i32::MAX, i32::MIN),
        };
        if highest == lowest {
            return Ok(());
        }
        let name = |code| Lowering::from_code(code).map_or("an unknown value", Lowering::as_str);
        Err(Error::LoweringMismatch {
            this: self.lowering().as_str(),
            lowest: name(lowest),
            highest: name(highest),
        })
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
