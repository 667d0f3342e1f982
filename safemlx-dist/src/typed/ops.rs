//! Placement-checked operations on [`ShardedArray`].
//!
//! The rules are tables; each row below is one trait impl, so the code reads
//! like the book's table and a rule that is not there does not compile.
//!
//! | op | left | right | result |
//! |---|---|---|---|
//! | `matmul` | `Replicated` | `Replicated` | `Replicated` |
//! | `matmul` | `Replicated` | `Sharded<1>` (column parallel) | `Sharded<1>` |
//! | `matmul` | `Sharded<1>` | `Sharded<0>` (row parallel) | `Partial` |
//! | `matmul` | `Sharded<0>` | `Replicated` | `Sharded<0>` |
//! | `matmul` | `Partial` | `Replicated` | `Partial` |
//! | `add`, `sub` | `P` | `P` | `P` |
//! | `mul` | `P` (not `Partial`) | `P` | `P` |
//! | `mul` | `Partial` | `Replicated` | `Partial` (and the mirror) |
//! | `scale`, `neg` | `P` | | `P` |
//! | `silu`, `gelu`, `exp` | `P` (not `Partial`) | | `P` |
//! | `softmax::<AXIS>` | `Replicated`, `Ragged`, `Sharded<A>` with `A != AXIS` | | same |
//! | `transpose` (2-D) | `Sharded<0>` / `Sharded<1>` | | `Sharded<1>` / `Sharded<0>` |
//! | `reshape` | `Sharded<A>`: axes `..=A` kept | | same |
//! | `sum_all` | `Replicated` | | `Replicated` scalar |
//! | `sum_all` | `Sharded<A>`, `Ragged`, `Partial` | | `Partial` scalar |

use std::any::TypeId;

use safemlx::{Array, Stream};

use super::placement::{Nonlinear, Partial, Placement, Ragged, Replicated, Sharded};
use super::sharded::ShardedArray;
use super::Collective;
use crate::error::{Error, Result};

/// A right-hand side no operand has. Each rule trait has an impl for it so
/// that no placement ever has exactly one rule: with one, the compiler would
/// guess the operand's placement from it and report a type mismatch instead
/// of the rule's message.
#[doc(hidden)]
#[derive(Debug)]
pub struct NoRule;

/// The placement of `Self` (left) times `Rhs` (right) by `matmul`.
#[diagnostic::on_unimplemented(
    message = "no matmul rule for `{Self}` x `{Rhs}`",
    label = "`{Self}` times `{Rhs}` has no placement",
    note = "the rules: Replicated x Sharded<1> (column parallel) -> Sharded<1>; Sharded<1> x Sharded<0> (row parallel) -> Partial; Sharded<0> x Replicated -> Sharded<0>; Replicated x Replicated -> Replicated; Partial x Replicated -> Partial",
    note = "to multiply column-sharded activations, shard the weight by rows (`Sharded<0>`) or gather the activations with `.all_gather()` first"
)]
pub trait MatmulRule<Rhs>: Placement {
    /// The result's placement.
    type Output: Placement;
}

macro_rules! matmul_rules {
    ($($lhs:ty, $rhs:ty => $out:ty;)*) => {$(
        impl MatmulRule<$rhs> for $lhs {
            type Output = $out;
        }
    )*};
}

impl<P: Placement> MatmulRule<NoRule> for P {
    type Output = P;
}

matmul_rules! {
    Replicated, Replicated => Replicated;
    Replicated, Sharded<1> => Sharded<1>;
    Sharded<1>, Sharded<0> => Partial;
    Sharded<0>, Replicated => Sharded<0>;
    Partial, Replicated => Partial;
}

/// Placements that may be added or subtracted: only equal ones.
#[diagnostic::on_unimplemented(
    message = "cannot add or subtract `{Self}` and `{Rhs}`: element-wise ops need both arrays in the same placement",
    label = "`{Self}` and `{Rhs}` are laid out differently",
    note = "redistribute one of them first, e.g. `.all_gather()` a `Sharded` array or `.all_sum()` a `Partial` one"
)]
pub trait SamePlacement<Rhs>: Placement {}

impl<P: Placement> SamePlacement<P> for P {}
impl<P: Placement> SamePlacement<NoRule> for P {}

/// The placement of an element-wise product.
#[diagnostic::on_unimplemented(
    message = "no element-wise product rule for `{Self}` * `{Rhs}`",
    label = "`{Self}` * `{Rhs}` has no placement",
    note = "a product of two partial sums is not a partial sum of the product: reduce one side with `.all_sum()` first",
    note = "the rules: P * P -> P for Replicated, Sharded<A> and Ragged; Partial * Replicated -> Partial; Replicated * Partial -> Partial"
)]
pub trait MulRule<Rhs>: Placement {
    /// The result's placement.
    type Output: Placement;
}

impl<P: Placement> MulRule<NoRule> for P {
    type Output = P;
}

impl MulRule<Replicated> for Replicated {
    type Output = Replicated;
}
impl<const A: usize> MulRule<Sharded<A>> for Sharded<A> {
    type Output = Sharded<A>;
}
impl MulRule<Ragged> for Ragged {
    type Output = Ragged;
}
impl MulRule<Replicated> for Partial {
    type Output = Partial;
}
impl MulRule<Partial> for Replicated {
    type Output = Partial;
}

/// Axes a softmax may run along: any axis of an unsharded array, any axis
/// but the sharded one of a `Sharded<A>` (for `A` up to 3).
#[diagnostic::on_unimplemented(
    message = "no softmax of `{Self}` along this axis: a softmax needs the whole axis, and `{Self}` splits it across ranks (or it is a `Partial` sum)",
    label = "softmax along the sharded axis",
    note = "gather first with `.all_gather()`, or redistribute to shard another axis (`.redistribute::<Sharded<B>>()`)"
)]
pub trait SoftmaxAlong<const AXIS: usize>: Placement {}

impl<const AXIS: usize> SoftmaxAlong<AXIS> for Replicated {}
impl<const AXIS: usize> SoftmaxAlong<AXIS> for Ragged {}

macro_rules! softmax_rules {
    ($($sharded:literal => $($axis:literal),*;)*) => {$($(
        impl SoftmaxAlong<$axis> for Sharded<$sharded> {}
    )*)*};
}

softmax_rules! {
    0 => 1, 2, 3, 4;
    1 => 0, 2, 3, 4;
    2 => 0, 1, 3, 4;
    3 => 0, 1, 2, 4;
}

/// The placement of the sum of all elements: a rank's share of the sum
/// unless every rank holds the whole array.
pub trait SumRule: Placement {
    /// The result's placement.
    type Output: Placement;
}

impl SumRule for Replicated {
    type Output = Replicated;
}
impl<const A: usize> SumRule for Sharded<A> {
    type Output = Partial;
}
impl SumRule for Ragged {
    type Output = Partial;
}
impl SumRule for Partial {
    type Output = Partial;
}

/// The placement of a 2-D transpose.
#[diagnostic::on_unimplemented(message = "no transpose rule for `{Self}`")]
pub trait TransposeRule: Placement {
    /// The result's placement.
    type Output: Placement;
}

impl TransposeRule for Replicated {
    type Output = Replicated;
}
impl TransposeRule for Partial {
    type Output = Partial;
}
impl TransposeRule for Sharded<0> {
    type Output = Sharded<1>;
}
impl TransposeRule for Sharded<1> {
    type Output = Sharded<0>;
}

/// The right-hand operand of a binary op: a `ShardedArray` on the same
/// group type `C`. Taking the operand as a whole type (rather than its
/// placement) lets the compiler report a missing placement rule with the
/// rule's own message instead of guessing a placement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an array of this group: ops combine arrays laid out over the same mesh",
    label = "laid out over another group type than `{C}`",
    note = "arrays combine only with arrays over the same group type: the same `Mesh<N>`, or the same mesh axis `Axis<A, N>`"
)]
pub trait Operand<C: Collective> {
    /// The operand's placement.
    type Placement: Placement;
    /// The operand itself.
    fn sharded(&self) -> &ShardedArray<Self::Placement, C>;
}

impl<P: Placement, C: Collective> Operand<C> for ShardedArray<P, C> {
    type Placement = P;
    fn sharded(&self) -> &ShardedArray<P, C> {
        self
    }
}

fn shape_error(what: String) -> Error {
    Error::Shape(what)
}

impl<P: Placement, C: Collective> ShardedArray<P, C> {
    /// `local` as placement `Q` of `global`, keeping this array's split
    /// when `Q` shards the same axis.
    fn same_local<Q: Placement>(&self, local: Array, global: Vec<i32>) -> ShardedArray<Q, C> {
        let split = (Q::AXIS.is_some() && Q::AXIS == P::AXIS)
            .then(|| self.split().cloned())
            .flatten();
        // A wide partial sum stays one through linear ops on it.
        let rounds_to = (TypeId::of::<Q>() == TypeId::of::<P>())
            .then(|| self.rounds_to())
            .flatten();
        ShardedArray::new_unchecked(local, self.comm().clone(), global)
            .with_split(split)
            .with_rounds_to(rounds_to)
    }

    pub(super) fn map(&self, local: Array) -> ShardedArray<P, C> {
        self.same_local(local, self.global_shape().to_vec())
    }

    /// Matrix product of 2-D arrays with placement propagation (see the
    /// table above). Local computation only: the collectives are in the
    /// redistributions around it.
    ///
    /// # Errors
    /// When either array is not 2-D or the inner (global) dimensions differ.
    pub fn matmul<R: Operand<C>>(
        &self,
        rhs: &R,
        s: &Stream,
    ) -> Result<ShardedArray<<P as MatmulRule<R::Placement>>::Output, C>>
    where
        P: MatmulRule<R::Placement>,
    {
        let rhs = rhs.sharded();
        let (l, r) = (self.global_shape(), rhs.global_shape());
        if l.len() != 2 || r.len() != 2 || l[1] != r[0] {
            return Err(shape_error(format!(
                "matmul of {} {l:?} by {} {r:?}: both must be 2-D with the left's columns equal to the right's rows",
                P::name(),
                R::Placement::name()
            )));
        }
        // The inner dimension: a row-parallel product needs the left's
        // columns and the right's rows divided alike.
        let inner = (P::AXIS == Some(1) && R::Placement::AXIS == Some(0))
            .then(|| (self.axis_lengths(1), rhs.axis_lengths(0)));
        if let Some((left, right)) = inner.filter(|(l, r)| l != r) {
            return Err(shape_error(format!(
                "matmul of {} {l:?} by {} {r:?}: the left's columns are split {left:?} over the ranks but the right's rows {right:?}; they must be split alike",
                P::name(),
                R::Placement::name()
            )));
        }
        let (a, b) = self.meeting(rhs, s)?;
        let local = a.matmul(&b, s)?;
        let out = ShardedArray::new_unchecked(local, self.comm().clone(), vec![l[0], r[1]]);
        // The output's sharded axis comes from the left's rows (axis 0) or
        // the right's columns (axis 1), with their split.
        let split = match <P as MatmulRule<R::Placement>>::Output::AXIS {
            Some(0) if P::AXIS == Some(0) => self.split().cloned(),
            Some(1) if R::Placement::AXIS == Some(1) => rhs.split().cloned(),
            _ => None,
        };
        Ok(out.with_split(split))
    }

    /// The two local operands of a binary op. A `Replicated` one that meets
    /// a placement that differs by rank has a local gradient that is only
    /// this rank's share: while a gradient is traced it goes through
    /// [`sum_gradients`](crate::runtime::sum_gradients); a declared copy
    /// ([`copy_of`](ShardedArray::copy_of)) through the sum over its
    /// holders.
    pub(super) fn meeting<Q: Placement>(
        &self,
        other: &ShardedArray<Q, C>,
        s: &Stream,
    ) -> Result<(Array, Array)> {
        let mixed = P::REPLICATED != Q::REPLICATED;
        Ok((
            self.operand_local(mixed, s)?,
            other.operand_local(mixed, s)?,
        ))
    }

    fn check_same_shape<Q: Placement>(&self, other: &ShardedArray<Q, C>, op: &str) -> Result<()> {
        if self.global_shape() == other.global_shape() {
            Ok(())
        } else {
            Err(shape_error(format!(
                "{op} of arrays of global shapes {:?} and {:?}: the shapes must be equal",
                self.global_shape(),
                other.global_shape()
            )))
        }
    }

    /// Element-wise sum of two arrays of the same placement and shape.
    pub fn add<R: Operand<C>>(&self, other: &R, s: &Stream) -> Result<Self>
    where
        P: SamePlacement<R::Placement>,
    {
        let other = other.sharded();
        self.check_same_shape(other, "add")?;
        self.check_same_split(other, "add")?;
        let rounds_to = self.rounds_to().or(other.rounds_to());
        Ok(self
            .map(self.local().add(other.local(), s)?)
            .with_rounds_to(rounds_to))
    }

    /// Element-wise difference of two arrays of the same placement and shape.
    pub fn sub<R: Operand<C>>(&self, other: &R, s: &Stream) -> Result<Self>
    where
        P: SamePlacement<R::Placement>,
    {
        let other = other.sharded();
        self.check_same_shape(other, "sub")?;
        self.check_same_split(other, "sub")?;
        let rounds_to = self.rounds_to().or(other.rounds_to());
        Ok(self
            .map(self.local().subtract(other.local(), s)?)
            .with_rounds_to(rounds_to))
    }

    /// Element-wise product (see the table above for placements).
    pub fn mul<R: Operand<C>>(
        &self,
        other: &R,
        s: &Stream,
    ) -> Result<ShardedArray<<P as MulRule<R::Placement>>::Output, C>>
    where
        P: MulRule<R::Placement>,
    {
        let other = other.sharded();
        if P::AXIS.is_some() {
            self.check_same_shape(other, "mul")?;
            self.check_same_split(other, "mul")?;
        }
        let (a, b) = self.meeting(other, s)?;
        let local = a.multiply(&b, s)?;
        Ok(self.same_local(local, self.global_shape().to_vec()))
    }

    /// Multiplies by a constant (linear: any placement).
    pub fn scale(&self, factor: f32, s: &Stream) -> Result<Self> {
        let factor = Array::from_f32(factor).as_dtype(self.local().dtype(), s)?;
        Ok(self.map(self.local().multiply(&factor, s)?))
    }

    /// Negates (linear: any placement).
    pub fn neg(&self, s: &Stream) -> Result<Self> {
        Ok(self.map(self.local().negative(s)?))
    }

    /// Reshapes the logical array to `global`. Unsharded placements take any
    /// shape of the same size; `Sharded<A>` keeps the sharded axis and the
    /// axes before it (only the axes after `A` may be split or merged, which
    /// each rank does on its chunk); `Ragged` keeps its leading rows.
    ///
    /// # Errors
    /// A shape of another size, or one that changes a kept axis, with both
    /// shapes in the message.
    pub fn reshape(&self, global: &[i32], s: &Stream) -> Result<Self> {
        let old = self.global_shape();
        let size = |shape: &[i32]| shape.iter().map(|&d| i64::from(d)).product::<i64>();
        let kept = match (P::AXIS, P::RAGGED) {
            (Some(axis), _) => axis + 1,
            (None, true) => 1,
            (None, false) => 0,
        };
        let same_size = P::RAGGED || size(old) == size(global);
        if !same_size || global.len() < kept || old[..kept] != global[..kept] {
            return Err(shape_error(format!(
                "reshape of {} {old:?} to {global:?}: {}",
                P::name(),
                if same_size {
                    "a sharded array keeps its sharded axis and the axes before it"
                } else {
                    "the sizes differ"
                }
            )));
        }
        let mut local = global.to_vec();
        if P::RAGGED {
            local[0] = self.local().shape()[0];
        } else {
            local =
                super::sharded::local_shape::<P>(global, self.comm().rank(), self.comm().size())?;
            if let (Some(axis), Some(split)) = (P::AXIS, self.split()) {
                local[axis] =
                    i32::try_from(split[self.comm().rank()]).map_err(|_| Error::ShapeOverflow {
                        value: split[self.comm().rank()],
                    })?;
            }
        }
        Ok(self.same_local(self.local().reshape(&local, s)?, global.to_vec()))
    }

    /// 2-D transpose; the sharded axis moves with the data.
    pub fn transpose(&self, s: &Stream) -> Result<ShardedArray<<P as TransposeRule>::Output, C>>
    where
        P: TransposeRule,
    {
        let g = self.global_shape();
        if g.len() != 2 {
            return Err(shape_error(format!(
                "transpose of global shape {g:?}: the typed transpose is 2-D"
            )));
        }
        let t = ShardedArray::new_unchecked(
            self.local().transpose(s)?,
            self.comm().clone(),
            vec![g[1], g[0]],
        );
        // The split moves with its axis; a copy stays a copy.
        Ok(t.with_split(self.split().cloned()).with_copies_of(self))
    }

    /// `x * sigmoid(x)`. Not for `Partial`.
    pub fn silu(&self, s: &Stream) -> Result<Self>
    where
        P: Nonlinear,
    {
        let sig = safemlx::ops::sigmoid(self.local(), s)?;
        Ok(self.map(self.local().multiply(&sig, s)?))
    }

    /// `1 / (1 + e^-x)`. Not for `Partial`.
    pub fn sigmoid(&self, s: &Stream) -> Result<Self>
    where
        P: Nonlinear,
    {
        Ok(self.map(safemlx::ops::sigmoid(self.local(), s)?))
    }

    /// `0.5 x (1 + erf(x / sqrt 2))`. Not for `Partial`.
    pub fn gelu(&self, s: &Stream) -> Result<Self>
    where
        P: Nonlinear,
    {
        let x = self.local();
        let dtype = x.dtype();
        let c = |v: f32| Array::from_f32(v).as_dtype(dtype, s);
        let inner = safemlx::ops::erf(x.multiply(&c(std::f32::consts::FRAC_1_SQRT_2)?, s)?, s)?;
        let y = x
            .multiply(&inner.add(&c(1.0)?, s)?, s)?
            .multiply(&c(0.5)?, s)?;
        Ok(self.map(y))
    }

    /// `e^x`. Not for `Partial`.
    pub fn exp(&self, s: &Stream) -> Result<Self>
    where
        P: Nonlinear,
    {
        Ok(self.map(self.local().exp(s)?))
    }

    /// The sum of all elements, a scalar: `Replicated` for a `Replicated`
    /// array, otherwise this rank's share (`Partial`; `.all_sum()` gives
    /// the total). A loss for `grad::value_and_grad`.
    ///
    /// # Errors
    /// An MLX error.
    pub fn sum_all(&self, s: &Stream) -> Result<ShardedArray<<P as SumRule>::Output, C>>
    where
        P: SumRule,
    {
        Ok(self.same_local(self.local().sum(None, s)?, Vec::new()))
    }

    /// Softmax along `AXIS`, which must not be the sharded axis (a softmax
    /// needs the whole axis): that is a compile error, as is a softmax of a
    /// `Partial`. Rules exist for `Sharded<A>` with `A` up to 3.
    pub fn softmax<const AXIS: usize>(&self, s: &Stream) -> Result<Self>
    where
        P: Nonlinear + SoftmaxAlong<AXIS>,
    {
        let axis = i32::try_from(AXIS).map_err(|_| Error::ShapeOverflow { value: AXIS })?;
        if AXIS >= self.global_shape().len() {
            return Err(shape_error(format!(
                "softmax along axis {AXIS} of global shape {:?}",
                self.global_shape()
            )));
        }
        Ok(self.map(safemlx::ops::softmax_axis(self.local(), axis, None, s)?))
    }
}
