//! A query head two ranks share by rows (`nn::SharedHead`) gives the
//! numbers of one process, with every part of attention it meets: a
//! gpt-oss-layout model (attention sinks, q/k/v/o biases, sliding-window
//! layers of 4 around a full one, YaRN) cut to 3 query heads over 1 KV
//! head, so that 2 ranks hold heads 0..2 and 1..3 and share head 1. The
//! logits of a prompt that outgrows the window, of its last row, and of
//! decoding its last tokens one by one through the cache equal those of
//! the same model in one process (relative error at most 1e-4), on ring
//! and MPI.

use std::path::PathBuf;

use safemlx::ops::indexing::TryIndexOp;
use safemlx::{Array, Stream};
use safemlx_dist::checkpoint::{save, HfDirectory};
use safemlx_dist::launch::{Ranks, RANK_OF_ENV};
use safemlx_dist::models::Llama;
use safemlx_dist::nn::gather_logits;
use safemlx_dist::{Backend, Group};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::host;
use safemlx_dist_tests::models::{check_logits, golden_dir};

const HEADS: usize = 3;
const HEAD_DIM: usize = 16;

/// Where the cut model is written (by the test before it starts ranks).
fn cut_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("shared-head-gpt-oss")
}

/// The tiny float gpt-oss with only its first 3 query heads and first KV
/// head: rows of q, k, v and their biases, columns of o, the sinks.
fn write_cut_model(s: &Stream) {
    let from = golden_dir("moe/gpt-oss-float");
    let dir = cut_dir();
    std::fs::create_dir_all(&dir).expect("a directory for the cut model");
    let tensors = Array::load_safetensors(from.join("model.safetensors"), s).expect("read");
    let (q, kv) = (HEADS * HEAD_DIM, HEAD_DIM);
    let cut: Vec<(String, Array)> = tensors
        .into_iter()
        .map(|(name, a)| {
            let len = |n: usize| 0..n as i32;
            let rows = |n| a.try_index_device(len(n), s).expect("rows");
            let b = match name.rsplit_once("self_attn.").map(|(_, rest)| rest) {
                Some("q_proj.weight" | "q_proj.bias") => rows(q),
                Some("k_proj.weight" | "k_proj.bias" | "v_proj.weight" | "v_proj.bias") => rows(kv),
                Some("o_proj.weight") => a.try_index_device((.., len(q)), s).expect("columns"),
                Some("sinks") => rows(HEADS),
                _ => a,
            };
            (name, b)
        })
        .collect();
    save(dir.join("model.safetensors"), &cut, s).expect("write");
    let config = std::fs::read_to_string(from.join("config.json")).expect("config");
    let mut config: serde_json::Value = serde_json::from_str(&config).expect("json");
    config["num_attention_heads"] = HEADS.into();
    config["num_key_value_heads"] = 1.into();
    std::fs::write(dir.join("config.json"), config.to_string()).expect("write config");
}

fn check(group: &Group) {
    let s = cpu();
    let dir = HfDirectory::open(cut_dir()).expect("the cut model");
    let model = Llama::from_hf(group, &dir, &s).expect("load");
    let split = model.head_split().expect("a layer");
    let what = format!("rank {} of {}", group.rank(), group.size());
    if group.size() == 2 {
        let shared = split.shared.expect("a shared head");
        assert_eq!(
            (shared.head, shared.owner),
            (1, group.rank() == 0),
            "{what}"
        );
        let query = [(0, 2), (1, 2)][group.rank()];
        assert_eq!(split.query, query, "{what}: query heads");
        assert!(
            model.holds().contains("(head 1 shared by rows)"),
            "{what}: {}",
            model.holds()
        );
    }
    // The same model in one process.
    let one = Llama::from_hf(&Group::local(), &dir, &s).expect("load in one process");
    let prompt: Vec<u32> = (0..11).map(|i| (i * 37 + 5) % 320).collect();
    let mut cache = one.new_cache();
    let logits = one.forward(&prompt, &mut cache, &s).expect("forward");
    let want = host(
        gather_logits(&logits, 0..prompt.len(), &s)
            .expect("gather")
            .local(),
        &s,
    );
    check_logits(&model, &prompt, &want, &what);
}

#[test]
fn a_head_shared_by_rows_equals_one_process_on_ring_and_mpi() {
    // The test writes the model once; its ranks (this test re-run) read it.
    if std::env::var_os(RANK_OF_ENV).is_none() {
        write_cut_model(&cpu());
    }
    for backend in [Backend::Ring, Backend::Mpi] {
        Ranks::new(2)
            .backend(backend)
            .run_test(check)
            .unwrap_or_else(|e| panic!("2 {backend:?} ranks: {e}"));
    }
}
