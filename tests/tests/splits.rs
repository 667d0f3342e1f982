//! Sharded arrays divided by an explicit split (a split by heads, or by
//! quantization groups) instead of the chunk rule: the typed ops carry it
//! (column-parallel matmul, nonlinearity, transpose, gather) and check it
//! (a row-parallel matmul of differently split operands is an error), and
//! a column- then row-parallel product, float or quantized, equals the
//! dense one at 1 to 4 ranks.

use safemlx::{Array, Stream};
use safemlx_dist::affine::AffineWeight;
use safemlx_dist::launch::Ranks;
use safemlx_dist::{Group, QuantizedArray, Replicated, Sharded, ShardedArray};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{assert_close, random, silu_array};
use safemlx_dist_tests::typed::Rng;

/// An uneven split of `units` units of `unit` elements over `n` ranks, not
/// the chunk rule's: one unit for each rank but the first, which takes the
/// rest, except rank 1 of 3 or more, which takes none.
fn uneven(units: usize, unit: usize, n: usize) -> Vec<usize> {
    let mut split: Vec<usize> = (0..n)
        .map(|r| usize::from(r > 0 && !(n >= 3 && r == 1)) * unit)
        .collect();
    split[0] = units * unit - split.iter().sum::<usize>();
    split
}

/// Columns (`axis` 1) or rows (`axis` 0) `offset..offset + len` of `a`.
fn slice(a: &Array, axis: i32, offset: usize, len: usize, s: &Stream) -> Array {
    let idx: Vec<i32> = (offset as i32..(offset + len) as i32).collect();
    a.take_axis(Array::from_slice(&idx, &[len as i32]), axis, s)
        .unwrap()
}

fn mine(split: &[usize], group: &Group) -> (usize, usize) {
    (split[..group.rank()].iter().sum(), split[group.rank()])
}

fn check_float(group: &Group) {
    let s = cpu();
    let mut rng = Rng::new(5);
    let (t, d, h) = (3, 4, 6);
    let x = random(&mut rng, &[t, d], 0.1);
    let w1 = random(&mut rng, &[d, h], 0.1);
    let w2 = random(&mut rng, &[h, d], 0.1);
    let split = uneven(h as usize, 1, group.size());
    let (first, len) = mine(&split, group);
    let w1s = ShardedArray::<Sharded<1>>::from_local_split(
        slice(&w1, 1, first, len, &s),
        group,
        &[d, h],
        &split,
    )
    .unwrap();
    let w2s = ShardedArray::<Sharded<0>>::from_local_split(
        slice(&w2, 0, first, len, &s),
        group,
        &[h, d],
        &split,
    )
    .unwrap();
    let xr = ShardedArray::replicated(x.clone(), group);
    let hidden = xr.matmul(&w1s, &s).unwrap().silu(&s).unwrap();
    assert_eq!(hidden.axis_split(), Some(split.clone()));
    let y = hidden.matmul(&w2s, &s).unwrap().all_sum(&s).unwrap();
    let dense_hidden = silu_array(&x.matmul(&w1, &s).unwrap(), &s);
    let want = dense_hidden.matmul(&w2, &s).unwrap();
    assert_close(y.local(), &want, "split column then row parallel", &s);
    // The gather puts the uneven parts together.
    let gathered = hidden.clone().all_gather(&s).unwrap();
    assert_close(gathered.local(), &dense_hidden, "gathered split", &s);
    // A transpose moves the split to the other axis.
    assert_eq!(w1s.transpose(&s).unwrap().axis_split(), Some(split.clone()));
    if group.size() == 2 {
        // The chunk rule's rows ([3, 3]) do not meet the [5, 1] split.
        let chunked = ShardedArray::replicated(w2.clone(), group)
            .shard::<0>(&s)
            .unwrap();
        let err = hidden.matmul(&chunked, &s).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "matmul of Sharded<1> [3, 6] by Sharded<0> [6, 4]: the left's columns are split {split:?} over the ranks but the right's rows [3, 3]; they must be split alike"
            )
        );
        let bad = ShardedArray::<Sharded<1>>::from_local_split(x.clone(), group, &[t, 8], &[5, 2])
            .unwrap_err()
            .to_string();
        assert_eq!(
            bad,
            "a split [5, 2] of axis 1 of global shape [3, 8] over 2 ranks: it needs one length per rank, adding up to the axis"
        );
    }
}

fn check_quantized(group: &Group) {
    let s = cpu();
    let mut rng = Rng::new(9);
    let (t, d, h, gs) = (2, 64, 192, 32);
    let x = random(&mut rng, &[t, d], 0.1);
    let gate = AffineWeight::quantize(&random(&mut rng, &[h, d], 0.05), gs, 4, &s).unwrap();
    let down = AffineWeight::quantize(&random(&mut rng, &[d, h], 0.05), gs, 4, &s).unwrap();
    // Whole groups of `down`'s inputs, unevenly; `gate` takes the same rows.
    let split = uneven(h as usize / gs, gs, group.size());
    let (first, len) = mine(&split, group);
    let gate_part = gate.rows(first, len, &s).unwrap();
    let down_part = down.groups(first / gs, len / gs, &s).unwrap();
    let gq = QuantizedArray::<Sharded<0>>::from_local_split(
        gate_part,
        group,
        [h as usize, d as usize],
        &split,
    )
    .unwrap();
    let dq = QuantizedArray::<Sharded<1>>::from_local_split(
        down_part,
        group,
        [d as usize, h as usize],
        &split,
    )
    .unwrap();
    assert_eq!(dq.axis_split(), Some(split.clone()));
    let xr: ShardedArray<Replicated> = ShardedArray::replicated(x.clone(), group);
    let hidden = xr.quantized_matmul(&gq, &s).unwrap().silu(&s).unwrap();
    let y = hidden
        .quantized_matmul(&dq, &s)
        .unwrap()
        .all_sum(&s)
        .unwrap();
    let dense_hidden = silu_array(&gate.matmul_t(&x, &s).unwrap(), &s);
    let want = down.matmul_t(&dense_hidden, &s).unwrap();
    assert_close(
        y.local(),
        &want,
        "split quantized column then row parallel",
        &s,
    );
    // The same gathered again.
    let back = dq.gather_full(&s).unwrap();
    assert_close(
        &back.dequantize(&s).unwrap(),
        &down.dequantize(&s).unwrap(),
        "quantized gather of a split",
        &s,
    );
}

fn on(ranks: usize) {
    Ranks::new(ranks)
        .run_test(|group| {
            check_float(group);
            check_quantized(group);
        })
        .unwrap_or_else(|e| panic!("{ranks} ranks: {e}"));
}

#[test]
fn explicit_splits_on_1_rank() {
    on(1);
}

#[test]
fn explicit_splits_on_2_ranks() {
    on(2);
}

#[test]
fn explicit_splits_on_3_ranks() {
    on(3);
}

#[test]
fn explicit_splits_on_4_ranks() {
    on(4);
}
