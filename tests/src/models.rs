//! Checks of a loaded model's logits against golden ones: the whole prompt,
//! the last position only, and prefill then decode with the KV cache.

use std::path::{Path, PathBuf};

use safemlx::Stream;
use safemlx_dist::checkpoint::SafetensorsFile;
use safemlx_dist::models::Llama;
use safemlx_dist::nn::gather_logits;

use crate::cpu;
use crate::dense::{host, max_relative_error};

/// The golden model directory `case` (`llama/...`, `moe/...`) under
/// `tests/golden`.
pub fn golden_dir(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden")
        .join(case)
}

/// The prompt (`tokens`) and logits `[T, V]` (`logits`, row-major) of a
/// golden safetensors file.
pub fn golden(path: &Path, s: &Stream) -> (Vec<u32>, Vec<f32>) {
    let file = SafetensorsFile::open(path).expect("golden");
    let tokens = file
        .read("tokens", s)
        .and_then(|a| Ok(a.into_evaluated()?))
        .expect("tokens")
        .try_to_vec::<i32>()
        .expect("i32");
    let logits = host(&file.read("logits", s).expect("logits"), s);
    (tokens.into_iter().map(|t| t as u32).collect(), logits)
}

/// Checks `model`'s logits for `prompt` against `want` (relative error at
/// most `1e-4`): the whole prompt at once, `forward_last`, and a prefill of
/// all but 3 tokens followed by decoding them one by one with the cache.
/// `what` names the case and rank in failures.
pub fn check_logits(model: &Llama, prompt: &[u32], want: &[f32], what: &str) {
    let s = cpu();
    let vocab = model.config().vocab_size;
    let t = prompt.len();

    let mut cache = model.new_cache();
    let logits = model.forward(prompt, &mut cache, &s).expect("forward");
    let full = gather_logits(&logits, 0..t, &s).expect("gather");
    assert_eq!(full.global_shape(), [t as i32, vocab as i32]);
    let err = max_relative_error(&host(full.local(), &s), want);
    assert!(err <= 1e-4, "{what}: prompt logits relative error {err}");
    assert_eq!(cache.len(), t);

    let mut cache = model.new_cache();
    let last = model
        .forward_last(prompt, &mut cache, &s)
        .expect("forward_last");
    let last = gather_logits(&last, 0..1, &s).expect("gather");
    let err = max_relative_error(&host(last.local(), &s), &want[(t - 1) * vocab..]);
    assert!(err <= 1e-4, "{what}: forward_last relative error {err}");

    let mut cache = model.new_cache();
    let split = t - 3;
    let logits = model
        .forward(&prompt[..split], &mut cache, &s)
        .expect("prefill");
    let last = gather_logits(&logits, split - 1..split, &s).expect("gather");
    let row = |i: usize| &want[i * vocab..(i + 1) * vocab];
    let err = max_relative_error(&host(last.local(), &s), row(split - 1));
    assert!(
        err <= 1e-4,
        "{what}: prefill's last row relative error {err}"
    );
    for (i, &token) in prompt.iter().enumerate().skip(split) {
        let logits = model.forward(&[token], &mut cache, &s).expect("decode");
        let step = gather_logits(&logits, 0..1, &s).expect("gather");
        let err = max_relative_error(&host(step.local(), &s), row(i));
        assert!(err <= 1e-4, "{what}: decode step {i} relative error {err}");
    }
    assert_eq!(cache.len(), t);
    // A rank with no query head keeps no keys or values.
    let holds_heads = model.head_split().is_some_and(|h| h.query.1 > 0);
    assert_eq!(cache.nbytes() > 0, holds_heads, "{what}: KV cache bytes");
}
