//! gpt-oss's experts as mlx-lm saves them (every mlx-community gpt-oss):
//! its `sanitize` de-interleaves OpenAI's `gate_up_proj` into a
//! `SwitchGLU` with biases, `{mlx_lm}.gate_proj`, `.up_proj` `[E, H, D]`
//! and `.down_proj` `[E, D, H]` (`.weight`; `.scales` for packed ones,
//! `uint8` in MLX's `mxfp4` mode as OpenAI's release converts, or affine
//! with `.biases`), and `.bias` `[E, H]`, `[E, H]`, `[E, D]`.
//!
//! The matrices are read as any mlx-lm stack is (`switch.rs`: each rank
//! its experts or its hidden slice of every expert, packed ones kept
//! packed where they can be); the gate and up biases follow the same cut.

use safemlx::Stream;

use super::config::{ExpertPlacement, MoeConfig};
use super::{HiddenBiases, InterleavedNames, Moe};
use crate::checkpoint::Weights;
use crate::error::{Error, Result};

impl Moe {
    /// [`load_interleaved`](Self::load_interleaved) of a block whose
    /// experts are mlx-lm's stack `names.mlx_lm` (see the module docs).
    ///
    /// # Errors
    /// A missing tensor, or one of another shape or mode (named).
    pub(super) fn load_biased_switch(
        w: &Weights,
        names: &InterleavedNames,
        (dim, hidden, experts): (usize, usize, usize),
        config: MoeConfig,
        s: &Stream,
    ) -> Result<Self> {
        let stack = names.mlx_lm;
        let dims = (dim, hidden, experts);
        let Some((part, storage)) = super::switch::read(w, stack, dims, config.placement, s)?
        else {
            return Err(Error::Model {
                path: w.source().path().display().to_string(),
                message: format!("has no tensor {}", w.named(&w.name(stack))),
            });
        };
        // The hidden split switch.rs took.
        let kept = matches!(storage, Some((_, Ok(()))));
        let split = super::switch::hidden_split(w, stack, hidden, kept);
        let (axis, range) = match config.placement {
            ExpertPlacement::ExpertParallel => (0, w.chunk(experts)),
            ExpertPlacement::ExpertTensorParallel => {
                let rank = w.comm().rank();
                (1, (split[..rank].iter().sum(), split[rank]))
            }
        };
        let bias = |p: &str| {
            let name = format!("{stack}.{p}.bias");
            w.along((&name, false), &[experts, hidden], axis, &[range], s)
        };
        let pair = (bias("gate_proj")?, bias("up_proj")?);
        let placed = (config.placement, &split[..]);
        let hidden_biases = HiddenBiases::placed(w, pair, (experts, hidden), placed, s)?;
        let parts = (part, hidden_biases, storage);
        Self::with_router(w, names, (dim, experts), config, parts, s)
    }
}
