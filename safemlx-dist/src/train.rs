//! Training through pipeline stages: GPipe's schedule of micro-batches.
//!
//! ```text
//! forward:   every micro-batch through the stages, stage 0 first; each
//!            stage keeps the rows it received (its input), not its
//!            activations
//! backward:  the last stage takes each micro-batch's loss and its
//!            gradient with respect to its parameters and its input, and
//!            sends the input's gradient to the stage before; each stage
//!            recomputes its forward from the kept input and takes the
//!            gradient of (its output . the gradient it received)
//! tied:      the first and last stages hold the same tied embedding and
//!            add their two gradients
//! ```
//!
//! MLX's `send`/`recv` carry no gradient, so the schedule exchanges them
//! itself, as typed rows over the [`StageLink`] (its `send_gradient` and
//! `receive_gradient`). The gradients each stage gets equal the dense
//! model's gradients of the mean micro-batch loss for that stage's
//! parameters (tested against one process in `tests/pipeline_training.rs`).

use safemlx::{Array, Dtype, Stream};

use crate::error::{Error, Result};
use crate::grad::{value_and_grad, Parameters};
use crate::models::{Llama, StageInput};
use crate::typed::{Replicated, Sharded, ShardedArray, StageLink, StageMessage};

/// The mean of `loss` over the micro-batches `batches` (token sequences,
/// the same on every stage) through the pipeline `link` carries, and this
/// stage's gradients of it as a model of gradients (each in its
/// parameter's place). `loss(m, logits)` gives micro-batch `m`'s scalar
/// loss from its logits `[T, V]` on the last stage; the loss comes back
/// there (`None` on the other stages). The tied embedding's gradient is
/// the sum of both ends' on the first and last stages. A pipeline of one
/// stage is the same average over the micro-batches.
///
/// # Errors
/// No micro-batch or an empty one, a model that is not this rank's
/// stage, the model's or the loss's errors, or a boundary's.
pub fn value_and_grad_stages<F>(
    model: &Llama,
    link: &StageLink,
    batches: &[&[u32]],
    mut loss: F,
    s: &Stream,
) -> Result<(Option<Array>, Llama)>
where
    F: FnMut(usize, &ShardedArray<Sharded<1>>) -> Result<ShardedArray<Replicated>>,
{
    let stage = model.stage().clone();
    stage.expect_place(link.stage(), link.stages())?;
    if batches.is_empty() || batches.iter().any(|b| b.is_empty()) {
        return Err(Error::Shape(
            "pipeline training needs at least one micro-batch, none empty".to_owned(),
        ));
    }
    let scale = 1.0 / batches.len() as f32;
    let width = model.config().hidden_size;
    let params: Vec<Array> = model.parameters().into_iter().map(|p| p.local).collect();
    let n = params.len();
    // Forward: each stage keeps what it received.
    let mut inputs = Vec::with_capacity(batches.len());
    for tokens in batches {
        let input = if stage.is_first() {
            StageInput::Tokens(tokens)
        } else {
            match link.receive(width, Dtype::Float32, s)? {
                StageMessage::Hidden { rows, .. } => {
                    inputs.push(rows.local().clone());
                    StageInput::Hidden(rows)
                }
                _ => return Err(wrong_message()),
            }
        };
        if !stage.is_last() {
            let rows = model.forward_stage(input, &mut model.new_cache(), s)?;
            link.send_hidden(&rows, true, s)?;
        }
    }
    // Backward, micro-batch by micro-batch in the same order.
    let mut total: Option<Array> = None;
    let mut sums: Option<Vec<Array>> = None;
    for (m, tokens) in batches.iter().enumerate() {
        let upstream = if stage.is_last() {
            None
        } else {
            Some(link.receive_gradient(width, Dtype::Float32, s)?)
        };
        let mut arrays = params.clone();
        if !stage.is_first() {
            arrays.push(inputs[m].clone());
        }
        let (value, mut grads) = value_and_grad(&arrays, |p| {
            let here = model.with_parameters(&p[..n])?;
            let input = match p.get(n) {
                Some(x) => StageInput::Hidden(ShardedArray::replicated(x.clone(), link.tensor())),
                None => StageInput::Tokens(tokens),
            };
            let rows = here.forward_stage(input, &mut here.new_cache(), s)?;
            match &upstream {
                // sum(output . upstream gradient): its gradient is the chain rule's.
                Some(dy) => rows
                    .mul(&ShardedArray::replicated(dy.clone(), link.tensor()), s)?
                    .sum_all(s),
                None => loss(m, &here.stage_logits(&rows, s)?)?.scale(scale, s),
            }
        })?;
        if !stage.is_first() {
            let dx = grads.pop().ok_or_else(wrong_message)?;
            link.send_gradient(&ShardedArray::replicated(dx, link.tensor()), s)?;
        }
        crate::runtime::eval(&grads.iter().collect::<Vec<_>>())?;
        sums = Some(match sums {
            None => grads,
            Some(before) => before
                .iter()
                .zip(&grads)
                .map(|(a, b)| Ok(a.add(b, s)?))
                .collect::<Result<_>>()?,
        });
        if stage.is_last() {
            total = Some(match total {
                None => value,
                Some(t) => t.add(&value, s)?,
            });
        }
    }
    let mut sums = sums.ok_or_else(wrong_message)?;
    // The tied embedding (the first parameter on both ends) sums its two gradients.
    if model.config().tie_word_embeddings
        && !stage.is_whole()
        && (stage.is_first() || stage.is_last())
    {
        let mine = sums.first().ok_or_else(wrong_message)?;
        let theirs = link.exchange_with_other_end(mine, s)?;
        sums[0] = mine.add(&theirs, s)?;
    }
    Ok((total, model.with_parameters(&sums)?))
}

/// [`clip_grad_norm`](crate::optim::clip_grad_norm) of a pipeline's
/// gradients: the norm over every stage's (one `all_sum` of a scalar over
/// `link`'s world group), the tied embedding, held by the first and the
/// last stage, counted once.
///
/// # Errors
/// A `max_norm` that is not positive, or an MLX error.
pub fn clip_grad_norm_stages(
    grads: &Llama,
    max_norm: f32,
    link: &StageLink,
    s: &Stream,
) -> Result<(Llama, f32)> {
    let stage = grads.stage();
    let tied = grads.config().tie_word_embeddings
        && !stage.is_whole()
        && (stage.is_first() || stage.is_last());
    let copies = |index: usize, held_by: usize| {
        if tied && index == 0 {
            2 * held_by
        } else {
            held_by
        }
    };
    crate::optim::clip_counting(grads, max_norm, link.world(), copies, s)
}

fn wrong_message() -> Error {
    Error::Shape("a pipeline stage got a message of the wrong kind while training".to_owned())
}
