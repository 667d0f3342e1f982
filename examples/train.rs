//! Trains a tiny Llama-family model, tensor parallel, on a corpus the
//! program writes itself (byte-level: one token per byte).
//!
//! ```text
//! safemlx-launch -n N -- target/release/examples/train [--out DIR] [--steps K (200)]
//!     [--lr LR] [--seq T] [--resume] [--data-parallel R]
//!     [--mesh pp=P] [--micro-batches M (4)] [--tensor-split W1:W2:..]
//!     [--width D (64)] [--hidden H (128)] [--layers L (2)] [--bench FILE]
//! ```
//!
//! Rank 0 writes the model once (`DIR/model`: a Hugging Face directory of
//! random weights, 8 query heads over 4 KV heads; with more ranks than
//! KV heads, a KV head is shared by several ranks), then every rank loads
//! its part, and each step takes the
//! cross-entropy of the next byte over a window of the corpus, its gradient
//! (`grad::value_and_grad_of`), clips it to norm 1 and takes an AdamW step.
//! With `--data-parallel R` (MPI: MLX's ring cannot split a group) the `N`
//! ranks are `R` replicas of the model split over `N / R` ranks each; each
//! replica takes its own window per step and the gradients are averaged
//! over the replicas (`grad::average_gradients`).
//! With `--mesh pp=P[,tp=T]` (`-n P*T`) the layers are split into P
//! pipeline stages of T tensor-parallel ranks each and each step takes M windows as GPipe micro-batches
//! through them (`train/pipeline.rs`); `--mesh pp=1` on one rank is the
//! same schedule in one process, the dense reference of its loss curve.
//! `--tensor-split 5:3` gives the tensor-parallel ranks (of each stage)
//! attention heads and hidden columns in proportion to the weights.
//! Rank 0 shows a progress bar and prints the loss and tokens/s; at the end
//! each rank saves its parameters and AdamW state
//! (`DIR/checkpoint-N/rank-R.safetensors`, resumed with `--resume`), rank 0
//! writes the loss curve to `DIR/loss-N.json` (`DIR/loss-N-dpR.json` with
//! replicas) and draws every curve in `DIR` to `DIR/loss.png`. With
//! `--bench FILE` it appends a JSON line instead: tokens/s over the steps
//! after the first two, and the share of a step spent in collectives
//! (measured on two more steps, each collective timed).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use safemlx::{Array, Stream};
use safemlx_dist::checkpoint::{save, HfDirectory, SafetensorsFile, Weights};
use safemlx_dist::grad::{average_gradients, value_and_grad_of, Parameters};
use safemlx_dist::models::{parse_weights, Llama, LlamaConfig};
use safemlx_dist::nn::gather_logits;
use safemlx_dist::optim::{clip_grad_norm, AdamW};
use safemlx_dist::{CollectiveProfile, Group, Replicated, ShardedArray};
use safemlx_dist_examples::train_model::{corpus, write_model, Size, HEADS};
use safemlx_dist_examples::{backend_from_args, cpu_stream, flag, median};

#[path = "train/pipeline.rs"]
mod pipeline;

fn main() -> ExitCode {
    safemlx_dist_examples::exit("train", run())
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The mean cross-entropy of `targets` under the full logits `[T, V]`.
fn cross_entropy(
    logits: &ShardedArray<Replicated>,
    targets: &Array,
    group: &Group,
    s: &Stream,
) -> safemlx_dist::Result<ShardedArray<Replicated>> {
    let l = logits.local();
    let t = l.shape()[0];
    let lse = safemlx::ops::logsumexp_axis(l, -1, false, s)?;
    let picked = l
        .take_along_axis(&targets.reshape(&[t, 1], s)?, -1, s)?
        .reshape(&[t], s)?;
    let mean = lse.subtract(&picked, s)?.mean(None, s)?;
    ShardedArray::from_local(mean, group, &[])
}

struct Saved {
    steps: i32,
    losses: Vec<f32>,
}

/// `DIR/checkpoint-N[-dpR|-pp]/rank-K.safetensors`.
fn checkpoint_path(out: &Path, group: &Group, run: &str) -> PathBuf {
    out.join(format!("checkpoint-{}{run}", group.size()))
        .join(format!("rank-{}.safetensors", group.rank()))
}

/// This rank's parameters, AdamW moments and the losses so far.
fn save_checkpoint(
    path: &Path,
    model: &Llama,
    adam: &AdamW,
    losses: &[f32],
    s: &Stream,
) -> Result<(), String> {
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new("."))).map_err(err)?;
    let mut tensors: Vec<(String, Array)> = Vec::new();
    for (i, (p, (m, v))) in model.parameters().iter().zip(adam.moments()).enumerate() {
        tensors.push((format!("param.{i}"), p.local.clone()));
        tensors.push((format!("adam_m.{i}"), m.clone()));
        tensors.push((format!("adam_v.{i}"), v.clone()));
    }
    tensors.push(("steps".into(), Array::from_slice(&[adam.steps()], &[1])));
    tensors.push((
        "losses".into(),
        Array::from_slice(losses, &[losses.len() as i32]),
    ));
    save(path, &tensors, s).map_err(err)
}

fn resume(
    path: &Path,
    model: &Llama,
    adam: &mut AdamW,
    s: &Stream,
) -> Result<(Llama, Saved), String> {
    let file = SafetensorsFile::open(path).map_err(|e| {
        format!("--resume: cannot open this rank's checkpoint {}: {e}; run without --resume first, at the same rank count", path.display())
    })?;
    let count = model.parameters().len();
    let read = |name: String| file.read(&name, s).map_err(err);
    let params = (0..count)
        .map(|i| read(format!("param.{i}")))
        .collect::<Result<Vec<_>, _>>()?;
    let moments = (0..count)
        .map(|i| Ok((read(format!("adam_m.{i}"))?, read(format!("adam_v.{i}"))?)))
        .collect::<Result<Vec<_>, String>>()?;
    let steps = safemlx_dist_examples::values(&read("steps".into())?, s)?;
    let losses = safemlx_dist_examples::values(&read("losses".into())?, s)?;
    let steps = steps.first().copied().unwrap_or(0.0) as i32;
    adam.restore(steps, moments);
    Ok((
        model.with_parameters(&params).map_err(err)?,
        Saved { steps, losses },
    ))
}

/// The weights of `dir` over the tensor-parallel group `tp`, heads and
/// hidden columns in proportion to `shares` (`--tensor-split`) if given.
fn tensor_weights<'a>(
    dir: &'a HfDirectory,
    tp: &Group,
    shares: Option<&[u32]>,
) -> Result<Weights<'a>, String> {
    let w = Weights::new(dir, tp);
    match shares {
        Some(shares) => w.with_shares(shares).map_err(err),
        None => Ok(w),
    }
}

/// The groups of a run: the tensor-parallel group the model is split
/// over, and the data-parallel group of the ranks holding the same part
/// (this rank alone without replicas).
struct Groups {
    world: Group,
    tp: Group,
    dp: Option<Group>,
    replica: usize,
    replicas: usize,
}

fn groups(world: Group, replicas: usize) -> Result<Groups, String> {
    let n = world.size();
    if replicas == 0 || n % replicas != 0 {
        return Err(format!(
            "--data-parallel {replicas}: the {n} ranks must split into that many equal replicas"
        ));
    }
    if replicas == 1 {
        return Ok(Groups {
            tp: world.clone(),
            world,
            dp: None,
            replica: 0,
            replicas,
        });
    }
    let per = n / replicas;
    let rank = world.rank();
    let key = Some(rank as i32);
    let split = |color: usize| {
        world
            .split(color as i32, key)
            .map_err(|e| format!("--data-parallel needs a backend that splits groups (MPI): {e}"))
    };
    let tp = split(rank / per)?;
    let dp = split(rank % per)?;
    Ok(Groups {
        world,
        tp,
        dp: Some(dp),
        replica: rank / per,
        replicas,
    })
}

fn run() -> Result<(), String> {
    safemlx_dist_examples::command_line("train", "Trains a tiny Llama-family model tensor parallel (and data parallel on MPI) on a generated corpus", &[safemlx_dist_examples::BACKEND, ("--steps", Some("N"), "Training steps"), ("--lr", Some("LR"), "Learning rate"), ("--seq", Some("T"), "Sequence length"), ("--width", Some("D"), "Model width"), ("--hidden", Some("H"), "MLP width"), ("--layers", Some("L"), "Layers"), ("--data-parallel", Some("R"), "Replicas (MPI)"), ("--mesh", Some("pp=P[,tp=T]"), "Pipeline stages of T ranks each"), ("--micro-batches", Some("M"), "Windows per step through the pipeline (4)"), ("--tensor-split", Some("W1:W2:.."), "Heads and hidden columns per tensor-parallel rank in proportion to these weights"), ("--out", Some("DIR"), "Where checkpoints, losses and loss.png go"), ("--resume", None, "Resume from the checkpoints in --out"), ("--bench", Some("FILE"), "Write tokens/s and the collective share to FILE")]);
    let s = cpu_stream();
    let backend = backend_from_args()?;
    let world = safemlx_dist::init(false, backend).map_err(err)?;
    let number = |name: &str, default: &str| -> Result<f64, String> {
        let v = flag(name).unwrap_or_else(|| default.to_owned());
        v.parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| format!("{name} takes a positive number, got {v:?}"))
    };
    let out = PathBuf::from(flag("--out").unwrap_or_else(|| "target/train".to_owned()));
    let steps = number("--steps", "200")? as usize;
    let lr = number("--lr", "0.003")? as f32;
    let seq = number("--seq", "64")? as usize;
    let size = Size {
        dim: number("--width", "64")? as i32,
        hidden: number("--hidden", "128")? as i32,
        layers: number("--layers", "2")? as i32,
    };
    if size.dim % HEADS != 0 {
        return Err(format!(
            "--width {} must be a multiple of the {HEADS} heads",
            size.dim
        ));
    }
    let replicas = number("--data-parallel", "1")? as usize;
    let bench = flag("--bench");
    let resuming = std::env::args().any(|a| a == "--resume");
    let Groups {
        world,
        tp,
        dp,
        replica,
        replicas,
    } = groups(world, replicas)?;
    let micro_batches = number("--micro-batches", "4")? as usize;
    let pipe = pipeline::setup(&world, flag("--mesh").as_deref(), micro_batches, replicas)?;
    let model_dir = out.join("model");
    write_model(&model_dir, size, &world, &s)?;
    let dir = HfDirectory::open(&model_dir).map_err(err)?;
    let shares = flag("--tensor-split")
        .map(|text| parse_weights("--tensor-split", &text))
        .transpose()
        .map_err(err)?;
    let mut model = match &pipe {
        Some(p) => pipeline::load(p, &dir, shares.as_deref(), &s)?,
        None => {
            let w = tensor_weights(&dir, &tp, shares.as_deref())?;
            let path = dir.path().display().to_string();
            let config = LlamaConfig::from_hf(dir.config(), &path).map_err(err)?;
            Llama::load(&w, config, &s).map_err(err)?
        }
    };
    let c = model.config();
    let held = (
        c.hidden_size as i32,
        c.intermediate_size as i32,
        c.layers as i32,
    );
    if held != (size.dim, size.hidden, size.layers) {
        return Err(format!(
            "{} holds a model of width {}, MLP {} and {} layers; pass those sizes or another --out",
            model_dir.display(),
            held.0,
            held.1,
            held.2
        ));
    }
    let mut adam = AdamW::new(lr);
    let run = match (&pipe, replicas) {
        (Some(_), _) => "-pp".to_owned(),
        (None, 1) => String::new(),
        (None, r) => format!("-dp{r}"),
    };
    let path = checkpoint_path(&out, &world, &run);
    let mut losses = Vec::new();
    if resuming {
        let (resumed, saved) = resume(&path, &model, &mut adam, &s)?;
        model = resumed;
        losses = saved.losses;
        if world.rank() == 0 {
            println!(
                "rank 0: resumed after step {} from {}",
                saved.steps,
                path.display()
            );
        }
    }
    let text = corpus();
    let windows = (text.len() - seq - 1) / seq;
    let rank0 = world.rank() == 0;
    let bar = if rank0 && bench.is_none() {
        let bar = ProgressBar::new(steps as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}").map_err(err)?,
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    // Benchmark: two warm-up steps, the timed ones, two profiled ones.
    let profiled = if bench.is_some() { 2 } else { 0 };
    let mut times = Vec::new();
    let mut collective = Vec::new();
    let tokens_per_step = seq * pipe.as_ref().map_or(replicas, |p| p.micro_batches);
    let started = Instant::now();
    let first = losses.len();
    for step in first..first + steps + profiled {
        let profile = (step >= first + steps).then(CollectiveProfile::start);
        let timer = Instant::now();
        let (loss, norm) = if let Some(p) = &pipe {
            let window = (text.as_slice(), seq, step * p.micro_batches, windows);
            let (next, loss, norm) = pipeline::step(p, (&model, &mut adam), window, &s)?;
            model = next;
            (Array::from_f32(loss), norm)
        } else {
            // Each replica its own window.
            let at = ((step * replicas + replica) % windows) * seq;
            let tokens: Vec<u32> = text[at..at + seq].iter().map(|&b| u32::from(b)).collect();
            let targets: Vec<i32> = text[at + 1..at + seq + 1]
                .iter()
                .map(|&b| i32::from(b))
                .collect();
            let targets = Array::from_slice(&targets, &[seq as i32]);
            let (loss, grads) = value_and_grad_of(&model, |m| {
                let logits = m.forward(&tokens, &mut m.new_cache(), &s)?;
                cross_entropy(&gather_logits(&logits, 0..seq, &s)?, &targets, &tp, &s)
            })
            .map_err(err)?;
            let (grads, loss) = match &dp {
                Some(dp) => (
                    average_gradients(&grads, dp, 4 << 20, &s).map_err(err)?,
                    safemlx_dist::all_sum(&loss, dp, &s)
                        .map_err(err)?
                        .divide(Array::from_f32(replicas as f32), &s)
                        .map_err(err)?,
                ),
                None => (grads, loss),
            };
            let (grads, norm) = clip_grad_norm(&grads, 1.0, &tp, &s).map_err(err)?;
            model = adam.update(&model, &grads, &s).map_err(err)?;
            let locals: Vec<Array> = model.parameters().into_iter().map(|p| p.local).collect();
            safemlx_dist::eval(&locals.iter().chain([&loss]).collect::<Vec<_>>()).map_err(err)?;
            (loss, norm)
        };
        let seconds = timer.elapsed().as_secs_f64();
        if let Some(profile) = profile {
            collective.push(profile.stop().seconds / seconds);
            continue;
        }
        if step >= first + 2 {
            times.push(seconds);
        }
        let loss = safemlx_dist_examples::values(&loss, &s)?[0];
        losses.push(loss);
        let rate = tokens_per_step as f64 / seconds;
        bar.set_message(format!(
            "loss {loss:.4}  grad norm {norm:.3}  {rate:.0} tokens/s"
        ));
        bar.inc(1);
        if rank0 && (step + 1) % 20 == 0 {
            let line = format!("step {:>4}  loss {loss:.4}  {rate:.0} tokens/s", step + 1);
            // Not a terminal (a launcher, a log): the bar is not drawn.
            if bar.is_hidden() {
                println!("{line}");
            } else {
                bar.println(line);
            }
        }
    }
    bar.finish();
    let seconds = started.elapsed().as_secs_f64();
    let layout = if let Some(p) = &pipe {
        format!(
            "ranks: {} (pipeline stages, {} micro-batches)",
            world.size(),
            p.micro_batches
        )
    } else if replicas > 1 {
        format!(
            "ranks: {} ({replicas} replicas of {})",
            world.size(),
            tp.size()
        )
    } else {
        format!("ranks: {}", world.size())
    };
    if let Some(file) = bench {
        if rank0 {
            let step = median(times);
            let share = median(collective);
            let (stages, tensor, micro) = match &pipe {
                Some(p) => (p.link.stages(), p.link.tensor().size(), p.micro_batches),
                None => (1, tp.size(), 1),
            };
            let line = serde_json::json!({
                "bench": "train",
                "impl": "safemlx-dist",
                "backend": format!("{backend:?}").to_lowercase(),
                "ranks": world.size(),
                "mesh": format!("pp={stages},tp={tensor}"),
                "tensor_parallel": tensor,
                "data_parallel": replicas,
                "micro_batches": micro,
                "threads": 1,
                "width": size.dim,
                "hidden": size.hidden,
                "layers": size.layers,
                "seq": seq,
                "step_ms": step * 1e3,
                "tokens_per_s": tokens_per_step as f64 / step,
                "collective_share": share,
                "first_losses": losses.iter().take(3).collect::<Vec<_>>(),
            });
            println!(
                "{layout}: {:.1} ms per step of {tokens_per_step} tokens, {:.0} tokens/s, {:.1}% in collectives",
                step * 1e3,
                tokens_per_step as f64 / step,
                share * 100.0
            );
            safemlx_dist_examples::append_lines(&file, &[line])?;
        }
        return Ok(());
    }
    save_checkpoint(&path, &model, &adam, &losses, &s)?;
    if rank0 {
        println!(
            "{layout}, {steps} steps of {tokens_per_step} tokens in {seconds:.1} s ({:.0} tokens/s); loss {:.4} -> {:.4}",
            (steps * tokens_per_step) as f64 / seconds,
            losses.first().copied().unwrap_or(0.0),
            losses.last().copied().unwrap_or(0.0),
        );
        println!(
            "rank 0: saved each rank's checkpoint under {}",
            path.parent().unwrap_or(&out).display()
        );
        let name = format!("loss-{}{run}.json", world.size());
        let curve = out.join(name);
        std::fs::write(&curve, serde_json::to_string(&losses).map_err(err)?).map_err(err)?;
        let png = safemlx_dist_examples::loss_plot::plot(&out)?;
        println!(
            "rank 0: loss curve in {} (every loss-*.json in {})",
            png.display(),
            out.display()
        );
    }
    Ok(())
}
