//! Kimi K2's layout (`tests/golden/make_kimi_goldens.py`): `model_type`
//! `kimi_k2` reads as DeepSeek-V3 (its logits are the tiny DeepSeek-V3's,
//! mlx-lm's goldens, at 1 and 2 ranks), and its tiktoken vocabulary
//! (`tiktoken.model`, no tokenizer.json) encodes every text to the ids
//! OpenAI's `tiktoken` gives with Kimi's split pattern (Han runs, cased
//! words, digits by three, trailing spaces, special tokens) and decodes
//! them back.

use safemlx_dist::launch::Ranks;
use safemlx_dist::models::{load_layout, Layout, LoadOptions, Storage};
use safemlx_dist::tokenizer::Tokenizer;
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::models::{check_logits, golden, golden_dir};

#[test]
fn kimis_tiktoken_vocabulary_gives_tiktokens_ids() {
    let dir = golden_dir("kimi/kimi-k2");
    let tokenizer = Tokenizer::from_hf_dir(&dir).expect("builds");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokens.json")).unwrap()).unwrap();
    let texts = golden["texts"].as_array().unwrap();
    for (text, ids) in texts.iter().zip(golden["ids"].as_array().unwrap()) {
        let text = text.as_str().unwrap();
        let want: Vec<u32> = ids
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as u32)
            .collect();
        let got = tokenizer.encode(text).unwrap();
        assert_eq!(got, want, "{text:?}");
        assert_eq!(tokenizer.decode(&got, false).unwrap(), text, "{text:?}");
    }
}

#[test]
fn kimi_k2_reads_as_deepseek_v3_at_one_and_two_ranks() {
    let dir = golden_dir("kimi/kimi-k2");
    for n in [1, 2] {
        Ranks::new(n)
            .run_test(|group| {
                let s = cpu();
                let (prompt, want) = golden(&dir.join("golden.safetensors"), &s);
                let options = LoadOptions {
                    weights: Storage::AsStored,
                    ..LoadOptions::default()
                };
                let placed =
                    load_layout(group, &dir, options, &Layout::default(), &s).expect("loads");
                let what = format!("rank {} of {n}", group.rank());
                check_logits(&placed.loaded.model, &prompt, &want, &what);
            })
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}
