//! Which algorithm carries a collective: MLX's native op or a composition of
//! MLX's own `send`/`recv`, chosen per backend, group size and message size.
//!
//! Every rank of a group must choose the same way, or their sends and
//! receives do not pair up and the group deadlocks. The choice therefore
//! depends only on values all ranks share: the backend, the group size, the
//! message's byte size (equal on every rank for these collectives) and the
//! [`Lowering`] setting, which `Group::init` reads once from
//! `SAFEMLX_DIST_LOWERING` and checks is the same on every rank.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;
use crate::Backend;

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
}

impl Lowering {
    /// `auto`, `native` or `composed`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Native => "native",
            Self::Composed => "composed",
        }
    }

    /// A small code exchanged between ranks to check they agree.
    pub(crate) const fn code(self) -> i32 {
        match self {
            Self::Auto => 0,
            Self::Native => 1,
            Self::Composed => 2,
        }
    }

    /// The inverse of [`Lowering::code`].
    pub(crate) fn from_code(code: i32) -> Option<Self> {
        [Self::Auto, Self::Native, Self::Composed]
            .into_iter()
            .find(|l| l.code() == code)
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
        [Self::Auto, Self::Native, Self::Composed]
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
}

/// The ring backend's all-reduce sizes where the composition measured
/// faster than MLX's op (4 MiB at 2 and 4 ranks; 2 MiB, between the 1 MiB
/// where MLX's op won and the 4 MiB where the composition did, is not
/// measured); below, MLX's op has the lower latency, above (16 and 64 MiB)
/// its bandwidth wins. See the book's "Backends and lowerings" table.
pub(crate) const RING_ALL_REDUCE_COMPOSED_BYTES: std::ops::RangeInclusive<usize> =
    (2 << 20)..=(8 << 20);

/// Whether the compositions may run on `backend`: they need a send and a
/// receive in flight at once from two threads. MLX's ring backend allows
/// that; MLX initialises MPI without `MPI_THREAD_MULTIPLE`, and a blocked
/// `MPI_Send` of a large message then never sees its peer's receive (a
/// measured deadlock at 64 KiB), so MPI, and an unknown backend, stay native.
pub(crate) fn composable(backend: Backend) -> bool {
    backend == Backend::Ring
}

pub(crate) fn all_reduce(
    lowering: Lowering,
    backend: Backend,
    elements: usize,
    bytes: usize,
    size: usize,
) -> AllReducePlan {
    // The composition splits the elements into `size` chunks: it needs one each.
    if elements < size || !composable(backend) {
        return AllReducePlan::Native;
    }
    match lowering {
        Lowering::Native => AllReducePlan::Native,
        Lowering::Composed => AllReducePlan::Ring,
        Lowering::Auto => match backend {
            Backend::Ring if RING_ALL_REDUCE_COMPOSED_BYTES.contains(&bytes) => AllReducePlan::Ring,
            _ => AllReducePlan::Native,
        },
    }
}

pub(crate) fn sum_scatter(lowering: Lowering, backend: Backend) -> SumScatterPlan {
    let native_has_it = backend == Backend::Nccl;
    match lowering {
        _ if native_has_it => SumScatterPlan::Native,
        Lowering::Composed | Lowering::Auto if composable(backend) => SumScatterPlan::Ring,
        _ => SumScatterPlan::AllSumSlice,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowering_names_parse_and_bad_ones_are_explained() {
        for l in [Lowering::Auto, Lowering::Native, Lowering::Composed] {
            assert_eq!(l.as_str().parse::<Lowering>(), Ok(l));
            assert_eq!(Lowering::from_code(l.code()), Some(l));
        }
        assert_eq!(
            "fast".parse::<Lowering>().unwrap_err().to_string(),
            "SAFEMLX_DIST_LOWERING must be native, composed or auto, got \"fast\""
        );
    }

    #[test]
    fn plans_follow_the_documented_rules() {
        use AllReducePlan as A;
        use SumScatterPlan as S;
        let mib = 1 << 20;
        assert_eq!(
            all_reduce(Lowering::Auto, Backend::Ring, mib / 4, mib, 2),
            A::Native
        );
        assert_eq!(
            all_reduce(Lowering::Auto, Backend::Ring, mib, 4 * mib, 2),
            A::Ring
        );
        assert_eq!(
            all_reduce(Lowering::Auto, Backend::Ring, 2 * mib, 8 * mib, 4),
            A::Ring
        );
        assert_eq!(
            all_reduce(Lowering::Auto, Backend::Ring, 4 * mib, 16 * mib, 4),
            A::Native
        );
        assert_eq!(
            all_reduce(Lowering::Auto, Backend::Ring, 16 * mib, 64 * mib, 2),
            A::Native
        );
        assert_eq!(
            all_reduce(Lowering::Auto, Backend::Mpi, 1024, 4096, 4),
            A::Native
        );
        assert_eq!(
            all_reduce(Lowering::Auto, Backend::Ring, 1024, 4096, 2),
            A::Native
        );
        assert_eq!(
            all_reduce(Lowering::Composed, Backend::Mpi, 1024, 4096, 4),
            A::Native
        );
        assert_eq!(
            all_reduce(Lowering::Composed, Backend::Ring, 1024, 4096, 4),
            A::Ring
        );
        assert_eq!(
            all_reduce(Lowering::Composed, Backend::Ring, 3, 12, 4),
            A::Native
        );
        assert_eq!(
            all_reduce(Lowering::Native, Backend::Ring, 1024, 4096, 2),
            A::Native
        );
        assert_eq!(sum_scatter(Lowering::Auto, Backend::Ring), S::Ring);
        assert_eq!(sum_scatter(Lowering::Auto, Backend::Mpi), S::AllSumSlice);
        assert_eq!(sum_scatter(Lowering::Auto, Backend::Any), S::AllSumSlice);
        assert_eq!(sum_scatter(Lowering::Native, Backend::Ring), S::AllSumSlice);
        assert_eq!(sum_scatter(Lowering::Auto, Backend::Nccl), S::Native);
        assert_eq!(
            sum_scatter(Lowering::Composed, Backend::Mpi),
            S::AllSumSlice
        );
        assert_eq!(sum_scatter(Lowering::Composed, Backend::Ring), S::Ring);
    }
}
