//! One rank's part of a linear map as the checkpoint stores it: float, or
//! quantized (kept so, multiplied with `quantized_matmul`).

use safemlx::{Array, Stream};

use crate::checkpoint::{whole_groups, Weights};
use crate::error::{Error, Result};
use crate::quantized::AffineWeight;
use crate::typed::{LinearWeight, QuantizedArray, QuantizedPlacement, Sharded, ShardedArray};

/// This rank's part of `y = x Wᵀ` for a checkpoint tensor `W` `[out, in]`.
#[derive(Debug)]
pub enum Projection {
    /// Float, held transposed `[in, out]` for `x W`.
    Float(Array),
    /// Quantized, held `[out, in]` as stored.
    Quantized(AffineWeight),
}

impl Projection {
    /// Rows `ranges` (outputs) of the `[out, in]` tensor `name` of shape
    /// `shape`: quantized when the source stores it quantized.
    ///
    /// # Errors
    /// Another shape, rows past its end, or a failed read.
    pub fn rows(
        w: &Weights,
        name: &str,
        shape: [usize; 2],
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Self> {
        read_rows(w, name, shape, ranges, s)?.projection(s)
    }

    /// Columns `ranges` (inputs) of the `[out, in]` tensor `name` of shape
    /// `shape`; quantized ones in whole groups.
    ///
    /// # Errors
    /// Another shape, a range that cuts a quantization group (named with
    /// the tensor and the group size), or a failed read.
    pub fn columns(
        w: &Weights,
        name: &str,
        shape: [usize; 2],
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Self> {
        read_columns(w, name, shape, ranges, s)?.projection(s)
    }

    /// `x Wᵀ` for `x` `[..., in]`.
    ///
    /// # Errors
    /// `x` without `in` trailing values, or an MLX error.
    pub fn apply(&self, x: &Array, s: &Stream) -> Result<Array> {
        match self {
            Self::Float(w) => Ok(x.matmul(w, s)?),
            Self::Quantized(w) => w.matmul_t(x, s),
        }
    }

    /// Bytes held.
    pub fn nbytes(&self) -> usize {
        match self {
            Self::Float(w) => w.nbytes(),
            Self::Quantized(w) => w.nbytes(),
        }
    }

    /// The float weight as a trainable (sharded) parameter; none for a
    /// quantized one, which stays frozen.
    pub fn parameters(&self) -> Vec<crate::grad::Parameter> {
        match self {
            Self::Float(w) => vec![crate::grad::Parameter::own(w.clone())],
            Self::Quantized(_) => Vec::new(),
        }
    }

    /// The same projection with its float weight replaced (see
    /// [`parameters`](Self::parameters)).
    ///
    /// # Errors
    /// A count or shape other than the weight's.
    pub fn with_parameters(&self, locals: &[Array]) -> Result<Self> {
        match self {
            Self::Float(w) => {
                crate::grad::check_count(1, locals.len())?;
                if locals[0].shape() != w.shape() {
                    return Err(crate::error::Error::Shape(format!(
                        "a projection of shape {:?} was given an array of shape {:?}",
                        w.shape(),
                        locals[0].shape()
                    )));
                }
                Ok(Self::Float(locals[0].clone()))
            }
            Self::Quantized(w) => {
                crate::grad::check_count(0, locals.len())?;
                Ok(Self::Quantized(w.clone()))
            }
        }
    }

    /// Whether the weight stays quantized.
    pub fn is_quantized(&self) -> bool {
        matches!(self, Self::Quantized(_))
    }
}

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
        Some((group_size, _)) => {
            let path = w.source().path();
            let groups = whole_groups(path, &w.name(name), ranges, group_size)?;
            Stored::Quantized(w.quantized_groups(name, shape, &groups, s)?)
        }
        None => Stored::Float(w.columns(name, &shape, ranges, s)?),
    })
}

impl Stored {
    fn projection(self, s: &Stream) -> Result<Projection> {
        Ok(match self {
            Self::Float(a) => Projection::Float(a.transpose(s)?),
            Self::Quantized(q) => Projection::Quantized(q),
        })
    }

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

/// This rank's `(first, count)` of a dimension divided as `split`.
pub(super) fn part_of(split: &[usize], rank: usize) -> (usize, usize) {
    let first = split.iter().take(rank).sum();
    (first, split.get(rank).copied().unwrap_or(0))
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
    let part = [part_of(split, w.comm().rank())];
    read_rows(w, name, shape, &part, s)?.split(w, shape, split)
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
    let part = [part_of(split, w.comm().rank())];
    read_columns(w, name, shape, &part, s)?.split(w, shape, split)
}
