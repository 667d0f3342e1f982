//! FP8 checkpoints as DeepSeek-V3/R1 and Kimi K2 ship them: `F8_E4M3`
//! weights with a `float32` scale per 128x128 tile (`weight_scale_inv`).
//! The tiny DeepSeek-V3 in that layout (`tests/golden/make_fp8_goldens.py`)
//! gives mlx-lm's logits (its own dequantization) at 1, 2 and 4 ranks in
//! both expert placements, each rank reading about its share; a weight of
//! several tiles reads the same by rows, by columns and whole, and scales
//! of the wrong shape are refused naming both tensors.

use std::path::PathBuf;

use safemlx_dist::checkpoint::{HfDirectory, TensorSource};
use safemlx_dist::launch::Ranks;
use safemlx_dist::models::{load_layout, Layout, LoadOptions, Storage};
use safemlx_dist::nn::ExpertPlacement;
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::host;
use safemlx_dist_tests::models::{check_logits, golden, golden_dir};

#[test]
fn an_fp8_deepseek_v3_gives_mlx_lms_logits_at_one_two_and_four_ranks() {
    let dir = golden_dir("fp8/deepseek-v3");
    for n in [1, 2, 4] {
        Ranks::new(n)
            .run_test(|group| {
                let s = cpu();
                let (prompt, want) = golden(&dir.join("golden.safetensors"), &s);
                let size = std::fs::metadata(dir.join("model.safetensors"))
                    .unwrap()
                    .len();
                for experts in [
                    ExpertPlacement::ExpertParallel,
                    ExpertPlacement::ExpertTensorParallel,
                ] {
                    let what = format!("{}, rank {} of {n}", experts.as_str(), group.rank());
                    let options = LoadOptions {
                        weights: Storage::AsStored,
                        experts,
                        tensor_split: None,
                    };
                    let placed = load_layout(group, &dir, options, &Layout::default(), &s)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    check_logits(&placed.loaded.model, &prompt, &want, &what);
                    // Every weight here is one tile, which a rank reads
                    // whole; the experts are split.
                    let read = placed.loaded.weights.bytes_read() as f64;
                    assert!(
                        read <= size as f64 * (1.0 / n as f64 + 0.5),
                        "{what}: read {read} of {size}"
                    );
                }
            })
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}

/// A directory holding one FP8 weight `w.weight` `[300, 260]` (3 x 3
/// tiles of 128) and its scales of shape `scales`.
fn fp8_dir(tag: &str, scales: [usize; 2]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("safemlx-fp8-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config =
        r#"{"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}"#;
    std::fs::write(dir.join("config.json"), config).unwrap();
    // Bytes 0x30..0x48 cycle: e4m3 values 0.5 .. 2.0 and their negatives.
    let weight: Vec<u8> = (0..300 * 260)
        .map(|i| (0x30 + (i % 24) as u8) | if i % 7 == 0 { 0x80 } else { 0 })
        .collect();
    let count = scales[0] * scales[1];
    let scale: Vec<u8> = (0..count)
        .flat_map(|t| (1.0f32 + t as f32).to_le_bytes())
        .collect();
    let header = format!(
        r#"{{"w.weight":{{"dtype":"F8_E4M3","shape":[300,260],"data_offsets":[0,{}]}},"w.weight_scale_inv":{{"dtype":"F32","shape":[{},{}],"data_offsets":[{},{}]}}}}"#,
        weight.len(),
        scales[0],
        scales[1],
        weight.len(),
        weight.len() + scale.len()
    );
    let mut header = header.into_bytes();
    header.resize(header.len().div_ceil(8) * 8, b' ');
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend(header);
    file.extend(weight);
    file.extend(scale);
    std::fs::write(dir.join("model.safetensors"), file).unwrap();
    dir
}

#[test]
fn an_fp8_weight_of_several_tiles_reads_alike_by_rows_columns_and_whole() {
    let s = cpu();
    let path = fp8_dir("tiles", [3, 3]);
    let dir = HfDirectory::open(&path).expect("opens");
    let whole = host(&TensorSource::read(&dir, "w.weight", &s).unwrap(), &s);
    assert_eq!(whole.len(), 300 * 260);
    // Byte 0x30 is 2^(6 - 7) = 0.5, in tile (0, 0) of scale 1; and with the
    // sign bit (element 0 is a multiple of 7).
    assert_eq!(whole[0], -0.5);
    assert_eq!(whole[1], 0.5625); // 0x31: 0.5 * (1 + 1/8)
                                  // Element (130, 200) is in tile (1, 1), scale 1 + 4 = 5.
    let i = 130 * 260 + 200;
    let byte = 0x30 + (i % 24) as u8;
    let value = 2f32.powi(i32::from(byte >> 3) - 7) * (1.0 + f32::from(byte & 7) / 8.0);
    let sign = if i % 7 == 0 { -1.0 } else { 1.0 };
    assert_eq!(whole[i], sign * value * 5.0);
    let rows = TensorSource::read_rows(&dir, "w.weight", &[(100, 150)], &s);
    let rows = host(&rows.unwrap(), &s);
    assert_eq!(rows, whole[100 * 260..250 * 260]);
    let columns = TensorSource::read_columns(&dir, "w.weight", &[(120, 140)], &s);
    let columns = host(&columns.unwrap(), &s);
    let want: Vec<f32> = (0..300)
        .flat_map(|r| whole[r * 260 + 120..r * 260 + 260].to_vec())
        .collect();
    assert_eq!(columns, want);
    std::fs::remove_dir_all(&path).ok();

    let path = fp8_dir("bad", [2, 3]);
    let dir = HfDirectory::open(&path).expect("opens");
    let error = TensorSource::read(&dir, "w.weight", &s)
        .unwrap_err()
        .to_string();
    assert!(
        error.ends_with("FP8 weight `w.weight` [300, 260] in tiles of 128x128 needs scales `w.weight_scale_inv` of shape [3, 3], not [2, 3]"),
        "{error}"
    );
    std::fs::remove_dir_all(&path).ok();
}
