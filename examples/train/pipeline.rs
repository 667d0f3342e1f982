//! `train --mesh pp=P[,tp=T]`: the model split into P pipeline stages of T
//! ranks (ring or MPI), each step GPipe's `--micro-batches M` windows
//! through the stages
//! (`train::value_and_grad_stages`), the gradient clipped over every
//! stage, an AdamW step per stage.

use safemlx::{Array, Stream};
use safemlx_dist::checkpoint::HfDirectory;
use safemlx_dist::grad::Parameters;
use safemlx_dist::models::{LayerSplit, Llama, LlamaConfig, Stage};
use safemlx_dist::nn::gather_logits;
use safemlx_dist::optim::AdamW;
use safemlx_dist::train::{clip_grad_norm_stages, value_and_grad_stages};
use safemlx_dist::typed::{MeshSpec, StageLink};
use safemlx_dist::{DeviceMesh, Group};

use super::{cross_entropy, err};

/// A run's pipeline: its boundaries and micro-batches per step.
pub struct Pipeline {
    pub link: StageLink,
    pub micro_batches: usize,
}

/// The pipeline `--mesh` asks for over `world` (`None` without `--mesh`).
pub fn setup(
    world: &Group,
    mesh: Option<&str>,
    micro_batches: usize,
    replicas: usize,
) -> Result<Option<Pipeline>, String> {
    let Some(mesh) = mesh else {
        return Ok(None);
    };
    let axes = mesh
        .parse::<MeshSpec>()
        .and_then(|m| m.resolve(world.size()))
        .map_err(err)?;
    if replicas != 1 {
        return Err(format!(
            "--mesh {mesh}: training through a pipeline does not take --data-parallel"
        ));
    }
    let mesh = DeviceMesh::new(world, &[("pp", axes.pp), ("tp", axes.tp)]).map_err(err)?;
    Ok(Some(Pipeline {
        link: StageLink::new(&mesh).map_err(err)?,
        micro_batches,
    }))
}

/// This rank's stage of the model in `dir`, heads and hidden columns in
/// proportion to `shares` over the stage's ranks if given.
pub fn load(
    p: &Pipeline,
    dir: &HfDirectory,
    shares: Option<&[u32]>,
    s: &Stream,
) -> Result<Llama, String> {
    let path = dir.path().display().to_string();
    let config = LlamaConfig::from_hf(dir.config(), &path).map_err(err)?;
    let split = LayerSplit::Even(p.link.stages());
    let stage = Stage::of(&split, p.link.stage(), config.layers).map_err(err)?;
    let w = super::tensor_weights(dir, p.link.tensor(), shares)?;
    Llama::load_stage(&w, config, stage, s).map_err(err)
}

/// One step on the micro-batches starting at window `first`: the model
/// after it, the mean loss (on every rank) and the gradient norm.
pub fn step(
    p: &Pipeline,
    (model, adam): (&Llama, &mut AdamW),
    (text, seq, first, windows): (&[u8], usize, usize, usize),
    s: &Stream,
) -> Result<(Llama, f32, f32), String> {
    let window = |m: usize| ((first + m) % windows) * seq;
    let tokens: Vec<Vec<u32>> = (0..p.micro_batches)
        .map(|m| {
            text[window(m)..window(m) + seq]
                .iter()
                .map(|&b| u32::from(b))
                .collect()
        })
        .collect();
    let batches: Vec<&[u32]> = tokens.iter().map(Vec::as_slice).collect();
    let tensor = p.link.tensor();
    let (loss, grads) = value_and_grad_stages(
        model,
        &p.link,
        &batches,
        |m, logits| {
            let at = window(m);
            let targets: Vec<i32> = text[at + 1..at + seq + 1]
                .iter()
                .map(|&b| i32::from(b))
                .collect();
            let targets = Array::from_slice(&targets, &[seq as i32]);
            cross_entropy(&gather_logits(logits, 0..seq, s)?, &targets, tensor, s)
        },
        s,
    )
    .map_err(err)?;
    let (grads, norm) = clip_grad_norm_stages(&grads, 1.0, &p.link, s).map_err(err)?;
    let model = adam.update(model, &grads, s).map_err(err)?;
    let locals: Vec<Array> = model.parameters().into_iter().map(|p| p.local).collect();
    safemlx_dist::eval(&locals.iter().collect::<Vec<_>>()).map_err(err)?;
    // Every rank learns the last stage's loss (from its first
    // tensor-parallel rank; the others add zero).
    let loss = loss
        .filter(|_| p.link.tensor().rank() == 0)
        .unwrap_or_else(|| Array::from_f32(0.0));
    let loss = safemlx_dist::all_sum(&loss, p.link.world(), s).map_err(err)?;
    let loss = safemlx_dist_examples::values(&loss, s)?[0];
    Ok((model, loss, norm))
}
