//! The typed pieces attention and the MoE are written with: `add_bias` (a
//! bias follows its outputs), `shard_map` (each rank's own computation on
//! its shards), `partial_map` (a rank's share of a sum) and `copy_of` (a
//! part held by several ranks, e.g. a shared KV head):
//! values and gradients against the dense computation at 1 to 4 ranks.

use safemlx::{Array, Stream};
use safemlx_dist::grad::value_and_grad;
use safemlx_dist::launch::Ranks;
use safemlx_dist::typed::{chunk, partial_map, shard_map, LinearWeight};
use safemlx_dist::{Group, Replicated, Sharded, ShardedArray};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{assert_close, random, silu_array};
use safemlx_dist_tests::typed::Rng;

/// `count` entries of `full` along `axis` from `first`.
fn entries(full: &Array, axis: i32, (first, count): (usize, usize), s: &Stream) -> Array {
    let idx: Vec<i32> = (first as i32..(first + count) as i32).collect();
    full.take_axis(Array::from_slice(&idx, &[count as i32]), axis, s)
        .unwrap()
}

/// Six heads of width 2, split by heads (uneven at 4 ranks): the tokens
/// times `w` plus `b`, each head scaled by the replicated `g` and put
/// through silu on its own rank, then the output projection `o`.
fn check_heads(group: &Group) {
    let s = cpu();
    let mut rng = Rng::new(21);
    let (t, d, heads, width) = (3, 8, 6, 2);
    let out = heads * width;
    let full = [
        random(&mut rng, &[t, d], 0.5),
        random(&mut rng, &[out, d], 0.3),
        random(&mut rng, &[out], 0.3),
        random(&mut rng, &[width], 0.5),
        random(&mut rng, &[d, out], 0.3),
    ];
    let per_head = |y: &Array, g: &Array, t: i32| -> Array {
        let h = y.shape()[1] / width;
        let scaled = y
            .reshape(&[t, h, width], &s)
            .unwrap()
            .multiply(g, &s)
            .unwrap();
        silu_array(&scaled, &s)
            .reshape(&[t, h * width], &s)
            .unwrap()
    };
    let dense_loss = |p: &[Array]| -> Vec<Array> {
        let y = p[0]
            .matmul(p[1].transpose(&s).unwrap(), &s)
            .unwrap()
            .add(&p[2], &s)
            .unwrap();
        let z = per_head(&y, &p[3], t).matmul(p[4].transpose(&s).unwrap(), &s);
        vec![z.unwrap().square(&s).unwrap().sum(None, &s).unwrap()]
    };
    let (want_loss, want) =
        safemlx::transforms::value_and_grad_with_argnums(dense_loss, &[0, 1, 2, 3, 4][..])(&full)
            .unwrap();
    let split: Vec<usize> = (0..group.size())
        .map(|r| chunk(heads as usize, r, group.size()).1 * width as usize)
        .collect();
    let mine = (split[..group.rank()].iter().sum(), split[group.rank()]);
    let local = [
        full[0].clone(),
        entries(&full[1], 0, mine, &s),
        entries(&full[2], 0, mine, &s),
        full[3].clone(),
        entries(&full[4], 1, mine, &s),
    ];
    let (loss, grads) = value_and_grad(&local, |p| {
        let x = ShardedArray::<Replicated>::from_local(p[0].clone(), group, &[t, d])?;
        let sharded =
            |a: &Array, global: &[i32]| -> safemlx_dist::Result<ShardedArray<Sharded<0>>> {
                ShardedArray::from_local_split(a.clone(), group, global, &split)
            };
        let w = LinearWeight::Float(sharded(&p[1], &[out, d])?);
        let b = sharded(&p[2], &[out])?;
        let g = ShardedArray::<Replicated>::from_local(p[3].clone(), group, &[width])?;
        let o = LinearWeight::Float(ShardedArray::<Sharded<1>>::from_local_split(
            p[4].clone(),
            group,
            &[d, out],
            &split,
        )?);
        let y = x.linear(&w, &s)?.add_bias(&b, &s)?;
        let shape = y.global_shape().to_vec();
        let heads = shard_map(
            [&y],
            &[&g],
            (&shape, Some(&split)),
            |[y], g| Ok(per_head(&y, &g[0], t)),
            &s,
        )?;
        let z = heads.linear(&o, &s)?.all_sum(&s)?;
        z.mul(&z, &s)?.sum_all(&s)
    })
    .expect("value_and_grad");
    assert_close(&loss, &want_loss[0], "heads: loss", &s);
    let expected = [
        ("x (replicated)", want[0].clone()),
        ("w (this rank's head rows)", entries(&want[1], 0, mine, &s)),
        ("b (this rank's heads)", entries(&want[2], 0, mine, &s)),
        ("g (replicated, meets every rank's heads)", want[3].clone()),
        (
            "o (this rank's head columns)",
            entries(&want[4], 1, mine, &s),
        ),
    ];
    for (got, (name, want)) in grads.iter().zip(&expected) {
        assert_close(got, want, &format!("heads: d loss / d {name}"), &s);
    }
}

/// One weight `k` `[2, d]` held whole by every rank, declared copies: each
/// rank uses its copy differently (scaled by its rank + 1), and the
/// gradient of each copy is the gradient of the one shared weight.
fn check_copies(group: &Group) {
    let s = cpu();
    let mut rng = Rng::new(5);
    let (t, d, n) = (3, 4, group.size());
    let x = random(&mut rng, &[t, d], 0.5);
    let k = random(&mut rng, &[2, d], 0.5);
    let dense_loss = |p: &[Array]| -> Vec<Array> {
        let y = x.matmul(p[0].transpose(&s).unwrap(), &s).unwrap();
        let squares = y.square(&s).unwrap().sum(None, &s).unwrap();
        // Rank r scales by r + 1: the sum of (r + 1)^2 over the ranks.
        let weight = (1..=n).map(|r| (r * r) as f32).sum::<f32>();
        vec![squares.multiply(Array::from_f32(weight), &s).unwrap()]
    };
    let (want_loss, want) = safemlx::transforms::value_and_grad_with_argnums(dense_loss, &[0][..])(
        std::slice::from_ref(&k),
    )
    .unwrap();
    let rank = group.rank() as f32 + 1.0;
    let split = vec![2; n];
    let (loss, grads) = value_and_grad(std::slice::from_ref(&k), |p| {
        let copy = ShardedArray::<Sharded<0>>::from_local_split(
            p[0].clone(),
            group,
            &[2 * n as i32, d],
            &split,
        )?
        .copy_of(0, 1, n)?;
        assert_eq!(copy.holders(), n);
        let xr = ShardedArray::<Replicated>::replicated(x.clone(), group);
        let y = xr.linear(&LinearWeight::Float(copy), &s)?;
        let shape = y.global_shape().to_vec();
        let scaled = shard_map(
            [&y],
            &[],
            (&shape, Some(&split)),
            |[y], _| Ok(y.multiply(Array::from_f32(rank), &s)?),
            &s,
        )?;
        let all = scaled.all_gather(&s)?;
        all.mul(&all, &s)?.sum_all(&s)
    })
    .expect("value_and_grad");
    assert_close(&loss, &want_loss[0], "copies: loss", &s);
    assert_close(
        &grads[0],
        &want[0],
        "copies: d loss / d k on every rank",
        &s,
    );
}

/// A rank's share of a sum from two replicated inputs, each rank's by
/// another graph (rank 0 adds nothing, through other operations than its
/// peers): the value and both inputs' gradients equal the dense ones.
fn check_partial_share(group: &Group) {
    let s = cpu();
    let mut rng = Rng::new(8);
    let (t, d) = (3, 4);
    let full = [random(&mut rng, &[t, d], 0.5), random(&mut rng, &[d], 0.5)];
    let n = group.size();
    // Rank r contributes r (x * g): the sum is (x * g) n (n - 1) / 2.
    let total = (n * (n - 1) / 2) as f32;
    let dense_loss = |p: &[Array]| -> Vec<Array> {
        let y = p[0]
            .multiply(&p[1], &s)
            .unwrap()
            .multiply(Array::from_f32(total), &s)
            .unwrap();
        vec![y.square(&s).unwrap().sum(None, &s).unwrap()]
    };
    let (want_loss, want) =
        safemlx::transforms::value_and_grad_with_argnums(dense_loss, &[0, 1][..])(&full).unwrap();
    let rank = group.rank();
    let (loss, grads) = value_and_grad(&full, |p| {
        let x = ShardedArray::<Replicated>::from_local(p[0].clone(), group, &[t, d])?;
        let g = ShardedArray::<Replicated>::from_local(p[1].clone(), group, &[d])?;
        let share = partial_map(
            &[&x, &g],
            &[t, d],
            |inputs| {
                let (x, g) = (&inputs[0], &inputs[1]);
                Ok(if rank == 0 {
                    // Nothing, but from both inputs.
                    x.multiply(Array::from_f32(0.0), &s)?
                        .add(g.sum(None, &s)?.multiply(Array::from_f32(0.0), &s)?, &s)?
                } else {
                    x.multiply(g, &s)?
                        .multiply(Array::from_f32(rank as f32), &s)?
                })
            },
            &s,
        )?;
        let y = share.all_sum(&s)?;
        y.mul(&y, &s)?.sum_all(&s)
    })
    .expect("value_and_grad");
    assert_close(&loss, &want_loss[0], "partial share: loss", &s);
    assert_close(&grads[0], &want[0], "partial share: d loss / d x", &s);
    assert_close(&grads[1], &want[1], "partial share: d loss / d g", &s);
}

/// The messages of the checks that run before any computation.
fn check_errors(group: &Group) {
    let s = cpu();
    let n = group.size();
    let y = ShardedArray::<Replicated>::replicated(Array::from_slice(&[0f32; 8], &[2, 4]), group)
        .shard::<1>(&s)
        .unwrap();
    let short = ShardedArray::<Replicated>::replicated(Array::from_slice(&[0f32; 3], &[3]), group)
        .shard::<0>(&s)
        .unwrap();
    assert_eq!(
        y.add_bias(&short, &s).unwrap_err().to_string(),
        "a bias of global shape [3] added to outputs of global shape [2, 4]: the bias needs one value per output column"
    );
    let whole = ShardedArray::<Replicated>::replicated(Array::from_slice(&[0f32; 4], &[4]), group);
    assert_eq!(
        whole.copy_of(0, 1, n).unwrap_err().to_string(),
        format!("a Replicated array declared copies held by [{n}] ranks: copies are parts of a Sharded array (a Replicated one is whole on every rank already)")
    );
    let part = chunk(3, group.rank(), n).1;
    assert_eq!(
        short.clone().blocks_of(0, 2, 2, &[1, 1]).unwrap_err().to_string(),
        format!("a Sharded<0> part of {part} entries declared blocks 0..2 of 2 blocks of 2 entries held by [1, 1] ranks: the blocks must lie below the count, each held by at least one rank, the part as long as its blocks")
    );
    let shape = y.global_shape().to_vec();
    let error = shard_map(
        [&y],
        &[],
        (&shape, None),
        |[y], _| Ok(y.reshape(&[-1], &s)?),
        &s,
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("but the local array has shape"),
        "a result of another shape: {error}"
    );
}

#[test]
fn typed_heads_copies_and_biases_match_dense_at_1_to_4_ranks() {
    for n in 1..=4 {
        Ranks::new(n)
            .run_test(|group| {
                check_heads(group);
                check_copies(group);
                check_partial_share(group);
                check_errors(group);
            })
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}
