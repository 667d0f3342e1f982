//! Safetensors files: every dtype round-trips, files interoperate with
//! MLX's own reader and writer, bad and damaged files get errors that name
//! the file and the tensor. Loading shards between ranks is tested in
//! `checkpoint_shards.rs`.

use std::path::PathBuf;

use safemlx::{Array, Dtype};
use safemlx_dist::checkpoint::{save, SafetensorsFile};
use safemlx_dist_tests::dense::host_bytes;
use safemlx_dist_tests::{cpu, temp_safetensors};

#[test]
fn every_dtype_round_trips_and_mlx_reads_the_file() {
    let s = cpu();
    let f32s = Array::from_slice(&[1.5f32, -2.0, 3.25, 0.0, 7.0, -8.5], &[2, 3]);
    let tensors = vec![
        ("a.f32", f32s.clone()),
        ("b.f16", f32s.as_dtype(Dtype::Float16, &s).unwrap()),
        ("c.bf16", f32s.as_dtype(Dtype::Bfloat16, &s).unwrap()),
        ("d.i32", Array::from_slice(&[1i32, -2, 3, 4], &[2, 2, 1])),
        ("e.u8", Array::from_slice(&[7u8, 8, 9], &[3])),
        ("f.i64", Array::from_slice(&[-5i64], &[])),
        ("g.bool", Array::from_slice(&[true, false], &[2])),
    ];
    let path = temp_safetensors("dtypes");
    save(&path, &tensors, &s).expect("save");
    let checkpoint = SafetensorsFile::open(&path).expect("open");
    let names: Vec<&str> = checkpoint.names().collect();
    assert_eq!(names, tensors.iter().map(|t| t.0).collect::<Vec<_>>());
    for (name, want) in &tensors {
        let info = checkpoint.info(name).unwrap();
        assert_eq!(
            (info.dtype, info.shape.as_slice()),
            (want.dtype(), want.shape()),
            "{name}"
        );
        let got = checkpoint.read(name, &s).expect("read");
        assert_eq!(
            (got.dtype(), got.shape()),
            (want.dtype(), want.shape()),
            "{name}"
        );
        assert_eq!(host_bytes(&got, &s), host_bytes(want, &s), "{name}");
    }
    let total: u64 = tensors.iter().map(|(_, a)| a.nbytes() as u64).sum();
    assert_eq!(checkpoint.bytes_read(), total);

    // MLX's own reader agrees on every tensor.
    let native = Array::load_safetensors(&path, &s).expect("MLX reads our file");
    for (name, want) in &tensors {
        assert_eq!(
            host_bytes(&native[*name], &s),
            host_bytes(want, &s),
            "{name} via MLX"
        );
    }
    // And we read what MLX writes.
    let mlx_path = temp_safetensors("written-by-mlx");
    let map: std::collections::HashMap<String, Array> = tensors
        .iter()
        .map(|(n, a)| ((*n).to_owned(), a.clone()))
        .collect();
    Array::save_safetensors(&map, None, &mlx_path).expect("MLX writes");
    let theirs = SafetensorsFile::open(&mlx_path).expect("open MLX's file");
    for (name, want) in &tensors {
        assert_eq!(
            host_bytes(&theirs.read(name, &s).unwrap(), &s),
            host_bytes(want, &s),
            "{name} from MLX"
        );
    }
    std::fs::remove_file(&path).ok();
    std::fs::remove_file(&mlx_path).ok();
}

/// A file with this header and `data` bytes after it.
fn crafted(name: &str, header: &str, data: usize) -> PathBuf {
    let path = temp_safetensors(name);
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend(std::iter::repeat_n(0u8, data));
    std::fs::write(&path, file).unwrap();
    path
}

fn open_error(path: &PathBuf) -> String {
    let error = SafetensorsFile::open(path)
        .expect_err("a bad file")
        .to_string();
    std::fs::remove_file(path).ok();
    error.replace(&path.display().to_string(), "FILE")
}

#[test]
fn bad_files_are_named_with_what_is_wrong() {
    let short = temp_safetensors("short");
    std::fs::write(&short, [1u8, 2, 3]).unwrap();
    assert_eq!(
        open_error(&short),
        "checkpoint FILE: 3 bytes is too short for a safetensors file (it starts with an 8-byte header length)"
    );
    let huge = temp_safetensors("huge");
    let mut data = (1u64 << 40).to_le_bytes().to_vec();
    data.extend_from_slice(b"{}");
    std::fs::write(&huge, data).unwrap();
    assert_eq!(
        open_error(&huge),
        "checkpoint FILE: the header length is 1099511627776 bytes but the file has 2 bytes after it (and headers are at most 104857600 bytes); this is not a safetensors file"
    );
    assert!(open_error(&crafted("json", "{not json", 0))
        .starts_with("checkpoint FILE: the header is not a valid JSON object ("));
    assert_eq!(
        open_error(&crafted(
            "fp8",
            r#"{"w":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[0,2]}}"#,
            2
        )),
        "checkpoint FILE: tensor `w` has dtype F8_E5M2, which safemlx-dist does not read; supported: BOOL, U8, U16, U32, U64, I8, I16, I32, I64, F16, BF16, F32, F8_E4M3"
    );
    assert_eq!(
        open_error(&crafted(
            "size",
            r#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}}"#,
            24
        )),
        "checkpoint FILE: tensor `w` is F32 [2, 3] (24 bytes) but its data_offsets [0, 20] hold 20 bytes"
    );
    assert_eq!(
        open_error(&crafted(
            "truncated",
            r#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#,
            10
        )),
        "checkpoint FILE: tensor `w` ends at byte 24 of the data but the file holds 10 bytes of data; the file may be truncated"
    );
    let path = crafted(
        "missing",
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
        8,
    );
    let checkpoint = SafetensorsFile::open(&path).expect("valid");
    let error = checkpoint.info("c").expect_err("no c").to_string();
    assert_eq!(
        error.replace(&path.display().to_string(), "FILE"),
        "checkpoint FILE: has no tensor `c`; it has: a, b"
    );
    std::fs::remove_file(&path).ok();
    let error = save(
        temp_safetensors("dup"),
        &[("x", Array::from_f32(1.0)), ("x", Array::from_f32(2.0))],
        &cpu(),
    )
    .expect_err("a repeated name")
    .to_string();
    assert!(
        error.ends_with("cannot save a tensor named \"x\": names must be non-empty, unique and not __metadata__"),
        "{error}"
    );
}

/// The format's rules: the data section is indexed entirely, without holes
/// or overlaps; names are unique; `__metadata__` maps strings to strings.
/// Each of these files opened without error before the rules were enforced.
#[test]
fn damaged_files_break_the_formats_rules_and_are_refused() {
    let two = |a: [u64; 2], b: [u64; 2]| {
        format!(
            r#"{{"a":{{"dtype":"F32","shape":[1],"data_offsets":[{},{}]}},"b":{{"dtype":"F32","shape":[1],"data_offsets":[{},{}]}}}}"#,
            a[0], a[1], b[0], b[1]
        )
    };
    assert_eq!(
        open_error(&crafted("overlap", &two([0, 4], [2, 6]), 8)),
        "checkpoint FILE: tensor `b` starts at byte 2 of the data, inside `a` (which ends at 4): tensors must not overlap"
    );
    assert_eq!(
        open_error(&crafted("same", &two([0, 4], [0, 4]), 4)),
        "checkpoint FILE: tensor `b` starts at byte 0 of the data, inside `a` (which ends at 4): tensors must not overlap"
    );
    assert_eq!(
        open_error(&crafted("hole", &two([0, 4], [8, 12]), 12)),
        "checkpoint FILE: tensor `b` starts at byte 8 of the data, leaving bytes 4..8 after tensor `a` unused: the tensors must cover the data without holes"
    );
    assert_eq!(
        open_error(&crafted("trailing", &two([0, 4], [4, 8]), 9)),
        "checkpoint FILE: the tensors cover 8 bytes of data but the file holds 9 after the header: 1 trailing bytes (a wrong header length shifts every tensor)"
    );
    assert_eq!(
        open_error(&crafted(
            "duplicate",
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
            8
        )),
        "checkpoint FILE: tensor `a` appears twice in the header"
    );
    assert_eq!(
        open_error(&crafted(
            "metadata",
            r#"{"__metadata__":{"format":1},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            4
        )),
        "checkpoint FILE: its __metadata__ is {\"format\":1}, not a map of strings to strings"
    );

    // A real file whose header length is one byte short: before, every
    // tensor came back shifted by one byte (-0.0068 read as -6.4e19).
    let s = cpu();
    let path = temp_safetensors("one-short");
    save(
        &path,
        &[("w", Array::from_slice(&[-0.0068f32, 1.5], &[2]))],
        &s,
    )
    .unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    bytes[..8].copy_from_slice(&(len - 1).to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let error = open_error(&path);
    assert!(
        error.ends_with("1 trailing bytes (a wrong header length shifts every tensor)")
            || error.contains("not a valid JSON object"),
        "{error}"
    );

    // A FIFO: `open` would block until a writer came.
    let fifo = temp_safetensors("fifo");
    std::fs::remove_file(&fifo).ok();
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    assert_eq!(
        open_error(&fifo),
        "checkpoint FILE: is not a regular file (it is a FIFO); give a safetensors file"
    );
}
