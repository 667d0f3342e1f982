//! GGUF files: dequantized values equal the `gguf` package's (goldens made
//! by `tests/golden/make_gguf_goldens.py`), partial reads equal slices of
//! the whole, and damaged files are errors that name the file and tensor.

use std::path::{Path, PathBuf};

use safemlx_dist::checkpoint::{GgufFile, SafetensorsFile};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::host;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden/gguf")
        .join(name)
}

const TYPES: [&str; 6] = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"];

#[test]
fn every_type_dequantizes_to_the_gguf_packages_values() {
    let s = cpu();
    let file = GgufFile::open(golden("quants.gguf")).expect("opens");
    assert_eq!(file.version(), 3);
    let want = SafetensorsFile::open(golden("quants-dequantized.safetensors")).expect("golden");
    for name in TYPES {
        let expected = host(&want.read(name, &s).unwrap(), &s);
        let got = file.read(name, &s).unwrap();
        assert_eq!(got.shape(), [4, 64], "{name}");
        assert_eq!(host(&got, &s), expected, "{name}: whole tensor");
        // Rows 1..3, and columns 16..56 of every row (inside blocks of 32).
        let rows = host(&file.read_rows(name, &[(1, 2)], &s).unwrap(), &s);
        assert_eq!(rows, expected[64..192], "{name}: rows");
        let columns = host(&file.read_columns(name, &[(16, 40)], &s).unwrap(), &s);
        let want_columns: Vec<f32> = (0..4)
            .flat_map(|r| expected[r * 64 + 16..r * 64 + 56].to_vec())
            .collect();
        assert_eq!(columns, want_columns, "{name}: columns");
    }
    // A row of Q4_1 is 2 blocks of 20 bytes; two rows were read, then the
    // blocks holding columns 16..56 of 4 rows (2 blocks each).
    let before = file.bytes_read();
    file.read_rows("q4_1", &[(0, 2)], &s).unwrap();
    assert_eq!(file.bytes_read() - before, 2 * 40);
}

/// Random blocks of each K-quant and MXFP4 (and their scales) decode to
/// the `gguf` package's values; Q4_K and Q5_K also as MLX affine weights
/// (groups of 32, 4 and 5 bits), through MLX's own `dequantize`.
#[test]
fn k_quant_and_mxfp4_blocks_decode_to_the_gguf_packages_values() {
    use safemlx_dist::affine::AffineWeight;
    use safemlx_dist::checkpoint::{dequantize, to_affine, GgmlType};
    let s = cpu();
    let blocks = SafetensorsFile::open(golden("kquant-blocks.safetensors")).expect("golden");
    for (name, kind) in [
        ("Q2_K", GgmlType::Q2_K),
        ("Q3_K", GgmlType::Q3_K),
        ("Q4_K", GgmlType::Q4_K),
        ("Q5_K", GgmlType::Q5_K),
        ("Q6_K", GgmlType::Q6_K),
        ("MXFP4", GgmlType::MXFP4),
    ] {
        let bytes = blocks.read(&format!("{name}.bytes"), &s).unwrap();
        let bytes: Vec<u8> = bytes.into_evaluated().unwrap().try_to_vec().unwrap();
        let want = host(&blocks.read(&format!("{name}.values"), &s).unwrap(), &s);
        assert_eq!(dequantize(kind, &bytes), want, "{name}");
        if let Some(bits) = kind.affine_bits() {
            let (words, scales, biases, b) = to_affine(kind, &bytes);
            assert_eq!(b, bits);
            // The 4 blocks as one row of 1024 values.
            let groups = scales.len() as i32;
            let affine = AffineWeight::new(
                safemlx::Array::from_slice(&words, &[1, groups * bits as i32]),
                safemlx::Array::from_slice(&scales, &[1, groups]),
                safemlx::Array::from_slice(&biases, &[1, groups]),
                32,
                bits,
            )
            .unwrap();
            let got = host(&affine.dequantize(&s).unwrap(), &s);
            let worst = got
                .iter()
                .zip(&want)
                .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
            assert!(worst <= 1e-6, "{name} as MLX affine: off by {worst}");
        }
    }
}

/// A copy of `quants.gguf` with `edit` applied to its bytes.
fn damaged(tag: &str, edit: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let mut bytes = std::fs::read(golden("quants.gguf")).unwrap();
    edit(&mut bytes);
    let path = std::env::temp_dir().join(format!("safemlx-gguf-{tag}-{}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    path
}

fn open_error(path: &Path) -> String {
    let error = GgufFile::open(path)
        .expect_err("a damaged file")
        .to_string();
    std::fs::remove_file(path).ok();
    error.replace(&path.display().to_string(), "FILE")
}

/// Where tensor `name`'s entry in the table starts its type field.
fn type_field(bytes: &[u8], name: &str) -> usize {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend(name.as_bytes());
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("the name is in the table");
    at + key.len() + 4 + 2 * 8 // n_dims, two dimensions
}

#[test]
fn damaged_files_name_the_file_and_the_tensor() {
    assert_eq!(
        open_error(&damaged("magic", |b| b[..4].copy_from_slice(b"GGML"))),
        "checkpoint FILE: does not start with GGUF; this is not a GGUF file"
    );
    assert_eq!(
        open_error(&damaged("version", |b| b[4..8].copy_from_slice(&7u32.to_le_bytes()))),
        "checkpoint FILE: is GGUF version 7; versions 2 and 3 are read"
    );
    assert_eq!(
        open_error(&damaged("iq2", |b| {
            let at = type_field(b, "q8_0");
            b[at..at + 4].copy_from_slice(&16u32.to_le_bytes());
        })),
        "checkpoint FILE: tensor `q8_0` has type IQ2_XXS (16), which safemlx-dist does not read; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4"
    );
    // A K-quant's rows are super-blocks of 256 values; these rows hold 64.
    assert_eq!(
        open_error(&damaged("q6k", |b| {
            let at = type_field(b, "q8_0");
            b[at..at + 4].copy_from_slice(&14u32.to_le_bytes());
        })),
        "checkpoint FILE: tensor `q8_0` is Q6_K with rows of 64 values, not a whole number of 256-value blocks"
    );
    let offset = open_error(&damaged("offset", |b| {
        let at = type_field(b, "q4_1") + 4;
        b[at..at + 8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    }));
    assert!(
        offset.starts_with("checkpoint FILE: tensor `q4_1` holds bytes 1048576..1048736 of the data but the file has"),
        "{offset}"
    );
    let overlap = open_error(&damaged("overlap", |b| {
        let at = type_field(b, "q4_1") + 4;
        b[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    }));
    assert!(overlap.contains("overlap in the data"), "{overlap}");
    let truncated = open_error(&damaged("truncated", |b| b.truncate(b.len() - 100)));
    assert!(
        truncated.contains("of the data but the file has") && truncated.contains("truncated"),
        "{truncated}"
    );
    let header = open_error(&damaged("header", |b| b.truncate(40)));
    assert!(
        header.contains("the file is truncated or damaged"),
        "{header}"
    );
    let count = open_error(&damaged("count", |b| {
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes())
    }));
    assert_eq!(
        count,
        "checkpoint FILE: the tensor count is 18446744073709551615, more than a GGUF file holds; the file is damaged"
    );
    let file = GgufFile::open(golden("quants.gguf")).unwrap();
    let missing = file.tensor("token_embd.weight").unwrap_err().to_string();
    assert!(
        missing.ends_with(
            "has no tensor `token_embd.weight`; it has: bf16, f16, f32, q4_0, q4_1, q8_0"
        ),
        "{missing}"
    );
}

#[test]
fn a_model_whose_metadata_disagrees_with_its_tensors_names_the_tensor() {
    let s = cpu();
    let mut bytes = std::fs::read(golden("llama-tied-kv3.gguf")).unwrap();
    // llama.embedding_length 48 -> 36 (6 heads of 6).
    let key = b"llama.embedding_length";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4;
    bytes[at..at + 4].copy_from_slice(&36u32.to_le_bytes());
    let path = std::env::temp_dir().join(format!("safemlx-gguf-meta-{}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let group = safemlx_dist::init(false, safemlx_dist::Backend::Any).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let error = safemlx_dist::models::Llama::from_gguf(&group, file, &s)
        .expect_err("48 columns are not 36")
        .to_string()
        .replace(&path.display().to_string(), "FILE");
    std::fs::remove_file(&path).ok();
    assert_eq!(
        error,
        "model FILE: tensor `token_embd.weight` (model.embed_tokens.weight) has shape [67, 48] but the configuration gives [67, 36]"
    );
}

/// One shape check for every format: a Hugging Face directory, its
/// safetensors file and the same model as a GGUF file name a tensor of
/// another shape than the configuration's alike, the GGUF file by its own
/// name with the Hugging Face name beside it.
#[test]
fn every_format_names_a_tensor_of_another_shape_alike() {
    use safemlx_dist::checkpoint::{HfDirectory, TensorSource, Weights};
    use safemlx_dist::Sharded;
    let s = cpu();
    // Ring: no MPI_Init, which the other test of this binary may be running.
    let group = safemlx_dist::init(false, safemlx_dist::Backend::Ring).unwrap();
    let hf_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/llama/llama-tied-kv3");
    let hf = HfDirectory::open(&hf_path).unwrap();
    let single = SafetensorsFile::open(hf_path.join("model.safetensors")).unwrap();
    let file = GgufFile::open(golden("llama-tied-kv3.gguf")).unwrap();
    let (_, gguf) = safemlx_dist::models::Llama::gguf_weights(file, &s).unwrap();
    let error = |source: &dyn TensorSource| {
        Weights::new(source, &group)
            .pp("model.layers.0.self_attn")
            .get::<Sharded<0>>("k_proj.weight", &[16, 48], &s)
            .expect_err("24 rows are not 16")
            .to_string()
            .replace(&source.path().display().to_string(), "PATH")
    };
    let hf_message = "model PATH: tensor `model.layers.0.self_attn.k_proj.weight` has shape [24, 48] but the configuration gives [16, 48]";
    assert_eq!(error(&hf), hf_message);
    assert_eq!(error(&single), hf_message);
    assert_eq!(
        error(&gguf),
        "model PATH: tensor `blk.0.attn_k.weight` (model.layers.0.self_attn.k_proj.weight) has shape [24, 48] but the configuration gives [16, 48]"
    );
}

/// A copy of the golden `llama-tied-kv3.gguf` with the 4-byte value of
/// metadata key `key` replaced by `value`; its path.
fn patched(key: &str, value: [u8; 4]) -> PathBuf {
    let mut bytes = std::fs::read(golden("llama-tied-kv3.gguf")).unwrap();
    // The key, its value type (4 bytes), then the value.
    let at = bytes
        .windows(key.len())
        .position(|w| w == key.as_bytes())
        .unwrap()
        + key.len()
        + 4;
    bytes[at..at + 4].copy_from_slice(&value);
    let tag = key.replace('.', "-");
    let path = std::env::temp_dir().join(format!("safemlx-gguf-{tag}-{}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// GGUF metadata that cannot run, and tensors the metadata does not
/// describe, are errors naming the key or the tensors.
#[test]
fn gguf_metadata_that_cannot_run_is_named() {
    let s = cpu();
    let group = safemlx_dist::init(false, safemlx_dist::Backend::Ring).unwrap();
    let cases = [
        ("llama.rope.freq_base", 0f32.to_le_bytes(), "llama.rope.freq_base is 0: the RoPE base must be a finite number above 0"),
        ("llama.rope.freq_base", f32::NAN.to_le_bytes(), "llama.rope.freq_base is NaN: the RoPE base must be a finite number above 0"),
        ("llama.attention.layer_norm_rms_epsilon", (-1f32).to_le_bytes(), "llama.attention.layer_norm_rms_epsilon is -1: the RMSNorm epsilon must be above 0 and at most 0.1"),
        ("tokenizer.ggml.eos_token_id", 500u32.to_le_bytes(), "tokenizer.ggml.eos_token_id is 500, outside the vocabulary of 67 tokens"),
        // One layer described, two in the file: blk.1.* is not read.
        ("llama.block_count", 1u32.to_le_bytes(), "has 9 tensors the model does not read (blk.1.attn_k.weight, blk.1.attn_norm.weight, blk.1.attn_output.weight, ...): its metadata describes another model than its tensors"),
    ];
    for (key, value, message) in cases {
        let path = patched(key, value);
        let file = GgufFile::open(&path).unwrap();
        let error = safemlx_dist::models::Llama::from_gguf(&group, file, &s)
            .expect_err("a model that cannot run")
            .to_string()
            .replace(&path.display().to_string(), "FILE");
        std::fs::remove_file(&path).ok();
        assert_eq!(error, format!("model FILE: {message}"), "{key}");
    }
    // llama.rope.dimension_count 4 for heads of 8 (the golden file has no
    // such key: it is added, with a name that keeps the data 32-aligned).
    let mut bytes = std::fs::read(golden("llama-tied-kv3.gguf")).unwrap();
    let kvs = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
    bytes[16..24].copy_from_slice(&(kvs + 2).to_le_bytes());
    let mut added = Vec::new();
    let mut key = |name: &str, kind: u32, value: &[u8]| {
        added.extend_from_slice(&(name.len() as u64).to_le_bytes());
        added.extend_from_slice(name.as_bytes());
        added.extend_from_slice(&kind.to_le_bytes());
        added.extend_from_slice(value);
    };
    key("llama.rope.dimension_count", 4, &4u32.to_le_bytes());
    let name = b"rotating-half-of-heads";
    let mut text = (name.len() as u64).to_le_bytes().to_vec();
    text.extend_from_slice(name);
    key("general.name", 8, &text);
    assert_eq!(added.len() % 32, 0, "the data section keeps its alignment");
    bytes.splice(24..24, added);
    let path = std::env::temp_dir().join(format!("safemlx-gguf-nrot-{}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let error = safemlx_dist::models::Llama::from_gguf(&group, file, &s)
        .expect_err("half of each head rotated")
        .to_string()
        .replace(&path.display().to_string(), "FILE");
    std::fs::remove_file(&path).ok();
    assert_eq!(
        error,
        "model FILE: llama.rope.dimension_count is 4 but the head dimension is 8: rotating part of each head is not supported (llama.cpp refuses it too: \"invalid n_rot\")"
    );
}
