//! Text generation: prefill the prompt, then decode one token at a time
//! with the KV cache, sampling from the full logits of the last position
//! only (the LM head runs on that position alone; one `all_gather` of
//! `[1, V]` per step).
//!
//! Every rank computes the same gathered logits and runs the same seeded
//! sampler, so every rank produces the same tokens without a broadcast.

pub mod check;
mod pipeline;

use std::time::Instant;

use safemlx::Stream;

use crate::error::{Error, Result};
use crate::models::Llama;
use crate::nn::{gather_logits, KvCache};
use crate::typed::{Sharded, ShardedArray};

pub use pipeline::{forward_stages, generate_stages};

/// How the next token is chosen from the logits.
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f32,
    top_p: f32,
    state: u64,
}

impl Sampler {
    /// The most likely token every time.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            state: 0,
        }
    }

    /// Softmax sampling at `temperature` from the smallest set of tokens
    /// whose probability reaches `top_p`, with a seeded generator (the same
    /// seed gives the same tokens, on every rank). A temperature of 0 is
    /// greedy.
    ///
    /// # Errors
    /// A negative or non-finite temperature, or `top_p` outside (0, 1].
    pub fn new(temperature: f32, top_p: f32, seed: u64) -> Result<Self> {
        if !temperature.is_finite() || temperature < 0.0 {
            return Err(Error::Sampling(format!(
                "the temperature is {temperature}; give 0 (greedy) or a positive number"
            )));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(Error::Sampling(format!(
                "top_p is {top_p}; give a number in (0, 1]"
            )));
        }
        Ok(Self {
            temperature,
            top_p,
            state: seed ^ 0x9E37_79B9_7F4A_7C15,
        })
    }

    /// A uniform number in [0, 1) (splitmix64).
    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The next token for `logits` (one row of the vocabulary).
    ///
    /// # Errors
    /// Empty logits, or logits that are all NaN or infinite.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        let finite = || logits.iter().enumerate().filter(|(_, v)| v.is_finite());
        let (best, &max) = finite()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .ok_or_else(|| Error::Sampling("the logits hold no finite value".to_owned()))?;
        if self.temperature == 0.0 {
            return Ok(best as u32);
        }
        let mut probs: Vec<(usize, f64)> = finite()
            .map(|(i, &v)| (i, (f64::from(v - max) / f64::from(self.temperature)).exp()))
            .collect();
        probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let total: f64 = probs.iter().map(|p| p.1).sum();
        let mut kept = 0.0;
        let mut cut = probs.len();
        for (k, p) in probs.iter().enumerate() {
            kept += p.1 / total;
            if kept >= f64::from(self.top_p) {
                cut = k + 1;
                break;
            }
        }
        probs.truncate(cut);
        let mass: f64 = probs.iter().map(|p| p.1).sum();
        let mut target = self.uniform() * mass;
        for &(i, p) in &probs {
            target -= p;
            if target < 0.0 {
                return Ok(i as u32);
            }
        }
        Ok(probs.last().map_or(best, |p| p.0) as u32)
    }
}

/// What a generation did and how long it took.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Generated {
    /// The new tokens, without the prompt (and without the stop token).
    pub tokens: Vec<u32>,
    /// Whether it stopped at an end-of-sequence token.
    pub stopped_at_eos: bool,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Seconds of the prefill (the prompt's forward and the first token).
    pub prefill_seconds: f64,
    /// Seconds of the decode steps after the first token.
    pub decode_seconds: f64,
    /// Decode steps timed in `decode_seconds`.
    pub decode_steps: usize,
}

impl Generated {
    /// Nothing generated yet after a prompt of `tokens` tokens.
    fn of_prompt(tokens: usize) -> Self {
        Self {
            prompt_tokens: tokens,
            ..Self::default()
        }
    }

    /// Prompt tokens per second.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_seconds.max(1e-9)
    }

    /// Generated tokens per second after the first.
    pub fn decode_tokens_per_second(&self) -> f64 {
        self.decode_steps as f64 / self.decode_seconds.max(1e-9)
    }
}

/// Generates up to `max_tokens` tokens after `prompt`, stopping at any of
/// `eos`; `on_token` sees each new token as it is chosen (to stream it).
/// `cache` is filled from its current length (give a new one for a new
/// sequence).
///
/// # Errors
/// An empty prompt, the model's errors, or `on_token`'s.
#[allow(clippy::too_many_arguments)]
pub fn generate(
    model: &Llama,
    cache: &mut KvCache,
    prompt: &[u32],
    max_tokens: usize,
    sampler: &mut Sampler,
    eos: &[u32],
    on_token: impl FnMut(u32) -> Result<()>,
    s: &Stream,
) -> Result<Generated> {
    let mut out = Generated::of_prompt(prompt.len());
    if max_tokens == 0 {
        return Ok(out);
    }
    let started = Instant::now();
    let first = step(model, cache, prompt, sampler, s)?;
    out.prefill_seconds = started.elapsed().as_secs_f64();
    decode_loop(&mut out, first, (max_tokens, eos), on_token, |token| {
        step(model, cache, &[token], sampler, s)
    })?;
    Ok(out)
}

/// The decode steps after the prefill's token `next`: each token is kept
/// and passed to `on_token` until one of `eos` (not kept) or `max_tokens`
/// kept; `step` runs a kept token and returns the next. Fills `out`'s
/// tokens, stop and decode timing.
fn decode_loop(
    out: &mut Generated,
    mut next: u32,
    (max_tokens, eos): (usize, &[u32]),
    mut on_token: impl FnMut(u32) -> Result<()>,
    mut step: impl FnMut(u32) -> Result<u32>,
) -> Result<()> {
    let decode_started = Instant::now();
    loop {
        if eos.contains(&next) {
            out.stopped_at_eos = true;
            break;
        }
        out.tokens.push(next);
        on_token(next)?;
        if out.tokens.len() >= max_tokens {
            break;
        }
        next = step(next)?;
        out.decode_steps += 1;
    }
    out.decode_seconds = decode_started.elapsed().as_secs_f64();
    Ok(())
}

/// Runs `tokens` through the model and samples the token after the last.
fn step(
    model: &Llama,
    cache: &mut KvCache,
    tokens: &[u32],
    sampler: &mut Sampler,
    s: &Stream,
) -> Result<u32> {
    sample_logits(&model.forward_last(tokens, cache, s)?, sampler, s)
}

/// The token `sampler` draws from `logits`, one row of this rank's
/// vocabulary columns (gathered across the group first).
pub(crate) fn sample_logits(
    logits: &ShardedArray<Sharded<1>>,
    sampler: &mut Sampler,
    s: &Stream,
) -> Result<u32> {
    let last = gather_logits(logits, 0..1, s)?;
    // Row-contiguous: `try_to_vec` reads storage order, not logical order.
    let last = last.into_local().contiguous(false, s)?;
    crate::runtime::eval(&[&last])?;
    let row = last
        .into_evaluated()?
        .try_to_vec::<f32>()
        .map_err(|e| Error::Sampling(format!("cannot read the logits: {e}")))?;
    sampler.sample(&row)
}

#[cfg(test)]
mod tests {
    use super::Sampler;

    #[test]
    fn greedy_takes_the_largest_and_sampling_is_seeded() {
        let logits = [0.1, 3.0, f32::NAN, 2.9, -1.0];
        assert_eq!(Sampler::greedy().sample(&logits).unwrap(), 1);
        let draw = |seed| {
            let mut s = Sampler::new(1.0, 1.0, seed).unwrap();
            (0..20)
                .map(|_| s.sample(&logits).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert!(draw(7).contains(&3), "both likely tokens are drawn");
        // top_p 0.5 keeps only the most likely token here.
        let mut s = Sampler::new(1.0, 0.5, 1).unwrap();
        assert!((0..20).all(|_| s.sample(&logits).unwrap() == 1));
        assert!(Sampler::new(-1.0, 1.0, 0).is_err());
        assert!(Sampler::new(1.0, 0.0, 0).is_err());
        assert!(Sampler::greedy().sample(&[f32::NAN]).is_err());
    }
}
