//! Partial sums of 16-bit operands over several ranks are kept in float32
//! until they are summed, then rounded once, as one process rounds them
//! (see the design notes, "16-bit partial sums are summed in float32").

use std::any::TypeId;

use safemlx::{Array, Dtype, Stream};

use super::placement::{Partial, Placement};
use super::sharded::ShardedArray;
use super::Collective;
use crate::error::Result;

/// The dtype a partial sum of `dtype` operands over `ranks` ranks is
/// rounded to once it is summed, when it is kept in float32 until then:
/// 16-bit floats over several ranks.
///
/// One process multiplies 16-bit operands with float32 accumulation and
/// rounds each product once. Ranks that each rounded their share and then
/// added the roundings would differ from it by several roundings per
/// layer, which grow through the layers (2-rank bfloat16 logits of
/// gpt-oss were 5.8e-2 from one process's); kept in float32 until the
/// sum, the result is rounded once, as in one process. The cost: a float
/// weight is widened for its row-parallel product, and the sum moves
/// twice the bytes.
pub(crate) fn wide_sum_of(dtype: Dtype, ranks: usize) -> Option<Dtype> {
    (ranks > 1 && matches!(dtype, Dtype::Bfloat16 | Dtype::Float16)).then_some(dtype)
}

/// The dtype a product of `x` placed as `Out` is rounded to after its
/// sum, when it is a partial sum kept wide ([`wide_sum_of`]).
pub(super) fn wide_partial<Out: Placement, C: Collective>(
    x: &ShardedArray<impl Placement, C>,
) -> Option<Dtype> {
    (TypeId::of::<Out>() == TypeId::of::<Partial>())
        .then(|| wide_sum_of(x.local().dtype(), x.comm().size()))
        .flatten()
}

/// A reduced sum in the dtype its partial sums were kept wide for.
pub(super) fn rounded<C: Collective>(
    x: &ShardedArray<Partial, C>,
    sum: Array,
    s: &Stream,
) -> Result<Array> {
    match x.rounds_to() {
        Some(dtype) => Ok(sum.as_dtype(dtype, s)?),
        None => Ok(sum),
    }
}
