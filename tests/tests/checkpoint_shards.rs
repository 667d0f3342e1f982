//! Sharded checkpoint loading between real processes at 1 to 4 ranks:
//! each rank reads exactly its part of every weight (counted in bytes),
//! builds the same layers as from the full weights, gathers and saves a
//! file equal to the original; uneven chunks equal `shard_weight`; a block
//! whose weights are missing or misshapen is refused by name. The file
//! format's own tests are in `checkpoints.rs`.

use safemlx::{Array, Stream};
use safemlx_dist::checkpoint::{save, SafetensorsFile, Weights};
use safemlx_dist::launch::Ranks;
use safemlx_dist::{all_sum, Group, ShardedArray};
use safemlx_dist_examples::layers::TransformerBlock;
use safemlx_dist_tests::dense::{host, host_bytes, random};
use safemlx_dist_tests::typed::Rng;
use safemlx_dist_tests::{cpu, temp_safetensors};

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
        assert_eq!(
            host_bytes(&read, &s),
            host_bytes(original, &s),
            "{name} saved back"
        );
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
    let path = temp_safetensors("incomplete-block");
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
