//! The loss of `tests/golden/make_gradient_goldens.py` on a Llama-family
//! model, its gradient's global norm, and the check against mlx-lm's
//! figures in a golden directory's `gradients.safetensors`.

use safemlx::{Array, Stream};
use safemlx_dist::checkpoint::SafetensorsFile;
use safemlx_dist::grad::{value_and_grad_of, Parameters};
use safemlx_dist::models::Llama;
use safemlx_dist::nn::gather_logits;
use safemlx_dist::optim::{clip_grad_norm, AdamW};
use safemlx_dist::{Group, Replicated, ShardedArray};

use crate::dense::host;

/// The golden script's loss (the logits of a fixed prompt times a fixed
/// pattern, summed), its gradient's global norm, and the gradient as a
/// model.
pub fn model_loss_and_norm(model: &Llama, group: &Group, s: &Stream) -> (f32, f32, Llama) {
    let prompt: Vec<u32> = vec![1, 5, 17, 33, 2, 60, 66, 12, 40];
    let (t, v) = (prompt.len() as i32, model.config().vocab_size as i32);
    let c: Vec<f32> = (0..t * v).map(|i| (0.1 * i as f32).sin()).collect();
    let c = ShardedArray::<Replicated>::replicated(Array::from_slice(&c, &[t, v]), group);
    let (loss, grads) = value_and_grad_of(model, |m| {
        let logits = m.forward(&prompt, &mut m.new_cache(), s)?;
        gather_logits(&logits, 0..t as usize, s)?
            .mul(&c, s)?
            .sum_all(s)
    })
    .expect("value_and_grad_of");
    let (grads, norm) = clip_grad_norm(&grads, f32::MAX, group, s).expect("norm");
    (host(&loss, s)[0], norm, grads)
}

/// The loss and the gradient norm equal mlx-lm's (relative error at most
/// 1e-4 and 5e-6) from `dir`'s `gradients.safetensors`, and one AdamW step
/// lowers the loss.
pub fn check_against_golden(
    model: &Llama,
    dir: &std::path::Path,
    what: &str,
    group: &Group,
    s: &Stream,
) {
    let golden = SafetensorsFile::open(dir.join("gradients.safetensors")).unwrap();
    let want = |name: &str| host(&golden.read(name, s).unwrap(), s)[0];
    let (loss, norm, grads) = model_loss_and_norm(model, group, s);
    let relative = |a: f32, b: f32| (a - b).abs() / b.abs().max(1e-6);
    assert!(
        relative(loss, want("loss")) <= 1e-4,
        "{what}: loss {loss} vs mlx-lm {}",
        want("loss")
    );
    // Tighter than the loss: the small parameters' gradients (gpt-oss's
    // sinks, about 2e-5 of the norm, its expert biases) must show. The
    // goldens are met within 2.3e-6 at 1 to 4 ranks.
    assert!(
        relative(norm, want("grad_norm")) <= 5e-6,
        "{what}: gradient norm {norm} vs mlx-lm {}",
        want("grad_norm")
    );
    assert_eq!(grads.parameters().len(), model.parameters().len(), "{what}");
    // One AdamW step lowers the loss at every rank count.
    let mut adam = AdamW::new(1e-3);
    let stepped = adam.update(model, &grads, s).unwrap();
    let (after, _, _) = model_loss_and_norm(&stepped, group, s);
    assert!(
        after < loss,
        "{what}: the loss went from {loss} to {after} after a step"
    );
}
