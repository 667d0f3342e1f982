//! Layer benchmark: run as ranks (or alone with `--dense`) by
//! `cargo xtask bench layers`.
//!
//! Times one layer's forward (TP SwiGLU MLP, sharded attention or EP MoE)
//! and appends one JSON line from rank 0 to `--out`:
//! `{"layer", "backend", "ranks", "tokens", "d_model", "seconds_median",
//!   "tokens_per_s", ...}` plus the configuration, the thread setting and
//! the share of the step spent in collectives (measured in a second pass
//! under a [`CollectiveProfile`]). `--dense` runs the same math on one
//! process with plain MLX ops (the baseline).
//!
//! ```text
//! safemlx-launch -n 2 -- target/release/examples/bench_layers --layer mlp --out layers.jsonl
//! ```

use std::process::ExitCode;
use std::time::Instant;

use safemlx::{Array, Stream};
use safemlx_dist::nn::{ExpertMatmul, ExpertPlacement, Moe, MoeConfig};
use safemlx_dist::{all_max, all_sum, init, CollectiveProfile, Group, Ragged, ShardedArray};
use safemlx_dist_examples::layers::{ShardedAttention, SwiGluMlp};
use safemlx_dist_examples::{backend_from_args, cpu_stream, dense, flag, median, weights};

fn main() -> ExitCode {
    safemlx_dist_examples::exit("bench_layers", run())
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn number(name: &str, default: usize) -> Result<usize, String> {
    flag(name).map_or(Ok(default), |v| {
        v.parse()
            .map_err(|e| format!("{name} {v:?}: {e}; expected a whole number"))
    })
}

/// The layer's configuration (`--tokens`, `--d-model`, ...).
struct Config {
    layer: String,
    tokens: i32,
    d_model: i32,
    hidden: i32,
    heads: i32,
    experts: i32,
    top_k: usize,
    /// MoE: experts split (`parallel`) or sliced (`tensor-parallel`).
    placement: ExpertPlacement,
    /// MoE: grouped matmuls, one per local expert, or by device.
    matmul: ExpertMatmul,
    iters: usize,
}

impl Config {
    fn from_args() -> Result<Self, String> {
        let layer = flag("--layer").ok_or("--layer is required: mlp, attention or moe")?;
        if !matches!(layer.as_str(), "mlp" | "attention" | "moe") {
            return Err(format!(
                "unknown layer {layer:?}; expected mlp, attention or moe"
            ));
        }
        let int = |name, default| -> Result<i32, String> {
            i32::try_from(number(name, default)?).map_err(|_| format!("{name} is too large"))
        };
        Ok(Self {
            tokens: int("--tokens", 2048)?,
            d_model: int("--d-model", 1024)?,
            hidden: int("--hidden", 4096)?,
            heads: int("--heads", 16)?,
            experts: int("--experts", 8)?,
            top_k: number("--top-k", 2)?,
            placement: match flag("--placement").as_deref() {
                None | Some("parallel") => ExpertPlacement::ExpertParallel,
                Some("tensor-parallel") => ExpertPlacement::ExpertTensorParallel,
                Some(other) => {
                    return Err(format!(
                        "--placement takes parallel or tensor-parallel, got {other:?}"
                    ))
                }
            },
            matmul: match flag("--expert-matmul").as_deref() {
                None | Some("auto") => ExpertMatmul::Auto,
                Some("grouped") => ExpertMatmul::Grouped,
                Some("per-expert") => ExpertMatmul::PerExpert,
                Some(other) => {
                    return Err(format!(
                        "--expert-matmul takes auto, grouped or per-expert, got {other:?}"
                    ))
                }
            },
            iters: number("--iters", 5)?.max(1),
            layer,
        })
    }

    /// The configuration's fields of the JSON line.
    fn json(&self) -> String {
        let shape = match self.layer.as_str() {
            "mlp" => format!(r#""hidden":{}"#, self.hidden),
            "attention" => format!(r#""heads":{}"#, self.heads),
            _ => format!(
                r#""hidden":{},"experts":{},"top_k":{},"placement":"{}","expert_matmul":"{:?}""#,
                self.hidden,
                self.experts,
                self.top_k,
                self.placement.as_str(),
                self.matmul
            ),
        };
        format!(
            r#""layer":"{}","tokens":{},"d_model":{},{shape}"#,
            self.layer, self.tokens, self.d_model
        )
    }
}

/// The full weights and input of the layer, the same on every rank.
struct Inputs {
    x: Array,
    w: Vec<Array>,
}

impl Inputs {
    fn new(c: &Config) -> Self {
        let (d, h) = (c.d_model, c.hidden);
        let scale = 1.0 / (d as f32).sqrt();
        let w = match c.layer.as_str() {
            "mlp" => vec![
                weights(&[d, h], 1, scale),
                weights(&[d, h], 2, scale),
                weights(&[h, d], 3, 1.0 / (h as f32).sqrt()),
            ],
            "attention" => vec![weights(&[d, 3 * d], 1, scale), weights(&[d, d], 2, scale)],
            _ => vec![
                weights(&[d, c.experts], 1, 1.0),
                weights(&[c.experts, d, h], 2, scale),
                weights(&[c.experts, d, h], 5, scale),
                weights(&[c.experts, h, d], 3, 1.0 / (h as f32).sqrt()),
            ],
        };
        Self {
            x: weights(&[c.tokens, d], 4, 1.0),
            w,
        }
    }
}

/// One forward, evaluated.
type Step<'a> = Box<dyn FnMut() -> Result<(), String> + 'a>;

/// The sharded layer's forward on this rank.
fn sharded_step<'a>(
    c: &Config,
    inputs: &Inputs,
    group: &'a Group,
    s: &'a Stream,
) -> Result<Step<'a>, String> {
    let w = &inputs.w;
    Ok(match c.layer.as_str() {
        "mlp" => {
            let mlp = SwiGluMlp::from_full(group, w[0].clone(), w[1].clone(), w[2].clone(), s)
                .map_err(err)?;
            let x = ShardedArray::replicated(inputs.x.clone(), group);
            Box::new(move || {
                safemlx_dist::eval(&[mlp.forward(&x, s).map_err(err)?.local()]).map_err(err)?;
                Ok(())
            })
        }
        "attention" => {
            let attention =
                ShardedAttention::from_full(group, c.heads as usize, w[0].clone(), w[1].clone(), s)
                    .map_err(err)?;
            let x = ShardedArray::replicated(inputs.x.clone(), group);
            Box::new(move || {
                safemlx_dist::eval(&[attention.forward(&x, s).map_err(err)?.local()])
                    .map_err(err)?;
                Ok(())
            })
        }
        _ => {
            let mut config = MoeConfig::new(c.top_k).with_placement(c.placement);
            config = config.with_expert_matmul(c.matmul);
            let moe = Moe::from_full(
                group,
                config,
                w[0].clone(),
                w[1].clone(),
                w[2].clone(),
                w[3].clone(),
                s,
            )
            .map_err(err)?;
            if c.placement == ExpertPlacement::ExpertTensorParallel {
                // Every rank routes every token through its expert slices.
                let x = ShardedArray::replicated(inputs.x.clone(), group);
                return Ok(Box::new(move || {
                    safemlx_dist::eval(&[moe.forward(&x, s).map_err(err)?.tokens.local()])
                        .map_err(err)?;
                    Ok(())
                }));
            }
            // Expert parallel: each rank routes its chunk of the tokens.
            let n = group.size() as i32;
            if c.tokens % n != 0 {
                return Err(format!("--tokens {} must divide over {n} ranks", c.tokens));
            }
            let per_rank = c.tokens / n;
            let mine = inputs
                .x
                .split(n, 0, s)
                .map_err(err)?
                .swap_remove(group.rank());
            let x = ShardedArray::<Ragged>::from_local(mine, group, &[per_rank, c.d_model])
                .map_err(err)?;
            Box::new(move || {
                safemlx_dist::eval(&[moe.forward_rows(&x, s).map_err(err)?.tokens.local()])
                    .map_err(err)?;
                Ok(())
            })
        }
    })
}

/// The dense layer's forward on one process.
fn dense_step<'a>(c: &'a Config, inputs: &'a Inputs, s: &'a Stream) -> Step<'a> {
    let (x, w) = (&inputs.x, &inputs.w);
    Box::new(move || {
        let y = match c.layer.as_str() {
            "mlp" => dense::swiglu(x, &w[0], &w[1], &w[2], s)?,
            "attention" => dense::attention(x, &w[0], &w[1], c.heads, s)?,
            _ => dense::moe(x, &w[0], (&w[1], &w[2], &w[3]), c.top_k, s)?,
        };
        safemlx_dist::eval(&[&y]).map_err(err)?;
        Ok(())
    })
}

/// `value` combined over the ranks by `op` (`all_max`, `all_sum`); the
/// value itself without a group.
fn over_ranks(
    group: Option<&Group>,
    value: f64,
    op: fn(&Array, &Group, &Stream) -> safemlx_dist::Result<Array>,
    s: &Stream,
) -> Result<f64, String> {
    let Some(group) = group else {
        return Ok(value);
    };
    let combined = op(&Array::from_slice(&[value as f32], &[1]), group, s).map_err(err)?;
    safemlx_dist::eval(&[&combined]).map_err(err)?;
    let values = combined
        .evaluated()
        .map_err(err)?
        .try_to_vec::<f32>()
        .map_err(err)?;
    Ok(f64::from(values[0]))
}

/// Every rank waits here until all have arrived.
fn barrier(group: Option<&Group>, s: &Stream) -> Result<(), String> {
    over_ranks(group, 1.0, |a, g, s| all_sum(a, g, s), s).map(|_| ())
}

fn run() -> Result<(), String> {
    safemlx_dist_examples::command_line(
        "bench_layers",
        "A parallel layer's step time against its dense baseline, JSON lines",
        &[
            safemlx_dist_examples::BACKEND,
            ("--layer", Some("mlp|attention|moe"), "The layer"),
            ("--tokens", Some("T"), "Tokens"),
            ("--d-model", Some("D"), "Model width"),
            ("--hidden", Some("H"), "Hidden width"),
            ("--heads", Some("N"), "Attention heads"),
            ("--experts", Some("E"), "Experts"),
            ("--top-k", Some("K"), "Experts per token"),
            ("--placement", Some("P"), "Expert placement"),
            ("--expert-matmul", Some("M"), "Expert matmul"),
            ("--iters", Some("N"), "Timed iterations"),
            ("--threads", Some("N"), "BLAS threads"),
            ("--dense", None, "The dense baseline in one process"),
            ("--out", Some("FILE"), "Append the JSON lines to FILE"),
        ],
    );
    let c = Config::from_args()?;
    let dense_mode = std::env::args().any(|a| a == "--dense");
    let threads = flag("--threads").unwrap_or_else(|| "1".to_owned());
    let s = cpu_stream();
    let inputs = Inputs::new(&c);
    inputs.x.evaluated().map_err(err)?;
    let group = if dense_mode {
        None
    } else {
        Some(init(false, backend_from_args()?).map_err(err)?)
    };
    let (rank, n) = group.as_ref().map_or((0, 1), |g| (g.rank(), g.size()));
    let backend = if dense_mode {
        "dense".to_owned()
    } else {
        backend_from_args()?.to_string()
    };
    let mut step = match &group {
        Some(g) => sharded_step(&c, &inputs, g, &s)?,
        None => dense_step(&c, &inputs, &s),
    };

    // Plain steps: the layer as it runs.
    step()?;
    let mut times = Vec::with_capacity(c.iters);
    for i in 0..c.iters {
        barrier(group.as_ref(), &s)?;
        let started = Instant::now();
        step()?;
        // The step's time is the slowest rank's.
        let t = over_ranks(
            group.as_ref(),
            started.elapsed().as_secs_f64(),
            |a, g, s| all_max(a, g, s),
            &s,
        )?;
        if rank == 0 {
            eprintln!(
                "{} {backend} x{n}: step {}/{}: {:.1} ms",
                c.layer,
                i + 1,
                c.iters,
                t * 1e3
            );
        }
        times.push(t);
    }
    let seconds = median(times);

    // Profiled steps: the share of each step spent in collectives.
    let (mut collective, mut share) = (Vec::new(), Vec::new());
    if group.is_some() {
        for _ in 0..c.iters.div_ceil(2) {
            barrier(group.as_ref(), &s)?;
            let started = Instant::now();
            let profile = CollectiveProfile::start();
            step()?;
            let spent = profile.stop();
            let total = started.elapsed().as_secs_f64();
            collective.push(spent.seconds);
            share.push(spent.seconds / total);
        }
    }
    let (collective, share) = if collective.is_empty() {
        (0.0, 0.0)
    } else {
        (
            over_ranks(
                group.as_ref(),
                median(collective),
                |a, g, s| all_sum(a, g, s),
                &s,
            )? / n as f64,
            over_ranks(
                group.as_ref(),
                median(share),
                |a, g, s| all_sum(a, g, s),
                &s,
            )? / n as f64,
        )
    };
    if rank != 0 {
        return Ok(());
    }
    let tokens_per_s = f64::from(c.tokens) / seconds;
    let line = format!(
        r#"{{{},"backend":"{backend}","ranks":{n},"threads":"{threads}","iters":{},"seconds_median":{seconds:.6},"tokens_per_s":{tokens_per_s:.1},"collective_seconds_median":{collective:.6},"collective_share":{share:.4}}}"#,
        c.json(),
        c.iters
    );
    println!(
        "{} {backend} x{n} (threads {threads}): {:.1} ms per step, {tokens_per_s:.0} tokens/s, {:.1}% in collectives",
        c.layer,
        seconds * 1e3,
        share * 100.0
    );
    if let Some(path) = flag("--out") {
        safemlx_dist_examples::append_lines(&path, &[line])?;
    }
    Ok(())
}
