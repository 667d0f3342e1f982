//! The training example's data and model: a corpus of short sentences
//! from a fixed grammar and a small random Llama (tied embeddings, 8 query
//! and 4 KV heads, a byte vocabulary) written as a Hugging Face directory.

use std::path::Path;

use safemlx::{Array, Stream};
use safemlx_dist::checkpoint::save;
use safemlx_dist::Group;

use crate::weights;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The vocabulary: bytes.
pub const VOCAB: i32 = 256;
/// Query heads.
pub const HEADS: i32 = 8;
/// KV heads.
pub const KV_HEADS: i32 = 4;

/// The model's size: width, MLP hidden width, layers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Size {
    /// Model width.
    pub dim: i32,
    /// MLP hidden width.
    pub hidden: i32,
    /// Layers.
    pub layers: i32,
}

/// The corpus: short English sentences from a fixed grammar, the same on
/// every rank and run.
pub fn corpus() -> Vec<u8> {
    let subjects = ["the cat", "a dog", "the bird", "my friend", "the child"];
    let verbs = ["sees", "likes", "follows", "finds", "helps"];
    let objects = ["the ball", "a tree", "the house", "the river", "a book"];
    let mut text = String::new();
    let mut state: u64 = 7;
    let mut next = |n: usize| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        (state >> 33) as usize % n
    };
    while text.len() < 20_000 {
        let (s, v, o) = (next(5), next(5), next(5));
        text.push_str(&format!("{} {} {}. ", subjects[s], verbs[v], objects[o]));
    }
    text.into_bytes()
}

/// Rank 0 writes the random model to `dir` unless it is there; every rank
/// then waits for it (a barrier).
pub fn write_model(dir: &Path, size: Size, group: &Group, s: &Stream) -> Result<(), String> {
    let Size {
        dim,
        hidden,
        layers,
    } = size;
    if group.rank() == 0 && !dir.join("model.safetensors").exists() {
        std::fs::create_dir_all(dir).map_err(err)?;
        let config = serde_json::json!({
            "model_type": "llama",
            "vocab_size": VOCAB,
            "hidden_size": dim,
            "intermediate_size": hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "max_position_embeddings": 1024,
            "tie_word_embeddings": true,
            "torch_dtype": "float32",
        });
        std::fs::write(dir.join("config.json"), config.to_string()).map_err(err)?;
        let hd = dim / HEADS;
        let mut tensors: Vec<(String, Array)> = vec![
            (
                "model.embed_tokens.weight".into(),
                weights(&[VOCAB, dim], 1, 0.1),
            ),
            (
                "model.norm.weight".into(),
                Array::from_slice(&vec![1.0f32; dim as usize], &[dim]),
            ),
        ];
        for l in 0..layers {
            let p = |name: &str| format!("model.layers.{l}.{name}");
            let seed = 100 * (l as u64 + 1);
            let ones = || Array::from_slice(&vec![1.0f32; dim as usize], &[dim]);
            tensors.extend([
                (p("input_layernorm.weight"), ones()),
                (p("post_attention_layernorm.weight"), ones()),
                (
                    p("self_attn.q_proj.weight"),
                    weights(&[HEADS * hd, dim], seed + 1, 0.15),
                ),
                (
                    p("self_attn.k_proj.weight"),
                    weights(&[KV_HEADS * hd, dim], seed + 2, 0.15),
                ),
                (
                    p("self_attn.v_proj.weight"),
                    weights(&[KV_HEADS * hd, dim], seed + 3, 0.15),
                ),
                (
                    p("self_attn.o_proj.weight"),
                    weights(&[dim, HEADS * hd], seed + 4, 0.15),
                ),
                (
                    p("mlp.gate_proj.weight"),
                    weights(&[hidden, dim], seed + 5, 0.15),
                ),
                (
                    p("mlp.up_proj.weight"),
                    weights(&[hidden, dim], seed + 6, 0.15),
                ),
                (
                    p("mlp.down_proj.weight"),
                    weights(&[dim, hidden], seed + 7, 0.1),
                ),
            ]);
        }
        save(dir.join("model.safetensors"), &tensors, s).map_err(err)?;
        println!(
            "rank 0: wrote a random {layers}-layer model (width {dim}, MLP {hidden}) to {}",
            dir.display()
        );
    }
    let done = safemlx_dist::all_sum(&Array::from_f32(1.0), group, s).map_err(err)?;
    safemlx_dist::eval(&[&done]).map_err(err)
}
