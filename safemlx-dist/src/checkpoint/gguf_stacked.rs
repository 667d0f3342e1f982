//! A GGUF file's stacked tensors (llama.cpp's MoE experts `ffn_*_exps`,
//! `[E, out, in]` row-major) read in parts along any axis: by experts, by
//! rows of every expert, or by whole groups of columns, as floats or kept
//! quantized. The stack's rows are expert by expert, so every part is a
//! set of whole rows, or of whole blocks of each row.

use safemlx::{Array, Stream};

use super::GgufFile;
use crate::error::{Error, Result};

/// Values per group of a GGUF type kept quantized (see
/// [`GgufFile::read_quantized_groups`]).
const GROUP: usize = 32;

impl GgufFile {
    /// Ranges `(first, count)` along `axis` of the 3-D tensor `name`,
    /// dequantized to `float32` and concatenated along it.
    ///
    /// # Errors
    /// No such tensor, not 3-D, no such axis, ranges past its end, or a
    /// failed read.
    pub fn read_stacked(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Array> {
        let t = self.tensor(name)?;
        let shape = self.stacked_shape(name, axis)?;
        let picked = picked(ranges);
        if axis == 2 {
            let columns = self.read_columns(name, ranges, s)?;
            return Ok(columns.reshape(&[shape[0], shape[1], picked], s)?);
        }
        let [e, r, c] = shape.map(|d| d as usize);
        let rows = self.flat_rows(name, [e, r], axis, ranges)?;
        let values = self.row_values(name, t, (e * r, c), &rows)?;
        let mut out = shape;
        out[axis] = picked;
        Ok(Array::from_slice(&values, &out))
    }

    /// Ranges `(first, count)` along `axis` of the 3-D tensor `name` of a
    /// type that stays quantized, kept quantized: its packed values, scales
    /// and biases (MLX affine, groups of 32; MXFP4 as MLX's `mxfp4`, see
    /// `gguf_mxfp4.rs`), concatenated along `axis`.
    /// Ranges along the last axis are in values and must be whole groups.
    ///
    /// # Errors
    /// No such tensor, not 3-D, another type, ranges past its end or
    /// cutting a group, or a failed read.
    pub fn read_packed_stacked(
        &self,
        name: &str,
        axis: usize,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<super::PackedParts> {
        if self.tensor(name)?.kind == super::GgmlType::MXFP4 {
            return self.read_mxfp4_stacked(name, axis, ranges);
        }
        let shape = self.stacked_shape(name, axis)?;
        let [e, r, _] = shape.map(|d| d as usize);
        let (weight, lead) = if axis == 2 {
            if let Some(&(first, count)) = ranges
                .iter()
                .find(|&&(first, count)| first % GROUP != 0 || count % GROUP != 0)
            {
                return Err(self.error(format!(
                    "tensor `{name}` is read by whole groups of {GROUP} columns; columns {first}..{} were asked for",
                    first + count
                )));
            }
            let groups: Vec<_> = ranges
                .iter()
                .map(|&(f, c)| (f / GROUP, c / GROUP))
                .collect();
            (
                self.read_quantized_groups(name, &groups, s)?,
                [shape[0], shape[1]],
            )
        } else {
            let rows = self.flat_rows(name, [e, r], axis, ranges)?;
            let mut lead = [shape[0], shape[1]];
            lead[axis] = picked(ranges);
            (self.read_quantized_rows(name, &rows, s)?, lead)
        };
        let stack = |a: &Array| -> Result<Array> {
            let last = a.shape()[1];
            Ok(a.reshape(&[lead[0], lead[1], last], s)?)
        };
        Ok((
            stack(&weight.weight)?,
            stack(&weight.scales)?,
            Some(stack(&weight.biases)?),
        ))
    }

    /// The shape of the 3-D tensor `name`, checking it has `axis`.
    pub(super) fn stacked_shape(&self, name: &str, axis: usize) -> Result<[i32; 3]> {
        let t = self.tensor(name)?;
        match <[i32; 3]>::try_from(t.shape.as_slice()) {
            Ok(shape) if axis < 3 => Ok(shape),
            _ => Err(self.error(format!(
                "tensor `{name}` has shape {:?}; a stack is read along axis 0, 1 or 2 of 3 (axis {axis} was asked for)",
                t.shape
            ))),
        }
    }

    /// The rows of the stack `[e, r, ..]` flattened to `e * r` rows that
    /// hold `ranges` along `axis` (0: whole experts; 1: rows of each).
    pub(super) fn flat_rows(
        &self,
        name: &str,
        [e, r]: [usize; 2],
        axis: usize,
        ranges: &[(usize, usize)],
    ) -> Result<Vec<(usize, usize)>> {
        let len = [e, r][axis];
        if let Some(&(first, count)) = ranges
            .iter()
            .find(|&&(first, count)| first.checked_add(count).is_none_or(|end| end > len))
        {
            return Err(Error::Checkpoint {
                path: self.path().display().to_string(),
                message: format!(
                    "tensor `{name}` has {len} along axis {axis}; {first}..{} were asked for",
                    first.saturating_add(count)
                ),
            });
        }
        Ok(match axis {
            0 => ranges.iter().map(|&(f, c)| (f * r, c * r)).collect(),
            _ => (0..e)
                .flat_map(|x| ranges.iter().map(move |&(f, c)| (x * r + f, c)))
                .collect(),
        })
    }
}

/// The values ranges pick.
fn picked(ranges: &[(usize, usize)]) -> i32 {
    ranges.iter().map(|r| r.1).sum::<usize>() as i32
}
