//! `generate --check`: the whole model in one process (a child of the
//! comparing rank without peers) against the distributed run.

use std::path::Path;
use std::time::Instant;

use safemlx::Array;
use safemlx_dist::checkpoint::{save, SafetensorsFile};
use safemlx_dist::generate::{forward_stages, generate, generate_stages, Generated, Sampler};
use safemlx_dist::models::Loaded;
use safemlx_dist::nn::gather_logits;
use safemlx_dist::typed::StageLink;
use safemlx_dist::{all_sum, Group};
use safemlx_dist_examples::{compare, cpu_stream, values};

use super::{err, Options};

/// Set in the single-process reference run of `--check`: where it writes.
pub const REFERENCE_ENV: &str = "SAFEMLX_GENERATE_REFERENCE_OUT";

/// The reference run: the prompt's logits and greedy tokens of the whole
/// model in this one process, written to `out`.
pub fn write_reference(
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

/// `--check`: one rank holding the logits (rank 0, or a pipeline's last
/// rank) runs the reference in a child process with no peers, then
/// compares; every rank waits on it (an `all_sum` as a barrier) and
/// computes the same distributed logits and greedy tokens.
pub fn check(
    group: &Group,
    link: Option<&StageLink>,
    loaded: &Loaded,
    o: &Options,
    prompt: &[u32],
    generated: &Generated,
) -> Result<(), String> {
    let s = cpu_stream();
    let model = &loaded.model;
    let logits = match link {
        Some(link) => forward_stages(model, link, prompt, o.prefill_chunk, &s),
        None => model.forward(prompt, &mut model.new_cache(), &s).map(Some),
    };
    // The last stage holds the logits and every token (rank 0 outside a pipeline).
    let full = match logits.map_err(err)? {
        Some(logits) => Some(gather_logits(&logits, 0..prompt.len(), &s).map_err(err)?),
        None => None,
    };
    if let Some(full) = &full {
        safemlx_dist::eval(&[full.local()]).map_err(err)?;
    }
    let mut cache = model.new_cache();
    let greedy = if o.temperature == 0.0 {
        generated.tokens.clone()
    } else {
        let (eos, mut greedy) = (&model.config().eos_token_ids, Sampler::greedy());
        let quiet = |_| Ok(());
        match link {
            Some(link) => {
                let limits = (o.max_tokens, o.prefill_chunk);
                generate_stages(
                    model,
                    link,
                    &mut cache,
                    prompt,
                    limits,
                    &mut greedy,
                    eos,
                    quiet,
                    &s,
                )
            }
            None => generate(
                model,
                &mut cache,
                prompt,
                o.max_tokens,
                &mut greedy,
                eos,
                quiet,
                &s,
            ),
        }
        .map_err(err)?
        .tokens
    };
    let mut outcome = Ok(());
    // Every rank of the group (of the last stage, in a pipeline) holds the
    // gathered logits; one compares: rank 0, or the pipeline's last rank.
    let (rank, n) = (group.rank(), group.size());
    let compares = full
        .as_ref()
        .filter(|_| rank == if link.is_some() { n - 1 } else { 0 });
    if let Some(full) = compares {
        outcome = compare_with_reference(full.local(), &greedy, (group.rank(), group.size()));
    }
    // Every rank learns whether the comparing rank's check passed.
    let failed = f32::from(u8::from(outcome.is_err()));
    let any = all_sum(&Array::from_slice(&[failed], &[1]), group, &s).map_err(err)?;
    let any = values(&any, &s)?;
    if compares.is_none() && any.first().is_some_and(|v| *v > 0.0) {
        return Err("the check failed on the rank that compared".to_owned());
    }
    outcome
}

fn compare_with_reference(
    logits: &Array,
    greedy: &[u32],
    (rank, n): (usize, usize),
) -> Result<(), String> {
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
        "rank {rank}/{n}: --check against one process ({:.1} s): prompt logits max abs error {max_abs:.3e}, max relative error {rel:.3e}; greedy tokens {} ({} tokens)",
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
