//! A server's slot cache (`Llama::forward_last_slots` on `nn::SlotCache`):
//! each sequence's last logits equal those of running it alone on its own
//! cache, at 1 to 4 ranks, for a dense Llama with 3 KV heads, Qwen3's q/k
//! norms, Phi-3's fused tensors, Mixtral's experts, GLM-4-MoE's partial
//! rotation, sliding windows of 3 (Llama) and 4 (gpt-oss, with its
//! attention sinks) that the sequences outgrow, and DeepSeek-V3's latent
//! attention (with and without a query latent, YaRN): prompt blocks in two
//! slots, then single tokens out of slot order with a new sequence's block
//! among them, then a slot cut back and continued.

use safemlx::Stream;
use safemlx_dist::checkpoint::HfDirectory;
use safemlx_dist::launch::Ranks;
use safemlx_dist::models::Llama;
use safemlx_dist::nn::{gather_logits, KvCache, SlotCache};
use safemlx_dist::Group;
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{host, max_relative_error};
use safemlx_dist_tests::models::{golden, golden_dir as dir};

const CASES: [&str; 9] = [
    "llama/llama-tied-kv3",
    "llama/llama-window",
    "llama/qwen3-qknorm",
    "llama/phi3-fused",
    "moe/mixtral",
    "moe/glm4-moe",
    "moe/gpt-oss",
    "moe/deepseek-v3",
    "moe/deepseek-v3-lite",
];

/// The last row of logits of `tokens` run alone on `cache`.
fn alone(model: &Llama, tokens: &[u32], cache: &mut KvCache, s: &Stream) -> Vec<f32> {
    let logits = model.forward_last(tokens, cache, s).expect("forward alone");
    host(gather_logits(&logits, 0..1, s).expect("gather").local(), s)
}

/// One step on the slots: each sequence's last row, in batch order.
fn on_slots(
    model: &Llama,
    batch: &[(usize, &[u32])],
    slots: &mut SlotCache,
    s: &Stream,
) -> Vec<f32> {
    let logits = model
        .forward_last_slots(batch, slots, s)
        .expect("forward_last_slots");
    assert_eq!(logits.global_shape()[0] as usize, batch.len());
    host(
        gather_logits(&logits, 0..batch.len(), s)
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
        let (p, _) = golden(&dir(case).join("golden.safetensors"), &s);
        let mut slots = model.new_slots(3);
        let mut caches = [model.new_cache(), model.new_cache(), model.new_cache()];
        let close = |got: &[f32], want: &[f32], step: &str| {
            let err = max_relative_error(got, want);
            assert!(err <= 1e-4, "{what}: {step}: relative error {err}");
        };
        // Two prompts of 5 and 4 tokens in slots 0 and 2.
        let got = on_slots(&model, &[(0, &p[..5]), (2, &p[2..6])], &mut slots, &s);
        let mut want = alone(&model, &p[..5], &mut caches[0], &s);
        want.extend(alone(&model, &p[2..6], &mut caches[2], &s));
        close(&got, &want, "two prompt blocks");
        assert_eq!((slots.len(0), slots.len(1), slots.len(2)), (5, 0, 4));
        // Single tokens out of slot order at different positions (each
        // sees only its own slot's), a new sequence's block between.
        let batch: [(usize, &[u32]); 3] = [(2, &p[6..7]), (1, &p[..3]), (0, &p[5..6])];
        let got = on_slots(&model, &batch, &mut slots, &s);
        let mut want = alone(&model, &p[6..7], &mut caches[2], &s);
        want.extend(alone(&model, &p[..3], &mut caches[1], &s));
        want.extend(alone(&model, &p[5..6], &mut caches[0], &s));
        close(&got, &want, "single tokens around a block");
        // Slot 0 cut back to 2 positions continues as a fresh sequence of
        // the same first 2 tokens would.
        slots.truncate(0, 2);
        let got = on_slots(&model, &[(0, &p[2..4])], &mut slots, &s);
        let want = alone(&model, &p[..4], &mut model.new_cache(), &s);
        close(&got, &want, "a cut-back slot");
    }
}

#[test]
fn slot_logits_equal_each_sequence_alone_at_1_to_4_ranks() {
    for n in 1..=4 {
        Ranks::new(n)
            .run_test(check)
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}
