//! Parallel layers against the dense single-process computation of the same
//! math on the same weights, at 1, 2, 3 and 4 ranks (float32, relative error
//! at most 1e-4).

use safemlx::{Array, Stream};
use safemlx_dist::launch::Ranks;
use safemlx_dist::nn::{ColumnParallelLinear, RowParallelLinear, SwiGluMlp};
use safemlx_dist::{Group, ShardedArray};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::typed::Rng;

fn random(rng: &mut Rng, shape: &[i32]) -> Array {
    let len = shape.iter().product::<i32>() as usize;
    let values: Vec<f32> = rng
        .values(len)
        .into_iter()
        .map(|v| v as f32 * 0.05)
        .collect();
    Array::from_slice(&values, shape)
}

fn host(a: &Array, s: &Stream) -> Vec<f32> {
    a.contiguous(false, s)
        .and_then(|a| a.into_evaluated())
        .expect("evaluates")
        .try_to_vec::<f32>()
        .expect("float32")
}

fn assert_close(got: &Array, want: &Array, what: &str, s: &Stream) {
    let (got, want) = (host(got, s), host(want, s));
    assert_eq!(got.len(), want.len(), "{what}: sizes");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    let err = got
        .iter()
        .zip(&want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()))
        / scale;
    assert!(err <= 1e-4, "{what}: relative error {err}");
}

fn silu(x: &Array, s: &Stream) -> Array {
    x.multiply(safemlx::ops::sigmoid(x, s).unwrap(), s).unwrap()
}

fn check(group: &Group) {
    let s = cpu();
    let n = group.size() as i32;
    let mut rng = Rng::new(17);
    // Tokens divisible by n for the scattered outputs; hidden by n for the shards.
    let (t, d, h) = (2 * n, 6, 4 * n);
    let x = random(&mut rng, &[t, d]);
    let xr = ShardedArray::replicated(x.clone(), group);

    // Column then row parallel linear, biases added once.
    let (w1, b1, w2, b2) = (
        random(&mut rng, &[d, h]),
        random(&mut rng, &[h]),
        random(&mut rng, &[h, d]),
        random(&mut rng, &[d]),
    );
    let dense = x.matmul(&w1, &s).unwrap().add(&b1, &s).unwrap();
    let dense = dense.matmul(&w2, &s).unwrap().add(&b2, &s).unwrap();
    let col = ColumnParallelLinear::from_full(group, w1, b1, &s).expect("column");
    let row = RowParallelLinear::from_full(group, w2, b2, &s).expect("row");
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
        random(&mut rng, &[d, h]),
        random(&mut rng, &[d, h]),
        random(&mut rng, &[h, d]),
    );
    let a = silu(&x.matmul(&gate, &s).unwrap(), &s);
    let dense = a
        .multiply(x.matmul(&up, &s).unwrap(), &s)
        .unwrap()
        .matmul(&down, &s)
        .unwrap();
    let mlp = SwiGluMlp::from_full(group, gate, up, down, &s).expect("mlp");
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
fn parallel_layers_match_dense_at_1_to_4_ranks() {
    for ranks in [1, 2, 3, 4] {
        Ranks::new(ranks)
            .run_test(check)
            .unwrap_or_else(|e| panic!("{ranks} ranks: {e}"));
    }
}
