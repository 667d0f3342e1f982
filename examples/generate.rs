//! Text generation with a Llama-family model split over N ranks.
//!
//! ```text
//! safemlx-launch -n N -- target/release/examples/generate [--model PATH]
//!     [--prompt TEXT] [--chat] [--max-tokens K] [--temperature T]
//!     [--top-p P] [--seed S] [--dequantize] [--experts parallel|tensor-parallel]
//!     [--mesh pp=P[,tp=T]] [--split W1:W2:..] [--tensor-split W1:W2:..|memory]
//!     [--prefill-chunk C] [--check]
//! ```
//!
//! `--model` is a Hugging Face directory or a `.gguf` file; the default is
//! SmolLM2-135M-Instruct (Q4_1 GGUF) in the cache, which `cargo xtask demo`
//! fetches. Quantized weights (the GGUF's `Q4_1` and `Q8_0` blocks,
//! mlx-community directories) stay quantized; `--dequantize` loads them as
//! `float32` to compare. An MoE model's (Mixtral, Qwen2-MoE, Qwen3-MoE)
//! experts are split across ranks (`--experts parallel`, the default) or
//! every expert sliced across them (`--experts tensor-parallel`).
//! `--mesh pp=P[,tp=T]` splits the layers into P pipeline stages of T ranks
//! each (evenly, by `--split 3:1`, or by each rank's free memory with `--split
//! memory`), the prompt prefilled in chunks of
//! `--prefill-chunk` tokens; without it every rank holds a slice of every
//! layer (tensor parallel). `--tensor-split 3:1` gives the tensor-parallel
//! ranks (of each stage) attention heads, hidden columns and experts (or,
//! with every expert sliced, their hidden columns) in proportion to the
//! weights instead of evenly, `--tensor-split memory` to each rank's free
//! memory; the vocabulary stays even. Rank 0 streams the text; every rank
//! prints the bytes it read, the bytes its weights (quantized or not) and KV cache
//! hold, and the prefill and decode tokens/s. `--check` also runs the same model in one process (a child of
//! rank 0, or of a pipeline's last rank, without peers), compares the prompt's logits (maximum relative
//! error, at most 1e-4 for float32 logits) and checks that the greedy tokens agree
//! (`safemlx_dist::generate::check`; `safemlx generate --check` does the same).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use safemlx_dist::generate::{generate, generate_stages, Generated, Sampler};
use safemlx_dist::models::{
    load_layout, Layout, LoadOptions, Loaded, StageSplit, Storage, TensorSplit,
};
use safemlx_dist::nn::ExpertPlacement;
use safemlx_dist::typed::MeshSpec;
use safemlx_dist::{init, Backend};
use safemlx_dist_examples::cpu_stream;

use safemlx_dist::generate::check::{check, reference_out, write_reference, CheckedRun};

const DEFAULT_PROMPT: &str = "What is the capital of France? Answer in one sentence.";

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
    /// The mesh's axes: pipeline stages (pp) x tensor-parallel ranks per
    /// stage (tp) [default: tp=all ranks]
    #[arg(long, value_name = "pp=P,tp=T")]
    mesh: Option<MeshSpec>,
    /// Layers per pipeline stage in proportion to these weights, one per
    /// stage, or to each stage's free memory (`memory`; SAFEMLX_DIST_MEMORY
    /// overrides what a rank reports) [default: even]
    #[arg(long, value_name = "W1:W2:..|memory")]
    split: Option<StageSplit>,
    /// Attention heads, hidden columns and experts per tensor-parallel rank
    /// (of each stage) in proportion to these weights, one per rank, or to
    /// each rank's free memory (`memory`) [default: even]
    #[arg(long, value_name = "W1:W2:..|memory")]
    tensor_split: Option<TensorSplit>,
    /// Prompt tokens per chunk of a pipelined prefill
    #[arg(long, default_value_t = 64, value_name = "C")]
    prefill_chunk: usize,
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
    layout: Layout,
    prefill_chunk: usize,
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
            tensor_split: None,
        },
        layout: Layout {
            mesh: args.mesh.unwrap_or_default(),
            split: args.split,
            tensor_split: args.tensor_split,
        },
        prefill_chunk: args.prefill_chunk,
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
    let reference = reference_out();
    // Non-strict: without peers (run directly, or the reference) one rank.
    let backend = if reference.is_some() {
        Backend::Ring
    } else {
        o.backend
    };
    let group = init(false, backend).map_err(err)?;
    let (rank, n) = (group.rank(), group.size());
    // The reference is the whole model in one process, whatever the mesh.
    let layout = match reference {
        Some(_) => Layout::default(),
        None => o.layout.clone(),
    };
    let started = Instant::now();
    let placed = load_layout(&group, &o.model, o.load.clone(), &layout, &s).map_err(err)?;
    for note in &placed.notes {
        println!("{note}");
    }
    let (loaded, link, axes) = (placed.loaded, placed.link, placed.axes);
    let load_seconds = started.elapsed().as_secs_f64();
    let prompt = prompt_tokens(&loaded, &o)?;
    let model = &loaded.model;
    let eos = &model.config().eos_token_ids;

    if let Some(out) = reference {
        return write_reference(model, &prompt, o.max_tokens, &out, &s).map_err(err);
    }
    if rank == 0 {
        println!(
            "{}: {} layers, {} query / {} KV heads, vocabulary {}; {} ranks ({axes}), prompt {} tokens",
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
    let stream = |token| {
        if rank == 0 {
            let piece = text.push(token)?;
            // One write per piece: under mpirun each write is one tagged chunk.
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
        Ok(())
    };
    let limits = (o.max_tokens, o.prefill_chunk);
    let generated = match &link {
        Some(link) => generate_stages(
            model,
            link,
            &mut cache,
            &prompt,
            limits,
            &mut sampler,
            eos,
            stream,
            &s,
        ),
        None => generate(
            model,
            &mut cache,
            &prompt,
            o.max_tokens,
            &mut sampler,
            eos,
            stream,
            &s,
        ),
    }
    .map_err(err)?;
    if rank == 0 {
        println!();
    }
    report(&loaded, &generated, &cache, (rank, n), load_seconds);
    if o.check {
        let run = CheckedRun {
            prompt: &prompt,
            generated: &generated,
            max_tokens: o.max_tokens,
            prefill_chunk: o.prefill_chunk,
            sampled: o.temperature != 0.0,
        };
        if let Some(line) = check(&group, link.as_ref(), model, &run, &s).map_err(err)? {
            println!("{line}");
        }
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
        "rank {rank}/{n}: {}; read {} of weights in {load_seconds:.2} s, holds {} ({}), KV cache {}{latent}",
        model.holds(),
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
