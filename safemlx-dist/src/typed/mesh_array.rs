//! `MeshArray<P, M>`: one array placed over several mesh axes at once, one
//! placement per axis (DTensor's `[Shard(0), Replicate()]`, JAX's
//! `P('dp', 'tp')`).
//!
//! `M` is a tuple of [`Axis`] types, outer first, and `P` a tuple of
//! placements of the same length: `MeshArray<(Sharded<0>, Partial),
//! (Axis<Dp, 2>, Axis<Tp, 2>)>` holds this replica's rows of a batch as
//! partial sums over its tensor-parallel ranks. Each axis follows the
//! single-group rules of [`ShardedArray`]: a collective names its axis by
//! value (`all_sum_over(Tp, s)`), runs in that axis's subgroup, and
//! changes that axis's placement only; along every other axis nothing
//! moves.

use std::fmt::Debug;
use std::marker::PhantomData;

use safemlx::{Array, Stream};

use super::axis::{Axis, AxisName};
use super::placement::{chunk, Nonlinear, Partial, Placement, Replicated, Sharded};
use super::{Collective, RedistributeTo, ShardedArray};
use crate::error::{Error, Result};
use crate::runtime::{slice_axis, Group};

/// A placement along one axis of a [`MeshArray`]: `Replicated`,
/// `Sharded<D>` or `Partial` (ragged rows have one axis only).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be one axis's placement of a mesh array",
    note = "each axis is `Replicated`, `Sharded<D>` or `Partial`"
)]
pub trait AxisPlacement: Placement {}

impl AxisPlacement for Replicated {}
impl<const D: usize> AxisPlacement for Sharded<D> {}
impl AxisPlacement for Partial {}

/// An axis's position in a tuple of axes, as a type.
pub trait Position {
    /// The position, 0 for the outermost axis.
    const AT: usize;
}

/// The first (outermost) axis.
#[derive(Debug)]
pub struct First;
/// The second axis.
#[derive(Debug)]
pub struct Second;
/// The third axis.
#[derive(Debug)]
pub struct Third;

impl Position for First {
    const AT: usize = 0;
}
impl Position for Second {
    const AT: usize = 1;
}
impl Position for Third {
    const AT: usize = 2;
}

/// The mesh axes an array is placed over: a tuple of two or three
/// [`Axis`] types, outer first.
pub trait AxisSet: Clone + Debug + 'static {
    /// The axes' subgroups, outer first.
    fn groups(&self) -> Vec<&Group>;
    /// The axes' names, outer first.
    fn names() -> Vec<&'static str>;
}

/// One placement per axis: a tuple of [`AxisPlacement`]s as long as the
/// array's [`AxisSet`].
pub trait MeshPlacement: Copy + Default + Debug + 'static {
    /// Each axis's sharded dimension (`None`: not sharded), outer first.
    fn dims() -> Vec<Option<usize>>;
    /// Whether each axis is `Replicated`, outer first.
    fn replicated() -> Vec<bool>;
    /// The placements' names, e.g. `(Sharded<0>, Partial)`.
    fn name() -> String;
}

/// The axis named `B` of a tuple of axes, at position `I` (inferred).
#[diagnostic::on_unimplemented(
    message = "this array is placed over the mesh axes `{Self}`, none of them named `{B}`",
    label = "no axis `{B}` here",
    note = "name one of the array's own axes: its type lists them, outer first"
)]
pub trait AxisAt<B: AxisName, I: Position>: AxisSet {
    /// That axis's type.
    type Axis: Collective;
    /// That axis.
    fn at(&self) -> &Self::Axis;
}

/// The placement at position `I` of a tuple of placements, and the tuple
/// with it replaced.
pub trait PlacementAt<I: Position>: MeshPlacement {
    /// The placement along that axis.
    type At: AxisPlacement;
    /// The tuple with `To` along that axis.
    type With<To: AxisPlacement>: MeshPlacement;
}

/// Placements whose partial sums can be summed: `Partial`.
#[diagnostic::on_unimplemented(
    message = "`all_sum_over` sums partial sums, but this array is `{Self}` along that axis",
    label = "not `Partial` along the named axis",
    note = "`redistribute_over` gathers a `Sharded` axis or shards a `Replicated` one"
)]
pub trait IsPartial: AxisPlacement {}
impl IsPartial for Partial {}

/// Placements with no unreduced partial sum along any axis, which a
/// nonlinear function may take.
#[diagnostic::on_unimplemented(
    message = "a nonlinear function cannot be applied to `{Self}`: the ranks of some axis hold unreduced partial sums",
    label = "this array is `{Self}`",
    note = "reduce that axis first: `.all_sum_over(Tp, s)` (naming the axis) gives `Replicated` there"
)]
pub trait NoPartial: MeshPlacement {}

/// Every axis `Replicated`: the same whole array on every rank of the mesh.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not replicated along every axis",
    note = "reduce or gather each axis first (`all_sum_over`, `redistribute_over(axis, Replicated, s)`)"
)]
pub trait AllReplicated: MeshPlacement {}

macro_rules! axis_tuple {
    ($(($a:ident, $n:ident, $p:ident, $i:tt)),+) => {
        impl<$($a: AxisName, const $n: usize),+> AxisSet for ($(Axis<$a, $n>,)+) {
            fn groups(&self) -> Vec<&Group> {
                vec![$(self.$i.group()),+]
            }
            fn names() -> Vec<&'static str> {
                vec![$($a::NAME),+]
            }
        }

        impl<$($p: AxisPlacement),+> MeshPlacement for ($($p,)+) {
            fn dims() -> Vec<Option<usize>> {
                vec![$($p::AXIS),+]
            }
            fn replicated() -> Vec<bool> {
                vec![$($p::REPLICATED),+]
            }
            fn name() -> String {
                format!("({})", [$($p::name()),+].join(", "))
            }
        }

        impl<$($p: AxisPlacement + Nonlinear),+> NoPartial for ($($p,)+) {}
        impl AllReplicated for ($(axis_tuple!(@replicated $p),)+) {}
    };
    (@replicated $p:ident) => { Replicated };
}

axis_tuple!((A0, N0, P0, 0), (A1, N1, P1, 1));
axis_tuple!((A0, N0, P0, 0), (A1, N1, P1, 1), (A2, N2, P2, 2));

/// `AxisAt` and `PlacementAt` for position `$i` of a tuple: `$pick` names
/// the element there, the others pass through.
macro_rules! position {
    ($pos:ident, $i:tt; $(($a:ident, $n:ident)),+; $pick_a:ident, $pick_n:ident) => {
        impl<$($a: AxisName, const $n: usize),+> AxisAt<$pick_a, $pos> for ($(Axis<$a, $n>,)+) {
            type Axis = Axis<$pick_a, $pick_n>;
            fn at(&self) -> &Self::Axis {
                &self.$i
            }
        }
    };
}

position!(First, 0; (A0, N0), (A1, N1); A0, N0);
position!(Second, 1; (A0, N0), (A1, N1); A1, N1);
position!(First, 0; (A0, N0), (A1, N1), (A2, N2); A0, N0);
position!(Second, 1; (A0, N0), (A1, N1), (A2, N2); A1, N1);
position!(Third, 2; (A0, N0), (A1, N1), (A2, N2); A2, N2);

impl<P0: AxisPlacement, P1: AxisPlacement> PlacementAt<First> for (P0, P1) {
    type At = P0;
    type With<To: AxisPlacement> = (To, P1);
}
impl<P0: AxisPlacement, P1: AxisPlacement> PlacementAt<Second> for (P0, P1) {
    type At = P1;
    type With<To: AxisPlacement> = (P0, To);
}
impl<P0: AxisPlacement, P1: AxisPlacement, P2: AxisPlacement> PlacementAt<First> for (P0, P1, P2) {
    type At = P0;
    type With<To: AxisPlacement> = (To, P1, P2);
}
impl<P0: AxisPlacement, P1: AxisPlacement, P2: AxisPlacement> PlacementAt<Second> for (P0, P1, P2) {
    type At = P1;
    type With<To: AxisPlacement> = (P0, To, P2);
}
impl<P0: AxisPlacement, P1: AxisPlacement, P2: AxisPlacement> PlacementAt<Third> for (P0, P1, P2) {
    type At = P2;
    type With<To: AxisPlacement> = (P0, P1, To);
}

/// A logical array placed over the mesh axes `M` as `P`, one placement per
/// axis. This rank's local array is its part along every axis at once: for
/// `(Sharded<0>, Sharded<1>)`, its `dp` coordinate's chunk of rows and its
/// `tp` coordinate's chunk of columns (chunks by the rule on
/// [`Sharded`]). Two axes may not shard the same dimension.
///
/// ```
/// use safemlx::{Array, Device, DeviceType, Stream};
/// use safemlx_dist::typed::{Axis, Dp, MeshArray, Tp};
/// use safemlx_dist::{DeviceMesh, Group, Partial, Replicated, Sharded};
///
/// let s = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));
/// let mesh = DeviceMesh::new(&Group::local(), &[("dp", 1), ("tp", 1)])?;
/// let axes = (Axis::<Dp, 1>::of(&mesh)?, Axis::<Tp, 1>::of(&mesh)?);
/// let full = |v: &[f32], shape: &[i32]| Array::from_slice(v, shape);
/// // A batch's rows over dp; the weights' columns, then rows, over tp.
/// let x = MeshArray::<(Sharded<0>, Replicated), _>::from_full(full(&[1.0, 2.0], &[1, 2]), &axes, &s)?;
/// let w1 = MeshArray::<(Replicated, Sharded<1>), _>::from_full(full(&[1.0, 0.0, 0.0, 1.0], &[2, 2]), &axes, &s)?;
/// let w2 = MeshArray::<(Replicated, Sharded<0>), _>::from_full(full(&[2.0, 0.0, 0.0, 2.0], &[2, 2]), &axes, &s)?;
/// let h = x.matmul(&w1, &s)?.silu(&s)?;                  // (Sharded<0>, Sharded<1>)
/// let y: MeshArray<(Sharded<0>, Partial), _> = h.matmul(&w2, &s)?;
/// let y = y.all_sum_over(Tp, &s)?;                        // (Sharded<0>, Replicated)
/// let y = y.redistribute_over(Dp, Replicated, &s)?;       // (Replicated, Replicated)
/// assert_eq!(y.global_shape(), &[1, 2]);
/// # Ok::<(), safemlx_dist::Error>(())
/// ```
#[derive(Debug)]
pub struct MeshArray<P: MeshPlacement, M: AxisSet> {
    local: Array,
    axes: M,
    global: Vec<i32>,
    _placement: PhantomData<P>,
}

impl<P: MeshPlacement, M: AxisSet> Clone for MeshArray<P, M> {
    fn clone(&self) -> Self {
        Self {
            local: self.local.clone(),
            axes: self.axes.clone(),
            global: self.global.clone(),
            _placement: PhantomData,
        }
    }
}

/// `global` with the sharding of every axis but `skip` applied: what this
/// rank's local array is a part of along axis `skip`, or (with no axis
/// skipped) the local shape itself.
fn part_shape<P: MeshPlacement, M: AxisSet>(
    global: &[i32],
    axes: &M,
    skip: Option<usize>,
) -> Result<Vec<i32>> {
    let dims = P::dims();
    let sharded: Vec<usize> = dims.iter().flatten().copied().collect();
    if let Some(d) = (0..sharded.len())
        .find_map(|i| sharded[i + 1..].contains(&sharded[i]).then_some(sharded[i]))
    {
        return Err(Error::Shape(format!(
            "the placements {} over the axes {} shard dimension {d} along two axes; shard each dimension along one axis",
            P::name(),
            M::names().join(", ")
        )));
    }
    let mut shape = global.to_vec();
    for (i, (dim, group)) in dims.iter().zip(axes.groups()).enumerate() {
        let Some(d) = dim.filter(|_| Some(i) != skip) else {
            continue;
        };
        let Some(len) = shape.get_mut(d) else {
            return Err(Error::Shape(format!(
                "{} shards dimension {d} along axis {}, but the array's shape is {global:?}",
                P::name(),
                M::names()[i]
            )));
        };
        let (_, part) = chunk(
            usize::try_from(*len).unwrap_or(0),
            group.rank(),
            group.size(),
        );
        *len = i32::try_from(part).map_err(|_| Error::ShapeOverflow { value: part })?;
    }
    Ok(shape)
}

impl<P: MeshPlacement, M: AxisSet> MeshArray<P, M> {
    /// Wraps this rank's `local` array as placement `P` over `axes` of a
    /// logical array of shape `global`.
    ///
    /// # Errors
    /// When `local`'s shape is not this rank's part of `global` (both
    /// shapes in the message), or two axes shard one dimension.
    pub fn from_local(local: Array, axes: &M, global: &[i32]) -> Result<Self> {
        let want = part_shape::<P, M>(global, axes, None)?;
        if local.shape() != want.as_slice() {
            return Err(Error::Shape(format!(
                "this rank's part of a {} array of shape {global:?} over the axes {} has shape {want:?}, not {:?}",
                P::name(),
                M::names().join(", "),
                local.shape()
            )));
        }
        Ok(Self {
            local,
            axes: axes.clone(),
            global: global.to_vec(),
            _placement: PhantomData,
        })
    }

    /// This rank's local array.
    pub fn local(&self) -> &Array {
        &self.local
    }

    /// This rank's local array, consuming the wrapper.
    pub fn into_local(self) -> Array {
        self.local
    }

    /// The logical (global) shape.
    pub fn global_shape(&self) -> &[i32] {
        &self.global
    }

    /// The axes it is placed over.
    pub fn axes(&self) -> &M {
        &self.axes
    }

    /// The array along axis `axis` (by value: `Tp`) moved to placement
    /// `to` there, by that axis's collective in its subgroup (the rules of
    /// [`RedistributeTo`]); the other axes' placements stay.
    ///
    /// # Errors
    /// The collective's error, or a shape the placement cannot divide.
    pub fn redistribute_over<B, I, To>(
        self,
        axis: B,
        to: To,
        s: &Stream,
    ) -> Result<MeshArray<<P as PlacementAt<I>>::With<To>, M>>
    where
        B: AxisName,
        I: Position,
        M: AxisAt<B, I>,
        P: PlacementAt<I>,
        <P as PlacementAt<I>>::At: RedistributeTo<To>,
        To: AxisPlacement,
    {
        let _ = (axis, to);
        let along = part_shape::<P, M>(&self.global, &self.axes, Some(I::AT))?;
        let view = ShardedArray::<<P as PlacementAt<I>>::At, _>::from_local(
            self.local,
            self.axes.at(),
            &along,
        )?;
        let moved = view.redistribute::<To>(s)?;
        MeshArray::from_local(moved.local().clone(), &self.axes, &self.global)
    }

    /// The partial sums along axis `axis` summed there (an `all_sum` in
    /// that axis's subgroup): `Replicated` along it.
    ///
    /// # Errors
    /// As [`redistribute_over`](Self::redistribute_over).
    pub fn all_sum_over<B, I>(
        self,
        axis: B,
        s: &Stream,
    ) -> Result<MeshArray<<P as PlacementAt<I>>::With<Replicated>, M>>
    where
        B: AxisName,
        I: Position,
        M: AxisAt<B, I>,
        P: PlacementAt<I>,
        <P as PlacementAt<I>>::At: IsPartial + RedistributeTo<Replicated>,
    {
        self.redistribute_over(axis, Replicated, s)
    }

    pub(super) fn with_local<Q: MeshPlacement>(
        &self,
        local: Array,
        global: &[i32],
    ) -> Result<MeshArray<Q, M>> {
        MeshArray::from_local(local, &self.axes, global)
    }
}

impl<P: NoPartial, M: AxisSet> MeshArray<P, M> {
    /// This rank's part of `full` (the whole logical array, the same on
    /// every rank): a slice along each sharded axis.
    ///
    /// # Errors
    /// A dimension `P` shards that `full` lacks, or two axes sharding one.
    pub fn from_full(full: Array, axes: &M, s: &Stream) -> Result<Self> {
        let global = full.shape().to_vec();
        part_shape::<P, M>(&global, axes, None)?;
        let mut local = full;
        for (dim, group) in P::dims().into_iter().zip(axes.groups()) {
            if let Some(d) = dim {
                let len = usize::try_from(global[d]).unwrap_or(0);
                let (offset, part) = chunk(len, group.rank(), group.size());
                local = slice_axis(&local, d, offset, part, s)?;
            }
        }
        Self::from_local(local, axes, &global)
    }
}

impl<P: AllReplicated, M: AxisSet> MeshArray<P, M> {
    /// The whole array, the same on every rank of the mesh, as a
    /// replicated array of `group` (the mesh's world): a loss for
    /// [`grad::value_and_grad`](crate::grad::value_and_grad).
    pub fn into_replicated(self, group: &Group) -> ShardedArray<Replicated> {
        ShardedArray::replicated(self.local, group)
    }
}
