//! `safemlx generate`: one prompt, its text streamed by rank 0, and the
//! speed of prefill and decode.

use std::io::Write;

use safemlx_dist::generate::check::{check, reference_out, write_reference, CheckedRun};
use safemlx_dist::generate::{generate, generate_stages, Sampler};
use safemlx_dist::{init, Backend};

use crate::failure::Failure;
use crate::model_args::{cpu_stream, ModelArgs, SamplingArgs, Weights};

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
    /// Also run the whole model in one process (a child of the rank that
    /// holds the logits) and compare the prompt's logits (within a bound
    /// for their dtype, printed) and the greedy tokens; with `--weights
    /// auto` the weights are then float32 on both sides
    #[arg(long)]
    pub check: bool,
}

/// Runs `generate` on this rank.
///
/// # Errors
/// A bad option, the model's loading, or a fault of a peer.
pub fn run(mut args: GenerateArgs) -> Result<(), Failure> {
    let s = cpu_stream();
    if args.check && args.model.weights == Weights::Auto {
        // Both sides compute in float32, whatever memory each has.
        args.model.weights = Weights::Float;
    }
    if let Some(out) = reference_out() {
        return reference(args, &out);
    }
    let group = init(false, args.model.backend()?)?;
    let mut sampler = Sampler::new(
        args.sampling.temperature,
        args.sampling.top_p,
        args.sampling.seed,
    )
    .map_err(|e| e.to_string())?;
    let placed = args.model.load(&group, &s)?;
    let loaded = &placed.loaded;
    let prompt = prompt_tokens(&args, &loaded.tokenizer)?;
    let model = &loaded.model;
    if group.rank() == 0 {
        eprintln!("safemlx: prompt {} tokens", prompt.len());
    }
    let max_tokens = within_context(
        prompt.len(),
        args.max_tokens,
        model.config().max_position_embeddings,
    )?;
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
            (max_tokens, args.prefill_chunk),
            &mut sampler,
            eos,
            on_token,
            &s,
        ),
        None => generate(
            model,
            &mut cache,
            &prompt,
            max_tokens,
            &mut sampler,
            eos,
            on_token,
            &s,
        ),
    }
    .map_err(|e| e.to_string())?;
    if rank == 0 {
        println!();
    }
    if args.check {
        let run = CheckedRun {
            prompt: &prompt,
            generated: &generated,
            max_tokens,
            prefill_chunk: args.prefill_chunk,
            sampled: args.sampling.temperature != 0.0,
        };
        if let Some(line) = check(&group, placed.link.as_ref(), model, &run, &s)? {
            println!("{line}");
        }
    }
    if rank == 0 {
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

/// The prompt's tokens: `--prompt` through the chat template, or as it is
/// with `--raw`.
fn prompt_tokens(
    args: &GenerateArgs,
    tokenizer: &safemlx_dist::tokenizer::Tokenizer,
) -> Result<Vec<u32>, String> {
    let text = if args.raw {
        args.prompt.clone()
    } else {
        tokenizer
            .apply_chat_template(&[("user", &args.prompt)])
            .map_err(|e| format!("{e} (or give --raw)"))?
    };
    let prompt = tokenizer.encode(&text).map_err(|e| e.to_string())?;
    if prompt.is_empty() {
        return Err("the prompt has no tokens; give --prompt TEXT".to_owned());
    }
    Ok(prompt)
}

/// `--check`'s single-process reference (this program started again by the
/// comparing rank): the whole model, whatever the layout flags say,
/// written to `out`.
fn reference(mut args: GenerateArgs, out: &std::path::Path) -> Result<(), Failure> {
    let s = cpu_stream();
    let group = init(false, Backend::Ring)?;
    args.model.mesh = None;
    args.model.split = None;
    args.model.tensor_split = None;
    let placed = args.model.load(&group, &s)?;
    let model = &placed.loaded.model;
    let prompt = prompt_tokens(&args, &placed.loaded.tokenizer)?;
    let context = model.config().max_position_embeddings;
    let max_tokens = within_context(prompt.len(), args.max_tokens, context)?;
    write_reference(model, &prompt, max_tokens, out, &s)?;
    Ok(())
}

/// `max_tokens` cut so that the prompt and the generated tokens fit the
/// model's context (`context` 0: the file does not say).
///
/// # Errors
/// A prompt that fills the context by itself.
fn within_context(prompt: usize, max_tokens: usize, context: usize) -> Result<usize, String> {
    if context == 0 {
        return Ok(max_tokens);
    }
    if prompt >= context {
        return Err(format!(
            "the prompt has {prompt} tokens and the model's context is {context} (max_position_embeddings, or the GGUF's context_length): no room to generate; give a shorter prompt"
        ));
    }
    let room = context - prompt;
    if max_tokens > room {
        eprintln!(
            "safemlx: --max-tokens {max_tokens} cut to {room}: the prompt's {prompt} tokens and the generated ones must fit the model's context of {context}"
        );
    }
    Ok(max_tokens.min(room))
}

#[cfg(test)]
mod tests {
    use super::within_context;

    #[test]
    fn generation_stays_within_the_context() {
        assert_eq!(within_context(5, 100, 0), Ok(100));
        assert_eq!(within_context(5, 100, 64), Ok(59));
        assert_eq!(within_context(5, 10, 64), Ok(10));
        assert!(within_context(2, 10, 2)
            .unwrap_err()
            .starts_with("the prompt has 2 tokens and the model's context is 2"));
    }
}
