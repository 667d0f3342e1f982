//! RMSNorm on replicated tokens, with MLX's fused kernel.

use safemlx::Stream;

use crate::checkpoint::Weights;
use crate::error::Result;
use crate::typed::{Replicated, ShardedArray};

/// `x / sqrt(mean(x^2) + eps) * weight` over the last axis, every rank
/// computing it on its replicated copy (`safemlx::fast::rms_norm`).
#[derive(Debug, crate::grad::Parameters)]
pub struct RmsNorm {
    /// `[D]`, on every rank.
    pub weight: ShardedArray<Replicated>,
    /// The epsilon.
    #[parameters(skip)]
    pub eps: f32,
}

impl RmsNorm {
    /// Reads the `[dim]` weight `weight` of `w`.
    ///
    /// # Errors
    /// A missing tensor, or one that is not `[dim]`.
    pub fn load(w: &Weights, dim: usize, eps: f32, s: &Stream) -> Result<Self> {
        Ok(Self {
            weight: w.get("weight", &[dim], s)?,
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
