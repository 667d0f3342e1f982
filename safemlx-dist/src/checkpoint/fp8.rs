//! FP8 weights with block scales, as DeepSeek-V3/R1 and Kimi K2 ship them
//! (`quantization_config`: `quant_method` `fp8`, `weight_block_size`
//! `[128, 128]`): a weight `W` `[m, n]` stored `F8_E4M3` (one byte a value:
//! sign, 4 exponent bits biased by 7, 3 mantissa bits; no infinities,
//! `0x7f`/`0xff` NaN) beside `W_scale_inv` `[ceil(m / 128), ceil(n / 128)]`
//! (`float32`), the value being `fp8(W[i, j]) * scale_inv[i / 128, j /
//! 128]` (mlx-lm's `deepseek_v3.py` sanitize; the last tiles are padded).
//!
//! A rank reads its rows or columns rounded out to whole tiles and the
//! scales of those tiles, and dequantizes them to `float32` as they are
//! read (MLX multiplies no FP8).

use safemlx::{Array, Stream};

use super::affine::Stored;
use crate::error::{Error, Result};

/// An FP8 weight and its block scales.
#[derive(Debug)]
pub(super) struct BlockScaled {
    /// The `F8_E4M3` tensor `[m, n]`.
    pub weight: String,
    /// Its `float32` scales, one per tile.
    pub scales: String,
    /// The tile: `[rows, columns]` (`weight_block_size`).
    pub block: [usize; 2],
}

/// The value of an `F8_E4M3` byte.
pub fn e4m3(byte: u8) -> f32 {
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let (exponent, mantissa) = (i32::from((byte >> 3) & 0x0f), f32::from(byte & 0x07));
    if exponent == 0x0f && mantissa == 7.0 {
        return f32::NAN;
    }
    match exponent {
        0 => sign * mantissa / 8.0 * 2f32.powi(-6),
        e => sign * (1.0 + mantissa / 8.0) * 2f32.powi(e - 7),
    }
}

impl BlockScaled {
    /// Ranges `(first, count)` along `axis` (0 rows, 1 columns) as
    /// `float32`, dequantized.
    ///
    /// # Errors
    /// A weight that is not 2-D, scales of another shape than its tiles
    /// (both named), ranges past its end, or a failed read.
    pub fn along(
        &self,
        source: &dyn Stored,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array> {
        let fail = |message: String| Error::Checkpoint {
            path: source.location().display().to_string(),
            message,
        };
        let shape = source.stored_shape(&self.weight)?;
        let &[m, n] = shape.as_slice() else {
            return Err(fail(format!(
                "FP8 weight `{}` has shape {shape:?}; block-scaled weights are 2-D",
                self.weight
            )));
        };
        let (m, n) = (m as usize, n as usize);
        let [bm, bn] = self.block;
        let tiles = [m.div_ceil(bm), n.div_ceil(bn)];
        let scale_shape = source.stored_shape(&self.scales)?;
        if scale_shape != [tiles[0] as i32, tiles[1] as i32] {
            return Err(fail(format!(
                "FP8 weight `{}` [{m}, {n}] in tiles of {bm}x{bn} needs scales `{}` of shape {tiles:?}, not {scale_shape:?}",
                self.weight, self.scales
            )));
        }
        let (len, b) = ([m, n][axis.min(1)], self.block[axis.min(1)]);
        let mut parts = Vec::with_capacity(ranges.len());
        for &(first, count) in ranges.iter().filter(|r| r.1 > 0) {
            if axis > 1 || first.checked_add(count).is_none_or(|end| end > len) {
                return Err(fail(format!(
                    "FP8 weight `{}` [{m}, {n}]: {count} values from {first} along axis {axis} were asked for",
                    self.weight
                )));
            }
            // Whole tiles along the axis, then this range of them.
            let (t0, t1) = (first / b, (first + count).div_ceil(b).max(first / b));
            let (a, z) = (t0 * b, (t1 * b).min(len));
            let bytes = source.stored_along(&self.weight, axis, &[(a, z - a)], s)?;
            let scales = source.stored_along(&self.scales, axis, &[(t0, t1 - t0)], s)?;
            let bytes = bytes
                .into_evaluated()?
                .try_to_vec::<u8>()
                .unwrap_or_default();
            let scales = scales
                .as_dtype(safemlx::Dtype::Float32, s)?
                .into_evaluated()?
                .try_to_vec::<f32>()
                .unwrap_or_default();
            // The block's shape: rows x columns read.
            let (rows, columns) = if axis == 0 { (z - a, n) } else { (m, z - a) };
            let tile_columns = if axis == 0 { tiles[1] } else { t1 - t0 };
            let mut values = Vec::with_capacity(rows * columns);
            for (i, row) in bytes.chunks_exact(columns.max(1)).enumerate() {
                let scale_row = &scales[(i / bm) * tile_columns..];
                values.extend(
                    row.iter()
                        .enumerate()
                        .map(|(j, &q)| e4m3(q) * scale_row[j / bn]),
                );
            }
            let block = Array::from_slice(&values, &[rows as i32, columns as i32]);
            parts.push(crate::runtime::slice_axis(
                &block,
                axis,
                first - a,
                count,
                s,
            )?);
        }
        if parts.is_empty() {
            let shape = if axis == 0 {
                [0, n as i32]
            } else {
                [m as i32, 0]
            };
            return Ok(safemlx::ops::zeros::<f32>(&shape, s)?);
        }
        Ok(safemlx::ops::concatenate_axis(&parts, axis as i32, s)?)
    }
}
