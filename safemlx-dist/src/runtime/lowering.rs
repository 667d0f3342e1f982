//! Which algorithm carries a collective: MLX's native op, a composition of
//! MLX's own `send`/`recv`, or one of MLX's `all_to_all_v`, chosen per
//! backend, group size and message size.
//!
//! Every rank of a group must choose the same way, or their sends and
//! receives do not pair up and the group deadlocks. The choice therefore
//! depends only on values all ranks share: the backend, the group size, the
//! message's byte size (equal on every rank for these collectives) and the
//! [`Lowering`] setting, which `Group::init` reads once from
//! `SAFEMLX_DIST_LOWERING` and checks is the same on every rank.

use std::fmt;
use std::str::FromStr;

use super::Backend;
use crate::error::Error;

/// The environment variable that forces a lowering on every rank.
pub const LOWERING_ENV: &str = "SAFEMLX_DIST_LOWERING";

/// How collectives are lowered; see the book's "Backends and lowerings".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Lowering {
    /// Measured rules: a composition where it is faster, MLX's op otherwise.
    #[default]
    Auto,
    /// MLX's native collectives only (`sum_scatter` becomes `all_sum` plus a
    /// slice where MLX has no reduce-scatter). Required when ranks of other
    /// programs, e.g. MLX Python ranks, share the group.
    Native,
    /// The `send`/`recv` compositions wherever the backend allows them
    /// (ring), for benchmarks and tests; MPI keeps its native ops, since
    /// MLX's MPI backend does not allow a send and a receive in flight at
    /// once from two threads.
    Composed,
    /// Reductions as chunk exchanges with MLX's `all_to_all_v`: an
    /// all-reduce is a reduce-scatter (one `all_to_all_v`, then a local
    /// reduction) and an all-gather (a second `all_to_all_v`); a
    /// `sum_scatter` is the first half. For benchmarks and tests; `auto`
    /// uses it where it measured fastest.
    AllToAll,
}

impl Lowering {
    /// `auto`, `native`, `composed` or `all_to_all`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Native => "native",
            Self::Composed => "composed",
            Self::AllToAll => "all_to_all",
        }
    }

    /// Every lowering.
    pub const ALL: [Self; 4] = [Self::Auto, Self::Native, Self::Composed, Self::AllToAll];

    /// A small code exchanged between ranks to check they agree.
    pub(crate) const fn code(self) -> i32 {
        match self {
            Self::Auto => 0,
            Self::Native => 1,
            Self::Composed => 2,
            Self::AllToAll => 3,
        }
    }

    /// The inverse of [`Lowering::code`].
    pub(crate) fn from_code(code: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|l| l.code() == code)
    }

    /// `SAFEMLX_DIST_LOWERING`, or `auto` when unset.
    pub fn from_env() -> Result<Self, Error> {
        match std::env::var(LOWERING_ENV) {
            Ok(value) => value.parse(),
            Err(std::env::VarError::NotPresent) => Ok(Self::Auto),
            Err(std::env::VarError::NotUnicode(value)) => Err(Error::InvalidLowering {
                value: value.to_string_lossy().into_owned(),
            }),
        }
    }
}

impl fmt::Display for Lowering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Lowering {
    type Err = Error;

    fn from_str(value: &str) -> Result<Self, Error> {
        Self::ALL
            .into_iter()
            .find(|l| l.as_str() == value)
            .ok_or_else(|| Error::InvalidLowering {
                value: value.to_owned(),
            })
    }
}

/// The algorithm of an all-reduce (`all_sum`, `all_max`, `all_min`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllReducePlan {
    /// MLX's op.
    Native,
    /// Ring reduce-scatter then ring all-gather, from `send`/`recv` to neighbours.
    Ring,
    /// Reduce-scatter and all-gather, one `all_to_all_v` each.
    AllToAll,
}

/// The algorithm of a `sum_scatter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SumScatterPlan {
    /// MLX's op (backends that have it: NCCL).
    Native,
    /// MLX's `all_sum`, then this rank's chunk.
    AllSumSlice,
    /// Ring reduce-scatter from `send`/`recv` to neighbours.
    Ring,
    /// One `all_to_all_v` of the chunks, then a local sum.
    AllToAll,
}

/// The ring backend's all-reduce sizes where the `send`/`recv` composition
/// measured faster than MLX's op: 4 MiB at 2 and 4 ranks (above 2 MiB, up
/// to 8 MiB); above, MLX's op has the bandwidth (16 and 64 MiB). See the
/// book's "Backends and lowerings" table.
fn ring_composition_wins(bytes: usize) -> bool {
    bytes > (2 << 20) && bytes <= (8 << 20)
}

/// The ring backend's all-reduce sizes where the two `all_to_all_v`
/// measured faster than MLX's op: 1 and 2 MiB at 2 ranks (median 1.4 ms
/// against 4-6 ms at 1 MiB, 3.0-3.3 against 4.7-6.7 at 2 MiB); MLX's op wins
/// below 1 MiB, at 4 ranks, and from 16 MiB.
fn ring_all_to_all_wins(bytes: usize, size: usize) -> bool {
    size == 2 && ((1 << 20)..=(2 << 20)).contains(&bytes)
}

/// Whether the compositions may run on `backend`: they need a send and a
/// receive in flight at once from two threads. MLX's ring backend allows
/// that; MLX initialises MPI without `MPI_THREAD_MULTIPLE`, and a blocked
/// `MPI_Send` of a large message then never sees its peer's receive (a
/// measured deadlock at 64 KiB), so MPI, and an unknown backend, stay native.
/// The `all_to_all_v` exchanges are one MLX operation at a time and run on
/// MPI too (see [`exchangeable`]).
pub(crate) fn composable(backend: Backend) -> bool {
    backend == Backend::Ring
}

/// Whether the `all_to_all_v` exchanges may run on `backend`: they are one
/// MLX operation at a time, so wherever MLX has `all_to_all_v` (ring, MPI).
pub(crate) fn exchangeable(backend: Backend) -> bool {
    matches!(backend, Backend::Ring | Backend::Mpi)
}

pub(crate) fn all_reduce(
    lowering: Lowering,
    backend: Backend,
    elements: usize,
    bytes: usize,
    size: usize,
) -> AllReducePlan {
    // The compositions split the elements into `size` chunks: one each at least.
    if elements < size {
        return AllReducePlan::Native;
    }
    if lowering == Lowering::AllToAll && exchangeable(backend) {
        return AllReducePlan::AllToAll;
    }
    if !composable(backend) {
        return AllReducePlan::Native;
    }
    match lowering {
        Lowering::Native => AllReducePlan::Native,
        Lowering::Composed => AllReducePlan::Ring,
        Lowering::AllToAll => AllReducePlan::AllToAll,
        Lowering::Auto if ring_all_to_all_wins(bytes, size) => AllReducePlan::AllToAll,
        Lowering::Auto if ring_composition_wins(bytes) => AllReducePlan::Ring,
        Lowering::Auto => AllReducePlan::Native,
    }
}

/// The ring backend's `sum_scatter` sizes where one `all_to_all_v` measured
/// faster than the ring composition: up to 1 MiB at 2 ranks (0.1-0.8 ms
/// against 0.5-3.8 ms); from 4 MiB, and at 4 ranks, the ring wins.
fn ring_sum_scatter_all_to_all_wins(bytes: usize, size: usize) -> bool {
    size == 2 && bytes <= (1 << 20)
}

/// The MPI `sum_scatter` sizes where one `all_to_all_v` measured faster
/// than MLX's `all_sum` + slice: from 256 KiB (1.7-2x at 4 and 16 MiB, 2
/// and 4 ranks); below, they are within noise of each other.
fn mpi_sum_scatter_all_to_all_wins(bytes: usize) -> bool {
    bytes >= (256 << 10)
}

pub(crate) fn sum_scatter(
    lowering: Lowering,
    backend: Backend,
    bytes: usize,
    size: usize,
) -> SumScatterPlan {
    let native_has_it = backend == Backend::Nccl;
    match lowering {
        _ if native_has_it => SumScatterPlan::Native,
        Lowering::AllToAll if exchangeable(backend) => SumScatterPlan::AllToAll,
        Lowering::Auto if backend == Backend::Mpi && mpi_sum_scatter_all_to_all_wins(bytes) => {
            SumScatterPlan::AllToAll
        }
        _ if !composable(backend) => SumScatterPlan::AllSumSlice,
        Lowering::AllToAll => SumScatterPlan::AllToAll,
        Lowering::Auto if ring_sum_scatter_all_to_all_wins(bytes, size) => SumScatterPlan::AllToAll,
        Lowering::Composed | Lowering::Auto => SumScatterPlan::Ring,
        Lowering::Native => SumScatterPlan::AllSumSlice,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowering_names_parse_and_bad_ones_are_explained() {
        for l in Lowering::ALL {
            assert_eq!(l.as_str().parse::<Lowering>(), Ok(l));
            assert_eq!(Lowering::from_code(l.code()), Some(l));
        }
        assert_eq!(
            "fast".parse::<Lowering>().unwrap_err().to_string(),
            "SAFEMLX_DIST_LOWERING must be native, composed, all_to_all or auto, got \"fast\""
        );
    }

    #[test]
    fn plans_follow_the_documented_rules() {
        use AllReducePlan as A;
        use SumScatterPlan as S;
        let mib = 1 << 20;
        // (lowering, backend, elements, bytes, ranks, plan)
        let all_reduce_cases = [
            (
                Lowering::Auto,
                Backend::Ring,
                mib / 8,
                mib / 2,
                2,
                A::Native,
            ),
            (Lowering::Auto, Backend::Ring, mib / 4, mib, 2, A::AllToAll),
            (Lowering::Auto, Backend::Ring, mib / 4, mib, 4, A::Native),
            (Lowering::Auto, Backend::Ring, mib, 4 * mib, 2, A::Ring),
            (
                Lowering::AllToAll,
                Backend::Ring,
                1024,
                4096,
                3,
                A::AllToAll,
            ),
            (Lowering::AllToAll, Backend::Mpi, 1024, 4096, 2, A::AllToAll),
            (Lowering::Auto, Backend::Mpi, mib / 4, mib, 2, A::Native),
            (Lowering::Auto, Backend::Ring, 2 * mib, 8 * mib, 4, A::Ring),
            (
                Lowering::Auto,
                Backend::Ring,
                4 * mib,
                16 * mib,
                4,
                A::Native,
            ),
            (
                Lowering::Auto,
                Backend::Ring,
                16 * mib,
                64 * mib,
                2,
                A::Native,
            ),
            (Lowering::Auto, Backend::Mpi, 1024, 4096, 4, A::Native),
            (Lowering::Auto, Backend::Ring, 1024, 4096, 2, A::Native),
            (Lowering::Composed, Backend::Mpi, 1024, 4096, 4, A::Native),
            (Lowering::Composed, Backend::Ring, 1024, 4096, 4, A::Ring),
            (Lowering::Composed, Backend::Ring, 3, 12, 4, A::Native),
            (Lowering::Native, Backend::Ring, 1024, 4096, 2, A::Native),
        ];
        for (lowering, backend, elements, bytes, size, plan) in all_reduce_cases {
            assert_eq!(
                all_reduce(lowering, backend, elements, bytes, size),
                plan,
                "{lowering} {backend} {bytes} bytes x{size}"
            );
        }
        let ss = |lowering, backend, bytes, size| sum_scatter(lowering, backend, bytes, size);
        assert_eq!(ss(Lowering::Auto, Backend::Ring, 16 * mib, 2), S::Ring);
        assert_eq!(ss(Lowering::Auto, Backend::Ring, mib, 2), S::AllToAll);
        assert_eq!(ss(Lowering::Auto, Backend::Ring, mib, 4), S::Ring);
        assert_eq!(ss(Lowering::Auto, Backend::Mpi, mib / 8, 2), S::AllSumSlice);
        assert_eq!(ss(Lowering::Auto, Backend::Mpi, 16 * mib, 2), S::AllToAll);
        assert_eq!(ss(Lowering::Auto, Backend::Any, mib, 2), S::AllSumSlice);
        assert_eq!(ss(Lowering::Native, Backend::Ring, mib, 2), S::AllSumSlice);
        assert_eq!(ss(Lowering::Auto, Backend::Nccl, mib, 2), S::Native);
        assert_eq!(ss(Lowering::Composed, Backend::Mpi, mib, 2), S::AllSumSlice);
        assert_eq!(ss(Lowering::Composed, Backend::Ring, mib, 2), S::Ring);
        assert_eq!(
            ss(Lowering::AllToAll, Backend::Ring, 16 * mib, 4),
            S::AllToAll
        );
        assert_eq!(ss(Lowering::AllToAll, Backend::Mpi, mib, 2), S::AllToAll);
        assert_eq!(ss(Lowering::AllToAll, Backend::Any, mib, 2), S::AllSumSlice);
    }
}
