//! One rank's part of a linear weight `[out, in]`, read as the checkpoint
//! stores it (float, or quantized and kept so): its rows or its columns.

use safemlx::{Array, Stream};

use crate::affine::AffineWeight;
use crate::checkpoint::{whole_groups, Weights};
use crate::error::{Error, Result};
use crate::typed::{
    split_part, LinearWeight, QuantizedArray, QuantizedPlacement, Replicated, Sharded, ShardedArray,
};

/// Ranges of a checkpoint tensor `[out, in]` as stored: float, not
/// transposed, or quantized.
enum Stored {
    Float(Array),
    Quantized(AffineWeight),
}

/// Rows `ranges` (outputs) of the `[out, in]` tensor `name` of shape
/// `shape`, quantized when the source stores it quantized.
fn read_rows(
    w: &Weights,
    name: &str,
    shape: [usize; 2],
    ranges: &[(usize, usize)],
    s: &Stream,
) -> Result<Stored> {
    Ok(match w.quantization(name) {
        Some(_) => Stored::Quantized(w.quantized_rows(name, shape, ranges, s)?),
        None => Stored::Float(w.rows(name, &shape, ranges, s)?),
    })
}

/// Columns `ranges` (inputs) of the `[out, in]` tensor `name` of shape
/// `shape`; quantized ones in whole groups.
fn read_columns(
    w: &Weights,
    name: &str,
    shape: [usize; 2],
    ranges: &[(usize, usize)],
    s: &Stream,
) -> Result<Stored> {
    Ok(match w.quantization(name) {
        Some(crate::packing::PackedFormat { group_size, .. }) => {
            let path = w.source().path();
            let groups = whole_groups(path, &w.name(name), ranges, group_size)?;
            Stored::Quantized(w.quantized_groups(name, shape, &groups, s)?)
        }
        None => Stored::Float(w.columns(name, &shape, ranges, s)?),
    })
}

impl Stored {
    /// This rank's part of a weight of logical `shape` whose sharded axis
    /// is divided as `split` says.
    fn split<P: QuantizedPlacement>(
        self,
        w: &Weights,
        shape: [usize; 2],
        split: &[usize],
    ) -> Result<LinearWeight<P>> {
        Ok(match self {
            Self::Quantized(q) => LinearWeight::Quantized(QuantizedArray::from_local_split(
                q,
                w.comm(),
                shape,
                split,
            )?),
            Self::Float(a) => {
                let dim =
                    |d: usize| i32::try_from(d).map_err(|_| Error::ShapeOverflow { value: d });
                let global = [dim(shape[0])?, dim(shape[1])?];
                LinearWeight::Float(ShardedArray::from_local_split(a, w.comm(), &global, split)?)
            }
        })
    }
}

/// The outputs (rows) of the `[out, in]` tensor `name` of shape `shape`
/// divided over the ranks as `split` says, as the checkpoint stores it
/// (quantized ones stay quantized): this rank reads only its rows.
///
/// # Errors
/// Another shape, a split that does not add up to the rows, or a failed
/// read.
pub fn load_rows(
    w: &Weights,
    name: &str,
    shape: [usize; 2],
    split: &[usize],
    s: &Stream,
) -> Result<LinearWeight<Sharded<0>>> {
    load_row_block(w, name, shape, split_part(split, w.comm().rank()), split, s)
}

/// Rows `first..first + count` of the `[out, in]` tensor `name` of shape
/// `shape` as this rank's part of a `Sharded<0>` weight whose ranks hold
/// `split` rows each, where blocks may repeat: a KV head read by query
/// heads of several ranks is held by each of them (a weight of
/// `split.iter().sum()` rows, each copy a block; see
/// [`LinearWeight::blocks_of`]).
///
/// # Errors
/// Another shape, rows past its end, a `count` that is not this rank's
/// length in `split`, or a failed read.
pub fn load_row_block(
    w: &Weights,
    name: &str,
    shape: [usize; 2],
    (first, count): (usize, usize),
    split: &[usize],
    s: &Stream,
) -> Result<LinearWeight<Sharded<0>>> {
    let rows = split.iter().sum();
    read_rows(w, name, shape, &[(first, count)], s)?.split(w, [rows, shape[1]], split)
}

/// The inputs (columns) of the `[out, in]` tensor `name` of shape `shape`
/// divided over the ranks as `split` says; quantized ones stay quantized,
/// read in whole groups.
///
/// # Errors
/// Another shape, a split that does not add up to the columns or cuts a
/// quantization group (named with the tensor and the group size), or a
/// failed read.
pub fn load_columns(
    w: &Weights,
    name: &str,
    shape: [usize; 2],
    split: &[usize],
    s: &Stream,
) -> Result<LinearWeight<Sharded<1>>> {
    load_column_block(w, name, shape, split_part(split, w.comm().rank()), split, s)
}

/// Columns `first..first + count` of the `[out, in]` tensor `name` of
/// shape `shape` as this rank's part of a `Sharded<1>` weight whose ranks
/// hold `split` columns each, where blocks may repeat (the columns of a
/// query head two ranks share; see [`load_row_block`]).
///
/// # Errors
/// As [`load_columns`].
pub fn load_column_block(
    w: &Weights,
    name: &str,
    shape: [usize; 2],
    (first, count): (usize, usize),
    split: &[usize],
    s: &Stream,
) -> Result<LinearWeight<Sharded<1>>> {
    let columns = split.iter().sum();
    read_columns(w, name, shape, &[(first, count)], s)?.split(w, [shape[0], columns], split)
}

/// The whole `[out, in]` tensor `name` of shape `shape` on every rank, as
/// the checkpoint stores it (quantized ones stay quantized): a weight
/// every rank applies alike (DeepSeek's latent projections).
///
/// # Errors
/// Another shape, or a failed read.
pub fn load_replicated(
    w: &Weights,
    name: &str,
    shape: [usize; 2],
    s: &Stream,
) -> Result<LinearWeight<Replicated>> {
    Ok(match read_rows(w, name, shape, &[(0, shape[0])], s)? {
        Stored::Quantized(q) => {
            LinearWeight::Quantized(QuantizedArray::from_local(q, w.comm(), shape)?)
        }
        Stored::Float(a) => LinearWeight::Float(ShardedArray::replicated(a, w.comm())),
    })
}
