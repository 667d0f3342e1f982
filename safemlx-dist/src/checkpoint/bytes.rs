//! Arrays from and to row-major bytes, in pieces that fit MLX's `i32`
//! dimensions.

use safemlx::{Array, Dtype, Stream};

use super::format;
use crate::error::{Error, Result};
use crate::runtime::slice_axis;

/// The array of `shape` and `dtype` whose row-major bytes are `bytes`.
///
/// The bytes travel as MLX arrays of `u8` viewed as `dtype`; an MLX
/// dimension is an `i32`, so a part larger than `max_piece` bytes is built
/// from pieces of whole rows (along axis 0), concatenated.
pub(super) fn from_bytes(
    bytes: &[u8],
    dtype: Dtype,
    shape: &[i32],
    max_piece: usize,
    s: &Stream,
) -> Result<Array> {
    let piece = |bytes: &[u8], shape: &[i32]| -> Result<Array> {
        let len =
            i32::try_from(bytes.len()).map_err(|_| Error::ShapeOverflow { value: bytes.len() })?;
        Ok(Array::from_slice(bytes, &[len])
            .view_dtype(dtype, s)?
            .reshape(shape, s)?)
    };
    if bytes.len() <= max_piece || shape.is_empty() {
        return piece(bytes, shape);
    }
    let row_bytes =
        shape[1..].iter().map(|&d| d as usize).product::<usize>() * format::item_size(dtype);
    if row_bytes == 0 || row_bytes > max_piece {
        return Err(Error::ShapeOverflow { value: row_bytes });
    }
    let rows_per_piece = max_piece / row_bytes;
    let pieces = bytes
        .chunks(rows_per_piece * row_bytes)
        .map(|chunk| {
            let mut piece_shape = shape.to_vec();
            piece_shape[0] = (chunk.len() / row_bytes) as i32;
            piece(chunk, &piece_shape)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(safemlx::ops::concatenate_axis(&pieces, 0, s)?)
}

/// The row-major bytes of `array`, read back through MLX arrays of `u8` of
/// at most `max_piece` bytes each (an MLX dimension is an `i32`).
pub(super) fn to_bytes(array: &Array, max_piece: usize, s: &Stream) -> Result<Vec<u8>> {
    let flat = array.contiguous(false, s)?.reshape(&[-1], s)?;
    let item = format::item_size(array.dtype());
    let per_piece = (max_piece / item).max(1);
    let len = flat.size();
    let mut bytes = Vec::with_capacity(len * item);
    // One piece at least, so that an empty array is read (as nothing) too.
    for start in (0..len.max(1)).step_by(per_piece) {
        let count = per_piece.min(len - start);
        let raw = slice_axis(&flat, 0, start, count, s)?.view_dtype(Dtype::Uint8, s)?;
        crate::runtime::eval(&[&raw])?;
        let read = raw
            .into_evaluated()?
            .try_to_vec::<u8>()
            .map_err(|e| Error::Shape(e.to_string()))?;
        bytes.extend_from_slice(&read);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use safemlx::{Device, DeviceType};

    #[test]
    fn large_tensors_are_read_and_written_in_pieces() {
        let s = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));
        let values: Vec<f32> = (0..15).map(|v| v as f32).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        // Rows of 3 floats (12 bytes); pieces of at most 25 bytes: 2 rows each.
        let array = from_bytes(&bytes, Dtype::Float32, &[5, 3], 25, &s).unwrap();
        assert_eq!(array.shape(), [5, 3]);
        let read = array.evaluated().unwrap().try_to_vec::<f32>().unwrap();
        assert_eq!(read, values);
        // And back, in pieces of at most 16 bytes (4 floats).
        let array = Array::from_slice(&values, &[5, 3]);
        assert_eq!(to_bytes(&array, 16, &s).unwrap(), bytes);
        assert_eq!(to_bytes(&array, 1 << 20, &s).unwrap(), bytes);
        // A row larger than a piece cannot be split.
        assert_eq!(
            from_bytes(&bytes, Dtype::Float32, &[5, 3], 8, &s).unwrap_err(),
            Error::ShapeOverflow { value: 12 }
        );
    }
}
