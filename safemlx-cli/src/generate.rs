//! `safemlx generate`: one prompt, its text streamed by rank 0, and the
//! speed of prefill and decode.

use std::io::Write;

use safemlx_dist::generate::{generate, generate_stages, Sampler};
use safemlx_dist::init;

use crate::model_args::{cpu_stream, ModelArgs, SamplingArgs};

/// Generate text for one prompt.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt
    #[arg(long)]
    pub prompt: String,
    /// Send the prompt as it is, without the model's chat template
    #[arg(long)]
    pub raw: bool,
    /// Tokens to generate at most
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Prompt tokens per chunk of a pipelined prefill (with --mesh pp=P):
    /// the stages work on different chunks at once
    #[arg(long, default_value_t = 64, value_name = "C")]
    pub prefill_chunk: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// Runs `generate` on this rank.
///
/// # Errors
/// A bad option, the model's loading, or a fault of a peer.
pub fn run(args: GenerateArgs) -> Result<(), String> {
    let s = cpu_stream();
    let group = init(false, args.model.backend()?).map_err(|e| e.to_string())?;
    let mut sampler = Sampler::new(
        args.sampling.temperature,
        args.sampling.top_p,
        args.sampling.seed,
    )
    .map_err(|e| e.to_string())?;
    let placed = args.model.load(&group, &s)?;
    let loaded = &placed.loaded;
    let text = if args.raw {
        args.prompt.clone()
    } else {
        loaded
            .tokenizer
            .apply_chat_template(&[("user", &args.prompt)])
            .map_err(|e| format!("{e} (or give --raw)"))?
    };
    let prompt = loaded.tokenizer.encode(&text).map_err(|e| e.to_string())?;
    if prompt.is_empty() {
        return Err("the prompt has no tokens; give --prompt TEXT".to_owned());
    }
    let model = &loaded.model;
    let mut cache = model.new_cache();
    let mut pieces = loaded.tokenizer.stream();
    let mut stdout = std::io::stdout();
    let rank = group.rank();
    let eos = &model.config().eos_token_ids;
    let on_token = |token| {
        if rank == 0 {
            let piece = pieces.push(token)?;
            // One write per piece: under mpirun each write is one line.
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
        Ok(())
    };
    let generated = match &placed.link {
        // Pipeline stages: rank 0 (on the first stage) gets every token.
        Some(link) => generate_stages(
            model,
            link,
            &mut cache,
            &prompt,
            (args.max_tokens, args.prefill_chunk),
            &mut sampler,
            eos,
            on_token,
            &s,
        ),
        None => generate(
            model,
            &mut cache,
            &prompt,
            args.max_tokens,
            &mut sampler,
            eos,
            on_token,
            &s,
        ),
    }
    .map_err(|e| e.to_string())?;
    if rank == 0 {
        println!();
        eprintln!(
            "safemlx: prefill {} tokens at {:.1} tokens/s, decode {} tokens at {:.1} tokens/s on {} ranks{}",
            generated.prompt_tokens,
            generated.prefill_tokens_per_second(),
            generated.decode_steps,
            generated.decode_tokens_per_second(),
            group.size(),
            if generated.stopped_at_eos {
                " (stopped at EOS)"
            } else {
                ""
            }
        );
    }
    Ok(())
}
