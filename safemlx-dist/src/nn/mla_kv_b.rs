//! The rows of a latent-attention layer's `kv_b` (`[H (nope + v), r]`:
//! each head's key rows, then its value rows) that a rank's heads need,
//! from either layout a checkpoint has: Hugging Face's `kv_b_proj`, or
//! mlx-lm's per-head split, as every mlx-community DeepSeek-V3 and Kimi K2
//! directory stores it, `embed_q` `[H, r, nope]` (each head's key rows,
//! transposed) and `unembed_out` `[H, v, r]` (its value rows), floats or
//! affine quantized. Either way they are floats here: the layer absorbs
//! `kv_b` into the queries and the outputs.

use safemlx::ops;
use safemlx::{Array, Stream};

use crate::checkpoint::Weights;
use crate::error::{Error, Result};

/// The stems of `kv_b_proj`, `embed_q` and `unembed_out`.
pub(super) type Stems<'a> = [&'a str; 3];

/// The layer's heads and their key, value and latent widths.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dims {
    pub heads: usize,
    pub nope: usize,
    pub v: usize,
    pub rank: usize,
}

/// Heads `(first, count)`'s rows of `kv_b` as floats, `[count (nope + v),
/// r]`.
///
/// # Errors
/// A quantized `kv_b_proj` (refused: read the float model or mlx-lm's
/// split), a missing tensor, or one of another shape (named).
pub(super) fn read(
    w: &Weights,
    [kv_b_stem, embed_q_stem, unembed_out_stem]: Stems<'_>,
    c: Dims,
    (first, count): (usize, usize),
    s: &Stream,
) -> Result<Array> {
    let weight = |stem: &str| format!("{stem}.weight");
    let (embed_q, unembed_out) = (weight(embed_q_stem), weight(unembed_out_stem));
    let rows = c.nope + c.v;
    if w.contains(&embed_q) {
        let r = c.rank;
        // [count, r, nope] -> [count, nope, r]; then each head's value rows.
        let keys = w
            .floats_along(&embed_q, &[c.heads, r, c.nope], 0, (first, count), s)?
            .swap_axes(1, 2, s)?;
        let values = w.floats_along(&unembed_out, &[c.heads, c.v, r], 0, (first, count), s)?;
        let heads = ops::concatenate_axis(&[&keys, &values], 1, s)?;
        return Ok(heads.reshape(&[(count * rows) as i32, r as i32], s)?);
    }
    let kv_b = weight(kv_b_stem);
    if w.quantization(&kv_b).is_some() {
        return Err(Error::Model {
            path: w.source().path().display().to_string(),
            message: format!(
                "tensor `{}` is quantized; latent attention absorbs it into the queries and outputs as floats: load the float model, or mlx-lm's conversion (its per-head `{}` and `{}`)",
                w.name(&kv_b),
                embed_q_stem,
                unembed_out_stem
            ),
        });
    }
    w.rows(
        &kv_b,
        &[c.heads * rows, c.rank],
        &[(first * rows, count * rows)],
        s,
    )
}
