//! Computation that each rank does on its own shards: JAX's `shard_map`
//! for one sharded axis.
//!
//! Attention is the example: once queries, keys and values are split by
//! heads, every rank attends over its own heads with no communication, in
//! code (reshapes to heads, rotations, the softmax) that the typed ops do
//! not spell. [`shard_map`] runs such a function on the local arrays and
//! wraps its result back as a `Sharded<AXIS>` array, so the placements
//! still flow from the layer's input to its output: no `Partial` can enter
//! (the function would see a partial sum), and a `Replicated` input (a
//! norm weight) meets the rank's computation as in every typed op, its
//! gradient summed over the ranks while a gradient is traced.
//! [`partial_map`] is the same for a rank's share of a sum (`Partial`).

use safemlx::{Array, Stream};

use super::collective::Collective;
use super::placement::{Partial, Replicated, Sharded};
use super::sharded::ShardedArray;
use crate::error::Result;

/// `f` on this rank's shards and the replicated arrays, its result this
/// rank's part of a `Sharded<AXIS>` array of logical shape `global`,
/// divided as `split` says (`None`: the chunk rule).
///
/// `f` must compute each rank's result from that rank's shards alone
/// (heads attend to their own keys): the result is taken as the rank's
/// part of the output, with no communication. The shards' locals are the
/// arrays themselves (a declared copy through its gradient sum, see
/// [`ShardedArray::copy_of`]); the replicated ones through their gradient
/// sum while a gradient is traced.
///
/// # Errors
/// What `f` returns, or a result whose shape is not this rank's part of
/// `global` (named).
pub fn shard_map<const AXIS: usize, const N: usize, C, F>(
    shards: [&ShardedArray<Sharded<AXIS>, C>; N],
    replicated: &[&ShardedArray<Replicated, C>],
    (global, split): (&[i32], Option<&[usize]>),
    f: F,
    s: &Stream,
) -> Result<ShardedArray<Sharded<AXIS>, C>>
where
    C: Collective,
    F: FnOnce([Array; N], Vec<Array>) -> Result<Array>,
{
    let Some(first) = shards.first() else {
        return Err(crate::error::Error::Shape(
            "shard_map needs at least one sharded input".to_owned(),
        ));
    };
    let comm = first.comm().clone();
    let shard_locals = try_map(shards, |x| x.operand_local(false, s))?;
    let local = f(shard_locals, summed_together(replicated, s)?)?;
    match split {
        Some(split) => ShardedArray::from_local_split(local, &comm, global, split),
        None => ShardedArray::from_local(local, &comm, global),
    }
}

/// This rank's share of a sum computed from `replicated` inputs (and the
/// rank's own parts, which `f` may read): `f` on the replicated arrays'
/// locals, its result this rank's share of a `Partial` array of logical
/// shape `global`. An MoE layer on replicated tokens is the example: every
/// rank routes every token, computes the slots of its own experts, and
/// the output is the sum of the ranks' shares.
///
/// While a gradient is traced, the replicated inputs' gradients through
/// `f` are this rank's share and are summed over the ranks in one
/// `all_sum` for all of them, so a rank whose `f` builds another graph
/// than its peers' (its experts got no token) still issues the same sums
/// in the same order. Later rank-dependent uses of those arrays share the
/// same sum. A rank whose share is nothing must still compute it from
/// every input (zeros weighted by its gates, say): a result that does not
/// depend on them would leave its peers waiting for its sum.
///
/// # Errors
/// No replicated input, what `f` returns, or a result of another shape
/// than `global` (named).
pub fn partial_map<C, F>(
    replicated: &[&ShardedArray<Replicated, C>],
    global: &[i32],
    f: F,
    s: &Stream,
) -> Result<ShardedArray<Partial, C>>
where
    C: Collective,
    F: FnOnce(Vec<Array>) -> Result<Array>,
{
    let Some(first) = replicated.first() else {
        return Err(crate::error::Error::Shape(
            "partial_map needs at least one replicated input".to_owned(),
        ));
    };
    let comm = first.comm().clone();
    let local = f(summed_together(replicated, s)?)?;
    ShardedArray::from_local(local, &comm, global)
}

/// The replicated arrays' locals as rank-dependent computation uses them:
/// while a gradient is traced on several ranks, those without a sum yet go
/// through one joint sum (one `all_sum` backwards for all), which each
/// array keeps for its later uses.
fn summed_together<C: Collective>(
    replicated: &[&ShardedArray<Replicated, C>],
    s: &Stream,
) -> Result<Vec<Array>> {
    let Some(first) = replicated.first() else {
        return Ok(Vec::new());
    };
    if !crate::runtime::is_tracing() || first.comm().size() == 1 {
        return Ok(replicated.iter().map(|x| x.local().clone()).collect());
    }
    let fresh: Vec<&ShardedArray<Replicated, C>> = replicated
        .iter()
        .copied()
        .filter(|x| !x.has_summed())
        .collect();
    if !fresh.is_empty() {
        let locals: Vec<&Array> = fresh.iter().map(|x| x.local()).collect();
        let none = crate::runtime::SharedSlots::NONE;
        let (summed, _) =
            crate::runtime::sum_gradients_together(&locals, &[], none, first.comm().group(), s)?;
        for (x, a) in fresh.iter().zip(summed) {
            x.set_summed(a);
        }
    }
    replicated
        .iter()
        .map(|x| x.operand_local(true, s))
        .collect()
}

/// `g` on each element of `items`, stopping at the first error.
fn try_map<T, const N: usize>(
    items: [T; N],
    mut g: impl FnMut(T) -> Result<Array>,
) -> Result<[Array; N]> {
    let arrays: Vec<Array> = items.into_iter().map(&mut g).collect::<Result<_>>()?;
    arrays.try_into().map_err(|_| {
        crate::error::Error::Shape("shard_map: an input count changed while mapping".to_owned())
    })
}
