//! Groups whose size is a compile-time constant.

use super::Collective;
use crate::error::{Error, Result};
use crate::runtime::Group;

/// A group of exactly `N` ranks, known at compile time.
///
/// With a `Mesh<N>`, per-peer counts are `[usize; N]`, so a count array of
/// the wrong length does not compile, and arrays of meshes of different sizes
/// are different types. Creating one checks the run's size:
///
/// ```
/// use safemlx_dist::{init, Backend, Mesh};
///
/// let group = init(false, Backend::Ring)?; // one rank here
/// assert!(Mesh::<1>::new(group.clone()).is_ok());
/// assert_eq!(
///     Mesh::<4>::new(group).unwrap_err().to_string(),
///     "this program is written for a mesh of 4 ranks but was started with 1; launch it with -n 4"
/// );
/// # Ok::<(), safemlx_dist::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Mesh<const N: usize> {
    group: Group,
}

impl<const N: usize> Mesh<N> {
    /// Wraps `group` if it has exactly `N` ranks.
    pub fn new(group: Group) -> Result<Self> {
        if group.size() == N {
            Ok(Self { group })
        } else {
            Err(Error::MeshSize {
                expected: N,
                actual: group.size(),
            })
        }
    }
}

impl<const N: usize> Collective for Mesh<N> {
    type Counts = [usize; N];

    fn group(&self) -> &Group {
        &self.group
    }

    fn size(&self) -> usize {
        N
    }
}
