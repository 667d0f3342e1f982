//! Weights that stay quantized: GGUF blocks map exactly onto MLX's affine
//! layout (the `gguf` package's dequantized values, goldens made by
//! `tests/golden/make_gguf_goldens.py`), and quantized column- and
//! row-parallel layers at 1, 2, 3 and 4 ranks equal one process's
//! `quantized_matmul` of the same quantized weights, also as `QuantizedArray`
//! fields of `#[sharded]` structs (gathered, saved and read back).

use std::path::{Path, PathBuf};

use safemlx::ops::indexing::TryIndexOp;
use safemlx::Stream;
use safemlx_dist::affine::{AffineWeight, DEQUANTIZE_BLOCK, DEQUANTIZE_ROWS};
use safemlx_dist::checkpoint::{GgufFile, SafetensorsFile, TensorSource, Weights};
use safemlx_dist::launch::Ranks;
use safemlx_dist::typed::ShardedArray;
use safemlx_dist::{sharded, Backend, Group, QuantizedArray, Replicated, Sharded};
use safemlx_dist_examples::layers::{QuantizedColumnParallelLinear, QuantizedRowParallelLinear};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{host, max_relative_error, random};
use safemlx_dist_tests::typed::Rng;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden/gguf")
        .join(name)
}

/// Q8_0, Q4_0 and Q4_1 with the bits MLX holds them in.
const QUANTIZED: [(&str, usize); 3] = [("q8_0", 8), ("q4_0", 4), ("q4_1", 4)];

#[test]
fn gguf_blocks_are_mlx_affine_weights_with_the_gguf_packages_values() {
    let s = cpu();
    let file = GgufFile::open(golden("quants.gguf")).expect("opens");
    let want = SafetensorsFile::open(golden("quants-dequantized.safetensors")).expect("golden");
    for (name, bits) in QUANTIZED {
        let expected = host(&want.read(name, &s).unwrap(), &s);
        let whole = file.read_quantized_rows(name, &[(0, 4)], &s).unwrap();
        assert_eq!(
            (whole.shape(), whole.group_size, whole.bits),
            ([4, 64], 32, bits)
        );
        // Exactly: no re-quantization, MLX's dequantize gives gguf's values.
        assert_eq!(host(&whole.dequantize(&s).unwrap(), &s), expected, "{name}");
        let rows = file.read_quantized_rows(name, &[(1, 2)], &s).unwrap();
        assert_eq!(
            host(&rows.dequantize(&s).unwrap(), &s),
            expected[64..192],
            "{name}: rows"
        );
        let second: Vec<f32> = (0..4)
            .flat_map(|r| expected[r * 64 + 32..r * 64 + 64].to_vec())
            .collect();
        let groups = file.read_quantized_groups(name, &[(1, 1)], &s).unwrap();
        assert_eq!(groups.shape(), [4, 32]);
        assert_eq!(
            host(&groups.dequantize(&s).unwrap(), &s),
            second,
            "{name}: groups"
        );
        // The shard of the whole equals what was read for it.
        let shard = whole.groups(1, 1, &s).unwrap().rows(1, 2, &s).unwrap();
        let picked: Vec<f32> = second[32..96].to_vec();
        assert_eq!(
            host(&shard.dequantize(&s).unwrap(), &s),
            picked,
            "{name}: shard"
        );
    }
    // A Q4_1 row is 2 blocks of 20 bytes: rows 0..2 read 80 bytes, and
    // group 1 of 4 rows reads 4 blocks.
    let before = file.bytes_read();
    file.read_quantized_rows("q4_1", &[(0, 2)], &s).unwrap();
    file.read_quantized_groups("q4_1", &[(1, 1)], &s).unwrap();
    assert_eq!(file.bytes_read() - before, 80 + 4 * 20);
    let error = file
        .read_quantized_rows("f16", &[(0, 1)], &s)
        .expect_err("f16 has no quantized form")
        .to_string();
    assert!(
        error.ends_with("tensor `f16` is F16; only Q8_0, Q4_0, Q4_1, Q4_K and Q5_K stay quantized (read it with `read_rows`)"),
        "{error}"
    );
}

/// The same quantized weights on every rank: `(gate, up)` `[H, D]` and
/// `down` `[D, H]`, from a fixed seed.
fn weights(
    (d, h): (i32, i32),
    (group_size, bits): (usize, usize),
    s: &Stream,
) -> [AffineWeight; 3] {
    let mut rng = Rng::new(11);
    let mut q = |shape: [i32; 2]| {
        AffineWeight::quantize(&random(&mut rng, &shape, 0.05), group_size, bits, s).unwrap()
    };
    [q([h, d]), q([h, d]), q([d, h])]
}

/// On a CPU, a product of [`DEQUANTIZE_ROWS`] rows or more dequantizes the
/// weight (in blocks of at most [`DEQUANTIZE_BLOCK`] values) where fewer
/// rows go through `quantized_matmul`: both give each row's own product;
/// the dequantized values are MLX's `dequantize`'s, at every width.
#[test]
fn quantized_products_of_many_rows_equal_each_row_alone() {
    let s = cpu();
    let mut rng = Rng::new(5);
    // A small weight, and one of more than a block (2 blocks, uneven).
    let big = (DEQUANTIZE_BLOCK / 512 + 52) as i32;
    let shapes = [
        ([96, 64], 4),
        ([big, 512], 4),
        ([40, 128], 8),
        ([24, 64], 2),
        ([24, 64], 6),
    ];
    for ([out, inputs], bits) in shapes {
        let w =
            AffineWeight::quantize(&random(&mut rng, &[out, inputs], 0.05), 32, bits, &s).unwrap();
        // Our unpacking (2, 4 and 8 bits) gives MLX's very values.
        let mlx =
            safemlx::ops::dequantize(&w.weight, &w.scales, &w.biases, 32, bits as i32, &s).unwrap();
        assert_eq!(
            host(&w.dequantize(&s).unwrap(), &s),
            host(&mlx, &s),
            "{bits} bits"
        );
        for rows in [DEQUANTIZE_ROWS as i32 - 1, DEQUANTIZE_ROWS as i32, 9] {
            let x = random(&mut rng, &[rows, inputs], 1.0);
            let product = w.matmul_t(&x, &s).unwrap();
            assert_eq!(product.shape(), [rows, out]);
            let alone: Vec<f32> = (0..rows)
                .flat_map(|r| {
                    let row = x.try_index_device((r..r + 1, ..), &s).unwrap();
                    host(&w.matmul_t(&row, &s).unwrap(), &s)
                })
                .collect();
            let err = max_relative_error(&host(&product, &s), &alone);
            assert!(
                err < 1e-5,
                "[{out}, {inputs}] {bits} bits, {rows} rows: {err}"
            );
        }
    }
}

/// `down(silu(x gate) * (x up))` with quantized weights, dense on one
/// process.
fn one_process(x: &safemlx::Array, [gate, up, down]: &[AffineWeight; 3], s: &Stream) -> Vec<f32> {
    let g = gate.matmul_t(x, s).unwrap();
    let hidden = g
        .multiply(safemlx::ops::sigmoid(&g, s).unwrap(), s)
        .unwrap()
        .multiply(up.matmul_t(x, s).unwrap(), s)
        .unwrap();
    host(&down.matmul_t(&hidden, s).unwrap(), s)
}

fn quantized_mlp(group: &Group) {
    let s = cpu();
    for (dims, quant) in [
        ((64, 384), (32, 4)),
        ((64, 768), (64, 8)),
        ((128, 1536), (128, 4)),
    ] {
        let full = weights(dims, quant, &s);
        let x = random(&mut Rng::new(5), &[7, dims.0], 0.1);
        let want = one_process(&x, &full, &s);
        let gate = QuantizedColumnParallelLinear::from_full(group, full[0].clone(), &s).unwrap();
        let up = QuantizedColumnParallelLinear::from_full(group, full[1].clone(), &s).unwrap();
        let down = QuantizedRowParallelLinear::from_weight(group, &full[2], &s).unwrap();
        // Each rank holds about 1/n of the quantized bytes, never floats.
        let held = [gate.weight.local(), up.weight.local(), down.weight.local()]
            .map(AffineWeight::nbytes)
            .iter()
            .sum::<usize>();
        let total: usize = full.iter().map(AffineWeight::nbytes).sum();
        assert!(
            held <= total.div_ceil(group.size()) + 64,
            "{held} of {total} bytes"
        );
        let x = ShardedArray::replicated(x, group);
        let hidden = gate
            .forward(&x, &s)
            .unwrap()
            .silu(&s)
            .unwrap()
            .mul(&up.forward(&x, &s).unwrap(), &s)
            .unwrap();
        let y = down.forward(&hidden, &s).unwrap();
        assert_eq!(y.global_shape(), [7, dims.0]);
        let err = max_relative_error(&host(y.local(), &s), &want);
        assert!(
            err <= 1e-4,
            "rank {} of {}, {dims:?} {quant:?}: relative error {err}",
            group.rank(),
            group.size()
        );
    }
    // Outputs split unevenly (100 rows over 3 or 4 ranks), then gathered.
    let w = AffineWeight::quantize(&random(&mut Rng::new(3), &[100, 64], 0.05), 32, 4, &s).unwrap();
    let x = random(&mut Rng::new(4), &[5, 64], 0.1);
    let want = host(&w.matmul_t(&x, &s).unwrap(), &s);
    let layer = QuantizedColumnParallelLinear::from_full(group, w.clone(), &s).unwrap();
    let y = layer
        .forward(&ShardedArray::replicated(x, group), &s)
        .unwrap()
        .all_gather(&s)
        .unwrap();
    assert_eq!(y.global_shape(), [5, 100]);
    assert!(max_relative_error(&host(y.local(), &s), &want) <= 1e-5);
}

#[test]
fn quantized_layers_at_one_to_four_ranks_equal_one_process() {
    for n in 1..=4 {
        Ranks::new(n)
            .backend(Backend::Ring)
            .run_test(quantized_mlp)
            .unwrap_or_else(|e| panic!("{n} ring ranks: {e}"));
    }
}

/// GGUF's quantized blocks as layers: each rank reads its rows or groups.
fn gguf_layers(group: &Group) {
    let s = cpu();
    let file = GgufFile::open(golden("quants.gguf")).expect("opens");
    for (name, _) in QUANTIZED {
        let full = file.read(name, &s).unwrap();
        let x = random(&mut Rng::new(9), &[3, 64], 0.1);
        let want = host(&x.matmul(full.transpose(&s).unwrap(), &s).unwrap(), &s);
        let source = Weights::new(&file, group);
        let column = QuantizedColumnParallelLinear::load(&source, name, &s).unwrap();
        let y = column
            .forward(&ShardedArray::replicated(x.clone(), group), &s)
            .unwrap()
            .all_gather(&s)
            .unwrap();
        assert!(
            max_relative_error(&host(y.local(), &s), &want) <= 1e-5,
            "{name}"
        );
        // [4, 64] as a row-parallel weight: 2 groups, whole at 1 or 2 ranks.
        let row = QuantizedRowParallelLinear::load(&source, name, &s);
        if group.size() > 2 {
            let error = row.expect_err("3 ranks cut a group of 32").to_string();
            assert_eq!(
                error,
                format!(
                    "tensor `{name}`: a row-parallel quantized weight with 64 inputs in groups of 32 over {n} ranks: rank 0 would hold inputs 0..{end}, which cuts a group of 32; these inputs split only over rank counts that give every rank whole groups (2 groups)",
                    n = group.size(),
                    end = 64usize.div_ceil(group.size())
                )
            );
            continue;
        }
        let row = row.unwrap();
        let x = ShardedArray::replicated(x, group).shard::<1>(&s).unwrap();
        let y = row.forward(&x, &s).unwrap();
        assert!(
            max_relative_error(&host(y.local(), &s), &want) <= 1e-5,
            "{name}: row"
        );
    }
}

#[test]
fn gguf_quantized_layers_read_their_part_at_one_to_three_ranks() {
    for n in 1..=3 {
        Ranks::new(n)
            .backend(Backend::Ring)
            .run_test(gguf_layers)
            .unwrap_or_else(|e| panic!("{n} ring ranks: {e}"));
    }
}

/// A `#[sharded]` layer whose weights stay quantized: the up projection
/// split by outputs, the down projection by input groups, beside a float
/// field.
#[sharded]
struct TypedQuantizedMlp {
    #[shard(Sharded<0>, dims = [384, 64])]
    up: QuantizedArray<Sharded<0>>,
    #[shard(Sharded<1>)]
    down: QuantizedArray<Sharded<1>>,
    #[shard(Replicated)]
    scale: ShardedArray<Replicated>,
}

impl TypedQuantizedMlp {
    /// `(silu(x upᵀ) downᵀ) * scale`, one `all_sum`.
    fn forward(
        &self,
        x: &ShardedArray<Replicated>,
        s: &Stream,
    ) -> safemlx_dist::Result<ShardedArray<Replicated>> {
        x.quantized_matmul(&self.up, s)?
            .silu(s)?
            .quantized_matmul(&self.down, s)?
            .all_sum(s)?
            .mul(&self.scale, s)
    }
}

/// Asserts that two quantized weights hold the same values, naming the
/// first array that differs (not printing them).
fn assert_same(a: &AffineWeight, b: &AffineWeight, what: &str, s: &Stream) {
    let u32s = |a: &safemlx::Array| {
        // Row-contiguous first: `try_to_vec` reads storage order.
        let a = a.contiguous(false, s).unwrap().into_evaluated().unwrap();
        a.try_to_vec::<u32>().unwrap()
    };
    assert_eq!(
        (a.shape(), a.group_size, a.bits),
        (b.shape(), b.group_size, b.bits),
        "{what}"
    );
    assert!(
        u32s(&a.weight) == u32s(&b.weight),
        "{what}: packed values differ"
    );
    assert!(
        host(&a.scales, s) == host(&b.scales, s),
        "{what}: scales differ"
    );
    assert!(
        host(&a.biases, s) == host(&b.biases, s),
        "{what}: biases differ"
    );
}

fn typed_quantized(group: &Group) {
    let s = cpu();
    let (n, rank) = (group.size(), group.rank());
    let mut rng = Rng::new(21);
    let up = AffineWeight::quantize(&random(&mut rng, &[384, 64], 0.05), 32, 4, &s).unwrap();
    let down = AffineWeight::quantize(&random(&mut rng, &[64, 384], 0.05), 32, 8, &s).unwrap();
    let scale = random(&mut rng, &[64], 1.0);
    let x = random(&mut rng, &[5, 64], 0.1);
    // One process, the same quantized weights.
    let h = up.matmul_t(&x, &s).unwrap();
    let h = h
        .multiply(safemlx::ops::sigmoid(&h, &s).unwrap(), &s)
        .unwrap();
    let want = down.matmul_t(&h, &s).unwrap().multiply(&scale, &s).unwrap();
    let want = host(&want, &s);

    let mlp = TypedQuantizedMlp::from_full(group, up.clone(), down.clone(), scale.clone(), &s)
        .expect("shard the quantized MLP");
    let layout = mlp.layout();
    assert_eq!(layout[0].placement, "Quantized Sharded<0>");
    assert_eq!(layout[0].global_shape, [384, 64]);
    assert_eq!(layout[0].local_shape, [384 / n as i32, 64]);
    // 384 inputs in groups of 32: 12 groups, by the chunk rule over groups.
    let groups = safemlx_dist::typed::chunk(12, rank, n).1 as i32;
    assert_eq!(layout[1].local_shape, [64, groups * 32]);
    let y = mlp
        .forward(&ShardedArray::replicated(x.clone(), group), &s)
        .expect("forward");
    let err = max_relative_error(&host(y.local(), &s), &want);
    assert!(err <= 1e-4, "rank {rank} of {n}: relative error {err}");

    // Gathered back: the very quantized tensors, and a checkpoint of them
    // reads back into the same parts, each rank reading only its own.
    let tensors = mlp.gather_full(&s).expect("gather");
    let names: Vec<&str> = tensors.iter().map(|t| t.0).collect();
    assert_eq!(
        names,
        [
            "up",
            "up.scales",
            "up.biases",
            "up.quantization",
            "down",
            "down.scales",
            "down.biases",
            "down.quantization",
            "scale"
        ]
    );
    assert_same(&mlp.up.gather_full(&s).unwrap(), &up, "gathered up", &s);
    assert_same(
        &mlp.down.gather_full(&s).unwrap(),
        &down,
        "gathered down",
        &s,
    );
    let path = std::env::temp_dir().join(format!(
        "typed-quantized-{}-{rank}-of-{n}.safetensors",
        std::process::id()
    ));
    safemlx_dist::checkpoint::save(&path, &tensors, &s).expect("save");
    let checkpoint = SafetensorsFile::open(&path).unwrap();
    let read =
        TypedQuantizedMlp::load_fields(&Weights::new(&checkpoint, group), &s).expect("read back");
    let bytes = checkpoint.bytes_read() as usize;
    std::fs::remove_file(&path).ok();
    assert_same(read.up.local(), mlp.up.local(), "up read back", &s);
    assert_same(read.down.local(), mlp.down.local(), "down read back", &s);
    let total = up.nbytes() + down.nbytes() + 64 * 4 + 2 * 8;
    if n > 1 {
        assert!(bytes < total * 3 / 4, "read {bytes} of {total} bytes");
    }
    let y = read
        .forward(&ShardedArray::replicated(x, group), &s)
        .unwrap();
    assert!(max_relative_error(&host(y.local(), &s), &want) <= 1e-4);

    // Uneven group splits: 3 groups of 32 over 2 ranks are 2 + 1, over 4
    // ranks 1 + 1 + 1 + 0, and gather back whole.
    let w = AffineWeight::quantize(&random(&mut rng, &[8, 96], 0.05), 32, 4, &s).unwrap();
    let split = QuantizedArray::<Sharded<1>>::from_full(&w, group, &s).unwrap();
    let groups = safemlx_dist::typed::chunk(3, rank, n).1;
    assert_eq!(split.local().shape(), [8, groups * 32]);
    assert_same(
        &split.gather_full(&s).unwrap(),
        &w,
        "uneven groups gathered",
        &s,
    );
    // Its dequantized part is that part of the dequantized whole.
    let first = safemlx_dist::typed::chunk(3, rank, n).0 * 32;
    let whole = host(&w.dequantize(&s).unwrap(), &s);
    let part: Vec<f32> = (0..8)
        .flat_map(|r| whole[r * 96 + first..r * 96 + first + groups * 32].to_vec())
        .collect();
    assert_eq!(host(&split.local().dequantize(&s).unwrap(), &s), part);
    // An activation split by elements (48 + 48) does not meet 64 + 32.
    if n == 2 {
        let h = ShardedArray::replicated(random(&mut rng, &[2, 96], 0.1), group)
            .shard::<1>(&s)
            .unwrap();
        let error = h
            .quantized_matmul(&split, &s)
            .expect_err("48 is not 64 or 32");
        assert_eq!(
            error.to_string(),
            format!(
                "quantized matmul on rank {rank} of 2: x (Sharded<1>) holds 48 of the 96 inputs but the weight (Sharded<1>) holds {} ({} of 3 groups of 32); a Sharded<1> x splits its columns by elements unless made with a split, and the weight by groups, which agree only when every chunk is whole groups (e.g. 96 a multiple of 32 times the ranks)",
                groups * 32,
                groups
            )
        );
    }
}

#[test]
fn quantized_weights_in_sharded_structs_at_one_to_four_ranks() {
    for n in 1..=4 {
        Ranks::new(n)
            .backend(Backend::Ring)
            .run_test(typed_quantized)
            .unwrap_or_else(|e| panic!("{n} ring ranks: {e}"));
    }
}

/// An mlx-community tensor read as a typed quantized weight: each rank
/// reads its groups, which dequantize to its columns of the float tensor.
#[test]
fn quantized_array_reads_its_part_of_an_mlx_community_directory() {
    Ranks::new(3)
        .backend(Backend::Ring)
        .run_test(|group| {
            let s = cpu();
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/quantized/llama-tied-q4");
            let source = safemlx_dist::checkpoint::HfDirectory::open(&dir).unwrap();
            let name = "model.layers.0.mlp.down_proj.weight";
            let down = Weights::new(&source, group)
                .quantized::<Sharded<1>>(name, None, &s)
                .unwrap();
            let [rows, columns] = down.global_shape();
            let (first, count) = safemlx_dist::typed::chunk(columns / 32, group.rank(), 3);
            assert_eq!(down.local().shape(), [rows, count * 32]);
            let want =
                TensorSource::read_columns(&source, name, &[(first * 32, count * 32)], &s).unwrap();
            assert_eq!(
                host(&down.local().dequantize(&s).unwrap(), &s),
                host(&want, &s)
            );
        })
        .unwrap();
}
