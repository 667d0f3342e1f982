//! One pipeline stage's part of a forward pass: the embedding (first
//! stage), this stage's layers, and the logits (last stage).

use safemlx::Stream;

use super::Llama;
use crate::error::{Error, Result};
use crate::models::Stage;
use crate::nn::{Embedding, KvCache, LayerKv, RmsNorm};
use crate::typed::{Replicated, Sharded, ShardedArray};

/// What a stage's layers start from.
#[derive(Debug)]
pub enum StageInput<'a> {
    /// The tokens, embedded here (the first stage).
    Tokens(&'a [u32]),
    /// The previous stage's residual stream, `[T, D]`.
    Hidden(ShardedArray<Replicated>),
}

impl Llama {
    /// The layers this rank holds (all of them outside a pipeline).
    pub fn stage(&self) -> &Stage {
        &self.stage
    }

    /// One sequence through this stage's layers at positions
    /// `cache.len()..`, appending their keys and values to `cache` (made
    /// with [`new_cache`](Self::new_cache)): the residual stream after the
    /// stage's last layer, `[T, D]`, what the next stage receives (or what
    /// [`stage_logits`](Self::stage_logits) reads on the last stage).
    ///
    /// # Errors
    /// Tokens on a stage that does not embed them or hidden rows on one
    /// that does, no rows, rows of the wrong width, a cache of another
    /// stage, or an MLX error.
    pub fn forward_stage(
        &self,
        input: StageInput<'_>,
        cache: &mut KvCache,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        let x = match input {
            StageInput::Tokens(tokens) => self.embed_tokens(tokens, s)?,
            StageInput::Hidden(_) if self.stage.is_first() => {
                return Err(Error::Shape(format!(
                    "stage 0 of {} embeds tokens; it got hidden rows",
                    self.stage.count
                )))
            }
            StageInput::Hidden(x) => x,
        };
        let (rows, width) = match x.global_shape() {
            [rows, width] => (*rows, *width),
            shape => {
                return Err(Error::Shape(format!(
                    "stage {} got hidden rows of shape {shape:?}; it takes [T, {}]",
                    self.stage.index, self.config.hidden_size
                )))
            }
        };
        if rows < 1 || usize::try_from(width).ok() != Some(self.config.hidden_size) {
            return Err(Error::Shape(format!(
                "stage {} got hidden rows of shape [{rows}, {width}]; it takes [T, {}] with T >= 1",
                self.stage.index, self.config.hidden_size
            )));
        }
        self.check_sequence(0, rows as usize, cache)?;
        self.layers_with(x, s, |i, attention, x| {
            let mut layer: [(usize, &mut dyn LayerKv); 1] =
                [(rows as usize, cache.layers[i].as_mut())];
            attention.forward(x, &mut layer, s)
        })
    }

    /// On the last stage, the logits of every row of `hidden` (what
    /// [`forward_stage`](Self::forward_stage) returned), `[T, V]`: this
    /// rank's vocabulary columns.
    ///
    /// # Errors
    /// A stage other than the last, or an MLX error.
    pub fn stage_logits(
        &self,
        hidden: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<1>>> {
        self.head()?
            .logits(&self.final_norm()?.forward(hidden, s)?, s)
    }

    /// As [`stage_logits`](Self::stage_logits), the last row's only,
    /// `[1, V]`: what generation samples from.
    ///
    /// # Errors
    /// A stage other than the last, or an MLX error.
    pub fn stage_last_logits(
        &self,
        hidden: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Sharded<1>>> {
        let rows = hidden.global_shape().first().copied().unwrap_or(0).max(0) as usize;
        self.last_logits(hidden, &[rows], s)
    }

    /// Where the vocabulary of a shared LM head splits, when this pipeline
    /// shares it (see [`generate_stages`](crate::generate::generate_stages)):
    /// the first stage computes the logits of tokens `0..split`, the last
    /// stage those of `split..V`. Shared when the embeddings are tied (the
    /// first stage holds the table too), there are at least two stages,
    /// and each stage is one rank (`ranks_per_stage`); `None` otherwise.
    /// Every stage answers alike.
    pub fn shared_head_split(&self, ranks_per_stage: usize) -> Option<usize> {
        let shared = self.config.tie_word_embeddings
            && self.stage.count >= 2
            && ranks_per_stage == 1
            && self.config.vocab_size >= 2;
        shared.then_some(self.config.vocab_size / 2)
    }

    /// On the last stage, the final norm of the last row of `hidden` (what
    /// [`forward_stage`](Self::forward_stage) returned), `[1, D]`: what a
    /// shared LM head's two parts multiply.
    ///
    /// # Errors
    /// A stage other than the last, no rows, or an MLX error.
    pub fn stage_final_row(
        &self,
        hidden: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        let &[rows, _] = hidden.global_shape() else {
            return Err(Error::Shape(format!(
                "hidden rows are [T, D], got {:?}",
                hidden.global_shape()
            )));
        };
        let norm = self.final_norm()?;
        let rows = usize::try_from(rows)
            .ok()
            .filter(|&rows| rows >= 1)
            .ok_or_else(|| {
                Error::Shape(format!("stage {} got no hidden rows", self.stage.index))
            })?;
        norm.forward(&self.last_rows(hidden, &[rows], s)?, s)
    }

    /// On the first or the last stage of a pipeline that shares its LM
    /// head, the logits of tokens `vocab` for the normed rows `normed`
    /// ([`stage_final_row`](Self::stage_final_row)), `[T, vocab.len()]`.
    ///
    /// # Errors
    /// A stage without the tied table, a table split over several ranks,
    /// tokens past the vocabulary, or an MLX error.
    pub fn stage_vocab_logits(
        &self,
        normed: &ShardedArray<Replicated>,
        vocab: std::ops::Range<usize>,
        s: &Stream,
    ) -> Result<ShardedArray<Replicated>> {
        let table = self
            .embed
            .as_ref()
            .filter(|_| self.config.tie_word_embeddings)
            .ok_or_else(|| self.not_here("the tied LM head"))?;
        table.vocab_logits(normed, vocab, s)
    }

    /// The LM head: its own table, or the embedding when tied (the last
    /// stage's).
    pub(super) fn head(&self) -> Result<&Embedding> {
        match (&self.norm, self.lm_head.as_ref().or(self.embed.as_ref())) {
            (Some(_), Some(head)) => Ok(head),
            _ => Err(self.not_here("the LM head")),
        }
    }

    /// The final norm (the last stage's).
    pub(super) fn final_norm(&self) -> Result<&RmsNorm> {
        self.norm
            .as_ref()
            .ok_or_else(|| self.not_here("the final norm"))
    }

    /// The error for `what`, which another pipeline stage holds.
    pub(super) fn not_here(&self, what: &str) -> Error {
        Error::Model {
            path: self.path.clone(),
            message: format!(
                "{what} is on another pipeline stage: this rank holds stage {} of {} (layers {}..{})",
                self.stage.index, self.stage.count, self.stage.layers.start, self.stage.layers.end
            ),
        }
    }
}
