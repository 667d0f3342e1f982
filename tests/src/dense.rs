//! Helpers for comparing parallel layers with dense computations.

use safemlx::{Array, Stream};

use crate::typed::Rng;

/// A float32 array of `shape` with small values (`-9..=9` times `scale`).
pub fn random(rng: &mut Rng, shape: &[i32], scale: f32) -> Array {
    let len = shape.iter().product::<i32>() as usize;
    let values: Vec<f32> = rng
        .values(len)
        .into_iter()
        .map(|v| v as f32 * scale)
        .collect();
    Array::from_slice(&values, shape)
}

/// `a` evaluated and read back as float32, in row-major order.
pub fn host(a: &Array, s: &Stream) -> Vec<f32> {
    a.contiguous(false, s)
        .and_then(|a| a.into_evaluated())
        .expect("evaluates")
        .try_to_vec::<f32>()
        .expect("float32")
}

/// The largest absolute difference, relative to the largest reference value.
pub fn max_relative_error(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "sizes differ");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    got.iter()
        .zip(want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()))
        / scale
}
