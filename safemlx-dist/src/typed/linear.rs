//! A linear layer's weight as one typed value, float or quantized.
//!
//! [`LinearWeight<P>`] holds a weight `W` `[out, in]` as checkpoints store
//! it, placed as `P` whatever its storage: `Sharded<0>` splits the outputs
//! (column parallel), `Sharded<1>` the inputs (row parallel), `Replicated`
//! nothing. [`ShardedArray::linear`] is `x Wᵀ` with one table of rules for
//! both storages (those of `quantized_matmul`):
//!
//! | `x` | `W` | `x Wᵀ` |
//! |---|---|---|
//! | `Replicated` | `Sharded<0>` | `Sharded<1>` |
//! | `Sharded<1>` | `Sharded<1>` | `Partial` |
//! | `Replicated` | `Replicated` | `Replicated` |
//!
//! A float weight multiplies through its transposed view (no copy), a
//! quantized one through `quantized_matmul`; splits (by heads, by groups)
//! carry over as in the rest of the typed layer; a bias follows its
//! outputs ([`ShardedArray::add_bias`]). A `Sharded<0>` weight
//! also looks rows up ([`LinearWeight::lookup`]): the vocabulary table of
//! an embedding, whose lookup is each rank's share, `Partial`.

use safemlx::{Array, Dtype, Stream};

use super::collective::Collective;
use super::ops::{NoRule, Operand};
use super::placement::{split_part, Partial, Placement, Ragged, Replicated, Sharded};
use super::quantized::{QuantizedArray, QuantizedPlacement};
use super::sharded::ShardedArray;
use super::wide_sum::wide_partial;
use crate::error::{Error, Result};
use crate::runtime::Group;

/// A weight `[out, in]`, float or quantized, placed as `P`.
#[derive(Debug, Clone)]
pub enum LinearWeight<P: QuantizedPlacement, C: Collective = Group> {
    /// Float values.
    Float(ShardedArray<P, C>),
    /// Quantized values (MLX's affine layout), never dequantized whole.
    Quantized(QuantizedArray<P, C>),
}

/// The placement of `x Wᵀ` for an `x` of placement `Self` and a weight of
/// placement `W` (see the module's table).
#[diagnostic::on_unimplemented(
    message = "no linear rule for `{Self}` x `{W}`ᵀ",
    label = "`{Self}` times a `{W}` weight has no placement",
    note = "the rules: Replicated x Sharded<0> (column parallel) -> Sharded<1>; Sharded<1> x Sharded<1> (row parallel) -> Partial; Replicated x Replicated -> Replicated"
)]
pub trait LinearRule<W: QuantizedPlacement>: Placement {
    /// The product's placement.
    type Output: Placement;

    /// `x Wᵀ` for a float `W`.
    ///
    /// # Errors
    /// Shapes or splits that do not meet, or an MLX error.
    fn float<C: Collective>(
        x: &ShardedArray<Self, C>,
        w: &ShardedArray<W, C>,
        s: &Stream,
    ) -> Result<ShardedArray<Self::Output, C>>;

    /// `x Wᵀ` for a quantized `W`.
    ///
    /// # Errors
    /// Shapes or splits that do not meet, or an MLX error.
    fn quantized<C: Collective>(
        x: &ShardedArray<Self, C>,
        w: &QuantizedArray<W, C>,
        s: &Stream,
    ) -> Result<ShardedArray<Self::Output, C>>;
}

macro_rules! linear_rules {
    ($($x:ty, $w:ty => $out:ty;)*) => {$(
        impl LinearRule<$w> for $x {
            type Output = $out;
            fn float<C: Collective>(
                x: &ShardedArray<Self, C>,
                w: &ShardedArray<$w, C>,
                s: &Stream,
            ) -> Result<ShardedArray<$out, C>> {
                x.matmul(&w.transpose(s)?, s)
            }
            fn quantized<C: Collective>(
                x: &ShardedArray<Self, C>,
                w: &QuantizedArray<$w, C>,
                s: &Stream,
            ) -> Result<ShardedArray<$out, C>> {
                x.quantized_matmul(w, s)
            }
        }
    )*};
}

linear_rules! {
    Replicated, Sharded<0> => Sharded<1>;
    Sharded<1>, Sharded<1> => Partial;
    Replicated, Replicated => Replicated;
}

impl<P: QuantizedPlacement, C: Collective> LinearWeight<P, C> {
    /// The logical `[out, in]`.
    pub fn global_shape(&self) -> [usize; 2] {
        match self {
            Self::Float(w) => {
                let g = w.global_shape();
                [g[0] as usize, g.get(1).copied().unwrap_or(0) as usize]
            }
            Self::Quantized(w) => w.global_shape(),
        }
    }

    /// Every rank's length along the sharded axis (`None`: replicated).
    pub fn axis_split(&self) -> Option<Vec<usize>> {
        match self {
            Self::Float(w) => w.axis_split(),
            Self::Quantized(w) => w.axis_split(),
        }
    }

    /// The group the weight is placed over.
    pub fn comm(&self) -> &C {
        match self {
            Self::Float(w) => w.comm(),
            Self::Quantized(w) => w.comm(),
        }
    }

    /// The same weight, its part declared blocks of `slots` (see
    /// [`ShardedArray::blocks_of`]); nothing changes for a quantized one.
    ///
    /// # Errors
    /// As [`ShardedArray::blocks_of`].
    pub fn blocks_of(
        self,
        first: usize,
        slots: usize,
        block: usize,
        holders: &[usize],
    ) -> Result<Self> {
        Ok(match self {
            Self::Float(w) => Self::Float(w.blocks_of(first, slots, block, holders)?),
            Self::Quantized(w) => Self::Quantized(w),
        })
    }

    /// Whether the values stay quantized.
    pub fn is_quantized(&self) -> bool {
        matches!(self, Self::Quantized(_))
    }

    /// Bytes of this rank's part.
    pub fn nbytes(&self) -> usize {
        match self {
            Self::Float(w) => w.local().nbytes(),
            Self::Quantized(w) => w.local().nbytes(),
        }
    }
}

impl<P: Placement, C: Collective> ShardedArray<P, C> {
    /// `x Wᵀ` for a float or quantized `W` `[out, in]`, by the rules of
    /// [`LinearRule`].
    ///
    /// # Errors
    /// Shapes or splits that do not meet (named), or an MLX error.
    pub fn linear<W: QuantizedPlacement>(
        &self,
        w: &LinearWeight<W, C>,
        s: &Stream,
    ) -> Result<ShardedArray<<P as LinearRule<W>>::Output, C>>
    where
        P: LinearRule<W>,
    {
        let Some(narrow) = wide_partial::<<P as LinearRule<W>>::Output, C>(self) else {
            return match w {
                LinearWeight::Float(w) => P::float(self, w, s),
                LinearWeight::Quantized(w) => P::quantized(self, w, s),
            };
        };
        // Partial products of 16-bit operands, in float32 until their sum
        // (see `wide_partial`).
        let x = self.map(self.local().as_dtype(Dtype::Float32, s)?);
        let product = match w {
            LinearWeight::Float(w) => {
                P::float(&x, &w.map(w.local().as_dtype(Dtype::Float32, s)?), s)?
            }
            LinearWeight::Quantized(w) => P::quantized(&x, w, s)?,
        };
        // Float32 on every rank, an empty part's zeros too: the ranks
        // sum the same dtype.
        let local = product.local().as_dtype(Dtype::Float32, s)?;
        Ok(product.map(local).with_rounds_to(Some(narrow)))
    }
}

/// The placement of `y + b` for `y` `[T, N]` placed as `Self` and a bias
/// `b` `[N]` placed as `B`: a bias follows the outputs it is added to.
#[diagnostic::on_unimplemented(
    message = "no bias rule for `{Self}` + a `{B}` bias",
    label = "a `{B}` bias cannot be added to `{Self}` outputs",
    note = "the rules: Sharded<1> outputs (column parallel) + a Sharded<0> bias split alike; Replicated, Sharded<0> or Ragged outputs (rows) + a Replicated bias; a Partial sum + a Partial bias",
    note = "a whole bias on a Partial sum would be added once per rank: add it after the reduction (`.all_sum()` first)"
)]
pub trait BiasRule<B>: Placement {}

impl<P: Placement> BiasRule<NoRule> for P {}
impl BiasRule<Sharded<0>> for Sharded<1> {}
impl BiasRule<Replicated> for Replicated {}
impl BiasRule<Replicated> for Sharded<0> {}
impl BiasRule<Replicated> for Ragged {}
impl BiasRule<Partial> for Partial {}

impl<P: Placement, C: Collective> ShardedArray<P, C> {
    /// `self + b` for `self` `[T, N]` and a bias `b` `[N]`, by the rules of
    /// [`BiasRule`].
    ///
    /// # Errors
    /// `self` not 2-D, a bias of another length or split (named), or an
    /// MLX error.
    pub fn add_bias<R: Operand<C>>(&self, b: &R, s: &Stream) -> Result<Self>
    where
        P: BiasRule<R::Placement>,
    {
        type B<R, C> = <R as Operand<C>>::Placement;
        let b = b.sharded();
        let (y, n) = (self.global_shape(), b.global_shape());
        if y.len() != 2 || n != [y[1]] {
            return Err(Error::Shape(format!(
                "a bias of global shape {n:?} added to outputs of global shape {y:?}: the bias needs one value per output column"
            )));
        }
        if B::<R, C>::AXIS.is_some() && self.axis_lengths(1) != b.axis_lengths(0) {
            return Err(Error::Shape(format!(
                "a {} bias split {:?} added to {} outputs split {:?}: they must be split alike",
                B::<R, C>::name(),
                b.axis_lengths(0),
                P::name(),
                self.axis_lengths(1)
            )));
        }
        let (local, bias) = self.meeting(b, s)?;
        Ok(self.map(local.add(&bias, s)?))
    }
}

impl<C: Collective> LinearWeight<Sharded<0>, C> {
    /// The rows `ids` of the table `[V, D]` split by rows: on each rank its
    /// own rows of those ids and zeros for the others' (a quantized table
    /// dequantizes only those rows), so the lookup is `Partial`, `[T, D]`,
    /// and `.all_sum()` completes it. An id outside the table is an error
    /// naming it and its position.
    ///
    /// # Errors
    /// An id of `V` or more, more ids than MLX's shapes hold, or an MLX
    /// error.
    pub fn lookup(&self, ids: &[u32], s: &Stream) -> Result<ShardedArray<Partial, C>> {
        let [vocab, dim] = self.global_shape();
        let lengths = self.axis_split().unwrap_or_default();
        let (comm, rank) = (self.comm(), self.comm().rank());
        let (first, count) = split_part(&lengths, rank);
        let (rows, keep, t) = local_rows(ids, vocab, (first, count))?;
        let d = i32::try_from(dim).map_err(|_| Error::ShapeOverflow { value: dim })?;
        let local = match self {
            Self::Float(w) if count > 0 => w.local().take_axis(&rows, 0, s)?,
            Self::Quantized(w) if count > 0 => w.local().take_rows(&rows, s)?.dequantize(s)?,
            Self::Float(w) => safemlx::ops::zeros_dtype(&[t, d], w.local().dtype(), s)?,
            Self::Quantized(w) => safemlx::ops::zeros_dtype(&[t, d], w.local().scales.dtype(), s)?,
        };
        let local = if count > 0 {
            local.multiply(&keep.as_dtype(local.dtype(), s)?, s)?
        } else {
            local
        };
        ShardedArray::from_local(local, comm, &[t, d])
    }
}

/// A lookup of `ids` on the rank holding rows `(first, count)` of a table
/// of `vocab` rows: each id's local row (0 for another rank's), `[T]`; a
/// `float32` `[T, 1]` mask, 1 where the row is this rank's; and `T`.
fn local_rows(
    ids: &[u32],
    vocab: usize,
    (first, count): (usize, usize),
) -> Result<(Array, Array, i32)> {
    if let Some((at, id)) = ids.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
        return Err(Error::Shape(format!(
            "token {id} at position {at} is outside the vocabulary of {vocab} tokens"
        )));
    }
    let t = i32::try_from(ids.len()).map_err(|_| Error::ShapeOverflow { value: ids.len() })?;
    let mine = |t: u32| (first..first + count).contains(&(t as usize));
    let rows: Vec<i32> = ids
        .iter()
        .map(|&t| {
            if mine(t) {
                (t as usize - first) as i32
            } else {
                0
            }
        })
        .collect();
    let keep: Vec<f32> = ids.iter().map(|&t| f32::from(u8::from(mine(t)))).collect();
    Ok((
        Array::from_slice(&rows, &[t]),
        Array::from_slice(&keep, &[t, 1]),
        t,
    ))
}
