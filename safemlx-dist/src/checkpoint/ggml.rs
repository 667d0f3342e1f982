//! ggml's tensor types read here (F32, F16, BF16, Q8_0, Q4_0, Q4_1) and
//! their blocks: dequantized to `float32`, or turned into MLX's affine form
//! exactly (see `gguf.rs` for the file around them).

/// The tensor types read here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// `float32`.
    F32,
    /// `float16`.
    F16,
    /// `bfloat16`.
    Bf16,
    /// 8-bit, blocks of 32 with an f16 scale.
    Q8_0,
    /// 4-bit, blocks of 32 with an f16 scale (values offset by 8).
    Q4_0,
    /// 4-bit, blocks of 32 with an f16 scale and minimum.
    Q4_1,
}

impl GgmlType {
    /// (elements, bytes) of one block.
    pub(crate) fn block(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::Bf16 => (1, 2),
            Self::Q8_0 => (32, 34),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
        }
    }

    pub(super) fn from_code(code: u32) -> std::result::Result<Self, String> {
        Ok(match code {
            0 => Self::F32,
            1 => Self::F16,
            30 => Self::Bf16,
            8 => Self::Q8_0,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            other => return Err(format!("{} ({other})", ggml_type_name(other))),
        })
    }
}

/// llama.cpp's names of its tensor types, for messages.
fn ggml_type_name(code: u32) -> &'static str {
    const NAMES: [&str; 31] = [
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",
        "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL",
        "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16",
    ];
    NAMES
        .get(code as usize)
        .copied()
        .unwrap_or("an unknown type")
}

/// Whole Q8_0, Q4_0 or Q4_1 blocks as MLX affine values with group size
/// 32, exactly (no re-quantization): the packed `uint32` words, `float32`
/// scales and biases, and the bits (8 or 4).
///
/// Q8_0 (`d * q`, `q` an `i8`) is 8-bit with `q + 128`, scale `d` and bias
/// `-128 d`; Q4_0 (`d * (q - 8)`) is 4-bit with `q`, scale `d` and bias
/// `-8 d`; Q4_1 (`d * q + m`) has scale `d` and bias `m`. GGUF stores a
/// 4-bit block's values `j` and `j + 16` in the low and high nibble of byte
/// `j`; MLX packs values in order, 8 to a word, the first in the lowest
/// bits, so the nibbles are reordered. In `float32` every product and sum
/// is exact for Q8_0 and Q4_0, and is the same single rounding as the
/// dequantized path for Q4_1, so `dequantize` of the result equals
/// [`dequantize`] of the blocks.
///
/// Another type has no affine form and gives empty vectors.
pub fn to_affine(kind: GgmlType, bytes: &[u8]) -> (Vec<u32>, Vec<f32>, Vec<f32>, usize) {
    let (_, block_bytes) = kind.block();
    let blocks = bytes.len() / block_bytes.max(1);
    let bits = if kind == GgmlType::Q8_0 { 8 } else { 4 };
    let mut words = Vec::with_capacity(blocks * 32 * bits / 32);
    let (mut scales, mut biases) = (Vec::with_capacity(blocks), Vec::with_capacity(blocks));
    let mut values = [0u8; 32];
    for block in bytes.chunks_exact(block_bytes) {
        let d = f16(&block[..2]);
        let qs = match kind {
            GgmlType::Q8_0 => {
                for (v, &q) in values.iter_mut().zip(&block[2..]) {
                    *v = (q as i8 as i16 + 128) as u8;
                }
                scales.push(d);
                biases.push(-128.0 * d);
                None
            }
            GgmlType::Q4_0 => {
                scales.push(d);
                biases.push(-8.0 * d);
                Some(&block[2..])
            }
            GgmlType::Q4_1 => {
                scales.push(d);
                biases.push(f16(&block[2..4]));
                Some(&block[4..])
            }
            _ => return (Vec::new(), Vec::new(), Vec::new(), 0),
        };
        match qs {
            None => words.extend(
                values
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
            Some(qs) => {
                for (j, &q) in qs.iter().enumerate() {
                    values[j] = q & 0x0F;
                    values[j + 16] = q >> 4;
                }
                words.extend(values.chunks_exact(8).map(|v| {
                    v.iter()
                        .enumerate()
                        .fold(0u32, |w, (i, &q)| w | u32::from(q) << (4 * i))
                }));
            }
        }
    }
    (words, scales, biases, bits)
}

fn f16(bytes: &[u8]) -> f32 {
    half::f16::from_le_bytes([bytes[0], bytes[1]]).to_f32()
}

/// The `float32` values of whole blocks of `kind` (see the module docs).
pub fn dequantize(kind: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let (per_block, block_bytes) = kind.block();
    let mut out = Vec::with_capacity(bytes.len() / block_bytes * per_block);
    for block in bytes.chunks_exact(block_bytes) {
        match kind {
            GgmlType::F32 => out.push(f32::from_le_bytes([block[0], block[1], block[2], block[3]])),
            GgmlType::F16 => out.push(f16(block)),
            GgmlType::Bf16 => out.push(half::bf16::from_le_bytes([block[0], block[1]]).to_f32()),
            GgmlType::Q8_0 => {
                let d = f16(&block[..2]);
                out.extend(block[2..].iter().map(|&q| f32::from(q as i8) * d));
            }
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let d = f16(&block[..2]);
                let (m, qs) = match kind {
                    GgmlType::Q4_1 => (f16(&block[2..4]), &block[4..]),
                    _ => (-8.0 * d, &block[2..]),
                };
                out.extend(qs.iter().map(|&q| f32::from(q & 0x0F) * d + m));
                out.extend(qs.iter().map(|&q| f32::from(q >> 4) * d + m));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_dequantize_low_nibbles_first() {
        let mut q4_1 = half::f16::from_f32(0.5).to_le_bytes().to_vec();
        q4_1.extend(half::f16::from_f32(-1.0).to_le_bytes());
        q4_1.extend((0..16u8).map(|j| j | (15 - j) << 4));
        let v = dequantize(GgmlType::Q4_1, &q4_1);
        assert_eq!(v.len(), 32);
        assert_eq!((v[0], v[1], v[15]), (-1.0, -0.5, 6.5));
        assert_eq!((v[16], v[31]), (6.5, -1.0));
        let mut q8 = half::f16::from_f32(0.25).to_le_bytes().to_vec();
        q8.extend((0..32).map(|j| (j as i8 - 16) as u8));
        let v = dequantize(GgmlType::Q8_0, &q8);
        assert_eq!((v[0], v[16], v[31]), (-4.0, 0.0, 3.75));
        let mut q4_0 = half::f16::from_f32(2.0).to_le_bytes().to_vec();
        q4_0.extend([0x8Fu8; 16]);
        let v = dequantize(GgmlType::Q4_0, &q4_0);
        assert_eq!((v[0], v[16]), (14.0, 0.0));
    }
}
