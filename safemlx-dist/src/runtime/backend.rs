//! The communication backends MLX 0.32 knows.

use std::ffi::CStr;
use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// A distributed communication backend of MLX.
///
/// | variant | name | set-up |
/// |---|---|---|
/// | `Any` | `any` | MLX picks the first one that initialises |
/// | `Ring` | `ring` | TCP ring: `MLX_RANK`, `MLX_HOSTFILE` (JSON `[["ip:port", ...], ...]`, one list per rank) |
/// | `Mpi` | `mpi` | Open MPI, loaded at run time (`MLX_MPI_LIBNAME` overrides the library) |
/// | `Jaccl` | `jaccl` | RDMA on supported macOS systems: `MLX_RANK`, `MLX_IBV_DEVICES`, `MLX_JACCL_COORDINATOR` |
/// | `Nccl` | `nccl` | CUDA builds: `NCCL_HOST_IP`, `NCCL_PORT`, `MLX_RANK`, `MLX_WORLD_SIZE` |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Let MLX choose (passed to MLX as a null backend name).
    Any,
    /// MLX's TCP ring.
    Ring,
    /// Open MPI.
    Mpi,
    /// JACCL (RDMA) on supported macOS systems.
    Jaccl,
    /// NCCL in CUDA builds.
    Nccl,
}

impl Backend {
    /// Every backend, in the order of the table above.
    pub const ALL: [Backend; 5] = [Self::Any, Self::Ring, Self::Mpi, Self::Jaccl, Self::Nccl];

    /// The backend's name: `any`, `ring`, `mpi`, `jaccl` or `nccl`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Any => "any",
            Self::Ring => "ring",
            Self::Mpi => "mpi",
            Self::Jaccl => "jaccl",
            Self::Nccl => "nccl",
        }
    }

    /// The name MLX-C takes: `None` (null) for `Any`.
    pub(crate) fn native_name(self) -> Option<&'static CStr> {
        match self {
            Self::Any => None,
            Self::Ring => Some(c"ring"),
            Self::Mpi => Some(c"mpi"),
            Self::Jaccl => Some(c"jaccl"),
            Self::Nccl => Some(c"nccl"),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Backend {
    type Err = Error;

    /// Accepts exactly the five names; checked before anything reaches MLX.
    fn from_str(name: &str) -> Result<Self> {
        if name.contains('\0') {
            return Err(Error::BackendNameNul);
        }
        Self::ALL
            .into_iter()
            .find(|backend| backend.as_str() == name)
            .ok_or_else(|| Error::UnknownBackend {
                name: name.to_owned(),
            })
    }
}

impl TryFrom<&str> for Backend {
    type Error = Error;

    fn try_from(name: &str) -> Result<Self> {
        name.parse()
    }
}

impl TryFrom<String> for Backend {
    type Error = Error;

    fn try_from(name: String) -> Result<Self> {
        name.parse()
    }
}

/// Whether MLX was built with `backend`. Says nothing about whether peers
/// or the environment are configured: [`init`](crate::runtime::init) tells that.
pub fn is_available(backend: Backend) -> bool {
    super::native::is_available(backend.native_name())
}
