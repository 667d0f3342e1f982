//! Sharding full weights per rank and gathering them back: what the
//! `#[sharded]` struct form expands to.

use safemlx::{Array, Stream};

use super::collective::slice_axis;
use super::placement::{chunk, Placement};
use super::sharded::ShardedArray;
use super::Collective;
use crate::error::{Error, Result};

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

fn axis_of<P: Placement>(name: &str, full: &Array) -> Result<Option<usize>> {
    match P::AXIS {
        Some(axis) if axis >= full.ndim() => Err(Error::Shape(format!(
            "weight `{name}` is {} but has shape {:?}: it has no axis {axis}",
            P::name(),
            full.shape()
        ))),
        other => Ok(other),
    }
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
    let Some(axis) = axis_of::<P>(name, &full)? else {
        return ShardedArray::from_local(full, comm, &global);
    };
    let (rank, n) = (comm.rank(), comm.size());
    let dim = usize::try_from(global[axis]).unwrap_or(0);
    if segments <= 1 {
        let (offset, len) = chunk(dim, rank, n);
        return ShardedArray::from_local(slice_axis(&full, axis, offset, len, s)?, comm, &global);
    }
    if dim % (segments * n) != 0 {
        return Err(Error::Shape(format!(
            "weight `{name}` has {dim} elements along axis {axis} in {segments} segments: each segment ({} elements) must divide evenly over {n} ranks",
            dim / segments
        )));
    }
    let block = dim / segments;
    let per_rank = block / n;
    let parts = (0..segments)
        .map(|j| slice_axis(&full, axis, j * block + rank * per_rank, per_rank, s))
        .collect::<Result<Vec<_>>>()?;
    let local = safemlx::ops::concatenate_axis(&parts, axis as i32, s)?;
    ShardedArray::from_local(local, comm, &global)
}

/// The full weight again, on every rank (the inverse of [`shard_weight`]).
/// Cost: one `all_gather` of a sharded weight; nothing for a replicated one.
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
pub fn check_weight_dims(name: &str, full: &Array, dims: &[usize]) -> Result<()> {
    let matches = full.ndim() == dims.len()
        && full
            .shape()
            .iter()
            .zip(dims)
            .all(|(&got, &want)| usize::try_from(got).ok() == Some(want));
    if matches {
        Ok(())
    } else {
        Err(Error::Shape(format!(
            "weight `{name}` is declared with dims {dims:?} but the full weight given has shape {:?}",
            full.shape()
        )))
    }
}
