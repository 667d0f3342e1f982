//! Parallel layers against the dense single-process computation of the same
//! math on the same weights, at 1, 2, 3 and 4 ranks (float32, relative error
//! at most 1e-4).

use safemlx::Array;
use safemlx_dist::launch::Ranks;
use safemlx_dist::{Group, ShardedArray};
use safemlx_dist_examples::layers::{
    ColumnParallelLinear, RowParallelLinear, ShardedAttention, SwiGluMlp,
};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{
    assert_close, dense_attention, host, max_relative_error, silu_array,
};
use safemlx_dist_tests::typed::Rng;

fn check(group: &Group) {
    let s = cpu();
    let n = group.size() as i32;
    let mut rng = Rng::new(17);
    // Tokens divisible by n for the scattered outputs; hidden by n for the shards.
    let (t, d, h) = (2 * n, 6, 4 * n);
    let x = safemlx_dist_tests::dense::random(&mut rng, &[t, d], 0.05);
    let xr = ShardedArray::replicated(x.clone(), group);

    // Column then row parallel linear, biases added once.
    let (w1, b1, w2, b2) = (
        safemlx_dist_tests::dense::random(&mut rng, &[d, h], 0.05),
        safemlx_dist_tests::dense::random(&mut rng, &[h], 0.05),
        safemlx_dist_tests::dense::random(&mut rng, &[h, d], 0.05),
        safemlx_dist_tests::dense::random(&mut rng, &[d], 0.05),
    );
    let dense = x.matmul(&w1, &s).unwrap().add(&b1, &s).unwrap();
    let dense = dense.matmul(&w2, &s).unwrap().add(&b2, &s).unwrap();
    // Without biases first (Llama's projections), then with.
    let plain = x.matmul(&w1, &s).unwrap().matmul(&w2, &s).unwrap();
    let col = ColumnParallelLinear::from_full(group, w1.clone(), None, &s).expect("column");
    let row = RowParallelLinear::from_full(group, w2.clone(), None, &s).expect("row");
    let hidden = col.forward(&xr, &s).expect("column forward");
    assert_close(
        row.forward(&hidden, &s).unwrap().local(),
        &plain,
        "linear pair without biases",
        &s,
    );
    let (full, bias) = col.gather_full(&s).unwrap();
    assert_close(&full, &w1, "gathered column weight", &s);
    assert!(bias.is_none());
    let col = ColumnParallelLinear::from_full(group, w1, Some(b1), &s).expect("column");
    let row = RowParallelLinear::from_full(group, w2, Some(b2), &s).expect("row");
    let hidden = col.forward(&xr, &s).expect("column forward");
    assert_close(
        row.forward(&hidden, &s).unwrap().local(),
        &dense,
        "linear pair",
        &s,
    );
    let scattered = row.forward_scattered(&hidden, &s).expect("scattered");
    assert_close(
        scattered.all_gather(&s).unwrap().local(),
        &dense,
        "linear pair, sequence parallel",
        &s,
    );

    // SwiGLU MLP, both forwards.
    let (gate, up, down) = (
        safemlx_dist_tests::dense::random(&mut rng, &[d, h], 0.05),
        safemlx_dist_tests::dense::random(&mut rng, &[d, h], 0.05),
        safemlx_dist_tests::dense::random(&mut rng, &[h, d], 0.05),
    );
    let a = silu_array(&x.matmul(&gate, &s).unwrap(), &s);
    let dense = a
        .multiply(x.matmul(&up, &s).unwrap(), &s)
        .unwrap()
        .matmul(&down, &s)
        .unwrap();
    let mlp = SwiGluMlp::from_full(group, gate, up, down, &s).expect("mlp");

    // Causal attention: 2 heads per rank, 2 dimensions per head, 5 tokens.
    let heads = 2 * n;
    let dm = 2 * heads;
    let (xa, qkv, out) = (
        safemlx_dist_tests::dense::random(&mut rng, &[5, dm], 0.05),
        safemlx_dist_tests::dense::random(&mut rng, &[dm, 3 * dm], 0.05),
        safemlx_dist_tests::dense::random(&mut rng, &[dm, dm], 0.05),
    );
    let dense_attn = dense_attention(&xa, &qkv, &out, heads, &s);
    let attention =
        ShardedAttention::from_full(group, heads as usize, qkv, out, &s).expect("attention");
    let y = attention
        .forward(&ShardedArray::replicated(xa, group), &s)
        .expect("attention forward");
    assert_close(y.local(), &dense_attn, "sharded causal attention", &s);
    assert_close(
        mlp.forward(&xr, &s).unwrap().local(),
        &dense,
        "SwiGLU MLP",
        &s,
    );
    let rows = xr.shard::<0>(&s).unwrap();
    let out = mlp
        .forward_sequence_parallel(rows, &s)
        .expect("sequence parallel");
    assert_eq!(out.global_shape(), &[t, d]);
    assert_close(
        out.all_gather(&s).unwrap().local(),
        &dense,
        "SwiGLU MLP, sequence parallel",
        &s,
    );
}

#[test]
fn attention_heads_must_split_evenly() {
    Ranks::new(2)
        .run_test(|group| {
            let s = cpu();
            let w = |r: i32, c: i32| Array::from_slice(&vec![0f32; (r * c) as usize], &[r, c]);
            let error = ShardedAttention::from_full(group, 3, w(6, 18), w(6, 6), &s).expect_err("3 heads over 2 ranks");
            assert_eq!(
                error.to_string(),
                "attention with 3 heads over 2 ranks: heads are split across ranks, so the head count must be a multiple of the rank count"
            );
        })
        .unwrap();
}

#[test]
fn parallel_layers_match_dense_at_1_to_4_ranks() {
    for ranks in [1, 2, 3, 4] {
        Ranks::new(ranks)
            .run_test(check)
            .unwrap_or_else(|e| panic!("{ranks} ranks: {e}"));
    }
}

/// RMSNorm on the host, row by row.
fn dense_rms(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    x.chunks(w.len())
        .flat_map(|row| {
            let mean = row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
            let inv = 1.0 / (mean + eps).sqrt();
            row.iter()
                .zip(w)
                .map(move |(v, g)| v * inv * g)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn check_block(group: &Group) {
    use safemlx_dist::nn::{Moe, MoeConfig};
    use safemlx_dist_examples::layers::{FeedForward, TransformerBlock};
    use safemlx_dist_tests::dense::{random, DenseGating, DenseMoe};
    let s = cpu();
    let n = group.size() as i32;
    let mut rng = Rng::new(23);
    // 12 tokens and 12 experts divide over 1 to 4 ranks.
    let (t, heads, e, hidden) = (12, 2 * n, 12, 6);
    let d = 2 * heads;
    let x = random(&mut rng, &[t, d], 0.1);
    let (qkv, out) = (
        random(&mut rng, &[d, 3 * d], 0.1),
        random(&mut rng, &[d, d], 0.1),
    );
    let (norm1, norm2) = (random(&mut rng, &[d], 0.1), random(&mut rng, &[d], 0.1));
    let (gate, up, down) = (
        random(&mut rng, &[d, 2 * d * n], 0.1),
        random(&mut rng, &[d, 2 * d * n], 0.1),
        random(&mut rng, &[2 * d * n, d], 0.1),
    );
    let (router, expert_gate, expert_up, expert_down) = (
        random(&mut rng, &[d, e], 0.3),
        random(&mut rng, &[e, d, hidden], 0.1),
        random(&mut rng, &[e, d, hidden], 0.1),
        random(&mut rng, &[e, hidden, d], 0.1),
    );
    let eps = 1e-5;
    let add = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x + y).collect::<Vec<f32>>();

    // Dense: attention half.
    let hx = host(&x, &s);
    let normed = dense_rms(&hx, &host(&norm1, &s), eps);
    let normed_a = Array::from_slice(&normed, &[t, d]);
    let h = add(
        &hx,
        &host(&dense_attention(&normed_a, &qkv, &out, heads, &s), &s),
    );
    let normed2 = dense_rms(&h, &host(&norm2, &s), eps);
    let normed2_a = Array::from_slice(&normed2, &[t, d]);
    // MLP half.
    let a = silu_array(&normed2_a.matmul(&gate, &s).unwrap(), &s);
    let mlp_out = a
        .multiply(normed2_a.matmul(&up, &s).unwrap(), &s)
        .unwrap()
        .matmul(&down, &s)
        .unwrap();
    let dense_mlp_block = add(&h, &host(&mlp_out, &s));
    // MoE half (top-2, dropless).
    let dense_moe = DenseMoe {
        router: host(&router, &s),
        gate: host(&expert_gate, &s),
        up: host(&expert_up, &s),
        down: host(&expert_down, &s),
        dims: (e as usize, d as usize, hidden as usize),
        k: 2,
        gating: DenseGating::SoftmaxTopK { normalize: true },
        scaling: 1.0,
        score_bias: None,
        shared: None,
    };
    let moe_out: Vec<f32> = normed2
        .chunks(d as usize)
        .flat_map(|tok| dense_moe.token(tok, &mut |_| true))
        .collect();
    let dense_moe_block = add(&h, &moe_out);

    let attention = || {
        ShardedAttention::from_full(group, heads as usize, qkv.clone(), out.clone(), &s).unwrap()
    };
    let block = |feed_forward| TransformerBlock {
        attention: attention(),
        feed_forward,
        attention_norm: norm1.clone(),
        feed_forward_norm: norm2.clone(),
        eps,
    };
    let xr = ShardedArray::replicated(x.clone(), group);
    let mlp = SwiGluMlp::from_full(group, gate.clone(), up.clone(), down.clone(), &s).unwrap();
    let mlp_block = block(FeedForward::Mlp(mlp));
    let (y, aux) = mlp_block.forward(&xr, &s).expect("MLP block");
    assert_eq!(aux, 0.0);
    let err = max_relative_error(&host(y.local(), &s), &dense_mlp_block);
    assert!(err <= 1e-4, "MLP block: relative error {err}");
    let moe = Moe::from_full(
        group,
        MoeConfig::new(2),
        router.clone(),
        expert_gate.clone(),
        expert_up.clone(),
        expert_down.clone(),
        &s,
    )
    .unwrap();
    let moe_block = block(FeedForward::Moe(moe));
    let (y, aux) = moe_block.forward(&xr, &s).expect("MoE block");
    assert!(aux > 0.0);
    let err = max_relative_error(&host(y.local(), &s), &dense_moe_block);
    assert!(err <= 1e-4, "MoE block: relative error {err}");

    // Sequence parallel: rows in, rows out, norms on each rank's rows.
    let rows = xr.shard::<0>(&s).unwrap();
    for (label, block, dense) in [
        ("MLP", &mlp_block, &dense_mlp_block),
        ("MoE", &moe_block, &dense_moe_block),
    ] {
        let (y, _) = block
            .forward_sequence_parallel(&rows, &s)
            .expect("sequence-parallel block");
        assert_eq!(y.local().shape(), [t / n, d], "{label}: this rank's rows");
        let err = max_relative_error(&host(y.all_gather(&s).unwrap().local(), &s), dense);
        assert!(
            err <= 1e-4,
            "{label} block, sequence parallel: relative error {err}"
        );
    }
}

#[test]
fn transformer_blocks_match_dense_at_1_to_4_ranks() {
    for ranks in [1, 2, 3, 4] {
        Ranks::new(ranks)
            .run_test(check_block)
            .unwrap_or_else(|e| panic!("{ranks} ranks: {e}"));
    }
}
