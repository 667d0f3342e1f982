//! 16-bit checkpoints split over ranks: bfloat16 copies of the MoE
//! families' golden models (gpt-oss as OpenAI releases it, float32 sinks,
//! norms and biases beside bfloat16 weights and MXFP4 experts) give, at 2,
//! 3 and 4 ranks in both expert placements, finite logits within
//! bfloat16's bound (`--check`'s) of one bfloat16 process. The float32
//! sinks made MLX's attention fail ("Type of sinks must promote to output
//! type bfloat16"); ranks that rounded their partial sums to bfloat16
//! before adding them were up to 0.23 (DeepSeek-V3, 4 ranks) from one
//! process, where partial sums kept in float32 until they are summed
//! stay below 0.03.

use std::path::{Path, PathBuf};

use safemlx::Dtype;
use safemlx_dist::checkpoint::HfDirectory;
use safemlx_dist::launch::Ranks;
use safemlx_dist::models::{load_layout, Layout, LoadOptions, Storage};
use safemlx_dist::nn::{gather_logits, ExpertPlacement};
use safemlx_dist::Group;
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{host, max_relative_error};
use safemlx_dist_tests::models::golden;

fn golden_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden/moe")
        .join(name)
}

/// Whether tensor `name` stays float32 in the mixed copy: what OpenAI's
/// release keeps in float32 beside bfloat16 (sinks), and the small vectors
/// other releases keep so (norms, biases).
fn stays_float32(mixed: bool, name: &str) -> bool {
    mixed && (name.ends_with("sinks") || name.ends_with("norm.weight") || name.ends_with(".bias"))
}

/// Rank 0 writes the mixed copy; every rank waits for it and gets its path.
fn mixed_dir(group: &Group, model: &str, mixed: bool) -> PathBuf {
    let s = cpu();
    let dir = std::env::temp_dir().join(format!(
        "safemlx-mixed-{model}-{}-{}",
        group.size(),
        std::os::unix::process::parent_id()
    ));
    if group.rank() == 0 {
        std::fs::create_dir_all(&dir).unwrap();
        let source = HfDirectory::open(golden_dir(model)).expect("opens");
        let mut tensors = Vec::new();
        for name in source.names() {
            // As stored: the MXFP4 experts' blocks and scales stay bytes.
            let array = source.read(name, &s).expect("reads");
            let array = match source.info(name).expect("info").dtype {
                Dtype::Float32 if !stays_float32(mixed, name) => {
                    array.as_dtype(Dtype::Bfloat16, &s).unwrap()
                }
                _ => array,
            };
            tensors.push((name.to_owned(), array));
        }
        safemlx_dist::checkpoint::save(dir.join("model.safetensors"), &tensors, &s).unwrap();
        for file in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
            if golden_dir(model).join(file).exists() {
                std::fs::copy(golden_dir(model).join(file), dir.join(file)).unwrap();
            }
        }
    }
    let token = safemlx_dist::all_sum(&safemlx::Array::from_f32(1.0), group, &s).unwrap();
    safemlx_dist::eval(&[&token]).unwrap();
    dir
}

/// The golden models copied to bfloat16, and whether the copy keeps
/// gpt-oss's float32 tensors.
const MODELS: [(&str, bool); 5] = [
    ("gpt-oss", true),
    ("deepseek-v3", false),
    ("glm4-moe", false),
    ("qwen3-moe", false),
    ("mixtral", false),
];

/// The prompt's logits of `dir` loaded as stored over `group`.
fn logits_of(group: &Group, dir: &Path, experts: ExpertPlacement, prompt: &[u32]) -> Vec<f32> {
    let s = cpu();
    let options = LoadOptions {
        weights: Storage::AsStored,
        experts,
        tensor_split: None,
    };
    let placed = load_layout(group, dir, options, &Layout::default(), &s)
        .unwrap_or_else(|e| panic!("{}: {e}", experts.as_str()));
    let model = &placed.loaded.model;
    let logits = model
        .forward(prompt, &mut model.new_cache(), &s)
        .unwrap_or_else(|e| panic!("{}: {e}", experts.as_str()));
    let full = gather_logits(&logits, 0..prompt.len(), &s).expect("gathers");
    host(full.local(), &s)
}

#[test]
fn bfloat16_at_two_to_four_ranks_stays_within_bfloat16_rounding_of_one_process() {
    let bound = safemlx_dist::generate::check::bound_for(Dtype::Bfloat16);
    for n in [2, 3, 4] {
        Ranks::new(n)
            .run_test(|group| {
                let s = cpu();
                for (model, mixed) in MODELS {
                    let dir = mixed_dir(group, model, mixed);
                    let (prompt, want) = golden(&golden_dir(model).join("golden.safetensors"), &s);
                    // The whole model in this one process: what a split
                    // run must stay within bfloat16 rounding of.
                    let one = logits_of(
                        &Group::local(),
                        &dir,
                        ExpertPlacement::ExpertParallel,
                        &prompt,
                    );
                    let err = max_relative_error(&one, &want);
                    // The same model as mlx-lm's float32 goldens, with its
                    // weights and activations rounded to bfloat16.
                    assert!(
                        err < 0.25 && err > 1e-6,
                        "{model}, one process: relative error {err} to float32"
                    );
                    for experts in [
                        ExpertPlacement::ExpertParallel,
                        ExpertPlacement::ExpertTensorParallel,
                    ] {
                        let what = format!("{model}, {}, {n} ranks", experts.as_str());
                        let got = logits_of(group, &dir, experts, &prompt);
                        assert!(got.iter().all(|v| v.is_finite()), "{what}: not finite");
                        let err = max_relative_error(&got, &one);
                        assert!(
                            err <= bound,
                            "{what}: relative error {err} to one process (bound {bound})"
                        );
                    }
                    let done = safemlx_dist::all_sum(&safemlx::Array::from_f32(1.0), group, &s);
                    safemlx_dist::eval(&[&done.unwrap()]).unwrap();
                    if group.rank() == 0 {
                        std::fs::remove_dir_all(&dir).ok();
                    }
                }
            })
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}
