//! Mixture of experts: a router choosing each token's top-k of `E` SwiGLU
//! experts, placed expert parallel (experts split across ranks, tokens
//! routed with `all_to_all_v`) or expert tensor parallel (every expert's
//! hidden dimension split, one `all_sum`), with optional shared experts.
//!
//! ```text
//! logits  = x R                                   [t, E], R replicated
//! chosen  = top_k(logits)                         on the device
//! gates   = softmax(logits)[chosen] (/ their sum) or softmax(logits[chosen])
//! y       = sum_j gates_j * down_e(silu(gate_e x) * up_e x),  e = chosen_j
//!         + sigmoid(x g) * shared(x)              when the model has them
//! ```
//!
//! Routing stays on the device: the top-k (`argpartition`), the counts per
//! expert and the order of the routed rows are MLX arrays; only the `E`
//! counts come to the host, to size the `all_to_all_v`. The local experts
//! run as three grouped matmuls (`gather_mm` on rows sorted by expert) on
//! GPU streams, and as one matmul per local expert on CPU streams, where
//! MLX's `gather_mm` multiplies row by row (see [`ExpertMatmul`]).

mod biased_switch;
mod config;
mod experts;
mod forward;
mod interleaved;
mod packed;
mod routing;
mod switch;

use safemlx::{Array, Stream};

use crate::error::Result;
use crate::typed::{Placement, Replicated, Sharded, ShardedArray};

pub use config::{ExpertActivation, ExpertMatmul, ExpertPlacement, Gating, MoeConfig};
pub use experts::{ExpertNames, ExpertSlices, ExpertWeights};
pub use interleaved::InterleavedNames;
use packed::ExpertMatrices;
pub use packed::{Packed, PackedExperts, PackedFormat, PackedMatrices, Projection};

use super::Mlp;
use crate::grad::Parameters;

/// This rank's experts, by placement: float, or packed as stored (MXFP4,
/// affine); or packed experts a layout could not keep, dequantized and
/// frozen.
#[derive(Debug, Parameters)]
enum Experts {
    Parallel(ExpertWeights),
    TensorParallel(ExpertSlices),
    Packed(Box<PackedExperts>),
    Frozen(crate::grad::Frozen<Experts>),
}

impl Experts {
    fn placement(&self) -> config::ExpertPlacement {
        use config::ExpertPlacement::{ExpertParallel, ExpertTensorParallel};
        match self {
            Self::Parallel(_) => ExpertParallel,
            Self::TensorParallel(_) => ExpertTensorParallel,
            Self::Packed(m) => match m.matrices {
                PackedMatrices::Parallel(_) => ExpertParallel,
                PackedMatrices::TensorParallel(..) => ExpertTensorParallel,
            },
            Self::Frozen(f) => f.get().placement(),
        }
    }

    /// Under expert parallelism, every rank's experts `(first, count)` in
    /// rank order, as the arrays hold them (the chunk rule, or a weighted
    /// split); under expert tensor parallelism every rank holds all.
    fn owners(&self, experts: usize, n: usize) -> Vec<(usize, usize)> {
        let lengths = match self {
            Self::Parallel(w) => w.gate.axis_lengths(0),
            Self::Packed(m) => match &m.matrices {
                PackedMatrices::Parallel([g, ..]) => g.axis_lengths(0),
                PackedMatrices::TensorParallel(..) => return vec![(0, experts); n],
            },
            Self::TensorParallel(_) => return vec![(0, experts); n],
            Self::Frozen(f) => return f.get().owners(experts, n),
        };
        let mut first = 0;
        lengths
            .iter()
            .map(|&count| {
                first += count;
                (first - count, count)
            })
            .collect()
    }

    /// The three matrices as the forward multiplies them.
    fn matrices(&self) -> ExpertMatrices<'_> {
        match self {
            Self::Parallel(w) => {
                ExpertMatrices::Float([w.gate.local(), w.up.local(), w.down.local()])
            }
            Self::TensorParallel(w) => {
                ExpertMatrices::Float([w.gate.local(), w.up.local(), w.down.local()])
            }
            Self::Packed(m) => ExpertMatrices::Packed(m.locals()),
            Self::Frozen(f) => f.get().matrices(),
        }
    }

    fn nbytes(&self) -> usize {
        match self.matrices() {
            ExpertMatrices::Float(m) => m.iter().map(|a| a.nbytes()).sum(),
            ExpertMatrices::Packed(m) => m.iter().map(|l| l.nbytes()).sum(),
        }
    }
}

/// The experts' biases (gpt-oss): the gate and up biases `[E, H]` placed
/// as the gate and up weights are (by expert, or by hidden column), and
/// the down bias `[E, D]` on every rank, added to each slot's output by
/// the rank that computes the slot (expert parallel) or by rank 0 alone
/// (expert tensor parallel: the ranks' slices sum to the output once).
#[derive(Debug, Parameters)]
pub struct ExpertBiases {
    hidden: HiddenBiases,
    down: ShardedArray<Replicated>,
}

/// The gate and up biases `[E, H]` placed as `P`.
#[derive(Debug, Parameters)]
struct BiasPair<P: Placement> {
    gate: ShardedArray<P>,
    up: ShardedArray<P>,
}

/// The gate and up biases, by placement: by expert, or by hidden column.
#[derive(Debug, Parameters)]
enum HiddenBiases {
    Parallel(BiasPair<Sharded<0>>),
    TensorParallel(BiasPair<Sharded<1>>),
}

impl HiddenBiases {
    fn locals(&self) -> (&Array, &Array) {
        match self {
            Self::Parallel(b) => (b.gate.local(), b.up.local()),
            Self::TensorParallel(b) => (b.gate.local(), b.up.local()),
        }
    }
}

/// Experts every token goes through, beside the routed ones (Qwen2-MoE's
/// `shared_expert`, DeepSeek's shared experts): a tensor-parallel [`Mlp`],
/// optionally scaled per token by `sigmoid(x g)` (Qwen2-MoE's
/// `shared_expert_gate`, `g` `[D, 1]`).
#[derive(Debug, Parameters)]
pub struct SharedExperts {
    /// The MLP, hidden dimension split across ranks.
    pub mlp: Mlp,
    /// `[D, 1]`, on every rank.
    pub gate: Option<ShardedArray<Replicated>>,
}

/// What a forward returns besides the tokens.
#[derive(Debug)]
pub struct MoeOutput<P: Placement> {
    /// The tokens after the layer, `[t, D]`, in input order.
    pub tokens: ShardedArray<P>,
    /// The load-balancing loss `E * sum_e f_e * P_e` over all ranks' tokens
    /// (`f_e`: share of routed slots that chose expert `e`; `P_e`: mean
    /// router probability of `e`). 1.0 when perfectly balanced.
    pub aux_loss: f32,
    /// The router z-loss: the mean over tokens of `logsumexp(logits)^2`.
    pub z_loss: f32,
    /// Rows this rank sent to each rank (expert parallel; zeros otherwise).
    pub sent: Vec<usize>,
    /// Rows this rank's experts processed, from each rank (expert
    /// parallel; zeros otherwise).
    pub received: Vec<usize>,
    /// This rank's slots dropped by the capacity limit (0 when dropless).
    pub dropped: usize,
}

/// A mixture-of-experts layer on this rank (see the module docs).
///
/// Its parameters: the router (replicated), this rank's experts or slices
/// (`gate`, `up`, `down`), then the shared experts' MLP and gate when the
/// layer has them. Their gradients come from [`Moe::forward`]; the
/// load-balancing and z-losses are statistics (host numbers), not part of
/// the traced loss.
#[derive(Debug, Parameters)]
pub struct Moe {
    router: ShardedArray<Replicated>,
    /// `[E]`, added to the router's logits (gpt-oss).
    router_bias: Option<ShardedArray<Replicated>>,
    experts: Box<Experts>,
    biases: Option<Box<ExpertBiases>>,
    shared: Option<Box<SharedExperts>>,
    /// `[E]`, added to the scores experts are chosen on (not trained).
    #[parameters(skip)]
    score_bias: Option<Array>,
    #[parameters(skip)]
    config: MoeConfig,
    #[parameters(skip)]
    num_experts: usize,
    /// For packed experts (MXFP4, affine): kept as stored, or dequantized
    /// and why.
    #[parameters(skip)]
    packed: Option<packed::Storage>,
}

impl Moe {
    /// The experts this rank holds, `(first, count)`: its own under expert
    /// parallelism, every one (a slice of each) under expert tensor
    /// parallelism.
    pub fn held_experts(&self) -> (usize, usize) {
        let comm = self.router.comm();
        let owners = self.experts.owners(self.num_experts, comm.size());
        owners.get(comm.rank()).copied().unwrap_or((0, 0))
    }

    /// With shared experts beside the routed ones.
    pub fn with_shared(mut self, shared: SharedExperts) -> Self {
        self.shared = Some(Box::new(shared));
        self
    }

    /// With a correction bias `[E]` added to the scores experts are chosen
    /// on, not to the gates (see [`Gating::SigmoidGroups`]).
    ///
    /// # Errors
    /// A bias of another shape.
    pub fn with_score_bias(mut self, bias: Array) -> Result<Self> {
        if bias.shape() != [self.num_experts as i32] {
            return Err(crate::error::Error::Shape(format!(
                "a score correction bias of shape {:?} for {} experts: it needs one value per expert",
                bias.shape(),
                self.num_experts
            )));
        }
        self.score_bias = Some(bias);
        Ok(self)
    }

    /// The routing configuration.
    pub fn config(&self) -> &MoeConfig {
        &self.config
    }

    /// Whether the experts stay quantized (packed as stored).
    pub fn is_quantized(&self) -> bool {
        matches!(self.experts.as_ref(), Experts::Packed(_))
    }

    /// How the experts are packed, when they stay quantized.
    pub fn packed_format(&self) -> Option<PackedFormat> {
        match self.experts.as_ref() {
            Experts::Packed(m) => Some(m.format),
            _ => None,
        }
    }

    /// For a layer read from packed experts (MXFP4, affine quantized):
    /// how they are packed, and `Ok` when they stay as stored or the
    /// reason they were dequantized to float32; `None` for float
    /// checkpoints.
    pub fn packed_storage(&self) -> Option<(PackedFormat, &std::result::Result<(), String>)> {
        self.packed.as_ref().map(|(format, kept)| (*format, kept))
    }

    /// How many projections of packed experts are held as floats (stored
    /// without a packed form beside packed ones).
    pub fn float_projections(&self) -> usize {
        match self.experts.as_ref() {
            Experts::Packed(m) => m.float_projections(),
            _ => 0,
        }
    }

    /// Bytes of this rank's weights.
    pub fn nbytes(&self) -> usize {
        let experts = self.experts.nbytes();
        let shared = self.shared.as_ref().map_or(0, |sh| {
            sh.mlp.nbytes() + sh.gate.as_ref().map_or(0, |g| g.local().nbytes())
        });
        let biases = self.biases.as_ref().map_or(0, |b| {
            let (g, u) = b.hidden.locals();
            g.nbytes() + u.nbytes() + b.down.local().nbytes()
        });
        let router_bias = self.router_bias.as_ref().map_or(0, |b| b.local().nbytes());
        self.router.local().nbytes() + router_bias + experts + biases + shared
    }

    /// The full weights again: `router`, `gate`, `up`, `down` (one
    /// `all_gather` per expert tensor), as [`load`](Self::load) reads them.
    ///
    /// # Errors
    /// A layer with biases (gpt-oss's: [`load`](Self::load) does not read
    /// them), or a failed collective.
    pub fn gather_full(&self, s: &Stream) -> Result<Vec<(&'static str, Array)>> {
        if self.biases.is_some() || self.router_bias.is_some() {
            return Err(crate::error::Error::Setting(
                "an MoE layer with router or expert biases (gpt-oss) is not gathered into `Moe::load`'s tensors, which have no biases".to_owned(),
            ));
        }
        let mut all = vec![("router", self.router.local().clone())];
        all.extend(match self.experts.as_ref() {
            Experts::Parallel(w) => w.gather_full(s)?,
            Experts::TensorParallel(w) => w.gather_full(s)?,
            Experts::Packed(_) | Experts::Frozen(_) => {
                return Err(crate::error::Error::Setting(
                    "an MoE layer read packed (MXFP4 or affine quantized) is not gathered into `Moe::load`'s float tensors".to_owned(),
                ))
            }
        });
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn disagreeing_expert_tensors_are_named() {
        assert_eq!(
            super::experts::check_shapes("moe.", &[64, 8], &[6, 64, 128], &[6, 64, 128], &[8, 128, 64])
                .unwrap_err()
                .to_string(),
            "gate's expert count (axis 0) differs from the router's (axis 1): moe.router is [64, 8], moe.gate is [6, 64, 128], moe.up is [6, 64, 128], moe.down is [8, 128, 64]"
        );
        assert_eq!(
            super::experts::check_shapes("", &[64, 8], &[8, 64, 128], &[8, 64, 96], &[8, 128, 64])
                .unwrap_err()
                .to_string(),
            "up's shape differs from gate's: router is [64, 8], gate is [8, 64, 128], up is [8, 64, 96], down is [8, 128, 64]"
        );
        assert_eq!(
            super::experts::check_shapes("", &[64, 8], &[8, 64, 128], &[8, 64, 128], &[8, 128, 64])
                .unwrap(),
            (8, 64, 128)
        );
    }

    #[test]
    fn top_k_outside_the_experts_is_named() {
        assert_eq!(
            super::MoeConfig::new(9).check(8).unwrap_err().to_string(),
            "top_k is 9; with 8 experts it must be 1 to 8"
        );
        assert_eq!(
            super::MoeConfig::new(2)
                .with_capacity_factor(0.0)
                .check(8)
                .unwrap_err()
                .to_string(),
            "capacity factor 0: it must be a positive number"
        );
    }
}
