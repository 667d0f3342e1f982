//! Multi-head self-attention with heads split across ranks.

use safemlx::{Array, Stream};

use safemlx_dist::checkpoint::Weights;
use safemlx_dist::sharded;
use safemlx_dist::typed::{Replicated, Sharded, ShardedArray};
use safemlx_dist::Group;
use safemlx_dist::{Error, Result};

/// The attention weights: a fused QKV projection `[D, 3D]` whose Q, K and V
/// blocks are each split by columns (so rank `r` holds its heads' Q, K and
/// V), and the output projection `[D, D]` split by rows.
#[sharded]
#[derive(Debug)]
pub struct AttentionWeights {
    /// `[D, 3D]`: `[Q | K | V]`, each block column parallel.
    #[shard(Sharded<1>, segments = 3)]
    pub qkv: ShardedArray<Sharded<1>>,
    /// `[D, D]`, row parallel.
    #[shard(Sharded<0>)]
    pub out: ShardedArray<Sharded<0>>,
}

/// Causal multi-head self-attention, heads split across ranks: each rank
/// runs `heads / n` heads on its own, then the row-parallel output
/// projection's partial sums are reduced with one `all_sum` of `[T, D]`.
#[derive(Debug)]
pub struct ShardedAttention {
    weights: AttentionWeights,
    heads: usize,
}

impl safemlx_dist::grad::Parameters for ShardedAttention {
    fn parameters(&self) -> Vec<safemlx_dist::grad::Parameter> {
        self.weights.parameters()
    }

    fn with_parameters(&self, locals: &[Array]) -> Result<Self> {
        Ok(Self {
            weights: self.weights.with_parameters(locals)?,
            heads: self.heads,
        })
    }
}

impl ShardedAttention {
    /// Builds this rank's part from the full `qkv` `[D, 3D]` and `out`
    /// `[D, D]` weights for `heads` heads.
    ///
    /// # Errors
    /// When `heads` does not divide `D`, or the group size does not divide
    /// `heads`, with the numbers and the fix in the message.
    pub fn from_full(
        group: &Group,
        heads: usize,
        qkv: Array,
        out: Array,
        s: &Stream,
    ) -> Result<Self> {
        check_heads(out.shape(), heads, group.size())?;
        let weights = AttentionWeights::from_full(group, qkv, out, s)?;
        Ok(Self { weights, heads })
    }

    /// Builds this rank's part from `qkv` `[D, 3D]` and `out` `[D, D]`
    /// of `w`, reading only this rank's heads.
    ///
    /// # Errors
    /// Those of [`from_full`](Self::from_full), and a missing tensor.
    pub fn load(w: &Weights, heads: usize, s: &Stream) -> Result<Self> {
        let out = w.shape("out")?;
        let out: Vec<i32> = out
            .iter()
            .map(|&d| i32::try_from(d).unwrap_or(i32::MAX))
            .collect();
        check_heads(&out, heads, w.comm().size())?;
        let weights = AttentionWeights::load_fields(w, s)?;
        Ok(Self { weights, heads })
    }

    /// The model dimension `D`.
    pub fn dim(&self) -> usize {
        self.weights.out.global_shape()[0] as usize
    }

    /// The full weights again, `qkv` then `out` (see
    /// [`AttentionWeights::gather_full`]).
    pub fn gather_full(&self, s: &Stream) -> Result<Vec<(&'static str, Array)>> {
        self.weights.gather_full(s)
    }

    /// Causal self-attention of replicated tokens `x` `[T, D]`; the output
    /// is replicated. Cost: one `all_sum` of `[T, D]`.
    pub fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        let heads = self.attend(x, s)?;
        heads.matmul(&self.weights.out, s)?.all_sum(s)
    }

    /// Sequence parallel: tokens arrive split by rows, are gathered for the
    /// heads (causal attention needs every earlier token), and leave split
    /// by rows through a `sum_scatter` of the output projection's partial
    /// sums. Cost: an `all_gather` and a `sum_scatter` of `[T, D]`, the
    /// bytes of the `all_sum` of [`forward`](Self::forward).
    #[sharded(x @ Replicated, return @ Sharded<0>)]
    pub fn forward_sequence_parallel(
        &self,
        x: ShardedArray<Sharded<0>>,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<0>>> {
        self.attend(&x, s)?.matmul(&self.weights.out, s)
    }

    /// This rank's heads' outputs, `[T, D]` split by columns (head-major).
    fn attend(&self, x: &ShardedArray<Replicated>, s: &Stream) -> Result<ShardedArray<Sharded<1>>> {
        let comm = x.comm();
        let (t, d) = match x.global_shape() {
            [t, d] => (*t, *d),
            other => {
                return Err(Error::Shape(format!(
                    "attention takes tokens [T, D], got {other:?}"
                )))
            }
        };
        let local_heads = (self.heads / comm.size()) as i32;
        let head_dim = d / self.heads as i32;
        let width = local_heads * head_dim;
        let qkv = x.matmul(&self.weights.qkv, s)?; // [T, 3 * width] = [q | k | v]
        let parts = qkv.local().split_axis(&[width, 2 * width], 1, s)?;
        // [T, width] -> [heads, T, head_dim]
        let by_head = |a: &Array| -> Result<Array> {
            Ok(a.reshape(&[t, local_heads, head_dim], s)?
                .transpose_axes(&[1, 0, 2], s)?)
        };
        let (q, k, v) = (
            by_head(&parts[0])?,
            by_head(&parts[1])?,
            by_head(&parts[2])?,
        );
        let scale = Array::from_f32(1.0 / (head_dim as f32).sqrt());
        let scores = q
            .matmul(&k.transpose_axes(&[0, 2, 1], s)?, s)?
            .multiply(&scale, s)?;
        let scores = scores.add(causal_mask(t), s)?;
        let weights = safemlx::ops::softmax_axis(&scores, -1, None, s)?;
        let heads = weights.matmul(&v, s)?; // [heads, T, head_dim]
        let local = heads
            .transpose_axes(&[1, 0, 2], s)?
            .reshape(&[t, width], s)?;
        ShardedArray::from_local(local, comm, &[t, d])
    }
}

/// Checks `heads` against the model dimension (`out` is `[D, D]`) and the
/// rank count.
fn check_heads(out: &[i32], heads: usize, n: usize) -> Result<()> {
    let d = usize::try_from(out.first().copied().unwrap_or(0)).unwrap_or(0);
    if heads == 0 || d % heads != 0 {
        return Err(Error::Shape(format!(
            "attention with {heads} heads over a model dimension of {d}: the head count must divide the dimension"
        )));
    }
    if heads % n != 0 {
        return Err(Error::Shape(format!(
            "attention with {heads} heads over {n} ranks: heads are split across ranks, so the head count must be a multiple of the rank count"
        )));
    }
    Ok(())
}

/// `[T, T]`: 0 on and below the diagonal, a large negative number above it.
fn causal_mask(t: i32) -> Array {
    let t = t.max(0) as usize;
    let values: Vec<f32> = (0..t * t)
        .map(|i| if i % t > i / t { -1e9 } else { 0.0 })
        .collect();
    Array::from_slice(&values, &[t as i32, t as i32])
}
