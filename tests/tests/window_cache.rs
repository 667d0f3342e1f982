//! Sliding-window layers on a long sequence: the tiny model with windows of
//! 3 around a full-attention layer (`tests/golden/llama/llama-window`,
//! whose prompt logits equal mlx-lm's in `models.rs`) decodes 300 tokens
//! past its prompt at 1 and 2 ranks; every 100 steps the step's logits
//! equal the whole sequence run again on a fresh cache, the sliding
//! layers' caches stay bounded while the full layer's grows, and cutting
//! the cache back behind the window is an error that names the positions.

use std::path::Path;

use safemlx_dist::checkpoint::HfDirectory;
use safemlx_dist::launch::Ranks;
use safemlx_dist::models::Llama;
use safemlx_dist::nn::gather_logits;
use safemlx_dist::Group;
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{host, max_relative_error};
use safemlx_dist_tests::models::golden;

fn long_sequence(group: &Group) {
    let s = cpu();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/llama/llama-window");
    let model = Llama::from_hf(group, &HfDirectory::open(&dir).unwrap(), &s).unwrap();
    let what = format!("rank {} of {}", group.rank(), group.size());
    assert_eq!(model.config().sliding_window, Some(3));
    assert_eq!(model.config().full_attention_layers, [1]);
    let (prompt, _) = golden(&dir.join("golden.safetensors"), &s);
    let mut seq = prompt.clone();
    let mut cache = model.new_cache();
    model.forward(&seq, &mut cache, &s).unwrap();
    for step in 0..300u32 {
        let token = (step * 7 % 60) + 3;
        seq.push(token);
        let logits = model.forward(&[token], &mut cache, &s).unwrap();
        if step % 100 == 99 {
            let got = host(gather_logits(&logits, 0..1, &s).unwrap().local(), &s);
            let mut fresh = model.new_cache();
            let all = model.forward_last(&seq, &mut fresh, &s).unwrap();
            let want = host(gather_logits(&all, 0..1, &s).unwrap().local(), &s);
            let err = max_relative_error(&got, &want);
            assert!(err <= 1e-4, "{what}: step {step}: relative error {err}");
        }
    }
    assert_eq!(cache.len(), seq.len());
    // [1, kv heads, capacity, 12] keys and values of this rank's KV heads.
    let kv = model.head_split().unwrap().kv.1;
    let per_position = 2 * kv * 12 * 4;
    let [sliding, full, _] = [0, 1, 2].map(|i| cache.layers[i].nbytes());
    assert!(
        sliding <= (256 + 2 * 3) * per_position,
        "{what}: a sliding layer holds {sliding} bytes"
    );
    assert_eq!(full, 512 * per_position, "{what}: the full layer's buffer");
    let len = seq.len();
    assert_eq!(
        cache.truncate(5).unwrap_err().to_string(),
        format!(
            "a sliding-window cache holding positions {}..{len} cannot be cut back to 5: the positions before {} are no longer held",
            cache.layers[0].first_held(),
            cache.layers[0].first_held()
        ),
        "{what}"
    );
    cache.truncate(len - 1).expect("the last window is held");
    assert_eq!(cache.len(), len - 1);
}

#[test]
fn sliding_window_layers_decode_a_long_sequence_in_a_bounded_cache() {
    for n in [1, 2] {
        Ranks::new(n)
            .run_test(long_sequence)
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}
