//! Slices of arrays along an axis, for the collectives' compositions, the
//! gradient sums and the layers above.

use safemlx::{Array, Stream};

use crate::error::{Error, Result};

fn as_i32(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::ShapeOverflow { value: v })
}

/// Elements `[offset, offset + len)` of `x` along `axis`.
pub(crate) fn slice_axis(
    x: &Array,
    axis: usize,
    offset: usize,
    len: usize,
    s: &Stream,
) -> Result<Array> {
    let dim = usize::try_from(x.shape()[axis]).unwrap_or(0);
    if offset == 0 && len == dim {
        return Ok(x.clone());
    }
    let bounds = [as_i32(offset)?, as_i32(offset + len)?];
    let mut parts = x.split_axis(&bounds, as_i32(axis)?, s)?;
    Ok(parts.swap_remove(1))
}
