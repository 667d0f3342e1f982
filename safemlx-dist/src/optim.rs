//! Optimizers whose state follows the parameters' placements.
//!
//! The updates are element-wise, so each rank keeps the state of its own
//! chunk of a `Sharded` parameter only, and a `Replicated` parameter (whose
//! gradient is the same on every rank, see [`grad`](crate::grad)) stays the
//! same on every rank without any communication.

use safemlx::{Array, Stream};

use crate::error::{Error, Result};
use crate::grad::Parameters;
use crate::runtime::Group;

/// AdamW (Loshchilov and Hutter): Adam with bias correction and weight
/// decay applied to the parameter directly, as PyTorch's `AdamW`.
///
/// `p <- p - lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p)`.
#[derive(Debug)]
pub struct AdamW {
    /// The learning rate.
    pub lr: f32,
    /// The decay rates of the first and second moments.
    pub betas: (f32, f32),
    /// Added to the denominator.
    pub eps: f32,
    /// The decoupled weight decay.
    pub weight_decay: f32,
    steps: i32,
    moments: Vec<(Array, Array)>,
}

impl AdamW {
    /// AdamW with `lr`, betas (0.9, 0.999), eps 1e-8 and weight decay 0.01.
    pub fn new(lr: f32) -> Self {
        Self {
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            steps: 0,
            moments: Vec::new(),
        }
    }

    /// Steps taken so far.
    pub fn steps(&self) -> i32 {
        self.steps
    }

    /// The state: per parameter, this rank's first and second moments, in
    /// the order of [`Parameters::parameters`] (to save a checkpoint).
    pub fn moments(&self) -> &[(Array, Array)] {
        &self.moments
    }

    /// Restores a state saved from [`moments`](Self::moments) after `steps` steps.
    pub fn restore(&mut self, steps: i32, moments: Vec<(Array, Array)>) {
        self.steps = steps;
        self.moments = moments;
    }

    /// One step: the model with its parameters updated by `grads` (a model
    /// of gradients, as [`value_and_grad_of`](crate::grad::value_and_grad_of)
    /// returns). Lazy: evaluate the result to run it.
    ///
    /// # Errors
    /// Gradients that do not match the model's parameters, or an MLX error.
    pub fn update<M: Parameters>(&mut self, model: &M, grads: &M, s: &Stream) -> Result<M> {
        let (params, grads) = (model.parameters(), grads.parameters());
        if params.len() != grads.len()
            || params
                .iter()
                .zip(&grads)
                .any(|(p, g)| p.local.shape() != g.local.shape())
        {
            return Err(Error::Shape(format!(
                "AdamW: {} gradients for {} parameters, or of other shapes",
                grads.len(),
                params.len()
            )));
        }
        if self.moments.is_empty() {
            self.moments = params
                .iter()
                .map(|p| {
                    let zero = safemlx::ops::zeros_like(&p.local, s)?;
                    Ok((zero.clone(), zero))
                })
                .collect::<Result<_>>()?;
        } else if self.moments.len() != params.len() {
            return Err(Error::Shape(format!(
                "AdamW: a state of {} parameters for a model of {}",
                self.moments.len(),
                params.len()
            )));
        }
        self.steps += 1;
        let (b1, b2) = self.betas;
        let c = |v: f32| Array::from_f32(v);
        let correction1 = 1.0 - b1.powi(self.steps);
        let correction2 = 1.0 - b2.powi(self.steps);
        let mut updated = Vec::with_capacity(params.len());
        for ((p, g), (m, v)) in params.iter().zip(&grads).zip(self.moments.iter_mut()) {
            let g = &g.local;
            *m = m.multiply(c(b1), s)?.add(g.multiply(c(1.0 - b1), s)?, s)?;
            *v = v
                .multiply(c(b2), s)?
                .add(g.square(s)?.multiply(c(1.0 - b2), s)?, s)?;
            let step = m.multiply(c(1.0 / correction1), s)?.divide(
                v.multiply(c(1.0 / correction2), s)?
                    .sqrt(s)?
                    .add(c(self.eps), s)?,
                s,
            )?;
            let decayed = p.local.multiply(c(1.0 - self.lr * self.weight_decay), s)?;
            updated.push(decayed.subtract(step.multiply(c(self.lr), s)?, s)?);
        }
        model.with_parameters(&updated)
    }
}

/// The gradients scaled so that their global norm (over every rank's
/// chunks, each `Replicated` gradient counted once: see
/// [`Parameter::copies`](crate::grad::Parameter::copies)) is at most `max_norm`,
/// and that norm before scaling. Cost: one `all_sum` of a scalar.
///
/// # Errors
/// A `max_norm` that is not positive, or an MLX error.
pub fn clip_grad_norm<M: Parameters>(
    grads: &M,
    max_norm: f32,
    group: &Group,
    s: &Stream,
) -> Result<(M, f32)> {
    clip_counting(grads, max_norm, group, |_, copies| copies, s)
}

/// [`clip_grad_norm`] with each parameter's array counted as one of
/// `copies(index, held_by)` copies across `group` (`held_by`: the ranks
/// holding it, [`Parameter::copies`](crate::grad::Parameter::copies)).
pub(crate) fn clip_counting<M: Parameters>(
    grads: &M,
    max_norm: f32,
    group: &Group,
    copies: impl Fn(usize, usize) -> usize,
    s: &Stream,
) -> Result<(M, f32)> {
    if !(max_norm > 0.0 && max_norm.is_finite()) {
        return Err(Error::Setting(format!(
            "clip_grad_norm: max_norm must be a positive number, got {max_norm}"
        )));
    }
    // Each rank adds its arrays' squares, a copy held by k ranks at 1/k.
    let mut own = Array::from_f32(0.0);
    let params = grads.parameters();
    for (i, p) in params.iter().enumerate() {
        let sq = p.counted_squares(&p.local, copies(i, p.copies), s)?;
        own = own.add(&sq, s)?;
    }
    let total = crate::runtime::all_sum(&own, group, s)?;
    crate::runtime::eval(&[&total])?;
    let norm = total.try_item::<f32>(s)?.sqrt();
    let scale = (max_norm / (norm + 1e-6)).min(1.0);
    let scaled: Vec<Array> = params
        .iter()
        .map(|p| Ok(p.local.multiply(Array::from_f32(scale), s)?))
        .collect::<Result<_>>()?;
    Ok((grads.with_parameters(&scaled)?, norm))
}
