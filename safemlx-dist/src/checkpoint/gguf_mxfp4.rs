//! llama.cpp's MXFP4 experts (type 39, gpt-oss's `ffn_*_exps`) kept
//! packed in MLX's `mxfp4` layout. A llama.cpp block is 17 bytes: the
//! E8M0 scale, then 16 bytes of which byte `j` holds value `j` (low
//! nibble) and value `j + 16` (high nibble). MLX packs eight 4-bit values
//! a `uint32` word, the first in the lowest bits, beside one scale byte
//! per 32 values. Both hold the same 4-bit E2M1 codes and the same scale
//! byte (MLX's `2^(e - 127)`; llama.cpp's table of doubled values times
//! `2^(e - 128)` is the same number), so only the nibbles move.

use safemlx::Array;

use super::{GgufFile, PackedParts};
use crate::error::Result;

/// Values per MXFP4 block, and its bytes in llama.cpp's layout.
const BLOCK: (usize, usize) = (32, 17);

impl GgufFile {
    /// Ranges `(first, count)` along `axis` of the 3-D MXFP4 tensor
    /// `name`, kept packed as MLX's `mxfp4` (`uint32` values `[.., ..,
    /// in / 8]`, `uint8` scales `[.., .., in / 32]`, no biases),
    /// concatenated along `axis`. Ranges along the last axis are in
    /// values and must be whole blocks of 32.
    ///
    /// # Errors
    /// No such tensor, not 3-D, ranges past its end or cutting a block,
    /// or a failed read.
    pub(super) fn read_mxfp4_stacked(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
    ) -> Result<PackedParts> {
        let t = self.tensor(name)?;
        let shape = self.stacked_shape(name, axis)?;
        let [e, r, c] = shape.map(|d| d as usize);
        let (per, bytes) = BLOCK;
        let row_bytes = (c / per * bytes) as u64;
        let picked: usize = ranges.iter().map(|r| r.1).sum();
        // (first row, rows, first block, blocks) pieces, in output order.
        let (pieces, out): (Vec<_>, [usize; 3]) = if axis == 2 {
            let bad = |&&(f, n): &&(usize, usize)| f % per != 0 || n % per != 0 || f + n > c;
            if let Some(&(first, count)) = ranges.iter().find(bad) {
                return Err(self.error(format!(
                    "tensor `{name}` holds {c} columns in MXFP4 blocks of {per}; columns {first}..{} were asked for (whole blocks only)",
                    first.saturating_add(count)
                )));
            }
            let pieces = (0..e * r)
                .flat_map(|row| ranges.iter().map(move |&(f, n)| (row, 1, f / per, n / per)))
                .collect();
            (pieces, [e, r, picked])
        } else {
            let rows = self.flat_rows(name, [e, r], axis, ranges)?;
            let mut out = [e, r, c];
            out[axis] = picked;
            let pieces = rows.iter().map(|&(f, n)| (f, n, 0, c / per)).collect();
            (pieces, out)
        };
        let values = out.iter().product::<usize>();
        let (mut words, mut scales) = (
            Vec::with_capacity(values / 8),
            Vec::with_capacity(values / per),
        );
        for (row, rows, block, blocks) in pieces {
            // Whole rows are one read of consecutive rows; a block range one
            // read in its row.
            let start = row as u64 * row_bytes + (block * bytes) as u64;
            let len = (rows * blocks * bytes) as u64;
            let read = self.read_at(name, t.offset + start, len)?;
            read.chunks_exact(bytes)
                .for_each(|b| to_mlx(b, &mut words, &mut scales));
        }
        let dims = |last: usize| [out[0] as i32, out[1] as i32, last as i32];
        Ok((
            Array::from_slice(&words, &dims(out[2] / 8)),
            Array::from_slice(&scales, &dims(out[2] / per)),
            None,
        ))
    }
}

/// One llama.cpp MXFP4 block as MLX packs it: four words and the scale.
fn to_mlx(block: &[u8], words: &mut Vec<u32>, scales: &mut Vec<u8>) {
    scales.push(block[0]);
    let qs = &block[1..];
    let value = |i: usize| match i {
        0..16 => qs[i] & 0x0F,
        _ => qs[i - 16] >> 4,
    };
    for w in 0..4 {
        let word = (0..8).fold(0u32, |word, k| {
            word | u32::from(value(8 * w + k)) << (4 * k)
        });
        words.push(word);
    }
}

#[cfg(test)]
mod tests {
    use super::to_mlx;

    #[test]
    fn a_block_moves_its_nibbles_into_mlx_order() {
        // Value i of the block is i % 16 (llama.cpp: byte j holds values
        // j and j + 16, low nibble first).
        let mut block = vec![130u8];
        block.extend((0..16u8).map(|j| j | (j << 4)));
        let (mut words, mut scales) = (Vec::new(), Vec::new());
        to_mlx(&block, &mut words, &mut scales);
        assert_eq!(scales, [130]);
        // MLX: value k of word w in bits 4k..4k+4, values 8w..8w+8.
        assert_eq!(words, [0x7654_3210, 0xFEDC_BA98, 0x7654_3210, 0xFEDC_BA98]);
    }
}
