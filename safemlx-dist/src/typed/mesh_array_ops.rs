//! Placement-checked operations on [`MeshArray`]: each axis follows the
//! single-group tables of `ops.rs`, independently of the others. A
//! column-parallel product over `tp` of rows sharded over `dp` is
//! `(Sharded<0>, Replicated)` x `(Replicated, Sharded<1>)` ->
//! `(Sharded<0>, Sharded<1>)`; an axis without a rule does not compile,
//! with that axis's rule's message.
//!
//! While a gradient is traced, an operand `Replicated` along an axis where
//! the other operand differs by rank has a local gradient that is this
//! rank's share only: it is summed over that axis (as `ShardedArray`'s ops
//! do). Weights replicated over `dp` that meet rows sharded over `dp` thus
//! get the data-parallel gradient sum by the rule, not by hand.

use safemlx::{Array, Stream};

use super::mesh_array::{AxisPlacement, AxisSet, MeshArray, MeshPlacement, NoPartial};
use super::ops::{MatmulRule, MulRule, SumRule};
use crate::error::{Error, Result};
use crate::runtime::sum_gradients;

/// The placements of `Self` (left) times `Q` (right) by `matmul`, axis by
/// axis ([`MatmulRule`]).
pub trait MeshMatmul<Q: MeshPlacement>: MeshPlacement {
    /// The result's placements.
    type Output: MeshPlacement;
}

/// The placements of an element-wise product, axis by axis ([`MulRule`]).
pub trait MeshMul<Q: MeshPlacement>: MeshPlacement {
    /// The result's placements.
    type Output: MeshPlacement;
}

/// The placements of the sum of all elements, axis by axis ([`SumRule`]).
pub trait MeshSum: MeshPlacement {
    /// The result's placements.
    type Output: MeshPlacement;
}

macro_rules! per_axis {
    ($(($p:ident, $q:ident)),+) => {
        impl<$($p, $q),+> MeshMatmul<($($q,)+)> for ($($p,)+)
        where
            $($p: AxisPlacement + MatmulRule<$q>, $q: AxisPlacement,
              <$p as MatmulRule<$q>>::Output: AxisPlacement,)+
        {
            type Output = ($(<$p as MatmulRule<$q>>::Output,)+);
        }

        impl<$($p, $q),+> MeshMul<($($q,)+)> for ($($p,)+)
        where
            $($p: AxisPlacement + MulRule<$q>, $q: AxisPlacement,
              <$p as MulRule<$q>>::Output: AxisPlacement,)+
        {
            type Output = ($(<$p as MulRule<$q>>::Output,)+);
        }

        impl<$($p),+> MeshSum for ($($p,)+)
        where
            $($p: AxisPlacement + SumRule, <$p as SumRule>::Output: AxisPlacement,)+
        {
            type Output = ($(<$p as SumRule>::Output,)+);
        }
    };
}

per_axis!((P0, Q0), (P1, Q1));
per_axis!((P0, Q0), (P1, Q1), (P2, Q2));

impl<P: MeshPlacement, M: AxisSet> MeshArray<P, M> {
    /// The two local operands of a binary op with `Q`: along each axis
    /// where one side is `Replicated` and the other is not, the replicated
    /// side's gradient is summed over that axis.
    fn meeting<Q: MeshPlacement>(
        &self,
        other: &MeshArray<Q, M>,
        s: &Stream,
    ) -> Result<(Array, Array)> {
        let (mut a, mut b) = (self.local().clone(), other.local().clone());
        let sides = P::replicated().into_iter().zip(Q::replicated());
        for ((left, right), group) in sides.zip(self.axes().groups()) {
            match (left, right) {
                (true, false) => a = sum_gradients(&a, group, s)?,
                (false, true) => b = sum_gradients(&b, group, s)?,
                _ => {}
            }
        }
        Ok((a, b))
    }

    /// Matrix product of 2-D arrays, placements by [`MeshMatmul`]. Local
    /// computation only: the collectives are in the redistributions.
    ///
    /// # Errors
    /// When either array is not 2-D or the inner (global) dimensions differ.
    pub fn matmul<Q: MeshPlacement>(
        &self,
        rhs: &MeshArray<Q, M>,
        s: &Stream,
    ) -> Result<MeshArray<<P as MeshMatmul<Q>>::Output, M>>
    where
        P: MeshMatmul<Q>,
    {
        let (l, r) = (self.global_shape(), rhs.global_shape());
        if l.len() != 2 || r.len() != 2 || l[1] != r[0] {
            return Err(Error::Shape(format!(
                "matmul of {} {l:?} by {} {r:?}: both must be 2-D with the left's columns equal to the right's rows",
                P::name(),
                Q::name()
            )));
        }
        let (a, b) = self.meeting(rhs, s)?;
        self.with_local(a.matmul(&b, s)?, &[l[0], r[1]])
    }

    /// Element-wise product of arrays of one shape, placements by
    /// [`MeshMul`].
    ///
    /// # Errors
    /// Different global shapes.
    pub fn mul<Q: MeshPlacement>(
        &self,
        other: &MeshArray<Q, M>,
        s: &Stream,
    ) -> Result<MeshArray<<P as MeshMul<Q>>::Output, M>>
    where
        P: MeshMul<Q>,
    {
        self.same_shape(other.global_shape(), "mul")?;
        let (a, b) = self.meeting(other, s)?;
        self.with_local(a.multiply(&b, s)?, self.global_shape())
    }

    /// Element-wise sum of two arrays of the same placements and shape.
    ///
    /// # Errors
    /// Different global shapes.
    pub fn add(&self, other: &Self, s: &Stream) -> Result<Self> {
        self.same_shape(other.global_shape(), "add")?;
        self.with_local(self.local().add(other.local(), s)?, self.global_shape())
    }

    /// `factor` times the array (any placement: scaling is linear).
    ///
    /// # Errors
    /// An MLX error.
    pub fn scale(&self, factor: f32, s: &Stream) -> Result<Self> {
        let c = Array::from_f32(factor).as_dtype(self.local().dtype(), s)?;
        self.with_local(self.local().multiply(&c, s)?, self.global_shape())
    }

    /// The sum of all elements, a scalar: `Replicated` along the axes where
    /// the array is, this rank's share (`Partial`) along the others.
    ///
    /// # Errors
    /// An MLX error.
    pub fn sum_all(&self, s: &Stream) -> Result<MeshArray<<P as MeshSum>::Output, M>>
    where
        P: MeshSum,
    {
        self.with_local(self.local().sum(None, s)?, &[])
    }

    fn same_shape(&self, other: &[i32], op: &str) -> Result<()> {
        if self.global_shape() == other {
            return Ok(());
        }
        Err(Error::Shape(format!(
            "{op} of arrays of global shapes {:?} and {other:?}: the shapes must be equal",
            self.global_shape()
        )))
    }
}

impl<P: MeshPlacement, M: AxisSet> MeshArray<P, M> {
    /// `x * sigmoid(x)`. Not along an axis where the array is `Partial`.
    ///
    /// # Errors
    /// An MLX error.
    pub fn silu(&self, s: &Stream) -> Result<Self>
    where
        P: NoPartial,
    {
        let sig = safemlx::ops::sigmoid(self.local(), s)?;
        self.with_local(self.local().multiply(&sig, s)?, self.global_shape())
    }
}
