//! `--check`: the whole model in one process against the split run.
//!
//! The rank that holds the logits (rank 0, or a pipeline's last rank)
//! starts this same program again, with the same arguments, as one process
//! with no peers ([`REFERENCE_ENV`] says where it writes); that process
//! loads the whole model, computes the prompt's logits and the greedy
//! tokens and writes them ([`write_reference`]). The split run computes
//! the same and compares ([`check`]): the prompt's logits within a bound
//! for the dtype the logits are computed in, and the greedy tokens equal
//! (or equal up to a near-tie in one process: two best logits closer than
//! the bound lets the logits move).
//! `safemlx generate --check` and the `generate` example both use it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use safemlx::{Array, Dtype, Stream};

use super::{forward_stages, generate, generate_stages, Generated, Sampler};
use crate::checkpoint::{save, SafetensorsFile};
use crate::error::{Error, Result};
use crate::models::Llama;
use crate::nn::gather_logits;
use crate::runtime::{all_sum, eval, Group};
use crate::typed::StageLink;

/// Set in the single-process reference run: the file it writes.
pub const REFERENCE_ENV: &str = "SAFEMLX_GENERATE_REFERENCE_OUT";

/// Where this process, as the reference run, writes; `None` in a split run.
pub fn reference_out() -> Option<PathBuf> {
    std::env::var_os(REFERENCE_ENV).map(PathBuf::from)
}

/// What the checked run did.
#[derive(Debug, Clone, Copy)]
pub struct CheckedRun<'a> {
    /// The prompt's tokens.
    pub prompt: &'a [u32],
    /// What the run generated.
    pub generated: &'a Generated,
    /// Its `--max-tokens`.
    pub max_tokens: usize,
    /// Prompt tokens per chunk of a pipelined prefill.
    pub prefill_chunk: usize,
    /// Whether its tokens were sampled (the greedy ones are then made
    /// again to compare).
    pub sampled: bool,
}

/// The reference run: the prompt's logits and greedy tokens of the whole
/// `model` in this one process, written to `out`.
///
/// # Errors
/// The model's or the file's.
pub fn write_reference(
    model: &Llama,
    prompt: &[u32],
    max_tokens: usize,
    out: &Path,
    s: &Stream,
) -> Result<()> {
    let logits = model.forward(prompt, &mut model.new_cache(), s)?;
    let full = gather_logits(&logits, 0..prompt.len(), s)?;
    let eos = &model.config().eos_token_ids;
    let greedy = generate(
        model,
        &mut model.new_cache(),
        prompt,
        max_tokens,
        &mut Sampler::greedy(),
        eos,
        |_| Ok(()),
        s,
    )?;
    let tokens: Vec<i32> = greedy.tokens.iter().map(|&t| t as i32).collect();
    let count = i32::try_from(tokens.len()).map_err(|_| Error::ShapeOverflow {
        value: tokens.len(),
    })?;
    let gaps = top_two_gaps(model, prompt, &greedy.tokens, s)?;
    save(
        out,
        &[
            ("logits", full.into_local()),
            ("tokens", Array::from_slice(&tokens, &[count])),
            ("gaps", Array::from_slice(&gaps, &[count])),
        ],
        s,
    )
}

/// For each greedy token, how far its logit was above the next best one
/// when it was chosen: one forward of the prompt and the tokens.
fn top_two_gaps(model: &Llama, prompt: &[u32], tokens: &[u32], s: &Stream) -> Result<Vec<f32>> {
    let Some((_, fed)) = tokens.split_last() else {
        return Ok(Vec::new());
    };
    let all = [prompt, fed].concat();
    let logits = model.forward(&all, &mut model.new_cache(), s)?;
    let rows = gather_logits(&logits, prompt.len() - 1..all.len(), s)?;
    let vocab = rows
        .local()
        .shape()
        .last()
        .map_or(1, |&v| v.max(1) as usize);
    let values = floats(rows.local(), s)?;
    Ok(values
        .chunks(vocab)
        .map(|row| {
            let (best, next) = row.iter().fold((f32::MIN, f32::MIN), |(a, b), &v| {
                if v > a {
                    (v, a)
                } else {
                    (a, b.max(v))
                }
            });
            best - next
        })
        .collect())
}

/// Whether the split run's greedy tokens `got` may stand against one
/// process's `want`: equal, or equal up to a step where one process's two
/// best logits were at most `tie` apart (`gaps[i]`, see `top_two_gaps`), a
/// near-tie that a difference within the bound can turn. `Ok` says which;
/// `Err` names the first difference.
pub fn tokens_agree(
    got: &[u32],
    want: &[u32],
    gaps: &[f32],
    tie: f32,
) -> std::result::Result<String, String> {
    let Some(at) = (0..got.len().max(want.len())).find(|&i| got.get(i) != want.get(i)) else {
        return Ok("greedy tokens agree".to_owned());
    };
    match gaps.get(at) {
        Some(&gap) if at < got.len() && gap <= tie => Ok(format!(
            "greedy tokens agree up to token {at}, a near-tie in one process (its two best logits {gap:.3e} apart, within {tie:.3e})"
        )),
        gap => Err(format!(
            "greedy tokens differ from token {at}{}: {got:?} here, {want:?} in one process",
            gap.map(|g| format!(" (one process's two best logits {g:.3e} apart, above {tie:.3e})"))
                .unwrap_or_default()
        )),
    }
}

/// The relative bound on the prompt logits' error for logits computed in
/// `dtype`: float32 1e-4; a 16-bit float's rounding (8 bits of mantissa
/// for bfloat16, 11 for float16) grows through the layers of one process
/// and of a split run alike (a split run's partial sums are kept in
/// float32 until they are summed, so it rounds where one process does).
pub fn bound_for(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::Bfloat16 => 5e-2,
        Dtype::Float16 => 1e-2,
        _ => 1e-4,
    }
}

/// Compares the split run with the reference, which the comparing rank
/// starts; every rank makes the same calls (it is collective) and learns
/// the outcome. Returns the comparing rank's line (`rank R/N: --check
/// against one process ...`), `None` on the others.
///
/// # Errors
/// The reference's failure, logits beyond the bound, greedy tokens that
/// differ ([`Error::Check`], on every rank), or the model's errors.
pub fn check(
    group: &Group,
    link: Option<&StageLink>,
    model: &Llama,
    run: &CheckedRun<'_>,
    s: &Stream,
) -> Result<Option<String>> {
    let prompt = run.prompt;
    let logits = match link {
        Some(link) => forward_stages(model, link, prompt, run.prefill_chunk, s)?,
        None => Some(model.forward(prompt, &mut model.new_cache(), s)?),
    };
    // The last stage holds the logits and every token (rank 0 outside a
    // pipeline); the bound follows the dtype they are computed in, which
    // the gathered float32 copy no longer shows.
    let full = match logits {
        Some(logits) => Some((
            gather_logits(&logits, 0..prompt.len(), s)?,
            logits.local().dtype(),
        )),
        None => None,
    };
    if let Some((full, _)) = &full {
        eval(&[full.local()])?;
    }
    let greedy = if run.sampled {
        let (eos, mut greedy) = (&model.config().eos_token_ids, Sampler::greedy());
        let mut cache = model.new_cache();
        let quiet = |_| Ok(());
        match link {
            Some(link) => generate_stages(
                model,
                link,
                &mut cache,
                prompt,
                (run.max_tokens, run.prefill_chunk),
                &mut greedy,
                eos,
                quiet,
                s,
            )?,
            None => generate(
                model,
                &mut cache,
                prompt,
                run.max_tokens,
                &mut greedy,
                eos,
                quiet,
                s,
            )?,
        }
        .tokens
    } else {
        run.generated.tokens.clone()
    };
    let (rank, n) = (group.rank(), group.size());
    let compares = full
        .as_ref()
        .filter(|_| rank == if link.is_some() { n - 1 } else { 0 });
    let outcome = match compares {
        Some((full, dtype)) => {
            against_reference((full.local(), *dtype), &greedy, (rank, n), s).map(Some)
        }
        None => Ok(None),
    };
    // Every rank learns whether the comparing rank's check passed.
    let failed = f32::from(u8::from(outcome.is_err()));
    let any = all_sum(&Array::from_slice(&[failed], &[1]), group, s)?;
    eval(&[&any])?;
    let any = any.evaluated()?.try_to_vec::<f32>().unwrap_or_default();
    if compares.is_none() && any.first().is_some_and(|v| *v > 0.0) {
        return Err(Error::Check(
            "the check failed on the rank that compared".to_owned(),
        ));
    }
    outcome
}

/// Runs the reference (this program again, as one process) and compares.
fn against_reference(
    (logits, dtype): (&Array, Dtype),
    greedy: &[u32],
    (rank, n): (usize, usize),
    s: &Stream,
) -> Result<String> {
    let out = std::env::temp_dir().join(format!(
        "safemlx-generate-reference-{}.safetensors",
        std::process::id()
    ));
    let started = Instant::now();
    run_reference(&out)?;
    let reference = SafetensorsFile::open(&out)?;
    let want = reference.read("logits", s)?;
    let want_tokens = reference.read("tokens", s)?;
    let gaps = floats(&reference.read("gaps", s)?, s)?;
    let _ = std::fs::remove_file(&out);
    let (got, want) = (floats(logits, s)?, floats(&want, s)?);
    let (max_abs, rel) = compare_values(&got, &want).map_err(Error::Check)?;
    let want_tokens: Vec<u32> = floats(&want_tokens, s)?
        .into_iter()
        .map(|t| t as u32)
        .collect();
    let bound = bound_for(dtype);
    // A near-tie: two logits closer than the bound allows the logits to move.
    let tie = bound * want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let tokens = tokens_agree(greedy, &want_tokens, &gaps, tie);
    let line = format!(
        "rank {rank}/{n}: --check against one process ({:.1} s): prompt logits max abs error {max_abs:.3e}, max relative error {rel:.3e} (bound {bound:.0e} for {}); {} ({} tokens)",
        started.elapsed().as_secs_f64(),
        format!("{dtype:?}").to_lowercase(),
        tokens.as_ref().map_or("greedy tokens DIFFER", String::as_str),
        greedy.len()
    );
    if rel > bound {
        return Err(Error::Check(format!(
            "{line}: relative error {rel:.3e} is above {bound:.0e}"
        )));
    }
    match tokens {
        Ok(_) => Ok(line),
        Err(why) => Err(Error::Check(format!("{line}: {why}"))),
    }
}

/// This program with its arguments, as one process without peers, with
/// [`REFERENCE_ENV`] set to `out`.
fn run_reference(out: &Path) -> Result<()> {
    let failed = |why: String| Error::Check(format!("the single-process reference {why}"));
    let exe = std::env::current_exe().map_err(|e| failed(format!("cannot be found: {e}")))?;
    let mut child = std::process::Command::new(exe);
    child
        .args(std::env::args_os().skip(1))
        .env(REFERENCE_ENV, out)
        .env(crate::runtime::BACKEND_ENV, "ring");
    for var in ["MLX_RANK", "MLX_HOSTFILE", "MLX_WORLD_SIZE"] {
        child.env_remove(var);
    }
    for (key, _) in std::env::vars_os() {
        let name = key.to_string_lossy();
        if name.starts_with("OMPI_") || name.starts_with("PMIX_") {
            child.env_remove(&key);
        }
    }
    crate::runtime::restore_for_child(&mut child);
    let status = child
        .status()
        .map_err(|e| failed(format!("cannot be started: {e}")))?;
    if !status.success() {
        return Err(failed(format!("failed ({status})")));
    }
    Ok(())
}

fn floats(array: &Array, s: &Stream) -> Result<Vec<f32>> {
    let as_f32 = array.as_dtype(Dtype::Float32, s)?.contiguous(false, s)?;
    eval(&[&as_f32])?;
    Ok(as_f32.evaluated()?.try_to_vec::<f32>().unwrap_or_default())
}

/// The maximum absolute error of `got` against `want` and that error
/// relative to `want`'s largest magnitude. A NaN or infinity on either
/// side is an error (a maximum built with `f32::max` would drop a NaN and
/// report a perfect match for all-NaN output).
///
/// # Errors
/// Lengths that differ, or a value that is not finite, described.
pub fn compare_values(got: &[f32], want: &[f32]) -> std::result::Result<(f32, f32), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{} values computed but {} expected",
            got.len(),
            want.len()
        ));
    }
    for (side, values) in [("computed", got), ("expected", want)] {
        let bad = values.iter().filter(|v| !v.is_finite()).count();
        if let Some(at) = values.iter().position(|v| !v.is_finite()) {
            return Err(format!(
                "{bad} of {} {side} values are not finite (the first, at index {at}, is {})",
                values.len(),
                values[at]
            ));
        }
    }
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let max_abs = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    Ok((max_abs, max_abs / scale.max(1e-12)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_compare_with_their_errors_and_bounds_follow_the_dtype() {
        assert_eq!(compare_values(&[1.0, 2.0], &[1.0, 4.0]), Ok((2.0, 0.5)));
        assert_eq!(
            compare_values(&[f32::NAN], &[1.0]).unwrap_err(),
            "1 of 1 computed values are not finite (the first, at index 0, is NaN)"
        );
        assert!(compare_values(&[1.0], &[]).is_err());
        assert_eq!(bound_for(Dtype::Float32), 1e-4);
        assert!(bound_for(Dtype::Bfloat16) > bound_for(Dtype::Float16));
    }

    #[test]
    fn greedy_tokens_may_differ_only_after_a_near_tie() {
        let gaps = [2.0, 0.01, 3.0];
        assert_eq!(
            tokens_agree(&[1, 2, 3], &[1, 2, 3], &gaps, 0.1).as_deref(),
            Ok("greedy tokens agree")
        );
        assert_eq!(
            tokens_agree(&[1, 5, 6], &[1, 2, 3], &gaps, 0.1).as_deref(),
            Ok("greedy tokens agree up to token 1, a near-tie in one process (its two best logits 1.000e-2 apart, within 1.000e-1)")
        );
        assert_eq!(
            tokens_agree(&[7, 2, 3], &[1, 2, 3], &gaps, 0.1)
                .as_deref()
                .map_err(String::as_str),
            Err("greedy tokens differ from token 0 (one process's two best logits 2.000e0 apart, above 1.000e-1): [7, 2, 3] here, [1, 2, 3] in one process")
        );
        // A run that stopped early or went on: no near-tie to excuse it.
        assert!(tokens_agree(&[1, 2], &[1, 2, 3], &gaps, 10.0).is_err());
        assert!(tokens_agree(&[1, 2, 3, 4], &[1, 2, 3], &gaps, 10.0).is_err());
    }
}
