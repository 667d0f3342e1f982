//! `nn::Mlp`, the models' MLP, against the dense SwiGLU on the same
//! weights at 1-4 ranks: both forwards, an uneven hidden split, a rank
//! with no hidden column, and what that rank says when asked for a
//! gradient.

use safemlx::Array;
use safemlx_dist::grad::{value_and_grad, Parameters};
use safemlx_dist::launch::Ranks;
use safemlx_dist::nn::Mlp;
use safemlx_dist::{Group, Replicated, ShardedArray};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{assert_close, random, silu_array};
use safemlx_dist_tests::typed::Rng;

/// `down(silu(x gateᵀ) * (x upᵀ))` for weights `[out, in]`.
fn dense(x: &Array, gate: &Array, up: &Array, down: &Array) -> Array {
    let s = cpu();
    let t = |a: &Array| a.transpose(&s).unwrap();
    let hidden = silu_array(&x.matmul(t(gate), &s).unwrap(), &s)
        .multiply(x.matmul(t(up), &s).unwrap(), &s)
        .unwrap();
    hidden.matmul(t(down), &s).unwrap()
}

/// Forward and sequence-parallel forward equal the dense MLP for a hidden
/// size of `h`; returns the layer and its input.
fn check(group: &Group, h: i32) -> (Mlp, ShardedArray<Replicated>) {
    let s = cpu();
    let n = group.size() as i32;
    let what = format!("H = {h} over {n} ranks");
    let mut rng = Rng::new(23);
    let (t, d) = (2 * n, 8);
    let x = random(&mut rng, &[t, d], 1.0);
    let (gate, up, down) = (
        random(&mut rng, &[h, d], 0.2),
        random(&mut rng, &[h, d], 0.2),
        random(&mut rng, &[d, h], 0.2),
    );
    let want = dense(&x, &gate, &up, &down);
    let mlp = Mlp::from_full(group, gate, up, down, &s).expect("mlp");
    let first: i32 = (0..group.rank() as i32)
        .map(|r| h / n + i32::from(r < h % n))
        .sum();
    let count = h / n + i32::from((group.rank() as i32) < h % n);
    assert_eq!(mlp.hidden(), (first as usize, count as usize), "{what}");
    let xr = ShardedArray::replicated(x, group);
    assert_close(
        mlp.forward(&xr, &s).unwrap().local(),
        &want,
        &format!("{what}: forward"),
        &s,
    );
    let rows = xr.clone().shard::<0>(&s).unwrap();
    let out = mlp.forward_sequence_parallel(rows, &s).unwrap();
    assert_eq!(out.global_shape(), &[t, d], "{what}");
    assert_close(
        out.all_gather(&s).unwrap().local(),
        &want,
        &format!("{what}: sequence parallel"),
        &s,
    );
    (mlp, xr)
}

#[test]
fn mlp_matches_dense_at_1_to_4_ranks() {
    for ranks in [1, 2, 3, 4] {
        Ranks::new(ranks)
            .run_test(|group| {
                // Even, uneven (7 over 2-4), and trainable everywhere.
                for h in [12, 7] {
                    let (mlp, xr) = check(group, h);
                    assert_eq!(mlp.parameters().len(), 3);
                    let s = cpu();
                    let mut locals = vec![xr.local().clone()];
                    locals.extend(mlp.parameters().into_iter().map(|p| p.local));
                    let (_, grads) = value_and_grad(&locals, |p| {
                        let x = ShardedArray::<Replicated>::replicated(p[0].clone(), group);
                        let mlp = mlp.with_parameters(&p[1..])?;
                        mlp.forward(&x, &s)?.sum_all(&s)
                    })
                    .unwrap();
                    let shapes: Vec<&[i32]> = grads.iter().map(Array::shape).collect();
                    let c = mlp.hidden().1 as i32;
                    assert_eq!(
                        shapes,
                        [&[2 * group.size() as i32, 8][..], &[c, 8], &[c, 8], &[8, c]]
                    );
                }
            })
            .unwrap_or_else(|e| panic!("{ranks} ranks: {e}"));
    }
}

#[test]
fn a_rank_without_hidden_columns_adds_zeros_and_refuses_a_gradient() {
    Ranks::new(4)
        .run_test(|group| {
            let (mlp, xr) = check(group, 3);
            let s = cpu();
            let result = value_and_grad(&[xr.local().clone()], |p| {
                let x = ShardedArray::<Replicated>::replicated(p[0].clone(), group);
                mlp.forward(&x, &s)?.sum_all(&s)
            });
            if group.rank() == 3 {
                assert_eq!(
                    result.expect_err("no hidden column").to_string(),
                    "rank 3 holds none of the MLP's 3 hidden columns, so it cannot take part in a gradient; train on fewer ranks"
                );
            }
        })
        .unwrap();
}
