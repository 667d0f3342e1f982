//! A batch of sequences of different lengths at their own positions, in
//! one forward pass: every sequence's logits equal those of running it
//! alone, for dense, Phi-3 and MoE models (GLM-4-MoE's partial RoPE, DeepSeek-V3's latent
//! attention too) at 1 to 4 ranks (the property
//! continuous batching relies on), on one cache per sequence (the slot
//! cache's equivalent is `slots.rs`); a truncated cache continues as a
//! fresh one would; and the batch's errors, slot batches' too, name the
//! sequence.

use safemlx::Stream;
use safemlx_dist::checkpoint::HfDirectory;
use safemlx_dist::launch::Ranks;
use safemlx_dist::models::Llama;
use safemlx_dist::nn::{gather_logits, KvCache};
use safemlx_dist::Group;
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{host, max_relative_error};
use safemlx_dist_tests::models::{golden, golden_dir as dir};

/// Golden models: Llama with 3 KV heads, Qwen3's q/k norms, Phi-3's fused
/// tensors, Mixtral's experts, GLM-4-MoE's partial rotation, YaRN's
/// scaled rotation, DeepSeek-V3's latent attention (its latent cache),
/// gpt-oss's sinks and sliding windows (a sequence past its window).
const CASES: [&str; 8] = [
    "llama/llama-tied-kv3",
    "llama/qwen3-qknorm",
    "llama/qwen3-yarn",
    "llama/phi3-fused",
    "moe/mixtral",
    "moe/glm4-moe",
    "moe/deepseek-v3",
    "moe/gpt-oss",
];

/// Full logits rows of `tokens` run alone on `cache`.
fn alone(model: &Llama, tokens: &[u32], cache: &mut KvCache, s: &Stream) -> Vec<f32> {
    let logits = model.forward(tokens, cache, s).expect("forward alone");
    host(
        gather_logits(&logits, 0..tokens.len(), s)
            .expect("gather")
            .local(),
        s,
    )
}

fn check(group: &Group) {
    let s = cpu();
    for case in CASES {
        let model = Llama::from_hf(group, &HfDirectory::open(dir(case)).unwrap(), &s).unwrap();
        let what = format!("{case} at {} ranks", group.size());
        let (prompt, _) = golden(&dir(case).join("golden.safetensors"), &s);
        // A whole prompt, another prompt, and a prompt continued after 3
        // tokens cached alone.
        let (a, b, c) = (&prompt[..], &prompt[2..7], &prompt[3..7]);
        let mut alone_caches = [model.new_cache(), model.new_cache(), model.new_cache()];
        let mut caches = [model.new_cache(), model.new_cache(), model.new_cache()];
        model
            .forward(&prompt[..3], &mut alone_caches[2], &s)
            .unwrap();
        model.forward(&prompt[..3], &mut caches[2], &s).unwrap();
        let mut want = Vec::new();
        for (tokens, cache) in [a, b, c].into_iter().zip(alone_caches.iter_mut()) {
            want.extend(alone(&model, tokens, cache, &s));
        }
        let [ca, cb, cc] = &mut caches;
        let rows = a.len() + b.len() + c.len();
        let logits = model
            .forward_batch(&mut [(a, ca), (b, cb), (c, cc)], &s)
            .expect("forward_batch");
        let got = host(gather_logits(&logits, 0..rows, &s).unwrap().local(), &s);
        let err = max_relative_error(&got, &want);
        assert!(err <= 1e-4, "{what}: batched prompts' relative error {err}");
        let lengths: Vec<usize> = caches.iter().map(KvCache::len).collect();
        assert_eq!(
            lengths,
            [a.len(), 5, 7],
            "{what}: each sequence's positions"
        );
        // A decode step of the three together, each at its own position.
        let next = [[prompt[8]], [prompt[7]], [prompt[7]]];
        let mut want = Vec::new();
        for (token, cache) in next.iter().zip(alone_caches.iter_mut()) {
            want.extend(alone(&model, token, cache, &s));
        }
        let [ca, cb, cc] = &mut caches;
        let last = model
            .forward_last_batch(&mut [(&next[0], ca), (&next[1], cb), (&next[2], cc)], &s)
            .expect("forward_last_batch");
        assert_eq!(last.global_shape()[0], 3, "{what}: one row per sequence");
        let got = host(gather_logits(&last, 0..3, &s).unwrap().local(), &s);
        let err = max_relative_error(&got, &want);
        assert!(err <= 1e-4, "{what}: batched decode relative error {err}");
        // A cache cut back to its first 2 positions continues as if only
        // they had been fed (a server reusing a finished sequence's prefix).
        let [_, cb, _] = &mut caches;
        cb.truncate(2).expect("holds the positions");
        assert_eq!(cb.len(), 2, "{what}: the truncated cache's positions");
        let got = alone(&model, &prompt[..3], cb, &s);
        let mut fresh = model.new_cache();
        model.forward(&prompt[2..4], &mut fresh, &s).unwrap();
        let want = alone(&model, &prompt[..3], &mut fresh, &s);
        let err = max_relative_error(&got, &want);
        assert!(
            err <= 1e-4,
            "{what}: after truncation, relative error {err}"
        );
    }
}

#[test]
fn a_batch_gives_each_sequence_its_logits_alone_at_1_to_4_ranks() {
    for n in 1..=4 {
        Ranks::new(n)
            .run_test(check)
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}

#[test]
fn a_bad_batch_names_the_sequence() {
    Ranks::new(1)
        .run_test(|group| {
            let s = cpu();
            let model =
                Llama::from_hf(group, &HfDirectory::open(dir(CASES[0])).unwrap(), &s).unwrap();
            let error = |batch: &mut [(&[u32], &mut KvCache)]| {
                model.forward_batch(batch, &s).unwrap_err().to_string()
            };
            assert_eq!(error(&mut []), "the model got no sequences");
            let (mut one, mut two) = (model.new_cache(), model.new_cache());
            assert_eq!(
                error(&mut [(&[1, 2], &mut one), (&[], &mut two)]),
                "sequence 1 of the batch has no tokens"
            );
            let mut slots = model.new_slots(2);
            let slot_error = |batch: &[(usize, &[u32])], slots: &mut safemlx_dist::nn::SlotCache| {
                model.forward_last_slots(batch, slots, &s).unwrap_err().to_string()
            };
            assert_eq!(
                slot_error(&[(2, &[1])], &mut slots),
                "sequence 0 of the batch names slot 2 of 2"
            );
            assert_eq!(
                slot_error(&[(1, &[1]), (1, &[2])], &mut slots),
                "sequence 1 of the batch names slot 1 again"
            );
            assert_eq!(
                slot_error(&[(0, &[1]), (1, &[])], &mut slots),
                "sequence 1 of the batch has no tokens"
            );
            let mut short = KvCache::new(1);
            assert_eq!(
                error(&mut [(&[1], &mut short)]),
                "sequence 0 of the batch has a cache of 1 layers for a model of 2; make it with `new_cache()`"
            );
        })
        .unwrap();
}
