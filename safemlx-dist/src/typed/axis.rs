//! Mesh axes as types: arrays placed over one named axis of a
//! [`DeviceMesh`], so that the axis of every collective is checked at
//! compile time.

use std::fmt::Debug;
use std::marker::PhantomData;

use safemlx::Stream;

use super::{Collective, Partial, Placement, RedistributeTo, Replicated, ShardedArray};
use crate::error::{Error, Result};
use crate::runtime::{DeviceMesh, Group};

/// A mesh axis's name as a type. Arrays over different axes are different
/// types, and an operation naming an axis must name the array's own.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a mesh axis name",
    note = "use `Pp`, `Tp`, `Dp` or `Ep`, or implement `AxisName` for your own marker type"
)]
pub trait AxisName: Debug + 'static {
    /// The axis's name in the mesh (`DeviceMesh::new`'s names).
    const NAME: &'static str;
}

macro_rules! axis_names {
    ($($(#[$doc:meta])* $ty:ident = $name:literal;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $ty;

        impl AxisName for $ty {
            const NAME: &'static str = $name;
        }
    )*};
}

axis_names! {
    /// The pipeline axis, `pp`.
    Pp = "pp";
    /// The tensor-parallel axis, `tp`.
    Tp = "tp";
    /// The data-parallel axis, `dp`.
    Dp = "dp";
    /// The expert-parallel axis, `ep`.
    Ep = "ep";
}

/// Implemented only for an axis and itself: an operation that names its
/// axis `B` on an array over axis `A` compiles only when they are the same.
#[diagnostic::on_unimplemented(
    message = "this array is placed over mesh axis `{Self}`, not `{B}`",
    label = "names another axis than the array's",
    note = "an array's partial sums and shards are over the axis it is placed on; reduce or gather it there, or move it with `partial_over`"
)]
pub trait SameAxis<B> {}

impl<A: AxisName> SameAxis<A> for A {}

/// This rank's subgroup along the axis named `A` of a mesh, of exactly
/// `N` ranks: the group of arrays placed over that axis. Per-peer counts
/// on it are `[usize; N]`, as on a [`Mesh<N>`](super::Mesh).
///
/// ```
/// use safemlx_dist::typed::{Axis, Tp};
/// use safemlx_dist::{DeviceMesh, Group};
///
/// let mesh = DeviceMesh::new(&Group::local(), &[("dp", 1), ("tp", 1)])?;
/// let tp = Axis::<Tp, 1>::of(&mesh)?;
/// assert_eq!(tp.group().size(), 1);
/// assert_eq!(
///     Axis::<Tp, 2>::of(&mesh).unwrap_err().to_string(),
///     "this program places arrays over mesh axis `tp` of 2 ranks, but the mesh dp=1,tp=1 has 1 there"
/// );
/// # use safemlx_dist::Collective;
/// # Ok::<(), safemlx_dist::Error>(())
/// ```
#[derive(Debug)]
pub struct Axis<A: AxisName, const N: usize> {
    group: Group,
    axis: PhantomData<A>,
}

impl<A: AxisName, const N: usize> Clone for Axis<A, N> {
    fn clone(&self) -> Self {
        Self {
            group: self.group.clone(),
            axis: PhantomData,
        }
    }
}

impl<A: AxisName, const N: usize> Axis<A, N> {
    /// The axis named `A::NAME` of `mesh`, if it has `N` ranks.
    ///
    /// # Errors
    /// A mesh without that axis (naming its axes), or another size there.
    pub fn of(mesh: &DeviceMesh) -> Result<Self> {
        let group = mesh.axis(A::NAME)?;
        if group.size() != N {
            return Err(Error::Setting(format!(
                "this program places arrays over mesh axis `{}` of {N} ranks, but the mesh {mesh} has {} there",
                A::NAME,
                group.size()
            )));
        }
        Ok(Self {
            group: group.clone(),
            axis: PhantomData,
        })
    }
}

impl<A: AxisName, const N: usize> Collective for Axis<A, N> {
    type Counts = [usize; N];

    fn group(&self) -> &Group {
        &self.group
    }

    fn size(&self) -> usize {
        N
    }
}

impl<P: Placement, A: AxisName, const N: usize> ShardedArray<P, Axis<A, N>> {
    /// [`redistribute`](ShardedArray::redistribute) naming its axis: the
    /// collective runs over axis `B`, which must be the array's.
    ///
    /// # Errors
    /// As `redistribute`.
    pub fn redistribute_over<B: AxisName, To: Placement>(
        self,
        s: &Stream,
    ) -> Result<ShardedArray<To, Axis<A, N>>>
    where
        A: SameAxis<B>,
        P: RedistributeTo<To>,
    {
        self.redistribute(s)
    }
}

impl<A: AxisName, const N: usize> ShardedArray<Partial, Axis<A, N>> {
    /// The partial sums summed over axis `B`, the array's (an `all_sum`
    /// in that axis's subgroup).
    ///
    /// # Errors
    /// As [`all_sum`](ShardedArray::all_sum).
    pub fn all_sum_over<B: AxisName>(
        self,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated, Axis<A, N>>>
    where
        A: SameAxis<B>,
    {
        self.all_sum(s)
    }
}

impl<A: AxisName, const N: usize> ShardedArray<Replicated, Axis<A, N>> {
    /// This rank's whole array as its term of a sum over another axis
    /// `axis`: each data-parallel replica's gradient, replicated over its
    /// tensor-parallel ranks, is one term of the replicas' sum (DTensor's
    /// `[Partial(dp), Replicate(tp)]`, taken one axis at a time).
    ///
    /// # Errors
    /// None in practice (the shapes agree by construction).
    pub fn partial_over<B: AxisName, const M: usize>(
        &self,
        axis: &Axis<B, M>,
    ) -> Result<ShardedArray<Partial, Axis<B, M>>> {
        ShardedArray::from_local(self.local().clone(), axis, self.global_shape())
    }
}
