//! RMSNorm on replicated tokens, with MLX's fused kernel.

use safemlx::Stream;

use crate::checkpoint::TensorSource;
use crate::error::{Error, Result};
use crate::typed::{Replicated, ShardedArray};
use crate::Group;

/// `x / sqrt(mean(x^2) + eps) * weight` over the last axis, every rank
/// computing it on its replicated copy (`safemlx::fast::rms_norm`).
#[derive(Debug)]
pub struct RmsNorm {
    /// `[D]`, on every rank.
    pub weight: ShardedArray<Replicated>,
    /// The epsilon.
    pub eps: f32,
}

impl crate::grad::Parameters for RmsNorm {
    fn parameters(&self) -> Vec<crate::grad::Parameter> {
        vec![crate::grad::Parameter::of(&self.weight)]
    }

    fn with_parameters(&self, locals: &[safemlx::Array]) -> Result<Self> {
        crate::grad::check_count(1, locals.len())?;
        Ok(Self {
            weight: ShardedArray::from_local(
                locals[0].clone(),
                self.weight.comm(),
                self.weight.global_shape(),
            )?,
            eps: self.eps,
        })
    }
}

impl RmsNorm {
    /// Reads the `[dim]` weight `name`.
    ///
    /// # Errors
    /// A missing tensor, or one that is not `[dim]`.
    pub fn from_hf(
        group: &Group,
        dir: &dyn TensorSource,
        name: &str,
        dim: usize,
        eps: f32,
        s: &Stream,
    ) -> Result<Self> {
        let shape = &dir.shape(name)?;
        if shape.as_slice() != [dim as i32] {
            return Err(Error::Model {
                path: dir.path().display().to_string(),
                message: format!(
                    "tensor `{name}` has shape {shape:?} but the configuration gives [{dim}]"
                ),
            });
        }
        Ok(Self {
            weight: ShardedArray::replicated(dir.read(name, s)?, group),
            eps,
        })
    }

    /// The norm of `x` `[.., D]`. No communication.
    ///
    /// # Errors
    /// An MLX error (e.g. a last axis that is not `D`).
    pub fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        let y = safemlx::fast::rms_norm(x.local(), self.weight.local(), self.eps, s)?;
        ShardedArray::from_local(y, x.comm(), x.global_shape())
    }
}
