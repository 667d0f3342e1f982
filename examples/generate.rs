//! Text generation with a Llama-family model split over N ranks.
//!
//! ```text
//! safemlx-launch -n N -- target/release/examples/generate [--model PATH]
//!     [--prompt TEXT] [--chat] [--max-tokens K] [--temperature T]
//!     [--top-p P] [--seed S] [--dequantize] [--experts parallel|tensor-parallel]
//!     [--check]
//! ```
//!
//! `--model` is a Hugging Face directory or a `.gguf` file; the default is
//! SmolLM2-135M-Instruct (Q4_1 GGUF) in the cache, which `cargo xtask demo`
//! fetches. Quantized weights (the GGUF's `Q4_1` and `Q8_0` blocks,
//! mlx-community directories) stay quantized; `--dequantize` loads them as
//! `float32` to compare. An MoE model's (Mixtral, Qwen2-MoE, Qwen3-MoE)
//! experts are split across ranks (`--experts parallel`, the default) or
//! every expert sliced across them (`--experts tensor-parallel`). Rank 0 streams the text; every rank prints the
//! bytes it read, the bytes its weights (quantized or not) and KV cache
//! hold, and the prefill and decode tokens/s. `--check` also runs the same model in one process (a child of
//! rank 0 without peers), compares the prompt's logits (maximum relative
//! error, at most 1e-4) and checks that the greedy tokens agree.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use safemlx::Array;
use safemlx_dist::checkpoint::{save, SafetensorsFile};
use safemlx_dist::generate::{generate, Generated, Sampler};
use safemlx_dist::models::{load_with, LoadOptions, Loaded, Storage};
use safemlx_dist::nn::gather_logits;
use safemlx_dist::nn::ExpertPlacement;
use safemlx_dist::{all_sum, init, Backend, Group};
use safemlx_dist_examples::{compare, cpu_stream, values};

const DEFAULT_PROMPT: &str = "What is the capital of France? Answer in one sentence.";
/// Set in the single-process reference run of `--check`: where it writes.
const REFERENCE_ENV: &str = "SAFEMLX_GENERATE_REFERENCE_OUT";

fn main() -> ExitCode {
    safemlx_dist_examples::exit("generate", run())
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Text generation with a Llama-family model split over the ranks of its
/// launch: `safemlx-launch -n N -- generate [OPTIONS]`.
#[derive(clap::Parser)]
#[command(name = "generate", version)]
struct Args {
    /// A Hugging Face model directory or a .gguf file [default:
    /// SmolLM2-135M-Instruct (Q4_1 GGUF) in the cache, which `cargo xtask
    /// demo` fetches]
    #[arg(long, value_name = "DIR|FILE.gguf")]
    model: Option<PathBuf>,
    /// The prompt
    #[arg(long, default_value = DEFAULT_PROMPT)]
    prompt: String,
    /// Render the prompt with the model's chat template
    #[arg(long)]
    chat: bool,
    /// Tokens to generate at most
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Sampling temperature (0: greedy)
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling: the smallest set of tokens whose probability reaches P
    #[arg(long, default_value_t = 1.0, value_name = "P")]
    top_p: f32,
    /// The sampler's seed
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Load quantized weights as float32, to compare
    #[arg(long)]
    dequantize: bool,
    /// Where an MoE model's experts go
    #[arg(long, value_enum, default_value_t = Experts::Parallel)]
    experts: Experts,
    /// Also run the model in one process and compare the prompt's logits
    /// and the greedy tokens
    #[arg(long)]
    check: bool,
    /// MLX's distributed backend
    #[arg(long, env = "SAFEMLX_DIST_BACKEND", default_value = "ring")]
    backend: String,
}

/// `--experts`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Experts {
    /// Experts split across ranks (all_to_all_v)
    Parallel,
    /// Every expert sliced across ranks (all_sum)
    TensorParallel,
}

struct Options {
    model: PathBuf,
    prompt: String,
    chat: bool,
    max_tokens: usize,
    temperature: f32,
    top_p: f32,
    seed: u64,
    load: LoadOptions,
    check: bool,
    backend: Backend,
}

fn options() -> Result<Options, String> {
    let args = <Args as clap::Parser>::parse();
    let model = args
        .model
        .unwrap_or_else(safemlx_dist::models::default_model_path);
    if !model.exists() {
        return Err(format!(
            "model {} does not exist; give --model DIR|FILE.gguf, or run `cargo xtask demo`, which fetches {} into the cache",
            model.display(),
            safemlx_dist::models::DEFAULT_MODEL
        ));
    }
    Ok(Options {
        model,
        prompt: args.prompt,
        chat: args.chat,
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
        load: LoadOptions {
            weights: if args.dequantize {
                Storage::Dequantized
            } else {
                Storage::AsStored
            },
            experts: match args.experts {
                Experts::Parallel => ExpertPlacement::ExpertParallel,
                Experts::TensorParallel => ExpertPlacement::ExpertTensorParallel,
            },
        },
        check: args.check,
        backend: args.backend.parse().map_err(err)?,
    })
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// The prompt's token ids: the chat template's rendering with `--chat`.
fn prompt_tokens(loaded: &Loaded, o: &Options) -> Result<Vec<u32>, String> {
    let text = if o.chat {
        loaded
            .tokenizer
            .apply_chat_template(&[("user", &o.prompt)])
            .map_err(err)?
    } else {
        o.prompt.clone()
    };
    let tokens = loaded.tokenizer.encode(&text).map_err(err)?;
    if tokens.is_empty() {
        return Err("the prompt has no tokens; give --prompt TEXT".to_owned());
    }
    Ok(tokens)
}

fn run() -> Result<(), String> {
    let o = options()?;
    let s = cpu_stream();
    let reference = std::env::var_os(REFERENCE_ENV).map(PathBuf::from);
    // Non-strict: without peers (run directly, or the reference) one rank.
    let backend = if reference.is_some() {
        Backend::Ring
    } else {
        o.backend
    };
    let group = init(false, backend).map_err(err)?;
    let (rank, n) = (group.rank(), group.size());
    let started = Instant::now();
    let loaded = load_with(&group, &o.model, o.load, &s).map_err(err)?;
    let load_seconds = started.elapsed().as_secs_f64();
    let prompt = prompt_tokens(&loaded, &o)?;
    let model = &loaded.model;
    let eos = &model.config().eos_token_ids;

    if let Some(out) = reference {
        return write_reference(&loaded, &prompt, o.max_tokens, eos, &out);
    }
    if rank == 0 {
        println!(
            "{}: {} layers, {} query / {} KV heads, vocabulary {}; {} ranks, prompt {} tokens",
            o.model.display(),
            model.config().layers,
            model.config().heads,
            model.config().kv_heads,
            model.config().vocab_size,
            n,
            prompt.len()
        );
    }
    let mut sampler = Sampler::new(o.temperature, o.top_p, o.seed).map_err(err)?;
    let mut cache = model.new_cache();
    let mut text = loaded.tokenizer.stream();
    let mut stdout = std::io::stdout();
    let generated = generate(
        model,
        &mut cache,
        &prompt,
        o.max_tokens,
        &mut sampler,
        eos,
        |token| {
            if rank == 0 {
                let piece = text.push(token)?;
                // One write per piece: under mpirun each write is one tagged chunk.
                let _ = stdout.write_all(piece.as_bytes());
                let _ = stdout.flush();
            }
            Ok(())
        },
        &s,
    )
    .map_err(err)?;
    if rank == 0 {
        println!();
    }
    report(&loaded, &generated, &cache, (rank, n), load_seconds);
    if o.check {
        check(&group, &loaded, &o, &prompt, &generated)?;
    }
    Ok(())
}

fn report(
    loaded: &Loaded,
    g: &Generated,
    cache: &safemlx_dist::nn::KvCache,
    (rank, n): (usize, usize),
    load_seconds: f64,
) {
    let heads = loaded
        .model
        .head_split()
        .map(|h| {
            format!(
                "query heads {}..{}, KV heads {}..{}",
                h.query.0,
                h.query.0 + h.query.1,
                h.kv.0,
                h.kv.0 + h.kv.1
            )
        })
        .unwrap_or_default();
    let model = &loaded.model;
    let (per_token, per_head) = (
        model.cache_bytes_per_token(),
        model.per_head_cache_bytes_per_token(),
    );
    let latent = if per_token == per_head {
        String::new()
    } else {
        format!(" (latent: {per_token} bytes per token; per-head keys and values would take {per_head})")
    };
    println!(
        "rank {rank}/{n}: {heads}; read {} of weights in {load_seconds:.2} s, holds {} ({}), KV cache {}{latent}",
        mib(loaded.weights.bytes_read()),
        mib(model.weight_bytes() as u64),
        if model.is_quantized() {
            "quantized"
        } else {
            "float"
        },
        mib(cache.nbytes() as u64),
    );
    if rank == 0 {
        println!(
            "rank 0/{n}: prefill {} tokens at {:.1} tokens/s, decode {} tokens at {:.1} tokens/s{}",
            g.prompt_tokens,
            g.prefill_tokens_per_second(),
            g.decode_steps,
            g.decode_tokens_per_second(),
            if g.stopped_at_eos {
                " (stopped at EOS)"
            } else {
                ""
            }
        );
    }
}

/// The reference run: the prompt's logits and greedy tokens of the whole
/// model in this one process, written to `out`.
fn write_reference(
    loaded: &Loaded,
    prompt: &[u32],
    max_tokens: usize,
    eos: &[u32],
    out: &Path,
) -> Result<(), String> {
    let s = cpu_stream();
    let mut cache = loaded.model.new_cache();
    let logits = loaded.model.forward(prompt, &mut cache, &s).map_err(err)?;
    let full = gather_logits(&logits, 0..prompt.len(), &s).map_err(err)?;
    let mut cache = loaded.model.new_cache();
    let greedy = generate(
        &loaded.model,
        &mut cache,
        prompt,
        max_tokens,
        &mut Sampler::greedy(),
        eos,
        |_| Ok(()),
        &s,
    )
    .map_err(err)?;
    let tokens: Vec<i32> = greedy.tokens.iter().map(|&t| t as i32).collect();
    let count = i32::try_from(tokens.len()).map_err(err)?;
    save(
        out,
        &[
            ("logits", full.into_local()),
            ("tokens", Array::from_slice(&tokens, &[count])),
        ],
        &s,
    )
    .map_err(err)
}

/// `--check`: rank 0 runs the reference in a child process with no peers,
/// then compares; every rank waits on it (an `all_sum` as a barrier) and
/// computes the same distributed logits and greedy tokens.
fn check(
    group: &Group,
    loaded: &Loaded,
    o: &Options,
    prompt: &[u32],
    generated: &Generated,
) -> Result<(), String> {
    let s = cpu_stream();
    let rank = group.rank();
    let mut cache = loaded.model.new_cache();
    let logits = loaded.model.forward(prompt, &mut cache, &s).map_err(err)?;
    let full = gather_logits(&logits, 0..prompt.len(), &s).map_err(err)?;
    safemlx_dist::eval(&[full.local()]).map_err(err)?;
    let mut cache = loaded.model.new_cache();
    let greedy = if o.temperature == 0.0 {
        generated.tokens.clone()
    } else {
        generate(
            &loaded.model,
            &mut cache,
            prompt,
            o.max_tokens,
            &mut Sampler::greedy(),
            &loaded.model.config().eos_token_ids,
            |_| Ok(()),
            &s,
        )
        .map_err(err)?
        .tokens
    };
    let mut outcome = Ok(());
    if rank == 0 {
        outcome = compare_with_reference(full.local(), &greedy, group.size());
    }
    // Every rank learns whether rank 0's check passed.
    let failed = f32::from(u8::from(outcome.is_err()));
    let any = all_sum(&Array::from_slice(&[failed], &[1]), group, &s).map_err(err)?;
    safemlx_dist::eval(&[&any]).map_err(err)?;
    let any = any
        .into_evaluated()
        .map_err(err)?
        .try_to_vec::<f32>()
        .map_err(err)?;
    if rank != 0 && any.first().is_some_and(|v| *v > 0.0) {
        return Err("the check failed on rank 0".to_owned());
    }
    outcome
}

fn compare_with_reference(logits: &Array, greedy: &[u32], n: usize) -> Result<(), String> {
    let s = cpu_stream();
    let out = std::env::temp_dir().join(format!(
        "safemlx-generate-reference-{}.safetensors",
        std::process::id()
    ));
    let exe = std::env::current_exe().map_err(err)?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut child = std::process::Command::new(exe);
    child
        .args(&args)
        .env(REFERENCE_ENV, &out)
        .env("SAFEMLX_DIST_BACKEND", "ring");
    for var in ["MLX_RANK", "MLX_HOSTFILE", "MLX_WORLD_SIZE"] {
        child.env_remove(var);
    }
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("OMPI_") || key.to_string_lossy().starts_with("PMIX_")
        {
            child.env_remove(key);
        }
    }
    let started = Instant::now();
    let status = child
        .status()
        .map_err(|e| format!("cannot start the single-process reference: {e}"))?;
    if !status.success() {
        return Err(format!("the single-process reference failed ({status})"));
    }
    let reference = SafetensorsFile::open(&out).map_err(err)?;
    let want = reference.read("logits", &s).map_err(err)?;
    let want_tokens = reference.read("tokens", &s).map_err(err)?;
    std::fs::remove_file(&out).ok();
    let read = |a: &Array| values(a, &s);
    let (g, w) = (read(logits)?, read(&want)?);
    let (max_abs, rel) = compare(&g, &w)?;
    let want_tokens: Vec<u32> = read(&want_tokens)?.into_iter().map(|t| t as u32).collect();
    let agree = want_tokens == greedy;
    println!(
        "rank 0/{n}: --check against one process ({:.1} s): prompt logits max abs error {max_abs:.3e}, max relative error {rel:.3e}; greedy tokens {} ({} tokens)",
        started.elapsed().as_secs_f64(),
        if agree { "agree" } else { "DIFFER" },
        greedy.len()
    );
    if rel > 1e-4 {
        return Err(format!("relative error {rel:.3e} is above 1e-4"));
    }
    if !agree {
        return Err(format!(
            "greedy tokens differ: {greedy:?} here, {want_tokens:?} in one process"
        ));
    }
    Ok(())
}
