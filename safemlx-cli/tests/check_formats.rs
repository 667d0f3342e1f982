//! `safemlx generate --check` on the formats people download, split over
//! ranks: a bfloat16 checkpoint (the tiny DeepSeek-V3 of the goldens,
//! latent attention and a shared expert, copied to bfloat16) and
//! mlx-community MoE directories made by `mlx_lm.convert -q` (loaded as
//! stored: the experts stay quantized; gpt-oss's in MXFP4) and GGUF
//! K-quants made by llama.cpp (Q4_K_M; Mixtral and DeepSeek-V3 GGUFs with
//! stacked experts, gpt-oss with MXFP4 experts; a Phi-4-mini GGUF), and
//! DeepSeek's FP8 release layout, in both expert placements, as pipeline
//! stages and with a weighted split. The check states the dtype's bound
//! and passes: the logits stay within it of one process and the greedy
//! tokens agree (or part only at a near-tie of one process).

use std::path::{Path, PathBuf};
use std::process::Command;

use safemlx::{Device, DeviceType, Dtype, Stream};
use safemlx_dist::checkpoint::HfDirectory;

/// The golden DeepSeek-V3 with every float32 tensor stored as bfloat16.
fn bfloat16_copy() -> PathBuf {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/moe/deepseek-v3");
    let dir = std::env::temp_dir().join(format!("safemlx-check-bf16-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let s = Stream::new_with_device(&Device::new(DeviceType::Cpu, 0));
    let source = HfDirectory::open(&golden).expect("opens");
    let tensors: Vec<_> = source
        .names()
        .map(|name| {
            let array = source.read(name, &s).expect("reads");
            (
                name.to_owned(),
                array.as_dtype(Dtype::Bfloat16, &s).unwrap(),
            )
        })
        .collect();
    safemlx_dist::checkpoint::save(dir.join("model.safetensors"), &tensors, &s).unwrap();
    for file in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(golden.join(file), dir.join(file)).unwrap();
    }
    dir
}

/// `safemlx-launch -n RANKS -- safemlx generate --model DIR ARGS --check`:
/// its output, after checking it succeeded and printed the check's line
/// with `bound`.
fn check(dir: &Path, ranks: &str, args: &[&str], bound: &str) -> String {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_safemlx"));
    let out = Command::new(exe.with_file_name("safemlx-launch"))
        .args(["-n", ranks, "--timeout", "300", "--"])
        .arg(&exe)
        .args(["generate", "--model"])
        .arg(dir)
        .args([
            "--prompt",
            "The capital of France is",
            "--raw",
            "--max-tokens",
            "8",
        ])
        .args(["--weights", "as-stored", "--check"])
        .args(args)
        .output()
        .expect("safemlx-launch");
    let all =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let what = format!("{ranks} ranks, {args:?}");
    assert!(out.status.success(), "{what}: {all}");
    assert!(
        all.contains(" --check against one process ("),
        "{what}: {all}"
    );
    assert!(
        all.contains(&format!("({bound}); greedy tokens agree")),
        "{what}: {all}"
    );
    all
}

#[test]
fn generate_check_on_bfloat16_passes_at_two_and_four_ranks_with_its_bound() {
    let dir = bfloat16_copy();
    for (ranks, experts) in [("2", "parallel"), ("4", "tensor-parallel")] {
        check(
            &dir,
            ranks,
            &["--experts", experts],
            "bound 5e-2 for bfloat16",
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn generate_check_on_mlx_community_moe_passes_split_every_way() {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/mlx-community");
    let float32 = "bound 1e-4 for float32";
    let qwen3 = golden.join("qwen3-moe-4bit");
    for (ranks, args) in [
        ("2", &["--experts", "parallel"][..]),
        ("4", &["--experts", "tensor-parallel"]),
        ("2", &["--mesh", "pp=2"]),
        ("4", &["--mesh", "pp=2,tp=2"]),
    ] {
        let out = check(&qwen3, ranks, args, float32);
        if args[1] == "parallel" {
            assert!(
                out.contains(
                    "keeping the 4-bit affine (groups of 64) experts of 2 layers as stored"
                ),
                "{out}"
            );
        }
    }
    let mixtral = golden.join("mixtral-8bit");
    let args = ["--experts", "tensor-parallel", "--tensor-split", "3:1"];
    let out = check(&mixtral, "2", &args, float32);
    assert!(
        out.contains("keeping the 8-bit affine (groups of 32) experts of 2 layers as stored"),
        "{out}"
    );
    // gpt-oss as mlx-lm converts OpenAI's release: MXFP4 experts kept as
    // stored, attention 4-bit affine, split over experts' hidden blocks.
    let gpt_oss = golden.join("gpt-oss-mxfp4-q4");
    let out = check(&gpt_oss, "2", &["--experts", "tensor-parallel"], float32);
    assert!(
        out.contains("keeping the MXFP4 experts of 3 layers as stored"),
        "{out}"
    );
}

#[test]
fn generate_check_on_llama_cpp_k_quants_passes_split_and_staged() {
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/gguf");
    let file = gguf.join("kquant-Q4_K_M.gguf");
    for (ranks, args) in [("2", &[][..]), ("4", &["--mesh", "pp=2,tp=2"])] {
        let out = check(&file, ranks, args, "bound 1e-4 for float32");
        assert!(
            out.contains("dequantizing 3 Q6_K tensors (e.g. `blk.1.attn_v.weight`) to float32 as they are read"),
            "{out}"
        );
    }
}

#[test]
fn generate_check_on_llama_cpp_moe_files_passes_split_every_way() {
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/gguf");
    let cases = [
        (
            "moe-mixtral-Q4_K_M.gguf",
            "4-bit affine (groups of 32) experts of 2 layers",
        ),
        (
            "moe-deepseek2-Q8_0.gguf",
            "8-bit affine (groups of 32) experts of 1 layers",
        ),
        ("gpt-oss-MXFP4_MOE.gguf", "MXFP4 experts of 2 layers"),
    ];
    for (name, kept) in cases {
        for (ranks, experts) in [("2", "tensor-parallel"), ("4", "parallel")] {
            let out = check(
                &gguf.join(name),
                ranks,
                &["--experts", experts],
                "bound 1e-4 for float32",
            );
            assert!(
                out.contains(&format!("keeping the {kept} as stored")),
                "{out}"
            );
        }
    }
    // As pipeline stages, and stages of 2 ranks splitting the experts.
    let mixtral = gguf.join("moe-mixtral-Q4_K_M.gguf");
    for (ranks, mesh) in [("2", "pp=2"), ("4", "pp=2,tp=2")] {
        check(&mixtral, ranks, &["--mesh", mesh], "bound 1e-4 for float32");
    }
}

#[test]
fn generate_check_on_a_llama_cpp_phi4_mini_passes_split_and_staged() {
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/gguf");
    let file = gguf.join("phi4-mini-Q4_K_M.gguf");
    for (ranks, args) in [("2", &[][..]), ("4", &["--mesh", "pp=2,tp=2"])] {
        check(&file, ranks, args, "bound 1e-4 for float32");
    }
}

#[test]
fn generate_check_on_an_fp8_deepseek_v3_passes_in_both_placements() {
    let fp8 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/fp8/deepseek-v3");
    for (ranks, experts) in [("2", "parallel"), ("4", "tensor-parallel")] {
        check(
            &fp8,
            ranks,
            &["--experts", experts],
            "bound 1e-4 for float32",
        );
    }
}
