//! One rank's part of a linear map as the checkpoint stores it: float, or
//! quantized (kept so, multiplied with `quantized_matmul`).

use safemlx::{Array, Stream};

use crate::checkpoint::{whole_groups, TensorSource};
use crate::error::Result;
use crate::quantized::AffineWeight;

/// This rank's part of `y = x Wᵀ` for a checkpoint tensor `W` `[out, in]`.
#[derive(Debug)]
pub enum Projection {
    /// Float, held transposed `[in, out]` for `x W`.
    Float(Array),
    /// Quantized, held `[out, in]` as stored.
    Quantized(AffineWeight),
}

impl Projection {
    /// Rows `ranges` (outputs) of tensor `name`: quantized when `dir`
    /// stores it quantized ([`TensorSource::quantization`]).
    ///
    /// # Errors
    /// A missing tensor, rows past its end, or a failed read.
    pub fn rows(
        dir: &dyn TensorSource,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Self> {
        Ok(match dir.quantization(name) {
            Some(_) => Self::Quantized(dir.read_quantized_rows(name, ranges, s)?),
            None => Self::Float(dir.read_rows(name, ranges, s)?.transpose(s)?),
        })
    }

    /// Columns `ranges` (inputs) of tensor `name`; quantized ones in whole
    /// groups.
    ///
    /// # Errors
    /// A range that cuts a quantization group (named with the tensor and
    /// the group size), a missing tensor, or a failed read.
    pub fn columns(
        dir: &dyn TensorSource,
        name: &str,
        ranges: &[(usize, usize)],
        s: &Stream,
    ) -> Result<Self> {
        Ok(match dir.quantization(name) {
            Some((group_size, _)) => {
                let groups = whole_groups(dir.path(), name, ranges, group_size)?;
                Self::Quantized(dir.read_quantized_groups(name, &groups, s)?)
            }
            None => Self::Float(dir.read_columns(name, ranges, s)?.transpose(s)?),
        })
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
