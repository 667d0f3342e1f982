//! Gradients through the typed layer (`safemlx_dist::grad`) against the
//! dense single-process gradients of the same math on the same weights, at
//! 1 to 4 ring ranks and 2 MPI ranks (float32, relative error at most 1e-4):
//! a `Sharded` parameter's gradient is this rank's chunk of the dense one,
//! a `Replicated` one's is the whole dense gradient.

use safemlx::{Array, Stream};
use safemlx_dist::grad::{value_and_grad, value_and_grad_of, Parameters};
use safemlx_dist::launch::Ranks;
use safemlx_dist::nn::{gather_logits, Embedding, RmsNorm};
use safemlx_dist::typed::{Replicated, Sharded};
use safemlx_dist::{Backend, Group, ShardedArray};
use safemlx_dist_examples::layers::{
    ColumnParallelLinear, RowParallelLinear, ShardedAttention, SwiGluMlp,
};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{assert_close, dense_attention, host, part, random, silu_array};
use safemlx_dist_tests::typed::Rng;

fn dense_rms_norm(x: &Array, w: &Array, s: &Stream) -> Array {
    safemlx::fast::rms_norm(x, w, 1e-5, s).unwrap()
}

/// `0.5 * sum(mlp(norm(x))^2)` with a tensor-parallel MLP: the norm's
/// weight and `x` are replicated and meet the sharded MLP weights, so their
/// gradients need the sum over ranks that the typed layer inserts.
fn check_mlp(group: &Group) {
    let s = cpu();
    let mut rng = Rng::new(5);
    // Hidden 10: uneven over 3 and 4 ranks.
    let (t, d, h) = (5, 8, 10);
    let x = random(&mut rng, &[t, d], 0.5);
    let norm = random(&mut rng, &[d], 0.5)
        .add(Array::from_f32(1.0), &s)
        .unwrap();
    let gate = random(&mut rng, &[d, h], 0.3);
    let up = random(&mut rng, &[d, h], 0.3);
    let down = random(&mut rng, &[h, d], 0.3);

    let dense_loss = |p: &[Array]| -> Vec<Array> {
        let xn = dense_rms_norm(&p[0], &p[1], &s);
        let hidden = silu_array(&xn.matmul(&p[2], &s).unwrap(), &s)
            .multiply(xn.matmul(&p[3], &s).unwrap(), &s)
            .unwrap();
        let y = hidden.matmul(&p[4], &s).unwrap();
        vec![y
            .square(&s)
            .unwrap()
            .sum(None, &s)
            .unwrap()
            .multiply(Array::from_f32(0.5), &s)
            .unwrap()]
    };
    let params = [
        x.clone(),
        norm.clone(),
        gate.clone(),
        up.clone(),
        down.clone(),
    ];
    let (want_loss, want) =
        safemlx::transforms::value_and_grad_with_argnums(dense_loss, &[0, 1, 2, 3, 4][..])(&params)
            .unwrap();

    let local = [
        x.clone(),
        norm.clone(),
        part(&gate, 1, group, &s),
        part(&up, 1, group, &s),
        part(&down, 0, group, &s),
    ];
    let (loss, grads) = value_and_grad(&local, |p| {
        let x = ShardedArray::<Replicated>::from_local(p[0].clone(), group, &[t, d])?;
        let norm = RmsNorm {
            weight: ShardedArray::from_local(p[1].clone(), group, &[d])?,
            eps: 1e-5,
        };
        let mlp = SwiGluMlp {
            gate: ShardedArray::from_local(p[2].clone(), group, &[d, h])?,
            up: ShardedArray::from_local(p[3].clone(), group, &[d, h])?,
            down: ShardedArray::from_local(p[4].clone(), group, &[h, d])?,
        };
        let y = mlp.forward(&norm.forward(&x, &s)?, &s)?;
        y.mul(&y, &s)?.sum_all(&s)?.scale(0.5, &s)
    })
    .expect("value_and_grad");
    assert_close(&loss, &want_loss[0], "loss", &s);
    assert_close(&grads[0], &want[0], "d loss / d x (replicated)", &s);
    assert_close(
        &grads[1],
        &want[1],
        "d loss / d norm weight (replicated)",
        &s,
    );
    assert_close(
        &grads[2],
        &part(&want[2], 1, group, &s),
        "d loss / d gate (this rank's columns)",
        &s,
    );
    assert_close(
        &grads[3],
        &part(&want[3], 1, group, &s),
        "d loss / d up (this rank's columns)",
        &s,
    );
    assert_close(
        &grads[4],
        &part(&want[4], 0, group, &s),
        "d loss / d down (this rank's rows)",
        &s,
    );
}

/// Sequence parallel: the row-parallel output leaves through a
/// `sum_scatter` (rows per rank, uneven at 4 ranks), the loss of each
/// rank's rows is a `Partial` that one `all_sum` completes; and a column
/// taken from a replicated array with `shard` (a slice).
fn check_scattered(group: &Group) {
    let s = cpu();
    let mut rng = Rng::new(9);
    let (t, h, d) = (6, 8, 4);
    let hidden = random(&mut rng, &[t, h], 0.5);
    let w = random(&mut rng, &[h, d], 0.5);
    let c = random(&mut rng, &[t, d], 0.5);
    let dense_loss = |p: &[Array]| -> Vec<Array> {
        let y = p[0].matmul(&p[1], &s).unwrap();
        let y = y.multiply(&y, &s).unwrap().multiply(&p[2], &s).unwrap();
        vec![y.sum(None, &s).unwrap()]
    };
    let params = [hidden.clone(), w.clone(), c.clone()];
    let (want_loss, want) =
        safemlx::transforms::value_and_grad_with_argnums(dense_loss, &[0, 1, 2][..])(&params)
            .unwrap();
    let local = [
        part(&hidden, 1, group, &s),
        part(&w, 0, group, &s),
        c.clone(),
    ];
    let (loss, grads) = value_and_grad(&local, |p| {
        let row = RowParallelLinear {
            weight: ShardedArray::from_local(p[1].clone(), group, &[h, d])?,
            bias: None,
        };
        let hidden = ShardedArray::<Sharded<1>>::from_local(p[0].clone(), group, &[t, h])?;
        let rows = row.forward_scattered(&hidden, &s)?;
        // The weights `c` are replicated; each rank takes its rows of them.
        let c = ShardedArray::<Replicated>::from_local(p[2].clone(), group, &[t, d])?;
        let c_rows = c.redistribute::<Sharded<0>>(&s)?;
        rows.mul(&rows, &s)?
            .mul(&c_rows, &s)?
            .sum_all(&s)?
            .all_sum(&s)
    })
    .expect("value_and_grad");
    assert_close(&loss, &want_loss[0], "loss", &s);
    assert_close(
        &grads[0],
        &part(&want[0], 1, group, &s),
        "d loss / d hidden (this rank's columns)",
        &s,
    );
    assert_close(
        &grads[1],
        &part(&want[1], 0, group, &s),
        "d loss / d w (this rank's rows)",
        &s,
    );
    assert_close(
        &grads[2],
        &want[2],
        "d loss / d c (replicated, sliced by rows)",
        &s,
    );
}

/// `all_max`: the gradient goes to the rank holding the maximum, split
/// evenly between ranks that tie (MLX alone would pass it to every rank).
fn check_max(group: &Group) {
    let s = cpu();
    let (n, r) = (group.size() as f32, group.rank() as f32);
    // Element 0: rank 0 holds the maximum; element 1: every rank ties.
    let x = Array::from_slice(&[-r, 1.0], &[2]);
    let (loss, grads) = value_and_grad(&[x], |p| {
        let m = safemlx_dist::all_max(&p[0], group, &s)?;
        let weighted = m.multiply(Array::from_slice(&[3.0f32, 2.0], &[2]), &s)?;
        ShardedArray::<Replicated>::from_local(weighted.sum(None, &s)?, group, &[])
    })
    .expect("value_and_grad");
    assert_eq!(host(&loss, &s), [2.0]);
    let g0 = if group.rank() == 0 { 3.0 } else { 0.0 };
    assert_eq!(host(&grads[0], &s), [g0, 2.0 / n]);
}

/// Megatron's pair with biases: a column-parallel layer (its bias split
/// with its columns), then silu, a row-parallel layer (its bias
/// replicated, added after the `all_sum`); `x` is replicated.
fn check_linear_pair(group: &Group) {
    let s = cpu();
    let mut rng = Rng::new(13);
    // Hidden 7: uneven at 2 to 4 ranks.
    let (t, d, h) = (3, 5, 7);
    let full = [
        random(&mut rng, &[t, d], 0.5),
        random(&mut rng, &[d, h], 0.3),
        random(&mut rng, &[h], 0.3),
        random(&mut rng, &[h, d], 0.3),
        random(&mut rng, &[d], 0.3),
    ];
    let dense_loss = |p: &[Array]| -> Vec<Array> {
        let a = p[0].matmul(&p[1], &s).unwrap().add(&p[2], &s).unwrap();
        let y = silu_array(&a, &s)
            .matmul(&p[3], &s)
            .unwrap()
            .add(&p[4], &s)
            .unwrap();
        vec![y.square(&s).unwrap().sum(None, &s).unwrap()]
    };
    let (want_loss, want) =
        safemlx::transforms::value_and_grad_with_argnums(dense_loss, &[0, 1, 2, 3, 4][..])(&full)
            .unwrap();
    let local = [
        full[0].clone(),
        part(&full[1], 1, group, &s),
        part(&full[2], 0, group, &s),
        part(&full[3], 0, group, &s),
        full[4].clone(),
    ];
    let (loss, grads) = value_and_grad(&local, |p| {
        let column = ColumnParallelLinear {
            weight: ShardedArray::from_local(p[1].clone(), group, &[d, h])?,
            bias: Some(ShardedArray::from_local(p[2].clone(), group, &[h])?),
        };
        let row = RowParallelLinear {
            weight: ShardedArray::from_local(p[3].clone(), group, &[h, d])?,
            bias: Some(ShardedArray::from_local(p[4].clone(), group, &[d])?),
        };
        let x = ShardedArray::<Replicated>::from_local(p[0].clone(), group, &[t, d])?;
        let y = row.forward(&column.forward(&x, &s)?.silu(&s)?, &s)?;
        y.mul(&y, &s)?.sum_all(&s)
    })
    .expect("value_and_grad");
    assert_close(&loss, &want_loss[0], "linear pair: loss", &s);
    let expected = [
        ("x (replicated)", want[0].clone()),
        (
            "column weight (this rank's columns)",
            part(&want[1], 1, group, &s),
        ),
        (
            "column bias (this rank's entries)",
            part(&want[2], 0, group, &s),
        ),
        (
            "row weight (this rank's rows)",
            part(&want[3], 0, group, &s),
        ),
        ("row bias (replicated)", want[4].clone()),
    ];
    for (got, (name, want)) in grads.iter().zip(&expected) {
        assert_close(got, want, &format!("linear pair: d loss / d {name}"), &s);
    }
}

fn check(group: &Group) {
    check_linear_pair(group);
    check_mlp(group);
    check_scattered(group);
    check_max(group);
    check_attention_and_embedding(group);
}

#[test]
fn gradients_match_dense_at_1_to_4_ranks() {
    for ranks in [1, 2, 3, 4] {
        Ranks::new(ranks)
            .run_test(check)
            .unwrap_or_else(|e| panic!("{ranks} ring ranks: {e}"));
    }
}

#[test]
fn gradients_match_dense_on_mpi() {
    Ranks::new(2)
        .backend(Backend::Mpi)
        .run_test(check)
        .unwrap_or_else(|e| panic!("2 MPI ranks: {e}"));
}

#[test]
fn a_loss_that_is_not_a_scalar_is_an_error() {
    let group = safemlx_dist::init(false, Backend::Ring).unwrap();
    let err = value_and_grad(&[Array::from_slice(&[1.0f32, 2.0], &[2])], |p| {
        ShardedArray::<Replicated>::from_local(p[0].clone(), &group, &[2])
    })
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the loss must be a scalar (global shape []), got global shape [2]; sum it with `.sum_all()`"
    );
}

/// This rank's columns of each of the `segments` equal blocks of `full`'s
/// columns, side by side (a fused `[Q | K | V]` weight).
fn segment_parts(full: &Array, segments: i32, group: &Group, s: &Stream) -> Array {
    let width = full.shape()[1] / segments;
    let blocks = full.split(segments, 1, s).unwrap();
    assert_eq!(blocks[0].shape()[1], width);
    let parts: Vec<Array> = blocks.iter().map(|b| part(b, 1, group, s)).collect();
    safemlx::ops::concatenate_axis(&parts, 1, s).unwrap()
}

/// Causal attention with heads split across ranks, and the
/// vocabulary-parallel embedding used as embedding and tied LM head.
fn check_attention_and_embedding(group: &Group) {
    let s = cpu();
    let mut rng = Rng::new(13);
    // 12 heads: a multiple of 1 to 4 ranks; 2 dimensions per head.
    let (t, heads, vocab) = (5, 12, 11);
    let d = 2 * heads;
    let x = random(&mut rng, &[t, d], 0.3);
    let qkv = random(&mut rng, &[d, 3 * d], 0.3);
    let out = random(&mut rng, &[d, d], 0.3);
    let table = random(&mut rng, &[vocab, d], 0.3);
    let c = random(&mut rng, &[t, vocab], 0.3);
    let tokens: Vec<u32> = vec![3, 0, 10, 3, 7];
    let ids = Array::from_slice(&tokens.iter().map(|&t| t as i32).collect::<Vec<_>>(), &[t]);
    let dense_loss = |p: &[Array]| -> Vec<Array> {
        let h = p[3]
            .take_axis(&ids, 0, &s)
            .unwrap()
            .add(dense_attention(&p[0], &p[1], &p[2], heads, &s), &s)
            .unwrap();
        let logits = h.matmul(p[3].transpose(&s).unwrap(), &s).unwrap();
        vec![logits.multiply(&c, &s).unwrap().sum(None, &s).unwrap()]
    };
    let params = [x.clone(), qkv.clone(), out.clone(), table.clone()];
    let (want_loss, want) =
        safemlx::transforms::value_and_grad_with_argnums(dense_loss, &[0, 1, 2, 3][..])(&params)
            .unwrap();

    let attention = ShardedAttention::from_full(group, heads as usize, qkv, out, &s).unwrap();
    let embedding = Embedding::from_full(group, table, &s).unwrap();
    let xr = ShardedArray::<Replicated>::replicated(x, group);
    let (loss, grads) = value_and_grad_of(&(attention, embedding), |(attention, embedding)| {
        let h = embedding
            .forward(&tokens, &s)?
            .add(&attention.forward(&xr, &s)?, &s)?;
        let logits = gather_logits(&embedding.logits(&h, &s)?, 0..t as usize, &s)?;
        let c = ShardedArray::<Replicated>::replicated(c.clone(), group);
        logits.mul(&c, &s)?.sum_all(&s)
    })
    .expect("value_and_grad_of");
    assert_close(&loss, &want_loss[0], "loss", &s);
    let (attention, embedding) = grads;
    let got = attention.parameters();
    assert_close(
        &got[0].local,
        &segment_parts(&want[1], 3, group, &s),
        "d loss / d qkv (this rank's heads of q, k and v)",
        &s,
    );
    assert_close(
        &got[1].local,
        &part(&want[2], 0, group, &s),
        "d loss / d out (this rank's rows)",
        &s,
    );
    assert_close(
        &embedding.parameters()[0].local,
        &part(&want[3], 0, group, &s),
        "d loss / d embedding, tied head (this rank's vocabulary rows)",
        &s,
    );
    // The input's gradient is not returned here (it is not a parameter):
    // check it through `value_and_grad` on the replicated input alone.
    let attention = ShardedAttention::from_full(
        group,
        heads as usize,
        params[1].clone(),
        params[2].clone(),
        &s,
    )
    .unwrap();
    let (_, gx) = value_and_grad(&[params[0].clone()], |p| {
        let x = ShardedArray::<Replicated>::from_local(p[0].clone(), group, &[t, d])?;
        let y = attention.forward(&x, &s)?;
        let y = y.mul(&y, &s)?;
        y.sum_all(&s)
    })
    .unwrap();
    let dense_x = |p: &[Array]| -> Vec<Array> {
        let y = dense_attention(&p[0], &params[1], &params[2], heads, &s);
        vec![y.square(&s).unwrap().sum(None, &s).unwrap()]
    };
    let (_, want_x) = safemlx::transforms::value_and_grad(dense_x)(&params[..1]).unwrap();
    assert_close(
        &gx[0],
        &want_x[0],
        "d loss / d x through attention (replicated)",
        &s,
    );
}

/// A replicated value entering several rank-dependent ops (the MLP's gate
/// and up projections) is summed once backwards: the gradient of a
/// tensor-parallel MLP costs one `all_sum` forward and one backward.
#[test]
fn a_replicated_input_of_several_sharded_ops_is_summed_once() {
    Ranks::new(2)
        .run_test(|group| {
            let s = cpu();
            let mut rng = Rng::new(9);
            let (t, d, h) = (3, 4, 6);
            let mlp = SwiGluMlp::from_full(
                group,
                random(&mut rng, &[d, h], 0.3),
                random(&mut rng, &[d, h], 0.3),
                random(&mut rng, &[h, d], 0.3),
                &s,
            )
            .unwrap();
            let x = random(&mut rng, &[t, d], 0.5);
            let profile = safemlx_dist::CollectiveProfile::start();
            let (_, grads) = value_and_grad(&[x], |p| {
                let x = ShardedArray::<Replicated>::from_local(p[0].clone(), group, &[t, d])?;
                mlp.forward(&x, &s)?.sum_all(&s)
            })
            .unwrap();
            safemlx_dist::eval(&[&grads[0]]).unwrap();
            assert_eq!(profile.stop().calls, 2, "all_sums forward and backward");
        })
        .unwrap();
}
