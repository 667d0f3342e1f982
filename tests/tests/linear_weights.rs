//! `LinearWeight`: one typed weight, float or quantized, with one table of
//! placements for `x.linear(&w)` and a vocabulary lookup whose result is
//! `Partial`; against the dense products and lookups at 1 to 4 ranks.

use safemlx::{Array, Stream};
use safemlx_dist::affine::AffineWeight;
use safemlx_dist::launch::Ranks;
use safemlx_dist::typed::LinearWeight;
use safemlx_dist::{Group, QuantizedArray, Replicated, Sharded, ShardedArray};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{assert_close, random};
use safemlx_dist_tests::typed::Rng;

/// The weight `w` `[out, in]` stored both ways, split by rows and by columns.
fn both(
    w: &Array,
    group: &Group,
    s: &Stream,
) -> [(
    LinearWeight<Sharded<0>>,
    LinearWeight<Sharded<1>>,
    &'static str,
); 2] {
    let q = AffineWeight::quantize(w, 32, 4, s).unwrap();
    let float = |w: &Array| ShardedArray::replicated(w.clone(), group);
    [
        (
            LinearWeight::Float(float(w).shard::<0>(s).unwrap()),
            LinearWeight::Float(float(w).shard::<1>(s).unwrap()),
            "float",
        ),
        (
            LinearWeight::Quantized(QuantizedArray::from_full(&q, group, s).unwrap()),
            LinearWeight::Quantized(QuantizedArray::from_full(&q, group, s).unwrap()),
            "quantized",
        ),
    ]
}

fn check(group: &Group) {
    let s = cpu();
    let mut rng = Rng::new(3);
    let (t, out, inputs) = (3, 8, 64);
    let x = random(&mut rng, &[t, inputs], 0.1);
    let w = random(&mut rng, &[out, inputs], 0.1);
    let q = AffineWeight::quantize(&w, 32, 4, &s).unwrap();
    let dense_w = [w.clone(), q.dequantize(&s).unwrap()];
    let xr = ShardedArray::replicated(x.clone(), group);
    for ((column, row, what), dense) in both(&w, group, &s).into_iter().zip(dense_w) {
        let want = x.matmul(dense.transpose(&s).unwrap(), &s).unwrap();
        // Column parallel: Replicated x Sharded<0> is Sharded<1>.
        let y = xr.linear(&column, &s).unwrap().all_gather(&s).unwrap();
        assert_close(y.local(), &want, &format!("{what} column parallel"), &s);
        // Row parallel: Sharded<1> x Sharded<1> is Partial. (A quantized
        // weight's inputs meet x's element chunks in whole groups of 32 at
        // 1 or 2 ranks only.)
        if what == "float" || group.size() <= 2 {
            let xs = xr.clone().shard::<1>(&s).unwrap();
            let y = xs.linear(&row, &s).unwrap().all_sum(&s).unwrap();
            assert_close(y.local(), &want, &format!("{what} row parallel"), &s);
        }
        // The table's rows: a Partial lookup, completed by all_sum.
        let ids = [7u32, 0, 3, 7];
        let rows = column.lookup(&ids, &s).unwrap().all_sum(&s).unwrap();
        let idx = Array::from_slice(&[7i32, 0, 3, 7], &[4]);
        let want_rows = dense.take_axis(&idx, 0, &s).unwrap();
        assert_close(rows.local(), &want_rows, &format!("{what} lookup"), &s);
        assert_eq!(
            column.lookup(&[1, 8], &s).unwrap_err().to_string(),
            "token 8 at position 1 is outside the vocabulary of 8 tokens"
        );
        assert_eq!(column.global_shape(), [8, 64]);
        assert_eq!(column.is_quantized(), what == "quantized");
    }
    // A replicated weight: Replicated x Replicated.
    let whole = LinearWeight::Float(ShardedArray::<Replicated>::replicated(w.clone(), group));
    let y = xr.linear(&whole, &s).unwrap();
    let want = x.matmul(w.transpose(&s).unwrap(), &s).unwrap();
    assert_close(y.local(), &want, "replicated weight", &s);
}

#[test]
fn linear_weights_at_1_to_4_ranks() {
    for n in 1..=4 {
        Ranks::new(n)
            .run_test(check)
            .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}
