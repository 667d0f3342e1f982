//! mlx-lm's stacked experts, as every mlx-community directory stores an
//! MoE (mlx-lm's `SwitchGLU`): `{switch}.gate_proj` and `{switch}.up_proj`
//! `[E, H, D]`, `{switch}.down_proj` `[E, D, H]` (output rows by input
//! columns), as floats or affine quantized (`.weight` `uint32` `[E, out,
//! in * bits / 32]`, `.scales` and `.biases` `[E, out, in / group_size]`),
//! or in MLX's `mxfp4` mode (gpt-oss's: `.scales` `uint8`, no biases).
//!
//! Each rank reads only its experts (expert parallel) or its hidden slice
//! of every expert (expert tensor parallel: the gate and up rows, the down
//! projection's columns). Quantized experts stay packed and multiply with
//! MLX's `gather_qmm`; under expert tensor parallelism the hidden
//! dimension then splits by whole groups, and when that would leave a
//! rank no group (MLX's kernels take no empty matrix), or MLX does not
//! multiply MXFP4 on the stream's device, they are dequantized as they
//! are read, and the layer says why.

use safemlx::{Array, Stream};

use super::config::ExpertPlacement;
use super::packed::{Packed, PackedExperts, PackedFormat, PackedMatrices, Projection, Storage};
use super::{ExpertSlices, ExpertWeights, Experts};
use crate::checkpoint::Weights;
use crate::error::Result;
use crate::grad::Frozen;
use crate::typed::{Placement, ShardedArray};

/// mlx-lm's names of a `SwitchGLU`'s projections.
const PROJECTIONS: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// This rank's experts from the stack `switch` under `w` (`(dim, hidden,
/// experts)` its sizes), with how it holds packed ones; `None` when `w`
/// has no such stack.
///
/// A projection stored without a packed form beside packed ones
/// (llama.cpp's Q4_K_M keeps some `down` stacks in Q6_K) is held as
/// floats and the others stay packed.
///
/// # Errors
/// A projection missing, of another shape, or in a mode not read here
/// (named), or a failed read.
pub(super) fn read(
    w: &Weights,
    switch: &str,
    (dim, hidden, experts): (usize, usize, usize),
    placement: ExpertPlacement,
    s: &Stream,
) -> Result<Option<(Experts, Option<Storage>)>> {
    let names = PROJECTIONS.map(|p| format!("{switch}.{p}.weight"));
    if !w.contains(&names[0]) {
        return Ok(None);
    }
    let quantization = names.each_ref().map(|n| w.quantization(n));
    let shapes = [
        [experts, hidden, dim],
        [experts, hidden, dim],
        [experts, dim, hidden],
    ];
    // The format a layout must keep whole: the down projection's (its
    // input is the hidden dimension that expert tensor parallelism cuts),
    // else the first packed one's.
    let Some(format) = quantization[2].or(quantization[0]).or(quantization[1]) else {
        return Ok(Some((read_float(w, &names, shapes, placement, s)?, None)));
    };
    // The split's unit: a packed down projection's groups, else columns.
    let cut = quantization[2].unwrap_or(PackedFormat {
        group_size: 1,
        ..format
    });
    let groups = w.lengths(hidden / cut.group_size);
    let kept = super::packed::keep_on(s, placement, hidden, cut, &groups);
    let part = match &kept {
        Ok(()) => Experts::Packed(Box::new(read_packed(
            w,
            &names,
            (shapes, quantization),
            (placement, format),
            s,
        )?)),
        Err(_) => {
            let float = read_float(w, &names, shapes, placement, s)?;
            Experts::Frozen(Frozen::new(float))
        }
    };
    Ok(Some((part, Some((format, kept)))))
}

/// Each rank's lengths of the hidden dimension `hidden` of the stack
/// `switch` (as [`read`] splits it under expert tensor parallelism):
/// whole groups of a packed down projection when the experts stay packed
/// (`kept`), single columns otherwise.
pub(super) fn hidden_split(w: &Weights, switch: &str, hidden: usize, kept: bool) -> Vec<usize> {
    let down = w.quantization(&format!("{switch}.down_proj.weight"));
    let unit = match (kept, down) {
        (true, Some(f)) => f.group_size,
        _ => 1,
    };
    w.lengths_in(hidden, unit)
}

/// Where a rank's part of a projection is: `(axis, (first, count))`.
type Cut = (usize, (usize, usize));

/// What each rank reads of the three projections, and each rank's
/// lengths along the cut axis (whole `unit`s of the hidden dimension).
fn cuts(
    w: &Weights,
    (experts, hidden): (usize, usize),
    placement: ExpertPlacement,
    unit: usize,
) -> ([Cut; 3], Vec<usize>) {
    match placement {
        ExpertPlacement::ExpertParallel => {
            let part = w.chunk(experts);
            ([(0, part); 3], w.lengths(experts))
        }
        ExpertPlacement::ExpertTensorParallel => {
            let split = w.lengths_in(hidden, unit);
            let rank = w.comm().rank();
            let part = (split[..rank].iter().sum(), split[rank]);
            ([(1, part), (1, part), (2, part)], split)
        }
    }
}

/// This rank's float experts: gate and up `[E', D, H']`, down `[E', H',
/// D]` (quantized ones dequantized).
fn read_float(
    w: &Weights,
    names: &[String; 3],
    shapes: [[usize; 3]; 3],
    placement: ExpertPlacement,
    s: &Stream,
) -> Result<Experts> {
    let [e, h, d] = shapes[0];
    let (cut, split) = cuts(w, (e, h), placement, 1);
    let read = |i: usize| -> Result<Array> {
        let (axis, range) = cut[i];
        let stored = w.floats_along(&names[i], &shapes[i], axis, range, s)?;
        // As the float experts are held: input rows by output columns.
        Ok(stored.swap_axes(1, 2, s)?)
    };
    let group = w.comm();
    let (ei, hi, di) = (e as i32, h as i32, d as i32);
    let [gate, up, down] = [read(0)?, read(1)?, read(2)?];
    Ok(match placement {
        ExpertPlacement::ExpertParallel => Experts::Parallel(ExpertWeights {
            gate: ShardedArray::from_local_split(gate, group, &[ei, di, hi], &split)?,
            up: ShardedArray::from_local_split(up, group, &[ei, di, hi], &split)?,
            down: ShardedArray::from_local_split(down, group, &[ei, hi, di], &split)?,
        }),
        ExpertPlacement::ExpertTensorParallel => Experts::TensorParallel(ExpertSlices {
            gate: ShardedArray::from_local_split(gate, group, &[ei, di, hi], &split)?,
            up: ShardedArray::from_local_split(up, group, &[ei, di, hi], &split)?,
            down: ShardedArray::from_local_split(down, group, &[ei, hi, di], &split)?,
        }),
    })
}

/// This rank's experts kept packed: gate and up `[E', H', D]`, down `[E',
/// D, H']` as stored (a projection without a packed form dequantized, in
/// the same orientation).
fn read_packed(
    w: &Weights,
    names: &[String; 3],
    (shapes, quantization): ([[usize; 3]; 3], [Option<PackedFormat>; 3]),
    (placement, format): (ExpertPlacement, PackedFormat),
    s: &Stream,
) -> Result<PackedExperts> {
    let [e, h, _] = shapes[0];
    let unit = quantization[2].map_or(1, |f| f.group_size);
    let (cut, split) = cuts(w, (e, h), placement, unit);
    // Projection `name` placed as `P` along the cut's axis, each rank's
    // lengths `split` in values: packed values, scales and biases, or
    // floats.
    fn placed<P: Placement>(
        w: &Weights,
        (name, shape, (axis, range)): (&str, [usize; 3], Cut),
        (split, format): (&[usize], Option<PackedFormat>),
        s: &Stream,
    ) -> Result<Projection<P>> {
        let comm = w.comm();
        let global = |last: usize| -> [i32; 3] { [shape[0] as i32, shape[1] as i32, last as i32] };
        let Some(format) = format else {
            let floats = w.floats_along(name, &shape, axis, range, s)?;
            let floats = ShardedArray::from_local_split(floats, comm, &global(shape[2]), split)?;
            return Ok(Projection::Float(floats));
        };
        let (packed, scales, biases) = w.packed_along(name, &shape, axis, &[range], s)?;
        let g = format.group_size;
        let (words, groups) = (
            global(shape[2] / g * format.words_per_group()),
            global(shape[2] / g),
        );
        // Along the last axis the split is in values: in words and groups here.
        let per = |n: usize, d: usize| -> Vec<usize> { split.iter().map(|v| v / d * n).collect() };
        let (split_words, split_groups) = match axis {
            2 => (per(format.words_per_group(), g), per(1, g)),
            _ => (split.to_vec(), split.to_vec()),
        };
        let packed = Packed {
            packed: ShardedArray::from_local_split(packed, comm, &words, &split_words)?,
            scales: ShardedArray::from_local_split(scales, comm, &groups, &split_groups)?,
            biases: biases
                .map(|b| ShardedArray::from_local_split(b, comm, &groups, &split_groups))
                .transpose()?,
        };
        Ok(Projection::Packed(Box::new(packed), format))
    }
    let at = |i: usize| (names[i].as_str(), shapes[i], cut[i]);
    let how = |i: usize| (&split[..], quantization[i]);
    let matrices = match placement {
        ExpertPlacement::ExpertParallel => PackedMatrices::Parallel([
            placed(w, at(0), how(0), s)?,
            placed(w, at(1), how(1), s)?,
            placed(w, at(2), how(2), s)?,
        ]),
        ExpertPlacement::ExpertTensorParallel => PackedMatrices::TensorParallel(
            [placed(w, at(0), how(0), s)?, placed(w, at(1), how(1), s)?],
            placed(w, at(2), how(2), s)?,
        ),
    };
    Ok(PackedExperts { format, matrices })
}
