//! Generation through pipeline stages, one rank per stage.
//!
//! ```text
//! prefill: stage 0 embeds the prompt in chunks; each chunk runs through
//!          its layers and goes on to stage 1 while stage 0 runs the next
//!          chunk, so the stages work on different chunks at once.
//! token:   the last stage samples from the last row of the last chunk and
//!          sends the token to stage 0 (the ring closes: one hop).
//! decode:  stage 0 embeds the token; one row crosses each boundary.
//! end:     stage 0 sends "stop" down the stages.
//! ```
//!
//! **A shared LM head.** With tied embeddings and one rank per stage, the
//! first stage holds the LM head's table too (it embeds with it), and it
//! would idle while the last stage multiplies the whole vocabulary. So the
//! head is shared: the last stage sends its final normed row `[1, D]` to
//! stage 0, both compute half of the logits at once (stage 0 tokens
//! `0..V/2`, the last stage the rest), the last stage sends its half, and
//! stage 0 samples. The token then travels down with the next step's rows
//! (or with "stop"), so the last stage still knows every token.
//!
//! Each stage holds only its layers' weights and KV cache. Stage 0 and the
//! last stage know every token (stage 0 streams them); the stages between
//! see only rows.

use std::time::Instant;

use safemlx::{Array, Dtype, Stream};

use super::{decode_loop, generate, sample_logits, Generated, Sampler};
use crate::error::{Error, Result};
use crate::models::{Llama, StageInput};
use crate::nn::KvCache;
use crate::typed::{Sharded, ShardedArray, StageLink, StageMessage};

/// Generates up to `max_tokens` tokens after `prompt` as [`generate`]
/// does, with `model` one stage of a pipeline whose boundaries `link`
/// carries (the model of stage `k` loaded on world rank `k`), the prompt
/// prefilled in chunks of `prefill_chunk` tokens. Every stage calls it
/// with the same prompt, limits, sampler and end tokens; the last stage's
/// `sampler` draws the tokens (stage 0's with a shared LM head, see the
/// module), stage 0 calls `on_token` with each. A pipeline of one stage is
/// [`generate`].
///
/// # Errors
/// An empty prompt, a chunk of 0 tokens, a model that is not stage
/// `link.stage()` of `link.stages()`, the model's errors, a boundary's
/// ([`StageLink::receive`]), or `on_token`'s.
#[allow(clippy::too_many_arguments)]
pub fn generate_stages(
    model: &Llama,
    link: &StageLink,
    cache: &mut KvCache,
    prompt: &[u32],
    limits: (usize, usize),
    sampler: &mut Sampler,
    eos: &[u32],
    on_token: impl FnMut(u32) -> Result<()>,
    s: &Stream,
) -> Result<Generated> {
    let (max_tokens, prefill_chunk) = limits;
    let stage = model.stage();
    stage.expect_place(link.stage(), link.stages())?;
    if prompt.is_empty() || prefill_chunk == 0 {
        return Err(Error::Shape(format!(
            "a pipeline generation needs a prompt and chunks of at least one token; got {} tokens in chunks of {prefill_chunk}",
            prompt.len()
        )));
    }
    if stage.is_whole() {
        return generate(model, cache, prompt, max_tokens, sampler, eos, on_token, s);
    }
    let mut out = Generated::of_prompt(prompt.len());
    if max_tokens == 0 {
        return Ok(out);
    }
    let started = Instant::now();
    let split = model.shared_head_split(link.tensor().size());
    let mut next_token = |model: &Llama| match split {
        Some(split) => sample_shared(link, model, split, sampler, s),
        None => receive_token(link, model, s),
    };
    if stage.is_first() {
        let chunks: Vec<&[u32]> = prompt.chunks(prefill_chunk).collect();
        for (c, chunk) in chunks.iter().enumerate() {
            let rows = model.forward_stage(StageInput::Tokens(chunk), cache, s)?;
            link.send_hidden(&rows, c + 1 == chunks.len(), s)?;
        }
        let first = next_token(model)?;
        out.prefill_seconds = started.elapsed().as_secs_f64();
        let mut last = None;
        decode_loop(&mut out, first, (max_tokens, eos), on_token, |token| {
            let rows = model.forward_stage(StageInput::Tokens(&[token]), cache, s)?;
            link.send_hidden_carrying(&rows, true, split.map(|_| token), s)?;
            let next = next_token(model)?;
            last = Some(next);
            Ok(next)
        })?;
        // With a shared head, the last token sampled goes with "stop".
        let last = split.and(last.or(Some(first)));
        link.send_stop_carrying(last, s)?;
        return Ok(out);
    }
    let width = model.config().hidden_size;
    let mut decode_started = None;
    // With a shared head, the last stage learns the tokens from headers.
    let record = |out: &mut Generated, token: Option<u32>| match token {
        Some(token) if split.is_some() && stage.is_last() => {
            record_sampled(out, token, (max_tokens, eos));
        }
        _ => {}
    };
    loop {
        let (rows, last_chunk) = match link.receive(width, Dtype::Float32, s)? {
            StageMessage::Stop => {
                record(&mut out, link.carried_token());
                break;
            }
            StageMessage::Hidden { rows, last_chunk } => (rows, last_chunk),
            StageMessage::Token(_) | StageMessage::Logits(_) => unreachable_token()?,
        };
        let carried = link.carried_token();
        record(&mut out, carried);
        let rows = model.forward_stage(StageInput::Hidden(rows), cache, s)?;
        if !stage.is_last() {
            link.send_hidden_carrying(&rows, last_chunk, carried, s)?;
        } else if !last_chunk {
            // Now, while the stages before run the next chunk: left lazy,
            // every chunk would run at the end, after theirs.
            crate::runtime::eval(&[rows.local()])?;
        } else if let Some(split) = split {
            // The final row to stage 0 first, so both halves run at once.
            let normed = model.stage_final_row(&rows, s)?;
            link.send_hidden(&normed, true, s)?;
            let vocab = model.config().vocab_size;
            let theirs = model.stage_vocab_logits(&normed, split..vocab, s)?;
            link.send_logits(&theirs, s)?;
        } else {
            let token = sample_logits(&model.stage_last_logits(&rows, s)?, sampler, s)?;
            link.send_token(token, s)?;
            record_sampled(&mut out, token, (max_tokens, eos));
        }
        if last_chunk {
            match decode_started {
                None => {
                    out.prefill_seconds = started.elapsed().as_secs_f64();
                    decode_started = Some(Instant::now());
                }
                Some(_) => out.decode_steps += 1,
            }
        }
    }
    out.decode_seconds = decode_started.map_or(0.0, |d| d.elapsed().as_secs_f64());
    // Passes on the last token "stop" carried (a shared head's).
    link.send_stop_carrying(link.carried_token(), s)?;
    Ok(out)
}

/// The logits of every token of `tokens` through the pipeline on a fresh
/// cache, `[T, V]`, on the last stage (`None` on the others); the tokens go
/// in chunks of `chunk` as in [`generate_stages`]. Every stage calls it
/// with the same tokens.
///
/// # Errors
/// No tokens, a chunk of 0 tokens, the model's errors or a boundary's.
pub fn forward_stages(
    model: &Llama,
    link: &StageLink,
    tokens: &[u32],
    chunk: usize,
    s: &Stream,
) -> Result<Option<ShardedArray<Sharded<1>>>> {
    let stage = model.stage();
    if tokens.is_empty() || chunk == 0 {
        return Err(Error::Shape(format!(
            "a pipeline pass needs tokens and chunks of at least one token; got {} tokens in chunks of {chunk}",
            tokens.len()
        )));
    }
    let mut cache = model.new_cache();
    let mut logits = Vec::new();
    let chunks: Vec<&[u32]> = tokens.chunks(chunk).collect();
    for (c, piece) in chunks.iter().enumerate() {
        let input = if stage.is_first() {
            StageInput::Tokens(piece)
        } else {
            match link.receive(model.config().hidden_size, Dtype::Float32, s)? {
                StageMessage::Hidden { rows, .. } => StageInput::Hidden(rows),
                _ => return unreachable_token(),
            }
        };
        let rows = model.forward_stage(input, &mut cache, s)?;
        if stage.is_last() {
            let chunk_logits = model.stage_logits(&rows, s)?;
            // Overlapping the stages before, as in `generate_stages`.
            crate::runtime::eval(&[chunk_logits.local()])?;
            logits.push(chunk_logits);
        } else {
            link.send_hidden(&rows, c + 1 == chunks.len(), s)?;
        }
    }
    if !stage.is_last() {
        return Ok(None);
    }
    // Each chunk's rows, the same vocabulary columns on this rank.
    let locals: Vec<Array> = logits.iter().map(|l| l.local().clone()).collect();
    let vocab = logits.first().map_or(0, |l| l.global_shape()[1]);
    let rows = i32::try_from(tokens.len()).map_err(|_| Error::ShapeOverflow {
        value: tokens.len(),
    })?;
    let all = safemlx::ops::concatenate_axis(&locals, 0, s)?;
    let comm = logits.first().map(|l| l.comm().clone());
    let comm = comm.ok_or_else(|| Error::Shape("no chunk".to_owned()))?;
    Ok(Some(ShardedArray::from_local(all, &comm, &[rows, vocab])?))
}

/// The last stage's record of a token it sampled.
fn record_sampled(out: &mut Generated, token: u32, (max_tokens, eos): (usize, &[u32])) {
    if eos.contains(&token) {
        out.stopped_at_eos = true;
    } else if out.tokens.len() < max_tokens {
        out.tokens.push(token);
    }
}

/// Stage 0's token with a shared LM head: the last stage's final row, its
/// own half of the logits (tokens `0..split`) while the last stage computes
/// the other, then the two halves sampled together.
fn sample_shared(
    link: &StageLink,
    model: &Llama,
    split: usize,
    sampler: &mut Sampler,
    s: &Stream,
) -> Result<u32> {
    let width = model.config().hidden_size;
    let StageMessage::Hidden { rows: normed, .. } = link.receive(width, Dtype::Float32, s)? else {
        return unreachable_token();
    };
    let mine = model.stage_vocab_logits(&normed, 0..split, s)?;
    crate::runtime::eval(&[mine.local()])?;
    let vocab = model.config().vocab_size;
    let StageMessage::Logits(theirs) = link.receive(vocab - split, Dtype::Float32, s)? else {
        return unreachable_token();
    };
    let both =
        safemlx::ops::concatenate_axis(&[mine.local().clone(), theirs.local().clone()], 1, s)?;
    let rows = i32::try_from(vocab).map_err(|_| Error::ShapeOverflow { value: vocab })?;
    let logits = ShardedArray::<Sharded<1>>::from_local(both, mine.comm(), &[1, rows])?;
    sample_logits(&logits, sampler, s)
}

/// Stage 0's wait for the last stage's token.
fn receive_token(link: &StageLink, model: &Llama, s: &Stream) -> Result<u32> {
    match link.receive(model.config().hidden_size, Dtype::Float32, s)? {
        StageMessage::Token(token) => Ok(token),
        _ => unreachable_token(),
    }
}

/// [`StageLink::receive`] gives stage 0 only tokens (or a server's logits)
/// and the others only rows or the end.
fn unreachable_token<T>() -> Result<T> {
    Err(Error::Shape(
        "a pipeline stage got a message of the wrong kind".to_owned(),
    ))
}
