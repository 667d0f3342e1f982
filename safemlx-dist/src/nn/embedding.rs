//! The vocabulary-parallel token embedding and LM head, float or quantized.

use safemlx::{Array, Dtype, Stream};

use crate::checkpoint::Weights;
use crate::error::{Error, Result};
use crate::runtime::Group;
use crate::typed::{LinearWeight, Replicated, Sharded, ShardedArray};

/// A `[V, D]` vocabulary table split by rows, float or quantized as the
/// checkpoint stores it: rank `r` holds rows `chunk(V, r, n)`. As an
/// embedding, each rank looks up the tokens in its rows (zeros for the
/// others), a `Partial`, and one `all_sum` of `[T, D]` completes the
/// lookup; as an LM head, `h Eᵀ` gives each rank its vocabulary columns of
/// the logits, `Sharded<1>`, gathered only where a token is sampled. A
/// float table is one parameter (this rank's rows); a quantized one none:
/// it stays frozen.
#[derive(Debug, crate::grad::Parameters)]
pub struct Embedding {
    /// `[V, D]`, split by rows.
    pub weight: LinearWeight<Sharded<0>>,
}

impl Embedding {
    /// Reads this rank's rows of the `[vocab, dim]` tensor `weight`, kept
    /// quantized when the checkpoint stores it so.
    ///
    /// # Errors
    /// A missing tensor or one of another shape.
    pub fn load(w: &Weights, (vocab, dim): (usize, usize), s: &Stream) -> Result<Self> {
        let weight = if w.quantization("weight").is_some() {
            LinearWeight::Quantized(w.quantized("weight", Some([vocab, dim]), s)?)
        } else {
            LinearWeight::Float(w.get("weight", &[vocab, dim], s)?)
        };
        Ok(Self { weight })
    }

    /// This rank's rows of the full float `table` `[V, D]`.
    ///
    /// # Errors
    /// A table that is not 2-D, or an MLX error.
    pub fn from_full(group: &Group, table: Array, s: &Stream) -> Result<Self> {
        if table.ndim() != 2 {
            return Err(Error::Shape(format!(
                "a vocabulary table is [V, D], got {:?}",
                table.shape()
            )));
        }
        let weight = ShardedArray::replicated(table, group).shard::<0>(s)?;
        Ok(Self {
            weight: LinearWeight::Float(weight),
        })
    }

    /// The vocabulary size `V`.
    pub fn vocab(&self) -> usize {
        self.weight.global_shape()[0]
    }

    /// The rows of `tokens` on every rank, `[T, D]`. Cost: one `all_sum` of
    /// `[T, D]`.
    ///
    /// # Errors
    /// A token id outside the vocabulary (named with its position).
    pub fn forward(&self, tokens: &[u32], s: &Stream) -> Result<ShardedArray<Replicated>> {
        self.weight.lookup(tokens, s)?.all_sum(s)
    }

    /// The logits `h Eᵀ` of the replicated hidden states `h` `[T, D]`:
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
        h.linear(&self.weight, s)
    }

    /// The logits of vocabulary rows `vocab` only, `[T, vocab.len()]`, for
    /// the replicated hidden states `h` `[T, D]`, from a table this rank
    /// holds whole (a group of one): what the first and the last pipeline
    /// stage each compute of a shared LM head.
    ///
    /// # Errors
    /// A table split over several ranks, rows past the vocabulary, `h` not
    /// `[T, D]`, or an MLX error.
    pub fn vocab_logits(
        &self,
        h: &ShardedArray<Replicated>,
        vocab: std::ops::Range<usize>,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        let ranks = self.weight.comm().size();
        if ranks != 1 || vocab.start > vocab.end || vocab.end > self.vocab() {
            return Err(Error::Shape(format!(
                "vocabulary rows {vocab:?} of a table of {} rows held by {ranks} ranks: a part of the LM head needs the whole table on one rank",
                self.vocab()
            )));
        }
        let rows = h.global_shape()[0];
        let local = match &self.weight {
            LinearWeight::Float(w) => {
                let part = crate::runtime::slice_axis(w.local(), 0, vocab.start, vocab.len(), s)?;
                h.local().matmul(part.transpose(s)?, s)?
            }
            LinearWeight::Quantized(w) => w
                .local()
                .rows(vocab.start, vocab.len(), s)?
                .matmul_t(h.local(), s)?,
        };
        let columns =
            i32::try_from(vocab.len()).map_err(|_| Error::ShapeOverflow { value: vocab.len() })?;
        ShardedArray::from_local(local, h.comm(), &[rows, columns])
    }

    /// Bytes of this rank's rows.
    pub fn nbytes(&self) -> usize {
        self.weight.nbytes()
    }

    /// Whether the table stays quantized.
    pub fn is_quantized(&self) -> bool {
        self.weight.is_quantized()
    }
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
