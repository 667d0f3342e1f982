//! Vocabulary-parallel token embedding and LM head.

use safemlx::{Array, Dtype, Stream};

use crate::checkpoint::Weights;
use crate::error::{Error, Result};
use crate::typed::{chunk, Partial, Replicated, Sharded, ShardedArray};
use safemlx_dist_macros::sharded;

/// A `[V, D]` table split by vocabulary rows: rank `r` holds rows
/// `chunk(V, r, n)`. As an embedding, each rank looks up the tokens in its
/// rows (zeros for the others) and one `all_sum` of `[T, D]` completes the
/// lookup; as an LM head, `h E^T` gives each rank its vocabulary columns
/// of the logits, `Sharded<1>`, gathered only where a token is sampled.
#[sharded]
#[derive(Debug)]
pub struct VocabParallelEmbedding {
    /// `[V, D]`, split by rows.
    #[shard(Sharded<0>)]
    pub weight: ShardedArray<Sharded<0>>,
}

impl VocabParallelEmbedding {
    /// Reads this rank's rows of the `[vocab, dim]` tensor `weight`.
    ///
    /// # Errors
    /// A missing tensor or one of another shape.
    pub fn load(w: &Weights, (vocab, dim): (usize, usize), s: &Stream) -> Result<Self> {
        Ok(Self {
            weight: w.get("weight", &[vocab, dim], s)?,
        })
    }

    /// The vocabulary size `V`.
    pub fn vocab(&self) -> usize {
        self.weight.global_shape()[0] as usize
    }

    /// The rows of `tokens` on every rank, `[T, D]`. Cost: one `all_sum` of
    /// `[T, D]`.
    ///
    /// # Errors
    /// A token id outside the vocabulary (named with its position).
    pub fn forward(&self, tokens: &[u32], s: &Stream) -> Result<ShardedArray<Replicated>> {
        let comm = self.weight.comm();
        let (first, count) = chunk(self.vocab(), comm.rank(), comm.size());
        let (rows, keep, t) = local_lookup(tokens, self.vocab(), (first, count))?;
        let d = self.weight.global_shape()[1];
        let local = if count == 0 {
            safemlx::ops::zeros_dtype(&[t, d], self.weight.local().dtype(), s)?
        } else {
            let keep = keep.as_dtype(self.weight.local().dtype(), s)?;
            self.weight
                .local()
                .take_axis(&rows, 0, s)?
                .multiply(&keep, s)?
        };
        ShardedArray::<Partial>::from_local(local, comm, &[t, d])?.all_sum(s)
    }

    /// The logits `h E^T` of the replicated hidden states `h` `[T, D]`:
    /// this rank's vocabulary columns, `[T, V]` split by columns. No
    /// communication.
    ///
    /// # Errors
    /// `h` is not `[T, D]`.
    pub fn logits(
        &self,
        h: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<1>>> {
        let transposed: ShardedArray<Sharded<1>> = self.weight.transpose(s)?; // [D, V]
        h.matmul(&transposed, s)
    }
}

/// A vocabulary-parallel lookup of `tokens` on the rank holding rows
/// `(first, count)` of `vocab`: each token's local row (0 for another
/// rank's), `[T]`; a `float32` `[T, 1]` mask, 1 where the row is this
/// rank's; and `T`.
///
/// # Errors
/// A token id outside the vocabulary (named with its position), or more
/// tokens than MLX's `i32` shapes hold.
pub(super) fn local_lookup(
    tokens: &[u32],
    vocab: usize,
    (first, count): (usize, usize),
) -> Result<(Array, Array, i32)> {
    if let Some((at, id)) = tokens
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab)
    {
        return Err(Error::Shape(format!(
            "token {id} at position {at} is outside the vocabulary of {vocab} tokens"
        )));
    }
    let t = i32::try_from(tokens.len()).map_err(|_| Error::ShapeOverflow {
        value: tokens.len(),
    })?;
    let mine = |t: u32| (first..first + count).contains(&(t as usize));
    let rows: Vec<i32> = tokens
        .iter()
        .map(|&t| {
            if mine(t) {
                (t as usize - first) as i32
            } else {
                0
            }
        })
        .collect();
    let keep: Vec<f32> = tokens
        .iter()
        .map(|&t| f32::from(u8::from(mine(t))))
        .collect();
    Ok((
        Array::from_slice(&rows, &[t]),
        Array::from_slice(&keep, &[t, 1]),
        t,
    ))
}

/// The full logits of rows `rows` of vocabulary-split logits `[T, V]`, on
/// every rank, in `float32`: one `all_gather` of `[rows, V]`, only for the
/// positions that are sampled (or checked).
///
/// # Errors
/// A row range past `T`, or an MLX error.
pub fn gather_logits(
    logits: &ShardedArray<Sharded<1>>,
    rows: std::ops::Range<usize>,
    s: &Stream,
) -> Result<ShardedArray<Replicated>> {
    let &[t, v] = logits.global_shape() else {
        return Err(Error::Shape(format!(
            "logits are [T, V], got {:?}",
            logits.global_shape()
        )));
    };
    if rows.end > t as usize || rows.start > rows.end {
        return Err(Error::Shape(format!(
            "rows {rows:?} of logits with {t} rows were asked for"
        )));
    }
    let count = (rows.end - rows.start) as i32;
    let picked = crate::runtime::slice_axis(logits.local(), 0, rows.start, rows.len(), s)?
        .as_dtype(Dtype::Float32, s)?;
    ShardedArray::<Sharded<1>>::from_local(picked, logits.comm(), &[count, v])?.all_gather(s)
}
