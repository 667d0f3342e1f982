//! llama.cpp's K-quants: super-blocks of 256 values in sub-blocks with
//! their own scales (the layouts of llama.cpp's `ggml-quants.c` and the
//! `gguf` package's `quants.py`), and MXFP4 (gpt-oss).
//!
//! | type | bytes | layout | values |
//! |---|---|---|---|
//! | Q2_K | 84 | `scales[16]`, `qs[64]`, `d`, `dmin` | 16 sub-blocks of 16: `d (sc & 15) q - dmin (sc >> 4)`, 2-bit `q` |
//! | Q3_K | 110 | `hmask[32]`, `qs[64]`, `scales[12]`, `d` | 16 of 16: `d (sc - 32) (q - 4 [high bit clear])`, 6-bit `sc` |
//! | Q4_K | 144 | `d`, `dmin`, `scales[12]`, `qs[128]` | 8 of 32: `d sc q - dmin m`, 6-bit `sc`, `m`, 4-bit `q` |
//! | Q5_K | 176 | `d`, `dmin`, `scales[12]`, `qh[32]`, `qs[128]` | 8 of 32: as Q4_K with a fifth bit from `qh` |
//! | Q6_K | 210 | `ql[128]`, `qh[64]`, `scales[16]` (`i8`), `d` | 16 of 16: `d sc (q - 32)`, 6-bit `q` |
//! | MXFP4 | 17 | `e`, `qs[16]` | 32 values: `2^(e - 127) / 2 * fp4(q)`, low nibbles first |
//!
//! Q4_K and Q5_K are MLX affine with groups of 32 exactly (scale `d sc`,
//! bias `-dmin m`): [`affine_k`] gives their sub-blocks in that form.

/// One Q4_K / Q5_K sub-block's 6-bit scale and minimum, `j` in `0..8`.
fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn f16(bytes: &[u8]) -> f32 {
    half::f16::from_le_bytes([bytes[0], bytes[1]]).to_f32()
}

/// A Q4_K or Q5_K super-block (`high`: Q5_K) as 8 sub-blocks of 32: their
/// values `q` (0..16 or 0..32), scales `d sc` and biases `-dmin m`, in
/// order.
pub(super) fn affine_k(block: &[u8], high: bool) -> ([u8; 256], [f32; 8], [f32; 8]) {
    let (d, dmin) = (f16(&block[0..2]), f16(&block[2..4]));
    let scales = &block[4..16];
    let (qh, qs) = match high {
        true => (Some(&block[16..48]), &block[48..176]),
        false => (None, &block[16..144]),
    };
    let mut values = [0u8; 256];
    let (mut scale, mut bias) = ([0f32; 8], [0f32; 8]);
    for sub in 0..8 {
        let (sc, m) = scale_min(sub, scales);
        scale[sub] = d * f32::from(sc);
        bias[sub] = -(dmin * f32::from(m));
        // Sub-blocks 2c and 2c + 1 are the low and high nibbles of bytes
        // 32c..32c + 32; Q5_K's fifth bit of sub-block s is bit s of qh.
        let bytes = &qs[32 * (sub / 2)..32 * (sub / 2) + 32];
        for (l, &b) in bytes.iter().enumerate() {
            let low = if sub % 2 == 0 { b & 0x0F } else { b >> 4 };
            let fifth = qh.map_or(0, |qh| ((qh[l] >> sub) & 1) << 4);
            values[32 * sub + l] = low | fifth;
        }
    }
    (values, scale, bias)
}

/// The 256 values of a Q2_K super-block.
fn q2_k(block: &[u8], out: &mut Vec<f32>) {
    let (scales, qs) = (&block[0..16], &block[16..80]);
    let (d, dmin) = (f16(&block[80..82]), f16(&block[82..84]));
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for j in 0..4 {
            for part in 0..2 {
                let sc = scales[8 * half + 2 * j + part];
                let (dl, ml) = (d * f32::from(sc & 0x0F), dmin * f32::from(sc >> 4));
                for &b in &q[16 * part..16 * part + 16] {
                    out.push(dl * f32::from((b >> (2 * j)) & 3) - ml);
                }
            }
        }
    }
}

/// Q3_K's 16 6-bit scales from its 12 bytes.
fn q3_k_scales(bytes: &[u8]) -> [i8; 16] {
    let word = |i: usize| {
        u32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ])
    };
    let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
    let (a0, a1, tmp) = (word(0), word(1), word(2));
    let aux = [
        (a0 & k2) | ((tmp & k1) << 4),
        (a1 & k2) | (((tmp >> 2) & k1) << 4),
        ((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4),
        ((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4),
    ];
    let mut out = [0i8; 16];
    for (i, w) in aux.iter().enumerate() {
        for (k, b) in w.to_le_bytes().into_iter().enumerate() {
            out[4 * i + k] = b as i8;
        }
    }
    out
}

/// The 256 values of a Q3_K super-block.
fn q3_k(block: &[u8], out: &mut Vec<f32>) {
    let (hmask, qs) = (&block[0..32], &block[32..96]);
    let scales = q3_k_scales(&block[96..108]);
    let d = f16(&block[108..110]);
    let mut is = 0;
    let mut m = 1u8;
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for j in 0..4 {
            for part in 0..2 {
                let dl = d * f32::from(i16::from(scales[is]) - 32);
                is += 1;
                for l in 16 * part..16 * part + 16 {
                    let low = i16::from((q[l] >> (2 * j)) & 3);
                    let high = if hmask[l] & m != 0 { 0 } else { 4 };
                    out.push(dl * f32::from(low - high));
                }
            }
            m <<= 1;
        }
    }
}

/// The 256 values of a Q6_K super-block.
fn q6_k(block: &[u8], out: &mut Vec<f32>) {
    let (ql, qh, scales) = (&block[0..128], &block[128..192], &block[192..208]);
    let d = f16(&block[208..210]);
    let mut values = [0f32; 256];
    for half in 0..2 {
        let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
        let sc = &scales[8 * half..];
        let y = &mut values[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q = [
                (ql[l] & 0x0F) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (k, q) in q.into_iter().enumerate() {
                let scale = f32::from(sc[is + 2 * k] as i8);
                y[l + 32 * k] = d * scale * f32::from(i16::from(q) - 32);
            }
        }
    }
    out.extend_from_slice(&values);
}

/// The 32 values of an MXFP4 block: a power-of-two scale `e` (biased by
/// 127) and 16 bytes, value `j` the low nibble of byte `j`, `j + 16` the
/// high one, each an FP4 (E2M1) number.
fn mxfp4(block: &[u8], out: &mut Vec<f32>) {
    const FP4: [f32; 16] = [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];
    // 2^(e - 127); e = 0 is the subnormal 2^-127.
    let scale = match block[0] {
        0 => f32::from_bits(0x0040_0000),
        e => f32::from_bits(u32::from(e) << 23),
    };
    let qs = &block[1..17];
    out.extend(qs.iter().map(|&q| FP4[usize::from(q & 0x0F)] * scale));
    out.extend(qs.iter().map(|&q| FP4[usize::from(q >> 4)] * scale));
}

/// Appends the values of one block of K-quant or MXFP4 `kind` (its name in
/// llama.cpp) to `out`; `false` for another type.
pub(super) fn dequantize_block(kind: &str, block: &[u8], out: &mut Vec<f32>) -> bool {
    match kind {
        "Q2_K" => q2_k(block, out),
        "Q3_K" => q3_k(block, out),
        "Q4_K" | "Q5_K" => {
            let (values, scale, bias) = affine_k(block, kind == "Q5_K");
            for (i, &q) in values.iter().enumerate() {
                out.push(scale[i / 32] * f32::from(q) + bias[i / 32]);
            }
        }
        "Q6_K" => q6_k(block, out),
        "MXFP4" => mxfp4(block, out),
        _ => return false,
    }
    true
}
