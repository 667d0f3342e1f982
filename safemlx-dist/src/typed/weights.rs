//! Sharding full weights per rank and gathering them back: what the
//! `#[sharded]` struct form expands to.

use safemlx::{Array, Stream};

use super::placement::{chunk, Placement};
use super::sharded::ShardedArray;
use super::Collective;
use crate::error::{Error, Result};
use crate::runtime::slice_axis;

/// One field of a `#[sharded]` layer: what `layout()` lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldLayout {
    /// The field's name.
    pub name: &'static str,
    /// Its placement, e.g. `Sharded<1>`.
    pub placement: String,
    /// How many fused blocks its sharded axis holds (3 for a fused QKV).
    pub segments: usize,
    /// The full weight's shape.
    pub global_shape: Vec<i32>,
    /// This rank's part's shape.
    pub local_shape: Vec<i32>,
}

impl FieldLayout {
    /// The layout of `weight`, named `name`.
    pub fn of<P: Placement, C: Collective>(
        name: &'static str,
        segments: usize,
        weight: &ShardedArray<P, C>,
    ) -> Self {
        Self {
            name,
            placement: P::name(),
            segments,
            global_shape: weight.global_shape().to_vec(),
            local_shape: weight.local().shape().to_vec(),
        }
    }
}

/// The sharded axis of placement `P` for a weight of `shape`, checked.
pub(crate) fn sharded_axis<P: Placement>(name: &str, shape: &[i32]) -> Result<Option<usize>> {
    match P::AXIS {
        Some(axis) if axis >= shape.len() => Err(Error::Shape(format!(
            "weight `{name}` is {} but has shape {shape:?}: it has no axis {axis}",
            P::name(),
        ))),
        other => Ok(other),
    }
}

/// The ranges `(offset, len)` along a sharded axis of `dim` elements that
/// rank `rank` of `n` keeps, in order: its chunk, or with `segments = k`
/// its chunk of each of the `k` equal blocks.
///
/// # Errors
/// Segments that do not divide evenly over the ranks, naming the weight.
pub(crate) fn shard_ranges(
    name: &str,
    axis: usize,
    dim: usize,
    segments: usize,
    (rank, n): (usize, usize),
) -> Result<Vec<(usize, usize)>> {
    if segments <= 1 {
        return Ok(vec![chunk(dim, rank, n)]);
    }
    if dim % segments != 0 {
        return Err(Error::Shape(format!(
            "weight `{name}` has {dim} elements along axis {axis}, which do not split into {segments} equal segments (its fused blocks): {dim} is not a multiple of {segments}"
        )));
    }
    if dim % (segments * n) != 0 {
        return Err(Error::Shape(format!(
            "weight `{name}` has {dim} elements along axis {axis} in {segments} segments: each segment ({} elements) must divide evenly over {n} ranks",
            dim / segments
        )));
    }
    let block = dim / segments;
    let per_rank = block / n;
    Ok((0..segments)
        .map(|j| (j * block + rank * per_rank, per_rank))
        .collect())
}

/// This rank's part of the full weight `full`: all of it when replicated;
/// along the sharded axis its chunk, or with `segments = k` its chunk of
/// each of the `k` equal blocks (a fused QKV keeps `[Q_r | K_r | V_r]`).
pub fn shard_weight<P: Placement, C: Collective>(
    full: Array,
    comm: &C,
    segments: usize,
    name: &str,
    s: &Stream,
) -> Result<ShardedArray<P, C>> {
    let global = full.shape().to_vec();
    let Some(axis) = sharded_axis::<P>(name, &global)? else {
        return ShardedArray::from_local(full, comm, &global);
    };
    let dim = usize::try_from(global[axis]).unwrap_or(0);
    let ranges = shard_ranges(name, axis, dim, segments, (comm.rank(), comm.size()))?;
    let parts = ranges
        .iter()
        .map(|&(offset, len)| slice_axis(&full, axis, offset, len, s))
        .collect::<Result<Vec<_>>>()?;
    let local = match parts.as_slice() {
        [one] => one.clone(),
        _ => safemlx::ops::concatenate_axis(&parts, axis as i32, s)?,
    };
    ShardedArray::from_local(local, comm, &global)
}

/// The full weight again, on every rank (the inverse of [`shard_weight`]).
/// Cost: one `all_gather` of a sharded weight; nothing for a replicated one.
///
/// The gather is evaluated here, on every rank: gathered weights are often
/// used by one rank only (rank 0 saves the checkpoint), and a rank that
/// left its side of a collective unevaluated would stall the others.
pub fn gather_weight<P: Placement, C: Collective>(
    weight: &ShardedArray<P, C>,
    segments: usize,
    s: &Stream,
) -> Result<Array> {
    let Some(axis) = P::AXIS else {
        return Ok(weight.local().clone());
    };
    let lengths = weight.axis_lengths(axis);
    let gathered = weight
        .comm()
        .all_gather(weight.local(), axis, &lengths, s)?;
    crate::runtime::eval(&[&gathered])?;
    let n = weight.comm().size();
    if segments <= 1 || n == 1 {
        return Ok(gathered);
    }
    // Rank r's block holds its piece of every segment: reorder from
    // (rank, segment) to (segment, rank).
    let pieces = gathered.split(
        i32::try_from(n * segments).unwrap_or(i32::MAX),
        axis as i32,
        s,
    )?;
    let ordered: Vec<&Array> = (0..segments)
        .flat_map(|j| (0..n).map(move |r| (r, j)))
        .map(|(r, j)| &pieces[r * segments + j])
        .collect();
    Ok(safemlx::ops::concatenate_axis(&ordered, axis as i32, s)?)
}

/// A declared dimension of a `#[sharded]` function's spec.
#[derive(Debug, Clone, Copy)]
pub enum Dim {
    /// A literal size.
    Size(usize),
    /// A named size: every use of the name must agree.
    Named(&'static str),
}

/// The named sizes seen so far while checking one call's shapes.
#[derive(Debug, Default)]
pub struct Dims {
    bound: Vec<(&'static str, i32)>,
}

impl Dims {
    /// Checks `shape` (the global shape of `param`) against its declaration.
    ///
    /// # Errors
    /// The wrong rank or a size that differs from the declaration or from
    /// an earlier use of the same name, naming the parameter, the axis, the
    /// value and the expectation.
    pub fn check(
        &mut self,
        param: &str,
        declared: &str,
        shape: &[i32],
        dims: &[Dim],
    ) -> Result<()> {
        let fail = |what: String| {
            Err(Error::Shape(format!(
                "`{param}` is declared {declared} but its global shape is {shape:?}: {what}"
            )))
        };
        if shape.len() != dims.len() {
            return fail(format!(
                "it has {} dimensions, not {}",
                shape.len(),
                dims.len()
            ));
        }
        for (axis, (&got, dim)) in shape.iter().zip(dims).enumerate() {
            match *dim {
                Dim::Size(want) => {
                    if usize::try_from(got).ok() != Some(want) {
                        return fail(format!("axis {axis} is {got}, expected {want}"));
                    }
                }
                Dim::Named(name) => {
                    match self.bound.iter().find(|(n, _)| *n == name) {
                        Some(&(_, want)) if want != got => {
                            return fail(format!("axis {axis} is {got}, but `{name}` is {want} elsewhere in this call"));
                        }
                        Some(_) => {}
                        None if got >= 0 => self.bound.push((name, got)),
                        None => {}
                    }
                }
            }
        }
        Ok(())
    }
}

/// Checks a full weight against the shape its `#[shard(..., dims = [...])]`
/// declares, before anything is sliced.
///
/// # Errors
/// The field's name, the declared shape and the weight's shape.
pub fn check_weight_dims(name: &str, shape: &[i32], dims: &[usize]) -> Result<()> {
    let matches = shape.len() == dims.len()
        && shape
            .iter()
            .zip(dims)
            .all(|(&got, &want)| usize::try_from(got).ok() == Some(want));
    if matches {
        Ok(())
    } else {
        Err(Error::Shape(format!(
            "weight `{name}` is declared with dims {dims:?} but the full weight given has shape {shape:?}"
        )))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn segments_that_do_not_divide_the_axis_are_named_as_such() {
        // Before, at 1 rank: "each segment (42 elements) must divide evenly over 1 ranks".
        assert_eq!(
            super::shard_ranges("qkv", 1, 128, 3, (0, 1)).unwrap_err().to_string(),
            "weight `qkv` has 128 elements along axis 1, which do not split into 3 equal segments (its fused blocks): 128 is not a multiple of 3"
        );
        assert_eq!(
            super::shard_ranges("qkv", 1, 96, 3, (1, 2)).unwrap(),
            [(16, 16), (48, 16), (80, 16)]
        );
    }
}
