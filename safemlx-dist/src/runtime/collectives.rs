//! The collectives: lazy MLX graph nodes on an explicit stream.
//!
//! Each function validates its arguments (see `validate.rs`) before native
//! code runs, returns its input unchanged on a singleton group, and otherwise
//! adds one MLX node; bytes move when the result is evaluated.

use safemlx::{Array, Dtype, Stream};

use super::composed::{self, Combine};
use super::exchange;
use super::gradient_rules;
use super::group::Group;
use super::lowering::{self, AllReducePlan, SumScatterPlan};
use super::native::{self, Unary};
use super::path;
use super::profile;
use super::validate;
use crate::error::{Error, PeerRole, Result};

fn tracing() -> bool {
    super::gradient_sum::is_tracing()
}

fn reduce(op: Unary, input: &Array, group: &Group, stream: &Stream) -> Result<Array> {
    let name = match op {
        Unary::AllSum => "all_sum",
        Unary::AllMax => "all_max",
        Unary::AllMin => "all_min",
        _ => "all_reduce",
    };
    group.enter(name, input);
    let combine = Combine::of(op).unwrap_or(Combine::Sum);
    if let Some(chain) = group.path() {
        let me = group.rank();
        let composed = |x: &Array, c: Combine| path::all_reduce(chain, me, x, c, stream);
        return group.in_order(input, |input| {
            profile::timed(input, || match tracing() {
                // The sum's and extremum's gradients of MLX's own groups.
                true => gradient_rules::reduce(input, combine, composed, stream),
                false => composed(input, combine),
            })
        });
    }
    if tracing() && !group.is_singleton() && op != Unary::AllSum {
        // MLX passes the gradient of an `AllReduce` through unchanged,
        // right for a sum only.
        return group.in_order(input, |input| {
            let native = |x: &Array, c: Combine| {
                let op = match c {
                    Combine::Sum => Unary::AllSum,
                    Combine::Max => Unary::AllMax,
                    Combine::Min => Unary::AllMin,
                };
                native::unary(op, x, group.native()?, stream)
            };
            gradient_rules::reduce(input, combine, native, stream)
        });
    }
    group.in_order(input, |input| {
        profile::timed(input, || reduce_untimed(op, input, group, stream))
    })
}

fn reduce_untimed(op: Unary, input: &Array, group: &Group, stream: &Stream) -> Result<Array> {
    if group.is_singleton() {
        return Ok(input.clone());
    }
    if tracing() {
        // MLX's `AllReduce` has the gradient of a replicated result; the
        // exchange and ring lowerings have none or a different one.
        return native::unary(op, input, group.native()?, stream);
    }
    let plan = lowering::all_reduce(
        group.lowering(),
        group.backend(),
        input.size(),
        input.nbytes(),
        group.size(),
    );
    match (plan, Combine::of(op)) {
        (AllReducePlan::Ring, Some(combine)) => composed::all_reduce(input, combine, group, stream),
        (AllReducePlan::AllToAll, Some(combine)) => {
            exchange::all_reduce(input, combine, group, stream)
        }
        _ => native::unary(op, input, group.native()?, stream),
    }
}

/// Element-wise sum across the group; every rank gets the same result, of
/// the input's shape.
///
/// Cost: an all-reduce; with the ring algorithm each rank sends and receives
/// about `2 * (size - 1) / size` times the input's bytes. On the ring backend
/// messages of 1 to 2 MiB between 2 ranks go through two `all_to_all_v`
/// exchanges, and of 2 to 8 MiB through a ring reduce-scatter + all-gather
/// built from `send`/`recv`, which measured faster than MLX's op there (see
/// the group's [`Lowering`](crate::runtime::Lowering) and the book's table).
pub fn all_sum(input: &Array, group: &Group, stream: impl AsRef<Stream>) -> Result<Array> {
    reduce(Unary::AllSum, input, group, stream.as_ref())
}

/// Element-wise maximum across the group; same shape and cost as [`all_sum`].
pub fn all_max(input: &Array, group: &Group, stream: impl AsRef<Stream>) -> Result<Array> {
    reduce(Unary::AllMax, input, group, stream.as_ref())
}

/// Element-wise minimum across the group; same shape and cost as [`all_sum`].
pub fn all_min(input: &Array, group: &Group, stream: impl AsRef<Stream>) -> Result<Array> {
    reduce(Unary::AllMin, input, group, stream.as_ref())
}

/// Every rank's input concatenated along axis 0, in rank order (a scalar
/// becomes 1-D when the group has more than one rank).
///
/// Cost: each rank receives `(size - 1)` times its input's bytes.
///
/// # Errors
/// `all-gather output's first dimension exceeds i32` when `first_dim * size`
/// does not fit MLX's `i32` shapes.
pub fn all_gather(input: &Array, group: &Group, stream: impl AsRef<Stream>) -> Result<Array> {
    if group.is_singleton() {
        return Ok(input.clone());
    }
    validate::all_gather(input.shape(), group.size())?;
    group.enter("all_gather", input);
    let s = stream.as_ref();
    group.in_order(input, |input| {
        profile::timed(input, || match group.path() {
            Some(chain) if tracing() => gradient_rules::all_gather(
                input,
                (group.rank(), group.size()),
                |x| path::all_gather(chain, group.rank(), x, s),
                s,
            ),
            Some(chain) => path::all_gather(chain, group.rank(), input, s),
            None => native::unary(Unary::AllGather, input, group.native()?, s),
        })
    })
}

/// Sum across the group, then rank `r` keeps the `r`-th of `size` equal
/// chunks along axis 0 (a reduce-scatter).
///
/// Cost: each rank sends and receives about `(size - 1) / size` times the
/// input's bytes, half of an [`all_sum`]. MLX 0.32 has this op only on NCCL;
/// elsewhere it is one `all_to_all_v` exchange and a local sum (ring at 2
/// ranks up to 1 MiB, MPI from 256 KiB), a ring reduce-scatter of
/// `send`/`recv` (ring otherwise) or MLX's `all_sum` followed by a slice
/// (MPI below 256 KiB, or the `native` lowering).
///
/// # Errors
/// A scalar input, a negative dimension, or a first dimension that the group
/// size does not divide, e.g.
/// `sum-scatter input's first dimension (10) is not divisible by group size (4)`.
pub fn sum_scatter(input: &Array, group: &Group, stream: impl AsRef<Stream>) -> Result<Array> {
    if group.is_singleton() {
        return Ok(input.clone());
    }
    validate::sum_scatter(input.shape(), group.size())?;
    group.enter("sum_scatter", input);
    let stream = stream.as_ref();
    if let (Some(chain), false) = (group.path(), tracing()) {
        return group.in_order(input, |input| {
            profile::timed(input, || {
                path::sum_scatter(chain, group.rank(), input, stream)
            })
        });
    }
    group.in_order(input, |input| {
        profile::timed(input, || {
            let plan = if tracing() {
                // The one lowering with a gradient rule everywhere.
                SumScatterPlan::AllSumSlice
            } else {
                lowering::sum_scatter(
                    group.lowering(),
                    group.backend(),
                    input.nbytes(),
                    group.size(),
                )
            };
            match plan {
                SumScatterPlan::Native => {
                    native::unary(Unary::SumScatter, input, group.native()?, stream)
                }
                SumScatterPlan::AllSumSlice => composed::all_sum_then_slice(input, group, stream),
                SumScatterPlan::Ring => composed::sum_scatter(input, group, stream),
                SumScatterPlan::AllToAll => exchange::sum_scatter(input, group, stream),
            }
        })
    })
}

/// Variable-row exchange: `send_counts[d]` leading rows of `input` go to rank
/// `d` (the input is laid out in destination order); `recv_counts[s]` rows
/// come from rank `s` (the output is laid out in source order).
///
/// Cost: exactly the rows named by the counts move; nothing for a rank's own rows.
///
/// # Errors
/// The checks of `spec/runtime.md`, in its order: a scalar input, counts
/// without one entry per rank, overflowing sums or byte sizes, a send sum
/// other than the input's rows, mismatched singleton totals, and a self send
/// count different from the self receive count.
pub fn all_to_all_v(
    input: &Array,
    send_counts: &[usize],
    recv_counts: &[usize],
    group: &Group,
    stream: impl AsRef<Stream>,
) -> Result<Array> {
    let counts = validate::all_to_all_v(
        input.shape(),
        input.item_size(),
        group.rank(),
        group.size(),
        send_counts,
        recv_counts,
    )?;
    if group.is_singleton() {
        return Ok(input.clone());
    }
    group.enter("all_to_all_v", input);
    if let (Some(chain), true) = (group.path(), tracing()) {
        return group.in_order(input, |input| {
            let fixed = safemlx::stop_gradient(input, stream.as_ref())?;
            let exchanged = profile::timed(&fixed, || {
                path::all_to_all_v(
                    chain,
                    group.rank(),
                    &fixed,
                    &counts.send,
                    &counts.recv,
                    stream.as_ref(),
                )
            })?;
            // MLX's rule: the gradient goes back the way the rows came
            // (the reverse exchange, counts swapped).
            let (group, s) = (group.clone(), stream.as_ref().clone());
            let (send, recv) = (counts.send.clone(), counts.recv.clone());
            native::with_vjp(
                input,
                &exchanged,
                Box::new(move |g| match group.path() {
                    Some(chain) => path::all_to_all_v(chain, group.rank(), g, &recv, &send, &s),
                    None => Err(Error::Setting(
                        "a ring subgroup without its chain".to_owned(),
                    )),
                }),
            )
        });
    }
    if let Some(chain) = group.path() {
        return group.in_order(input, |input| {
            profile::timed(input, || {
                path::all_to_all_v(
                    chain,
                    group.rank(),
                    input,
                    &counts.send,
                    &counts.recv,
                    stream.as_ref(),
                )
            })
        });
    }
    group.in_order(input, |input| {
        profile::timed(input, || {
            native::all_to_all_v(
                input,
                &counts.send,
                &counts.recv,
                group.native()?,
                stream.as_ref(),
            )
        })
    })
}

/// Lazily sends `input` to rank `destination`; evaluate the returned array
/// to perform the send. The ring backend only reaches direct neighbours.
///
/// Cost: the input's bytes, once.
pub fn send(
    input: &Array,
    destination: usize,
    group: &Group,
    stream: impl AsRef<Stream>,
) -> Result<Array> {
    let destination = validate::peer(destination, group.size(), PeerRole::Destination)?;
    if let Some(chain) = group.path() {
        let peer = chain.neighbour(group.rank(), usize::try_from(destination).unwrap_or(0))?;
        return native::send(input, peer, chain.world(), stream.as_ref());
    }
    native::send(input, destination, group.native()?, stream.as_ref())
}

/// Lazily receives an array of `shape` and `dtype` from rank `source`.
///
/// Cost: the received bytes, once.
pub fn recv(
    shape: &[i32],
    dtype: Dtype,
    source: usize,
    group: &Group,
    stream: impl AsRef<Stream>,
) -> Result<Array> {
    validate::recv_shape(shape)?;
    let source = validate::peer(source, group.size(), PeerRole::Source)?;
    if let Some(chain) = group.path() {
        let peer = chain.neighbour(group.rank(), usize::try_from(source).unwrap_or(0))?;
        return native::recv(shape, dtype, peer, chain.world(), stream.as_ref());
    }
    native::recv(shape, dtype, source, group.native()?, stream.as_ref())
}

/// Lazily receives an array with `like`'s shape and dtype from rank `source`.
pub fn recv_like(
    like: &Array,
    source: usize,
    group: &Group,
    stream: impl AsRef<Stream>,
) -> Result<Array> {
    let source = validate::peer(source, group.size(), PeerRole::Source)?;
    if let Some(chain) = group.path() {
        let peer = chain.neighbour(group.rank(), usize::try_from(source).unwrap_or(0))?;
        return native::recv_like(like, peer, chain.world(), stream.as_ref());
    }
    native::recv_like(like, source, group.native()?, stream.as_ref())
}
