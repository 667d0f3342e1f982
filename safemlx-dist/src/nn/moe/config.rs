//! How an MoE layer routes: gating, expert placement, expert matmul, and
//! the configuration that holds them.

use crate::error::{Error, Result};

/// How the router's logits become the gates of a token's `k` experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// A softmax over all experts, then the `k` largest; with `normalize`
    /// the `k` gates are rescaled to sum to 1 (Qwen3-MoE's
    /// `norm_topk_prob`; Qwen2-MoE ships without it).
    SoftmaxTopK {
        /// Rescale the chosen gates to sum to 1.
        normalize: bool,
    },
    /// The `k` largest logits, then a softmax over those `k` (Mixtral).
    TopKSoftmax,
    /// DeepSeek-V3's and GLM-4-MoE's `noaux_tc`: scores `sigmoid(logits)`;
    /// the experts are chosen on the scores plus the layer's correction
    /// bias (`e_score_correction_bias`, when it has one) among the
    /// `topk_group` of `groups` expert groups whose two best biased scores
    /// sum highest; the gates are the chosen experts' unbiased scores,
    /// rescaled to sum to 1 with `normalize` (when `k > 1`).
    SigmoidGroups {
        /// Expert groups (`n_group`); 1: no group limit.
        groups: usize,
        /// Groups a token's experts may come from (`topk_group`).
        topk_group: usize,
        /// Rescale the chosen gates to sum to 1 (`norm_topk_prob`).
        normalize: bool,
    },
}

/// How an expert combines its gate and up projections into the hidden
/// values its down projection reads.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum ExpertActivation {
    /// `silu(gate) * up` (Mixtral, Qwen, GLM, DeepSeek).
    #[default]
    Swiglu,
    /// gpt-oss's clamped SwiGLU: `g = min(gate, limit)`, `u = clip(up,
    /// -limit, limit)`, then `(u + 1) * g * sigmoid(alpha * g)`.
    ClampedSwiglu {
        /// The sigmoid's slope (1.702).
        alpha: f32,
        /// The clamp (`swiglu_limit`, 7).
        limit: f32,
    },
}

/// Where the experts' weights live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExpertPlacement {
    /// Experts split across ranks by the chunk rule (`E` need not divide:
    /// 5 experts over 2 ranks are 3 + 2); each rank routes its tokens to
    /// the ranks of their experts with `all_to_all_v` and back.
    #[default]
    ExpertParallel,
    /// Every rank holds every expert's slice of the hidden dimension
    /// (`gate`/`up` columns, `down` rows, by the chunk rule); every rank
    /// routes all tokens and one `all_sum` adds the slices (mlx-lm's
    /// sharding of its `SwitchGLU`).
    ExpertTensorParallel,
}

impl ExpertPlacement {
    /// `"expert parallel"` or `"expert tensor parallel"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ExpertParallel => "expert parallel",
            Self::ExpertTensorParallel => "expert tensor parallel",
        }
    }
}

/// How the local experts multiply their rows (sorted by expert).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExpertMatmul {
    /// [`Grouped`](Self::Grouped) on GPU streams, [`PerExpert`](Self::PerExpert)
    /// on CPU streams: MLX's CPU `gather_mm` is one `sgemm` per row (and
    /// float32 only), 6-8x slower than the loop at 64 experts, top-8
    /// (measured: see the book's MoE chapter).
    #[default]
    Auto,
    /// Three `gather_mm` calls over all rows (one kernel each on a GPU).
    Grouped,
    /// One matmul per local expert on its run of rows (needs the rows per
    /// expert on the host).
    PerExpert,
}

/// The routing of an MoE layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    /// Experts per token, 1 to `E`.
    pub top_k: usize,
    /// How gates are computed.
    pub gating: Gating,
    /// A factor on every routed gate (DeepSeek's `routed_scaling_factor`;
    /// 1 for Mixtral and Qwen).
    pub routed_scaling: f32,
    /// With `Some(f)`, each expert takes at most `ceil(f * t * k / E)` of
    /// the `t * k` slots a rank routes (in token order); the rest are
    /// dropped and counted. `None`: dropless.
    pub capacity_factor: Option<f32>,
    /// Where the experts live.
    pub placement: ExpertPlacement,
    /// How the local experts multiply (automatic by default).
    pub expert_matmul: ExpertMatmul,
    /// The experts' activation (SwiGLU by default).
    pub activation: ExpertActivation,
}

impl MoeConfig {
    /// Top-`k` routing with renormalised softmax gates, expert parallel,
    /// dropless, expert matmuls chosen by device.
    pub fn new(top_k: usize) -> Self {
        Self {
            top_k,
            gating: Gating::SoftmaxTopK { normalize: true },
            routed_scaling: 1.0,
            capacity_factor: None,
            placement: ExpertPlacement::ExpertParallel,
            expert_matmul: ExpertMatmul::Auto,
            activation: ExpertActivation::Swiglu,
        }
    }

    /// With the experts' `activation`.
    pub fn with_activation(mut self, activation: ExpertActivation) -> Self {
        self.activation = activation;
        self
    }

    /// With `gating`.
    pub fn with_gating(mut self, gating: Gating) -> Self {
        self.gating = gating;
        self
    }

    /// With `placement`.
    pub fn with_placement(mut self, placement: ExpertPlacement) -> Self {
        self.placement = placement;
        self
    }

    /// With a capacity factor (see [`capacity_factor`](Self::capacity_factor)).
    pub fn with_capacity_factor(mut self, factor: f32) -> Self {
        self.capacity_factor = Some(factor);
        self
    }

    /// With a routed scaling factor.
    pub fn with_routed_scaling(mut self, factor: f32) -> Self {
        self.routed_scaling = factor;
        self
    }

    /// With `matmul` for the local experts.
    pub fn with_expert_matmul(mut self, matmul: ExpertMatmul) -> Self {
        self.expert_matmul = matmul;
        self
    }

    pub(super) fn check(&self, experts: usize) -> Result<()> {
        if self.top_k == 0 || self.top_k > experts {
            return Err(Error::Setting(format!(
                "top_k is {}; with {experts} experts it must be 1 to {experts}",
                self.top_k
            )));
        }
        if let Gating::SigmoidGroups {
            groups, topk_group, ..
        } = self.gating
        {
            if groups == 0 || experts % groups != 0 {
                return Err(Error::Setting(format!(
                    "{groups} expert groups: they must divide the {experts} experts"
                )));
            }
            if topk_group == 0 || topk_group > groups {
                return Err(Error::Setting(format!(
                    "a token's experts come from {topk_group} of the {groups} groups: it must be 1 to {groups}"
                )));
            }
            let open = topk_group * (experts / groups);
            if self.top_k > open {
                return Err(Error::Setting(format!(
                    "top_k is {}, more than the {open} experts of {topk_group} groups of {} a token may choose from",
                    self.top_k,
                    experts / groups
                )));
            }
        }
        if let Some(f) = self.capacity_factor {
            if !(f.is_finite() && f > 0.0) {
                return Err(Error::Setting(format!(
                    "capacity factor {f}: it must be a positive number"
                )));
            }
        }
        if let ExpertActivation::ClampedSwiglu { alpha, limit } = self.activation {
            if !(alpha.is_finite() && limit.is_finite() && limit > 0.0) {
                return Err(Error::Setting(format!(
                    "a clamped SwiGLU with alpha {alpha} and limit {limit}: both must be finite, the limit above 0"
                )));
            }
        }
        if !self.routed_scaling.is_finite() {
            return Err(Error::Setting(format!(
                "routed scaling factor {}: it must be a finite number",
                self.routed_scaling
            )));
        }
        Ok(())
    }
}
