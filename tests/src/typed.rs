//! Property checks of the typed layer, run by every rank: random shapes
//! (uneven chunks included), axes and dtypes, against host computations.

use safemlx::{Array, Dtype, Stream};
use safemlx_dist::typed::chunk;
use safemlx_dist::{Collective, Partial, Replicated, Sharded, ShardedArray};

use crate::{array, cpu, read};

/// A small deterministic generator (xorshift), seeded the same on every
/// rank so that "the same array on every rank" needs no communication.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        lo + (self.0 % (hi - lo + 1) as u64) as usize
    }

    /// `len` small integers in `-9..=9` (exact in float32 and int32 sums).
    pub fn values(&mut self, len: usize) -> Vec<i32> {
        (0..len).map(|_| self.range(0, 18) as i32 - 9).collect()
    }
}

fn global_shape(rng: &mut Rng, n: usize) -> Vec<i32> {
    // Dimensions from 1 to 2n + 3: often not divisible by n, sometimes smaller.
    (0..rng.range(2, 3))
        .map(|_| rng.range(1, 2 * n + 3) as i32)
        .collect()
}

/// Row-major slice of `values` (shape `shape`) along `axis`: `[offset, offset + len)`.
fn host_slice(values: &[i32], shape: &[i32], axis: usize, offset: usize, len: usize) -> Vec<i32> {
    let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    let inner: usize = dims[axis + 1..].iter().product();
    let outer: usize = dims[..axis].iter().product();
    let mut out = Vec::new();
    for o in 0..outer {
        let base = o * dims[axis] * inner;
        out.extend_from_slice(&values[base + offset * inner..base + (offset + len) * inner]);
    }
    out
}

fn check_axis<const A: usize, C: Collective>(comm: &C, rng: &mut Rng, dtype: Dtype, s: &Stream) {
    let (r, n) = (comm.rank(), comm.size());
    let shape = global_shape(rng, n);
    if A >= shape.len() {
        return;
    }
    let full = rng.values(shape.iter().product::<i32>() as usize);
    let x = ShardedArray::replicated(array(&full, &shape, dtype, s), comm);

    // Replicated -> Sharded<A> is this rank's chunk; -> Replicated is the identity.
    let sharded = x.clone().shard::<A>(s).expect("shard");
    let (offset, len) = chunk(shape[A] as usize, r, n);
    assert_eq!(
        read(sharded.local(), dtype, s),
        host_slice(&full, &shape, A, offset, len),
        "rank {r}: chunk along {A} of {shape:?}"
    );
    let gathered = sharded.clone().all_gather(s).expect("all_gather");
    assert_eq!(gathered.global_shape(), shape.as_slice());
    assert_eq!(
        read(gathered.local(), dtype, s),
        full,
        "shard -> gather along {A} of {shape:?}"
    );

    // Sharded<A> -> Sharded<B> -> Replicated is the identity, for every other axis.
    for b in 0..shape.len() {
        let back = match b {
            0 => reshard::<A, 0, C>(&sharded, s),
            1 => reshard::<A, 1, C>(&sharded, s),
            _ => reshard::<A, 2, C>(&sharded, s),
        };
        assert_eq!(
            back, full,
            "Sharded<{A}> -> Sharded<{b}> -> Replicated of {shape:?}"
        );
    }

    // Reshaping the axes after A keeps the layout: gathering gives the
    // reshaped original.
    let merged: Vec<i32> = shape[..=A]
        .iter()
        .copied()
        .chain((A + 1 < shape.len()).then(|| shape[A + 1..].iter().product()))
        .collect();
    let reshaped = sharded
        .reshape(&merged, s)
        .expect("reshape after the sharded axis");
    assert_eq!(reshaped.global_shape(), merged.as_slice());
    let gathered = reshaped.all_gather(s).expect("gather reshaped");
    assert_eq!(
        read(gathered.local(), dtype, s),
        full,
        "reshape {shape:?} -> {merged:?}"
    );
    if A > 0 {
        let moved: Vec<i32> = vec![shape.iter().product()];
        let error = sharded
            .reshape(&moved, s)
            .expect_err("merging the sharded axis");
        assert!(
            error.to_string().contains("keeps its sharded axis"),
            "{error}"
        );
    }

    // Partial: rank q holds values scaled by (q + 1); the logical array is their sum.
    let partial_values: Vec<i32> = full.iter().map(|v| v * (r as i32 + 1)).collect();
    let partial = ShardedArray::<Partial, C>::from_local(
        array(&partial_values, &shape, dtype, s),
        comm,
        &shape,
    )
    .expect("a Partial local has the global shape");
    let weight = (n * (n + 1) / 2) as i32;
    let summed: Vec<i32> = full.iter().map(|v| v * weight).collect();
    let replicated = partial.clone().all_sum(s).expect("all_sum");
    assert_eq!(
        read(replicated.local(), dtype, s),
        summed,
        "Partial -> Replicated of {shape:?}"
    );
    let scattered = partial.sum_scatter::<A>(s).expect("sum_scatter");
    assert_eq!(
        read(scattered.local(), dtype, s),
        host_slice(&summed, &shape, A, offset, len),
        "Partial -> Sharded<{A}> of {shape:?}"
    );
}

fn reshard<const A: usize, const B: usize, C: Collective>(
    x: &ShardedArray<Sharded<A>, C>,
    s: &Stream,
) -> Vec<i32> {
    let dtype = x.local().dtype();
    let moved = x.clone().redistribute::<Sharded<B>>(s).expect("all_to_all");
    let back = moved.all_gather(s).expect("all_gather");
    read(back.local(), dtype, s)
}

/// Random shapes, axes 0 to 2, float32 and int32.
pub fn check_redistribution<C: Collective>(comm: &C, seed: u64) {
    let s = cpu();
    let mut rng = Rng::new(seed);
    for round in 0..4 {
        for dtype in [Dtype::Float32, Dtype::Int32] {
            println!("redistribution round {round} {dtype:?}");
            check_axis::<0, C>(comm, &mut rng, dtype, &s);
            check_axis::<1, C>(comm, &mut rng, dtype, &s);
            check_axis::<2, C>(comm, &mut rng, dtype, &s);
        }
    }
}

fn floats(values: &[i32], scale: f32) -> Vec<f32> {
    values.iter().map(|&v| v as f32 * scale).collect()
}

fn max_relative_error(got: &Array, want: &Array, s: &Stream) -> f32 {
    let diff = got.subtract(want, s).and_then(|d| d.abs(s)).expect("diff");
    let scale = want.abs(s).and_then(|w| w.max(None, s)).expect("scale");
    let worst = diff.max(None, s).expect("max");
    let worst = worst.into_evaluated().expect("eval").item::<f32>();
    let scale = scale
        .into_evaluated()
        .expect("eval")
        .item::<f32>()
        .max(1e-6);
    worst / scale
}

/// A two-layer MLP, column- then row-parallel, and the row-sharded
/// (sequence-parallel) variant, against the dense single-process math.
pub fn check_matmul_propagation<C: Collective>(comm: &C, seed: u64) {
    let s = cpu();
    let mut rng = Rng::new(seed);
    let n = comm.size();
    let (t, d, h) = (rng.range(1, 9), rng.range(2, 12), rng.range(n, 4 * n + 1));
    let x = Array::from_slice(&floats(&rng.values(t * d), 0.1), &[t as i32, d as i32]);
    let w1 = Array::from_slice(&floats(&rng.values(d * h), 0.05), &[d as i32, h as i32]);
    let w2 = Array::from_slice(&floats(&rng.values(h * d), 0.05), &[h as i32, d as i32]);

    // Dense, one process.
    let dense_h = x.matmul(&w1, &s).expect("dense");
    let dense_h = dense_h
        .multiply(safemlx::ops::sigmoid(&dense_h, &s).expect("sigmoid"), &s)
        .expect("silu");
    let dense = dense_h.matmul(&w2, &s).expect("dense");

    // Column parallel, nonlinearity on Sharded<1>, row parallel, all_sum.
    let xr = ShardedArray::<Replicated, C>::replicated(x.clone(), comm);
    let w1c = ShardedArray::replicated(w1, comm)
        .shard::<1>(&s)
        .expect("shard w1");
    let w2r = ShardedArray::replicated(w2.clone(), comm)
        .shard::<0>(&s)
        .expect("shard w2");
    let hidden = xr
        .matmul(&w1c, &s)
        .expect("column parallel")
        .silu(&s)
        .expect("silu");
    let partial: ShardedArray<Partial, C> = hidden.matmul(&w2r, &s).expect("row parallel");
    let out = partial.all_sum(&s).expect("all_sum");
    let err = max_relative_error(out.local(), &dense, &s);
    assert!(
        err <= 1e-5,
        "tensor-parallel MLP differs from dense by {err} (t {t}, d {d}, h {h})"
    );

    // Rows sharded: Sharded<0> x Replicated -> Sharded<0>, gathered.
    let xs = xr.shard::<0>(&s).expect("shard rows");
    let w2full = ShardedArray::<Replicated, C>::replicated(w2, comm);
    let hs = ShardedArray::<Replicated, C>::replicated(dense_h.clone(), comm)
        .shard::<0>(&s)
        .expect("shard rows");
    let rows = hs
        .matmul(&w2full, &s)
        .expect("row-sharded")
        .all_gather(&s)
        .expect("gather");
    let err = max_relative_error(rows.local(), &dense, &s);
    assert!(
        err <= 1e-5,
        "row-sharded matmul differs from dense by {err}"
    );
    assert_eq!(xs.global_shape(), &[t as i32, d as i32]);
}

/// Routing rows by run-time counts: rank `r` sends `(r + d) % 3` rows to
/// rank `d` (zero to some), tagged `[sender, destination, index]`; the
/// received rows, the rows sent back and the gathered rows are checked.
pub fn check_routing<C: Collective>(comm: &C, send_counts: &C::Counts) {
    use safemlx_dist::typed::RoutingPlan;
    use safemlx_dist::Ragged;
    let s = cpu();
    let (r, n) = (comm.rank(), comm.size());
    let counts = send_counts.as_ref();
    let row = |from: usize, to: usize, k: usize| [from as i32, to as i32, k as i32];
    let mine: Vec<i32> = (0..n)
        .flat_map(|d| (0..counts[d]).flat_map(move |k| row(r, d, k)))
        .collect();
    let rows = counts.iter().sum::<usize>() as i32;
    let x = ShardedArray::<Ragged, C>::from_local(
        array(&mine, &[rows, 3], Dtype::Int32, &s),
        comm,
        &[rows, 3],
    )
    .expect("ragged rows");
    let plan = RoutingPlan::exchange(comm, send_counts, &s).expect("count exchange");
    let expected_recv: Vec<usize> = (0..n).map(|src| crate::rows_between(src, r)).collect();
    assert_eq!(
        plan.recv_counts(),
        expected_recv.as_slice(),
        "received counts"
    );

    let routed = x.route(&plan, &s).expect("route");
    let expected: Vec<i32> = (0..n)
        .flat_map(|src| (0..expected_recv[src]).flat_map(move |k| row(src, r, k)))
        .collect();
    assert_eq!(
        read(routed.local(), Dtype::Int32, &s),
        expected,
        "routed rows"
    );

    let back = routed.route_back(&plan, &x, &s).expect("route back");
    assert_eq!(
        read(back.local(), Dtype::Int32, &s),
        mine,
        "rows come back in place"
    );

    let all = x.gather_rows(&s).expect("gather rows");
    let everyone: Vec<i32> = (0..n)
        .flat_map(|q| {
            (0..n).flat_map(move |d| (0..crate::rows_between(q, d)).flat_map(move |k| row(q, d, k)))
        })
        .collect();
    assert_eq!(
        read(all.local(), Dtype::Int32, &s),
        everyone,
        "gathered rows"
    );
    assert_eq!(all.global_shape()[0] as usize, everyone.len() / 3);
}
