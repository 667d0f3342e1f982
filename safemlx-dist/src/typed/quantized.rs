//! `QuantizedArray<P, C>`: a quantized `[out, in]` weight laid out across
//! the ranks of `C`, for `#[sharded]` layer structs.
//!
//! The weight stays in MLX's affine form ([`AffineWeight`]: packed `uint32`
//! values, scales, biases) from the file to the matmul. Its placements:
//!
//! | placement    | rank `r` holds                                   | split by       |
//! |--------------|--------------------------------------------------|----------------|
//! | `Replicated` | the whole weight                                 | -              |
//! | `Sharded<0>` | its chunk of the rows (outputs)                  | the chunk rule over rows |
//! | `Sharded<1>` | its chunk of every row's groups (inputs)         | the chunk rule over groups |
//!
//! Splitting the inputs by groups always gives whole groups (3 groups over
//! 2 ranks are 2 + 1); no other placement exists for a quantized weight,
//! and `QuantizedArray<Partial>` does not compile.

use safemlx::{Array, Stream};

use super::ops::NoRule;
use super::placement::{chunk, chunk_lengths, Partial, Placement, Replicated, Sharded};
use super::sharded::ShardedArray;
use super::weights::FieldLayout;
use super::Collective;
use crate::affine::AffineWeight;
use crate::error::{Error, Result};
use crate::runtime::Group;

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Replicated {}
    impl Sealed for super::Sharded<0> {}
    impl Sealed for super::Sharded<1> {}
}

/// The placements a quantized `[out, in]` weight can have.
#[diagnostic::on_unimplemented(
    message = "a quantized weight cannot be `{Self}`",
    label = "not a placement of a quantized weight",
    note = "a quantized `[out, in]` weight is `Replicated`, `Sharded<0>` (rows: outputs) or `Sharded<1>` (inputs, in whole groups)"
)]
pub trait QuantizedPlacement: Placement + sealed::Sealed {}
impl QuantizedPlacement for Replicated {}
impl QuantizedPlacement for Sharded<0> {}
impl QuantizedPlacement for Sharded<1> {}

/// The placement of `Self` (x) times `Wᵀ` for a quantized `W` placed `Q`
/// ([`ShardedArray::quantized_matmul`]).
#[diagnostic::on_unimplemented(
    message = "no quantized matmul rule for `{Self}` x a `{Q}` quantized weight",
    label = "`{Self}` times a `{Q}` weight (transposed) has no placement",
    note = "the rules (x times W transposed, W [out, in]): Replicated x Sharded<0> (column parallel) -> Sharded<1>; Sharded<1> x Sharded<1> (row parallel) -> Partial; Replicated x Replicated -> Replicated; Sharded<0> x Replicated -> Sharded<0>; Partial x Replicated -> Partial",
    note = "a weight split by inputs (`Sharded<1>`) takes x split by columns: `.shard::<1>()` it first"
)]
pub trait QuantizedMatmulRule<Q>: Placement {
    /// The result's placement.
    type Output: Placement;
}

impl<P: Placement> QuantizedMatmulRule<NoRule> for P {
    type Output = P;
}

macro_rules! quantized_matmul_rules {
    ($($x:ty, $w:ty => $out:ty;)*) => {$(
        impl QuantizedMatmulRule<$w> for $x {
            type Output = $out;
        }
    )*};
}

quantized_matmul_rules! {
    Replicated, Replicated => Replicated;
    Replicated, Sharded<0> => Sharded<1>;
    Sharded<1>, Sharded<1> => Partial;
    Sharded<0>, Replicated => Sharded<0>;
    Partial, Replicated => Partial;
}

/// A quantized `[out, in]` weight (see the module docs): this rank's part,
/// the group, the logical shape, group size and bits.
#[derive(Debug, Clone)]
pub struct QuantizedArray<P: QuantizedPlacement, C: Collective = Group> {
    local: AffineWeight,
    comm: C,
    global: [usize; 2],
    /// Every rank's length (elements) along the sharded axis when not the
    /// chunk rule's (see [`from_local_split`](Self::from_local_split)).
    split: Option<std::sync::Arc<[usize]>>,
    _placement: std::marker::PhantomData<P>,
}

/// What rank `rank` of `n` keeps of a `[rows, columns]` weight in groups
/// of `group_size` under `P`: `(first, count)` of the rows, or of every
/// row's groups; `None` for all of it.
pub(crate) fn quantized_part<P: Placement>(
    [rows, columns]: [usize; 2],
    group_size: usize,
    (rank, n): (usize, usize),
) -> Option<(usize, usize)> {
    match P::AXIS {
        Some(0) => Some(chunk(rows, rank, n)),
        Some(_) => Some(chunk(columns / group_size, rank, n)),
        None => None,
    }
}

impl<P: QuantizedPlacement, C: Collective> QuantizedArray<P, C> {
    /// Wraps this rank's part `local` of a quantized weight of logical
    /// shape `global` (`[rows, columns]`).
    ///
    /// # Errors
    /// `local` is not what this rank holds under `P` (both shapes and the
    /// group size named), or `columns` is not whole groups.
    pub fn from_local(local: AffineWeight, comm: &C, global: [usize; 2]) -> Result<Self> {
        let g = local.group_size;
        if global[1] % g != 0 {
            return Err(Error::Shape(format!(
                "a quantized weight of shape {global:?} in groups of {g}: its {} columns are not whole groups",
                global[1]
            )));
        }
        let expected = match quantized_part::<P>(global, g, (comm.rank(), comm.size())) {
            Some((_, count)) if P::AXIS == Some(0) => [count, global[1]],
            Some((_, groups)) => [global[0], groups * g],
            None => global,
        };
        if local.shape() != expected {
            return Err(Error::Shape(format!(
                "rank {} of {} holds {expected:?} of a {} quantized weight of shape {global:?} in groups of {g}, but its part has shape {:?}",
                comm.rank(),
                comm.size(),
                P::name(),
                local.shape()
            )));
        }
        Ok(Self::wrap(local, comm, global, None))
    }

    fn wrap(
        local: AffineWeight,
        comm: &C,
        global: [usize; 2],
        split: Option<std::sync::Arc<[usize]>>,
    ) -> Self {
        Self {
            local,
            comm: comm.clone(),
            global,
            split,
            _placement: std::marker::PhantomData,
        }
    }

    /// Wraps this rank's part `local` of a quantized weight of logical
    /// shape `global` whose sharded axis is divided as `split` says: rank
    /// `r` holds `split[r]` rows (`Sharded<0>`) or input columns
    /// (`Sharded<1>`, whole groups), in rank order, instead of the chunk
    /// rule's: the rows of a gate projection that meet a down projection's
    /// groups, say.
    ///
    /// # Errors
    /// A replicated placement, a `split` without one length per rank, not
    /// adding up to the axis or cutting a group, or a `local` part of
    /// another shape, each named.
    pub fn from_local_split(
        local: AffineWeight,
        comm: &C,
        global: [usize; 2],
        split: &[usize],
    ) -> Result<Self> {
        let g = local.group_size;
        let n = comm.size();
        let Some(axis) = P::AXIS else {
            return Err(Error::Shape(format!(
                "an explicit split is for a sharded quantized weight, not {}",
                P::name()
            )));
        };
        let cuts = axis == 1 && split.iter().any(|len| len % g != 0);
        if split.len() != n || split.iter().sum::<usize>() != global[axis] || cuts {
            return Err(Error::Shape(format!(
                "a split {split:?} of axis {axis} of a quantized weight {global:?} in groups of {g} over {n} ranks: it needs one length per rank, adding up to the axis{}",
                if axis == 1 { ", each whole groups" } else { "" }
            )));
        }
        let mut expected = global;
        expected[axis] = split[comm.rank()];
        if local.shape() != expected {
            return Err(Error::Shape(format!(
                "rank {} of {n} holds {expected:?} of a {} quantized weight of shape {global:?} split {split:?}, but its part has shape {:?}",
                comm.rank(),
                P::name(),
                local.shape()
            )));
        }
        Ok(Self::wrap(local, comm, global, Some(split.into())))
    }

    /// Every rank's length (elements) along the sharded axis: rows for
    /// `Sharded<0>`, input columns for `Sharded<1>`; `None` when
    /// replicated.
    pub fn axis_split(&self) -> Option<Vec<usize>> {
        let axis = P::AXIS?;
        if let Some(split) = &self.split {
            return Some(split.to_vec());
        }
        let (n, [rows, columns]) = (self.comm.size(), self.global);
        Some(if axis == 0 {
            chunk_lengths(rows, n)
        } else {
            let g = self.local.group_size;
            chunk_lengths(columns / g, n)
                .iter()
                .map(|c| c * g)
                .collect()
        })
    }

    /// This rank's part of the full quantized weight `full`. No
    /// communication.
    ///
    /// # Errors
    /// An MLX error.
    pub fn from_full(full: &AffineWeight, comm: &C, s: &Stream) -> Result<Self> {
        let global = full.shape();
        let local = match quantized_part::<P>(global, full.group_size, (comm.rank(), comm.size())) {
            Some((first, count)) if P::AXIS == Some(0) => full.rows(first, count, s)?,
            Some((first, count)) => full.groups(first, count, s)?,
            None => full.clone(),
        };
        Self::from_local(local, comm, global)
    }

    /// This rank's part.
    pub fn local(&self) -> &AffineWeight {
        &self.local
    }

    /// The group the weight is laid out over.
    pub fn comm(&self) -> &C {
        &self.comm
    }

    /// The logical `[rows, columns]`.
    pub fn global_shape(&self) -> [usize; 2] {
        self.global
    }

    /// The full quantized weight again, on every rank. Cost: one
    /// `all_gather` each of the packed values, scales and biases of a
    /// sharded weight; nothing for a replicated one. Evaluated here, as
    /// [`gather_weight`](super::gather_weight) is.
    ///
    /// # Errors
    /// An MLX or communication error.
    pub fn gather_full(&self, s: &Stream) -> Result<AffineWeight> {
        let Some(axis) = P::AXIS else {
            return Ok(self.local.clone());
        };
        let q = &self.local;
        let lengths = self.axis_split().unwrap_or_default();
        let (values, groups) = if axis == 0 {
            (lengths.clone(), lengths)
        } else {
            let groups: Vec<usize> = lengths.iter().map(|c| c / q.group_size).collect();
            let words = q.group_size * q.bits / 32;
            (groups.iter().map(|g| g * words).collect(), groups)
        };
        let weight = self.comm.all_gather(&q.weight, axis, &values, s)?;
        let scales = self.comm.all_gather(&q.scales, axis, &groups, s)?;
        let biases = self.comm.all_gather(&q.biases, axis, &groups, s)?;
        crate::runtime::eval(&[&weight, &scales, &biases])?;
        AffineWeight::new(weight, scales, biases, q.group_size, q.bits)
    }
}

/// The four tensors a checkpoint stores for a quantized field `w` (what
/// a checkpoint's weight source reads back): `w` (the packed
/// values), `w.scales`, `w.biases` and `w.quantization` (`uint32`
/// `[group_size, bits]`), in that order.
pub fn checkpoint_tensors(full: AffineWeight) -> [Array; 4] {
    let quantization = Array::from_slice(&[full.group_size as u32, full.bits as u32], &[2]);
    [full.weight, full.scales, full.biases, quantization]
}

impl FieldLayout {
    /// The layout of the quantized weight `weight`, named `name` (its
    /// logical shapes).
    pub fn of_quantized<P: QuantizedPlacement, C: Collective>(
        name: &'static str,
        weight: &QuantizedArray<P, C>,
    ) -> Self {
        let shape = |s: [usize; 2]| s.iter().map(|&d| d as i32).collect();
        Self {
            name,
            placement: format!("Quantized {}", P::name()),
            segments: 1,
            global_shape: shape(weight.global),
            local_shape: shape(weight.local.shape()),
        }
    }
}

impl<P: Placement, C: Collective> ShardedArray<P, C> {
    /// `x Wᵀ` for a 2-D `x` `[T, in]` and a quantized `W` `[out, in]`,
    /// without dequantizing, by the rules of [`QuantizedMatmulRule`] (those
    /// of `x.matmul(Wᵀ)`): a `Replicated` `x` times a `Sharded<0>` `W`
    /// (column parallel) is `Sharded<1>`, a `Sharded<1>` `x` times a
    /// `Sharded<1>` `W` (row parallel) is `Partial`.
    ///
    /// # Errors
    /// Shapes that do not agree, or a row-parallel product whose `x`
    /// columns (chunked by elements) are not the weight's inputs (chunked
    /// by groups) on this rank.
    pub fn quantized_matmul<Q: QuantizedPlacement>(
        &self,
        w: &QuantizedArray<Q, C>,
        s: &Stream,
    ) -> Result<ShardedArray<<P as QuantizedMatmulRule<Q>>::Output, C>>
    where
        P: QuantizedMatmulRule<Q>,
    {
        let (x, [rows, columns]) = (self.global_shape(), w.global);
        if x.len() != 2 || usize::try_from(x[1]).ok() != Some(columns) {
            return Err(Error::Shape(format!(
                "quantized matmul of {} {x:?} by a {} quantized weight [{rows}, {columns}] transposed: x must be 2-D with {columns} columns",
                P::name(),
                Q::name()
            )));
        }
        let local_inputs = w.local.shape()[1];
        let x_inputs = self.local().shape().get(1).map(|&c| c as usize);
        // A row-parallel product: x's column split must be the weight's
        // input groups on every rank, not only on this one.
        let row_parallel = P::AXIS == Some(1) && Q::AXIS == Some(1);
        if row_parallel && x_inputs == Some(local_inputs) {
            let (xs, ws) = (self.axis_lengths(1), w.axis_split().unwrap_or_default());
            if xs != ws {
                return Err(Error::Shape(format!(
                    "quantized matmul of {} {x:?} by a {} quantized weight [{rows}, {columns}] transposed: x's columns are split {xs:?} over the ranks but the weight's inputs {ws:?}; they must be split alike",
                    P::name(),
                    Q::name()
                )));
            }
        }
        if x_inputs != Some(local_inputs) {
            return Err(Error::Shape(format!(
                "quantized matmul on rank {} of {}: x ({}) holds {} of the {columns} inputs but the weight ({}) holds {local_inputs} ({} of {} groups of {}); a Sharded<1> x splits its columns by elements unless made with a split, and the weight by groups, which agree only when every chunk is whole groups (e.g. {columns} a multiple of {} times the ranks)",
                self.comm().rank(),
                self.comm().size(),
                P::name(),
                x_inputs.unwrap_or(0),
                Q::name(),
                local_inputs / w.local.group_size,
                columns / w.local.group_size,
                w.local.group_size,
                w.local.group_size,
            )));
        }
        // A replicated x times a sharded weight: x's local gradient is this
        // rank's share (see `grad`).
        let x_local = if P::REPLICATED && !Q::REPLICATED {
            self.summed_local(s)?
        } else {
            self.local().clone()
        };
        let local = w.local.matmul_t(&x_local, s)?;
        let out = ShardedArray::new_unchecked(local, self.comm().clone(), vec![x[0], rows as i32]);
        // A column-parallel product keeps a row split of the weight.
        let split = (Q::AXIS == Some(0)).then(|| w.split.clone()).flatten();
        Ok(out.with_split(split))
    }
}
