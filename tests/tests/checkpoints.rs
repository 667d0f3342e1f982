//! Safetensors checkpoints: every dtype round-trips, files interoperate
//! with MLX's own reader and writer, bad files get errors that name the
//! file and the tensor, and between real processes at 1 to 4 ranks each
//! rank reads exactly its part of every weight (counted in bytes), builds
//! the same layers as from the full weights, and gathers and saves a file
//! equal to the original.

use std::path::PathBuf;

use safemlx::{Array, Dtype, Stream};
use safemlx_dist::checkpoint::{save, SafetensorsFile, Weights};
use safemlx_dist::launch::Ranks;
use safemlx_dist::{all_sum, Group, ShardedArray};
use safemlx_dist_examples::layers::TransformerBlock;
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{host, random};
use safemlx_dist_tests::typed::Rng;

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "safemlx-dist-test-{}-{name}.safetensors",
        std::process::id()
    ))
}

fn bytes(a: &Array, s: &Stream) -> Vec<u8> {
    let raw = a
        .contiguous(false, s)
        .and_then(|a| a.reshape(&[-1], s))
        .and_then(|a| a.view_dtype(Dtype::Uint8, s))
        .expect("bytes");
    raw.into_evaluated()
        .expect("evaluates")
        .try_to_vec::<u8>()
        .expect("u8")
}

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
    let path = temp("dtypes");
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
        assert_eq!(bytes(&got, &s), bytes(want, &s), "{name}");
    }
    let total: u64 = tensors.iter().map(|(_, a)| a.nbytes() as u64).sum();
    assert_eq!(checkpoint.bytes_read(), total);

    // MLX's own reader agrees on every tensor.
    let native = Array::load_safetensors(&path, &s).expect("MLX reads our file");
    for (name, want) in &tensors {
        assert_eq!(bytes(&native[*name], &s), bytes(want, &s), "{name} via MLX");
    }
    // And we read what MLX writes.
    let mlx_path = temp("written-by-mlx");
    let map: std::collections::HashMap<String, Array> = tensors
        .iter()
        .map(|(n, a)| ((*n).to_owned(), a.clone()))
        .collect();
    Array::save_safetensors(&map, None, &mlx_path).expect("MLX writes");
    let theirs = SafetensorsFile::open(&mlx_path).expect("open MLX's file");
    for (name, want) in &tensors {
        assert_eq!(
            bytes(&theirs.read(name, &s).unwrap(), &s),
            bytes(want, &s),
            "{name} from MLX"
        );
    }
    std::fs::remove_file(&path).ok();
    std::fs::remove_file(&mlx_path).ok();
}

/// A file with this header and `data` bytes after it.
fn crafted(name: &str, header: &str, data: usize) -> PathBuf {
    let path = temp(name);
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
    let short = temp("short");
    std::fs::write(&short, [1u8, 2, 3]).unwrap();
    assert_eq!(
        open_error(&short),
        "checkpoint FILE: 3 bytes is too short for a safetensors file (it starts with an 8-byte header length)"
    );
    let huge = temp("huge");
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
            r#"{"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}}"#,
            2
        )),
        "checkpoint FILE: tensor `w` has dtype F8_E4M3, which safemlx-dist does not read; supported: BOOL, U8, U16, U32, U64, I8, I16, I32, I64, F16, BF16, F32"
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
        temp("dup"),
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
    let path = temp("one-short");
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
    let fifo = temp("fifo");
    std::fs::remove_file(&fifo).ok();
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    assert_eq!(
        open_error(&fifo),
        "checkpoint FILE: is not a regular file (it is a FIFO); give a safetensors file"
    );
}

/// The weights of one transformer block (MLP or MoE) under the names
/// `TransformerBlock::load` reads; dims divide by 1 to 4 ranks.
fn block_weights(moe: bool) -> Vec<(String, Array)> {
    let mut rng = Rng::new(if moe { 5 } else { 3 });
    let (d, h, e) = (24, 48, 12);
    let mut w = vec![
        ("attention.qkv", random(&mut rng, &[d, 3 * d], 0.05)),
        ("attention.out", random(&mut rng, &[d, d], 0.05)),
        ("attention_norm", random(&mut rng, &[d], 0.1)),
        ("feed_forward_norm", random(&mut rng, &[d], 0.1)),
    ];
    if moe {
        w.push(("moe.router", random(&mut rng, &[d, e], 0.3)));
        w.push(("moe.gate", random(&mut rng, &[e, d, h], 0.05)));
        w.push(("moe.up", random(&mut rng, &[e, d, h], 0.05)));
        w.push(("moe.down", random(&mut rng, &[e, h, d], 0.05)));
    } else {
        w.push(("mlp.gate", random(&mut rng, &[d, h], 0.05)));
        w.push(("mlp.up", random(&mut rng, &[d, h], 0.05)));
        w.push(("mlp.down", random(&mut rng, &[h, d], 0.05)));
    }
    w.into_iter()
        .map(|(n, a)| (format!("layers.0.{n}"), a))
        .collect()
}

fn barrier(group: &Group, s: &Stream) {
    let token = all_sum(&Array::from_f32(1.0), group, s).expect("barrier");
    safemlx_dist::eval(&[&token]).expect("barrier");
}

fn check_block_checkpoint(group: &Group, moe: bool) {
    let s = cpu();
    let (rank, n) = (group.rank(), group.size());
    let tag = if moe { "moe" } else { "mlp" };
    let path = std::env::temp_dir().join(format!("safemlx-dist-test-block-{tag}-{n}.safetensors"));
    let weights = block_weights(moe);
    if rank == 0 {
        save(&path, &weights, &s).expect("rank 0 writes the checkpoint");
    }
    barrier(group, &s);

    let heads = 12;
    let checkpoint = SafetensorsFile::open(&path).expect("open");
    let block = TransformerBlock::load(
        &Weights::new(&checkpoint, group).pp("layers.0"),
        heads,
        2,
        &s,
    )
    .expect("load");
    // Exactly this rank's part of each weight was read: the row/column
    // chunks of the sharded weights, the replicated ones whole.
    let full = |name: &str| weights.iter().find(|w| w.0 == name).unwrap().1.clone();
    let share = |name: &str| full(name).nbytes() as u64 / n as u64;
    let whole = |name: &str| full(name).nbytes() as u64;
    let mut want = share("layers.0.attention.qkv")
        + share("layers.0.attention.out")
        + whole("layers.0.attention_norm")
        + whole("layers.0.feed_forward_norm");
    want += if moe {
        whole("layers.0.moe.router")
            + share("layers.0.moe.gate")
            + share("layers.0.moe.up")
            + share("layers.0.moe.down")
    } else {
        share("layers.0.mlp.gate") + share("layers.0.mlp.up") + share("layers.0.mlp.down")
    };
    assert_eq!(
        checkpoint.bytes_read(),
        want,
        "rank {rank} of {n} reads only its part"
    );

    // The same layer as one built from the full weights: same output.
    let reference = {
        let w = |name: &str| full(&format!("layers.0.{name}"));
        let attention = safemlx_dist_examples::layers::ShardedAttention::from_full(
            group,
            heads,
            w("attention.qkv"),
            w("attention.out"),
            &s,
        )
        .unwrap();
        let feed_forward = if moe {
            safemlx_dist_examples::layers::FeedForward::Moe(
                safemlx_dist::nn::Moe::from_full(
                    group,
                    safemlx_dist::nn::MoeConfig::new(2),
                    w("moe.router"),
                    w("moe.gate"),
                    w("moe.up"),
                    w("moe.down"),
                    &s,
                )
                .unwrap(),
            )
        } else {
            safemlx_dist_examples::layers::FeedForward::Mlp(
                safemlx_dist_examples::layers::SwiGluMlp::from_full(
                    group,
                    w("mlp.gate"),
                    w("mlp.up"),
                    w("mlp.down"),
                    &s,
                )
                .unwrap(),
            )
        };
        TransformerBlock {
            attention,
            feed_forward,
            attention_norm: w("attention_norm"),
            feed_forward_norm: w("feed_forward_norm"),
            eps: safemlx_dist_examples::layers::DEFAULT_EPS,
        }
    };
    let x = ShardedArray::replicated(random(&mut Rng::new(9), &[8, 24], 0.1), group);
    let (got, _) = block.forward(&x, &s).expect("forward");
    let (want_y, _) = reference.forward(&x, &s).expect("reference forward");
    assert_eq!(host(got.local(), &s), host(want_y.local(), &s));

    // Gather and save: the same tensors as the original file.
    let gathered = block.gather_full("layers.0.", &s).expect("gather");
    let saved = std::env::temp_dir().join(format!(
        "safemlx-dist-test-block-{tag}-{n}-saved.safetensors"
    ));
    if rank == 0 {
        save(&saved, &gathered, &s).expect("save");
    }
    barrier(group, &s);
    let back = SafetensorsFile::open(&saved).expect("open the saved file");
    assert_eq!(back.names().count(), weights.len());
    for (name, original) in &weights {
        let read = back.read(name, &s).expect("tensor in the saved file");
        assert_eq!(bytes(&read, &s), bytes(original, &s), "{name} saved back");
    }
    barrier(group, &s);
}

#[test]
fn blocks_load_their_shards_and_save_back_at_1_to_4_ranks() {
    for ranks in [1, 2, 3, 4] {
        Ranks::new(ranks)
            .run_test(|group| {
                check_block_checkpoint(group, false);
                check_block_checkpoint(group, true);
            })
            .unwrap_or_else(|e| panic!("{ranks} ranks: {e}"));
    }
}

/// Uneven chunks (the first `d % n` ranks get one more; some get none)
/// read from a file equal `shard_weight` of the full tensor, along rows and
/// columns, with and without segments.
fn check_uneven(group: &Group) {
    use safemlx_dist::typed::shard_weight;
    use safemlx_dist::{Replicated, Sharded};
    let s = cpu();
    let n = group.size();
    let path = std::env::temp_dir().join(format!("safemlx-dist-test-uneven-{n}.safetensors"));
    let mut rng = Rng::new(11);
    let tensors = vec![
        ("odd", random(&mut rng, &[5, 3], 1.0)),
        ("tiny", random(&mut rng, &[2, 3], 1.0)),
        ("wide", random(&mut rng, &[3, 7], 1.0)),
        ("fused", random(&mut rng, &[2, 3 * 4 * n as i32], 1.0)),
    ];
    if group.rank() == 0 {
        save(&path, &tensors, &s).expect("save");
    }
    barrier(group, &s);
    let checkpoint = SafetensorsFile::open(&path).expect("open");
    let checkpoint = Weights::new(&checkpoint, group);
    for (name, full) in &tensors {
        let rows = checkpoint
            .get_fused::<Sharded<0>>(name, None, 1, &s)
            .unwrap();
        let want = shard_weight::<Sharded<0>, _>(full.clone(), group, 1, name, &s).unwrap();
        assert_eq!(rows.local().shape(), want.local().shape(), "{name} rows");
        assert_eq!(
            host(rows.local(), &s),
            host(want.local(), &s),
            "{name} rows"
        );
        let segments = if *name == "fused" { 3 } else { 1 };
        let cols = checkpoint
            .get_fused::<Sharded<1>>(name, None, segments, &s)
            .unwrap();
        let want = shard_weight::<Sharded<1>, _>(full.clone(), group, segments, name, &s).unwrap();
        assert_eq!(cols.local().shape(), want.local().shape(), "{name} columns");
        assert_eq!(
            host(cols.local(), &s),
            host(want.local(), &s),
            "{name} columns"
        );
        let all = checkpoint
            .get_fused::<Replicated>(name, None, 1, &s)
            .unwrap();
        assert_eq!(host(all.local(), &s), host(full, &s), "{name} replicated");
    }
    let error = checkpoint
        .get_fused::<Sharded<2>>("odd", None, 1, &s)
        .expect_err("no axis 2")
        .to_string();
    assert_eq!(
        error,
        "weight `odd` is Sharded<2> but has shape [5, 3]: it has no axis 2"
    );
    barrier(group, &s);
}

#[test]
fn uneven_shards_read_from_a_file_equal_shard_weight_at_1_to_4_ranks() {
    for ranks in [1, 2, 3, 4] {
        Ranks::new(ranks)
            .run_test(check_uneven)
            .unwrap_or_else(|e| panic!("{ranks} ranks: {e}"));
    }
}

#[test]
fn a_block_from_a_checkpoint_names_what_is_missing_or_wrong() {
    let s = cpu();
    let group = safemlx_dist::init(false, safemlx_dist::Backend::Any).expect("singleton");
    let path = temp("incomplete-block");
    let mut weights = block_weights(false);
    weights.retain(|(name, _)| name != "layers.0.mlp.up");
    save(&path, &weights, &s).expect("save");
    let checkpoint = SafetensorsFile::open(&path).expect("open");
    let shown = |e: safemlx_dist::Error| e.to_string().replace(&path.display().to_string(), "FILE");
    let source = Weights::new(&checkpoint, &group);
    let error = TransformerBlock::load(&source.pp("layers.0"), 12, 2, &s)
        .err()
        .map(shown);
    assert_eq!(
        error.as_deref(),
        Some("checkpoint FILE: has no tensor `layers.0.mlp.up`; it has: layers.0.attention.out, layers.0.attention.qkv, layers.0.attention_norm, layers.0.feed_forward_norm, layers.0.mlp.down, layers.0.mlp.gate")
    );
    let error = TransformerBlock::load(&source.pp("layers.0"), 7, 2, &s)
        .err()
        .map(shown);
    assert_eq!(
        error.as_deref(),
        Some("attention with 7 heads over a model dimension of 24: the head count must divide the dimension")
    );
    let error = TransformerBlock::load(&source.pp("layers.1"), 12, 2, &s)
        .err()
        .map(shown);
    assert!(
        error.as_deref().is_some_and(
            |e| e.starts_with("checkpoint FILE: has no tensor `layers.1.attention.out`")
        ),
        "{error:?}"
    );
    std::fs::remove_file(&path).ok();
}
