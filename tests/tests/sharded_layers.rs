//! `#[sharded]` layer structs between real processes: each rank keeps
//! exactly its part of every weight, the layer written with the typed layer
//! equals the dense single-process math, and gathering gives back the full
//! weights, fused QKV segments included.

use safemlx::{Array, Stream};
use safemlx_dist::launch::Ranks;
use safemlx_dist::{sharded, Group, Replicated, Sharded, ShardedArray};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{host, max_relative_error};
use safemlx_dist_tests::typed::Rng;

/// A tensor-parallel MLP: column-parallel up projection, row-parallel down.
#[sharded]
struct Mlp {
    #[shard(Sharded<1>)]
    up: ShardedArray<Sharded<1>>,
    #[shard(Sharded<0>)]
    down: ShardedArray<Sharded<0>>,
}

impl Mlp {
    /// Written by hand with the typed layer.
    fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> safemlx_dist::Result<ShardedArray<Replicated>> {
        x.matmul(&self.up, s)?
            .silu(s)?
            .matmul(&self.down, s)?
            .all_sum(s)
    }

    /// The same with `#[sharded]`: the input arrives sequence-sharded and
    /// is gathered; the body's `Partial` result gets the `all_sum`.
    #[sharded(x: [T, D = 8] @ Replicated, return: [T, D = 8] @ Replicated)]
    fn forward_macro(
        &self,
        x: ShardedArray<Sharded<0>>,
        s: &Stream,
    ) -> safemlx_dist::Result<ShardedArray<Replicated>> {
        x.matmul(&self.up, s)?.silu(s)?.matmul(&self.down, s)
    }

    /// Sequence-parallel output: the macro inserts a `sum_scatter`.
    #[sharded(x @ Replicated, return: [T, 8] @ Sharded<0>)]
    fn forward_scattered(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> safemlx_dist::Result<ShardedArray<Sharded<0>>> {
        x.matmul(&self.up, s)?.silu(s)?.matmul(&self.down, s)
    }
}

/// A fused QKV projection (three column blocks, each split across ranks)
/// and a replicated norm weight.
#[sharded]
struct Projection {
    #[shard(Sharded<1>, segments = 3)]
    qkv: ShardedArray<Sharded<1>>,
    #[shard(Replicated)]
    norm: ShardedArray<Replicated>,
}

impl Projection {
    /// Heads stay sharded: column-parallel QKV, no collective on the way out.
    #[sharded(x: [T, D] @ Replicated, return @ Sharded<1>)]
    fn project(
        &self,
        x: ShardedArray<Replicated>,
        s: &Stream,
    ) -> safemlx_dist::Result<ShardedArray<Sharded<1>>> {
        x.matmul(&self.qkv, s)
    }
}

fn check(group: &Group) {
    let s = cpu();
    let n = group.size() as i32;
    let mut rng = Rng::new(5);
    let (t, d, h) = (3, 8, 4 * n);
    let (x, up, down) = (
        safemlx_dist_tests::dense::random(&mut rng, &[t, d], 0.1),
        safemlx_dist_tests::dense::random(&mut rng, &[d, h], 0.1),
        safemlx_dist_tests::dense::random(&mut rng, &[h, d], 0.1),
    );

    let mlp = Mlp::from_full(group, up.clone(), down.clone(), &s).expect("shard the MLP");
    let layout = mlp.layout();
    assert_eq!(layout[0].name, "up");
    assert_eq!(layout[0].placement, "Sharded<1>");
    assert_eq!(layout[0].global_shape, [d, h]);
    assert_eq!(layout[0].local_shape, [d, h / n]);
    assert_eq!(layout[1].local_shape, [h / n, d]);

    // Dense, one process.
    let hidden = x.matmul(&up, &s).unwrap();
    let hidden = hidden
        .multiply(safemlx::ops::sigmoid(&hidden, &s).unwrap(), &s)
        .unwrap();
    let dense = host(&hidden.matmul(&down, &s).unwrap(), &s);
    let y = mlp
        .forward(&ShardedArray::replicated(x.clone(), group), &s)
        .expect("forward");
    let err = max_relative_error(&host(y.local(), &s), &dense);
    assert!(err <= 1e-5, "sharded MLP differs from dense by {err}");

    // The macro-annotated forward equals the hand-written one.
    let rows = ShardedArray::replicated(x.clone(), group)
        .shard::<0>(&s)
        .expect("sequence shard");
    let y_macro = mlp.forward_macro(rows, &s).expect("macro forward");
    assert!(
        max_relative_error(&host(y_macro.local(), &s), &dense) <= 1e-5,
        "macro forward"
    );
    let scattered = mlp
        .forward_scattered(&ShardedArray::replicated(x.clone(), group), &s)
        .expect("scattered forward");
    let back = scattered.all_gather(&s).expect("gather rows");
    assert!(
        max_relative_error(&host(back.local(), &s), &dense) <= 1e-5,
        "sum_scatter return"
    );
    // A wrong shape is caught before any collective, naming the parameter.
    let wide = ShardedArray::replicated(
        safemlx_dist_tests::dense::random(&mut rng, &[t, d + 1], 0.1),
        group,
    )
    .shard::<0>(&s)
    .unwrap();
    let error = mlp.forward_macro(wide, &s).expect_err("wrong width");
    assert_eq!(
        error.to_string(),
        format!(
            "`x` is declared [T, D = 8] but its global shape is [{t}, 9]: axis 1 is 9, expected 8"
        )
    );

    let full = mlp.gather_full(&s).expect("gather");
    assert_eq!(full[0].0, "up");
    assert_eq!(host(&full[0].1, &s), host(&up, &s));
    assert_eq!(host(&full[1].1, &s), host(&down, &s));

    // Fused QKV: rank r holds [Q_r | K_r | V_r]; x @ local = those columns of x @ qkv.
    let width = 2 * n; // per segment
    let (qkv, norm) = (
        safemlx_dist_tests::dense::random(&mut rng, &[d, 3 * width], 0.1),
        safemlx_dist_tests::dense::random(&mut rng, &[d], 0.1),
    );
    let proj = Projection::from_full(group, qkv.clone(), norm.clone(), &s).expect("shard QKV");
    assert_eq!(proj.layout()[0].segments, 3);
    assert_eq!(proj.layout()[0].local_shape, [d, 6]);
    let local = host(&x.matmul(proj.qkv.local(), &s).unwrap(), &s);
    let dense = host(&x.matmul(&qkv, &s).unwrap(), &s);
    let r = group.rank() as i32;
    let columns: Vec<i32> = (0..3)
        .flat_map(|j| (0..2).map(move |c| j * width + r * 2 + c))
        .collect();
    let expected: Vec<f32> = (0..t)
        .flat_map(|row| columns.iter().map(move |&c| (row, c)))
        .map(|(row, c)| dense[(row * 3 * width + c) as usize])
        .collect();
    assert!(
        max_relative_error(&local, &expected) <= 1e-5,
        "QKV segments"
    );
    let projected = proj
        .project(ShardedArray::replicated(x.clone(), group), &s)
        .expect("macro projection");
    assert_eq!(
        host(projected.local(), &s),
        local,
        "macro projection = hand-written"
    );
    let back = proj.gather_full(&s).expect("gather QKV");
    assert_eq!(
        host(&back[0].1, &s),
        host(&qkv, &s),
        "QKV gathers back in its original order"
    );
    assert_eq!(host(&back[1].1, &s), host(&norm, &s));
    assert_eq!(proj.norm.comm().size(), group.size());
}

#[test]
fn sharded_structs_match_dense_at_1_2_and_4_ranks() {
    for ranks in [1, 2, 4] {
        Ranks::new(ranks)
            .run_test(check)
            .unwrap_or_else(|e| panic!("{ranks} ranks: {e}"));
    }
}

#[test]
fn segments_that_do_not_divide_are_a_clear_error() {
    Ranks::new(2)
        .run_test(|group| {
            let s = cpu();
            let qkv = Array::from_slice(&[0f32; 4 * 9], &[4, 9]); // 3 segments of 3 columns over 2 ranks
            let norm = Array::from_slice(&[1f32; 4], &[4]);
            let error = Projection::from_full(group, qkv, norm, &s).err().expect("3 columns over 2 ranks");
            assert_eq!(
                error.to_string(),
                "weight `qkv` has 9 elements along axis 1 in 3 segments: each segment (3 elements) must divide evenly over 2 ranks"
            );
        })
        .unwrap();
}

/// A layer for any static mesh size, with declared full shapes: the
/// divisibility of 16 by `N` is checked when `Wide::<N>` is instantiated.
#[sharded]
struct Wide<const N: usize> {
    #[shard(Sharded<1>, dims = [8, 16])]
    up: ShardedArray<Sharded<1>, safemlx_dist::Mesh<N>>,
    #[shard(Replicated, dims = [16])]
    bias: ShardedArray<Replicated, safemlx_dist::Mesh<N>>,
}

fn check_wide<const N: usize>(group: &Group) {
    let s = cpu();
    let mesh = safemlx_dist::Mesh::<N>::new(group.clone()).expect("launched with N ranks");
    let up = Array::from_slice(&[0.5f32; 8 * 16], &[8, 16]);
    let bias = Array::from_slice(&[0.0f32; 16], &[16]);
    let layer = Wide::<N>::from_full(&mesh, up.clone(), bias.clone(), &s).expect("declared shapes");
    assert_eq!(layer.layout()[0].local_shape, [8, 16 / N as i32]);
    let error = Wide::<N>::from_full(
        &mesh,
        Array::from_slice(&[0.5f32; 8 * 12], &[8, 12]),
        bias,
        &s,
    )
    .err()
    .map(|e| e.to_string());
    assert_eq!(
        error.as_deref(),
        Some(
            "weight `up` is declared with dims [8, 16] but the full weight given has shape [8, 12]"
        )
    );
}

#[test]
fn declared_dims_on_static_meshes_of_2_and_4() {
    Ranks::new(2).run_test(check_wide::<2>).unwrap();
    Ranks::new(4).run_test(check_wide::<4>).unwrap();
}
