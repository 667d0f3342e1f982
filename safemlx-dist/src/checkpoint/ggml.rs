//! ggml's tensor types read here (F32, F16, BF16, Q8_0, Q4_0, Q4_1, the
//! K-quants Q2_K to Q6_K, MXFP4) and their blocks: dequantized to
//! `float32`, or turned into MLX's affine form exactly (Q8_0, Q4_0, Q4_1,
//! Q4_K, Q5_K; see `gguf.rs` for the file around them, `kquants.rs` for
//! the K-quants' blocks).

use super::kquants::{affine_k, dequantize_block};

/// The tensor types read here, named as llama.cpp names them.
#[allow(non_camel_case_types)]
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
    /// 2-bit, super-blocks of 256 in 16 sub-blocks with 4-bit scales and minimums.
    Q2_K,
    /// 3-bit, super-blocks of 256 in 16 sub-blocks with 6-bit scales.
    Q3_K,
    /// 4-bit, super-blocks of 256 in 8 sub-blocks of 32 with 6-bit scales and minimums.
    Q4_K,
    /// 5-bit, as Q4_K with a fifth bit per value.
    Q5_K,
    /// 6-bit, super-blocks of 256 in 16 sub-blocks with 8-bit scales.
    Q6_K,
    /// FP4 (E2M1) values, blocks of 32 with a power-of-two scale.
    MXFP4,
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
            Self::Q2_K => (256, 84),
            Self::Q3_K => (256, 110),
            Self::Q4_K => (256, 144),
            Self::Q5_K => (256, 176),
            Self::Q6_K => (256, 210),
            Self::MXFP4 => (32, 17),
        }
    }

    /// Bits per value when the type is MLX affine with groups of 32
    /// exactly (and stays quantized); `None` for the others.
    pub fn affine_bits(self) -> Option<usize> {
        match self {
            Self::Q8_0 => Some(8),
            Self::Q4_0 | Self::Q4_1 | Self::Q4_K => Some(4),
            Self::Q5_K => Some(5),
            _ => None,
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
            10 => Self::Q2_K,
            11 => Self::Q3_K,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            39 => Self::MXFP4,
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

/// Whole Q8_0, Q4_0, Q4_1, Q4_K or Q5_K blocks as MLX affine values with
/// group size 32, exactly (no re-quantization): the packed `uint32` words,
/// `float32` scales and biases, and the bits (8, 4 or 5).
///
/// Q8_0 (`d * q`, `q` an `i8`) is 8-bit with `q + 128`, scale `d` and bias
/// `-128 d`; Q4_0 (`d * (q - 8)`) is 4-bit with `q`, scale `d` and bias
/// `-8 d`; Q4_1 (`d * q + m`) has scale `d` and bias `m`; a Q4_K or Q5_K
/// sub-block of 32 has scale `d sc` and bias `-dmin m`. GGUF stores a
/// Q4_0/Q4_1 block's values `j` and `j + 16` in the low and high nibble of
/// byte `j`; MLX packs values in order as a little-endian bit stream (4
/// bits: 8 to a word, the first in the lowest bits; 5 bits: 8 in 40 bits),
/// so the values are reordered. In `float32` every product and sum is
/// exact for Q8_0 and Q4_0, and is the same single rounding as the
/// dequantized path for the others, so `dequantize` of the result equals
/// [`dequantize`] of the blocks.
///
/// Another type has no affine form and gives empty vectors.
pub fn to_affine(kind: GgmlType, bytes: &[u8]) -> (Vec<u32>, Vec<f32>, Vec<f32>, usize) {
    let (per_block, block_bytes) = kind.block();
    let Some(bits) = kind.affine_bits() else {
        return (Vec::new(), Vec::new(), Vec::new(), 0);
    };
    let blocks = bytes.len() / block_bytes.max(1);
    let groups = blocks * per_block / 32;
    let mut words = Vec::with_capacity(groups * bits);
    let (mut scales, mut biases) = (Vec::with_capacity(groups), Vec::with_capacity(groups));
    let mut values = [0u8; 32];
    for block in bytes.chunks_exact(block_bytes) {
        if let GgmlType::Q4_K | GgmlType::Q5_K = kind {
            let (q, scale, bias) = affine_k(block, kind == GgmlType::Q5_K);
            scales.extend(scale);
            biases.extend(bias);
            q.chunks_exact(32).for_each(|g| pack(g, bits, &mut words));
            continue;
        }
        let d = f16(&block[..2]);
        match kind {
            GgmlType::Q8_0 => {
                for (v, &q) in values.iter_mut().zip(&block[2..]) {
                    *v = (q as i8 as i16 + 128) as u8;
                }
                scales.push(d);
                biases.push(-128.0 * d);
            }
            _ => {
                let (bias, qs) = match kind {
                    GgmlType::Q4_1 => (f16(&block[2..4]), &block[4..]),
                    _ => (-8.0 * d, &block[2..]),
                };
                scales.push(d);
                biases.push(bias);
                for (j, &q) in qs.iter().enumerate() {
                    values[j] = q & 0x0F;
                    values[j + 16] = q >> 4;
                }
            }
        }
        pack(&values, bits, &mut words);
    }
    (words, scales, biases, bits)
}

/// `values` of `bits` bits each as MLX packs them: a little-endian bit
/// stream in `uint32` words (a group of 32 values fills `bits` words).
fn pack(values: &[u8], bits: usize, words: &mut Vec<u32>) {
    let (mut acc, mut filled) = (0u64, 0);
    for &v in values {
        acc |= u64::from(v) << filled;
        filled += bits;
        if filled >= 32 {
            words.push(acc as u32);
            acc >>= 32;
            filled -= 32;
        }
    }
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
            other => {
                dequantize_block(&format!("{other:?}"), block, &mut out);
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
