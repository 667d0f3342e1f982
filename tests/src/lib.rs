//! Shared checks for the multi-process tests: each rank computes every
//! collective and compares it with values computed on the host.
//!
//! The tests in `tests/` start real ranks with
//! [`safemlx_dist::launch::Ranks`]; the functions here are what each rank runs.

pub mod dense;
pub mod golden_gradients;
pub mod models;
pub mod netns;
pub mod typed;

use safemlx::{Array, Device, DeviceType, Dtype, Stream};
use safemlx_dist::{
    all_gather, all_max, all_min, all_sum, all_to_all_v, recv, recv_like, send, sum_scatter, Group,
};

/// The dtypes every collective is checked with.
pub const DTYPES: [Dtype; 3] = [Dtype::Float32, Dtype::Bfloat16, Dtype::Int32];

/// A CPU stream.
pub fn cpu() -> Stream {
    Stream::new_with_device(&Device::new(DeviceType::Cpu, 0))
}

/// A path in the temporary directory for a test's safetensors file,
/// unique to this process.
pub fn temp_safetensors(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "safemlx-dist-test-{}-{name}.safetensors",
        std::process::id()
    ))
}

/// `values` (small integers, exact in every dtype of [`DTYPES`]) as `dtype`.
pub fn array(values: &[i32], shape: &[i32], dtype: Dtype, stream: &Stream) -> Array {
    Array::from_slice(values, shape)
        .as_dtype(dtype, stream)
        .expect("cast to the test dtype")
}

/// Evaluates `array` and reads it back as `i32` in logical (row-major)
/// order, checking its dtype first.
pub fn read(array: &Array, dtype: Dtype, stream: &Stream) -> Vec<i32> {
    assert_eq!(array.dtype(), dtype, "collectives keep the dtype");
    array
        .as_dtype(Dtype::Int32, stream)
        .and_then(|a| a.contiguous(false, stream))
        .and_then(|a| a.into_evaluated())
        .expect("evaluates")
        .try_to_vec::<i32>()
        .expect("int32 data")
}

/// Checks the reductions, gather and scatter for one dtype on `group`.
pub fn check_reductions(group: &Group, dtype: Dtype) {
    let (r, n) = (group.rank() as i32, group.size() as i32);
    let s = cpu();
    // x_r[i] = (r + 1) * (i + 1), 2n values so that sum_scatter divides.
    let len = 2 * n;
    let x: Vec<i32> = (0..len).map(|i| (r + 1) * (i + 1)).collect();
    let input = array(&x, &[len], dtype, &s);
    let sum_of_ranks = n * (n + 1) / 2;

    let sum = all_sum(&input, group, &s).expect("all_sum");
    let expected: Vec<i32> = (0..len).map(|i| sum_of_ranks * (i + 1)).collect();
    assert_eq!(read(&sum, dtype, &s), expected, "all_sum {dtype:?}");
    assert_eq!(sum.shape(), &[len]);

    let max = all_max(&input, group, &s).expect("all_max");
    let expected: Vec<i32> = (0..len).map(|i| n * (i + 1)).collect();
    assert_eq!(read(&max, dtype, &s), expected, "all_max {dtype:?}");

    let min = all_min(&input, group, &s).expect("all_min");
    let expected: Vec<i32> = (0..len).map(|i| i + 1).collect();
    assert_eq!(read(&min, dtype, &s), expected, "all_min {dtype:?}");

    // all_gather of a [2, 3] block per rank: [2n, 3] in rank order.
    let block: Vec<i32> = (0..6).map(|j| r * 10 + j).collect();
    let gathered = all_gather(&array(&block, &[2, 3], dtype, &s), group, &s).expect("all_gather");
    assert_eq!(gathered.shape(), &[2 * n, 3], "all_gather shape");
    let expected: Vec<i32> = (0..n)
        .flat_map(|q| (0..6).map(move |j| q * 10 + j))
        .collect();
    assert_eq!(read(&gathered, dtype, &s), expected, "all_gather {dtype:?}");

    // sum_scatter of [2n, 2]: rank r keeps rows 2r and 2r + 1 of the sum.
    let rows: Vec<i32> = (0..len * 2).map(|i| (r + 1) * (i + 1)).collect();
    let scattered =
        sum_scatter(&array(&rows, &[len, 2], dtype, &s), group, &s).expect("sum_scatter");
    assert_eq!(scattered.shape(), &[2, 2], "sum_scatter shape");
    let expected: Vec<i32> = (4 * r..4 * r + 4).map(|i| sum_of_ranks * (i + 1)).collect();
    assert_eq!(
        read(&scattered, dtype, &s),
        expected,
        "sum_scatter {dtype:?}"
    );
}

/// Rank `from` sends `(from + to) % 3` rows to rank `to`: uneven, with zero
/// rows between some pairs (and for some ranks to themselves).
pub fn rows_between(from: usize, to: usize) -> usize {
    (from + to) % 3
}

/// Checks `all_to_all_v` with uneven counts, zero rows included.
pub fn check_all_to_all_v(group: &Group, dtype: Dtype) {
    let (r, n) = (group.rank(), group.size());
    let s = cpu();
    let send_counts: Vec<usize> = (0..n).map(|d| rows_between(r, d)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|src| rows_between(src, r)).collect();
    // Each row is [sender, destination, index within the message].
    let row = |from: usize, to: usize, k: usize| [from as i32, to as i32, k as i32];
    let input: Vec<i32> = (0..n)
        .flat_map(|d| (0..send_counts[d]).flat_map(move |k| row(r, d, k)))
        .collect();
    let rows = send_counts.iter().sum::<usize>() as i32;
    let x = array(&input, &[rows, 3], dtype, &s);
    let y = all_to_all_v(&x, &send_counts, &recv_counts, group, &s).expect("all_to_all_v");
    let expected: Vec<i32> = (0..n)
        .flat_map(|src| (0..recv_counts[src]).flat_map(move |k| row(src, r, k)))
        .collect();
    assert_eq!(y.shape(), &[recv_counts.iter().sum::<usize>() as i32, 3]);
    assert_eq!(read(&y, dtype, &s), expected, "all_to_all_v {dtype:?}");
}

/// Checks `send`, `recv` and `recv_like` around the ring: each rank sends to
/// the next rank and receives from the previous one.
///
/// The exchange is evaluated in an order that pairs up on every backend:
/// even ranks send, then receive; odd ranks receive, then send. (Running a
/// send and a receive at once on two streams works on ring but not on MPI,
/// which MLX initialises without `MPI_THREAD_MULTIPLE`.)
pub fn check_point_to_point(group: &Group, dtype: Dtype) {
    let (r, n) = (group.rank(), group.size());
    let s = cpu();
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let mine = array(&[r as i32, 7, 9], &[3], dtype, &s);
    mine.evaluated().expect("input evaluates");
    let exchange = |received: Array| {
        let sent = send(&mine, next, group, &s).expect("send");
        if r % 2 == 0 {
            sent.evaluated().expect("send evaluates");
            received.evaluated().expect("recv evaluates");
        } else {
            received.evaluated().expect("recv evaluates");
            sent.evaluated().expect("send evaluates");
        }
        read(&received, dtype, &s)
    };
    let got = exchange(recv(&[3], dtype, prev, group, &s).expect("recv"));
    assert_eq!(got, [prev as i32, 7, 9], "recv {dtype:?}");
    let got = exchange(recv_like(&mine, prev, group, &s).expect("recv_like"));
    assert_eq!(got, [prev as i32, 7, 9], "recv_like {dtype:?}");
}

/// Every collective, every dtype of [`DTYPES`].
pub fn check_every_collective(group: &Group) {
    for dtype in DTYPES {
        println!("{dtype:?}: reductions");
        check_reductions(group, dtype);
        println!("{dtype:?}: all_to_all_v");
        check_all_to_all_v(group, dtype);
        println!("{dtype:?}: send/recv");
        check_point_to_point(group, dtype);
    }
    println!(
        "rank {} of {}: every collective checked",
        group.rank(),
        group.size()
    );
}

/// All-reduces of an input whose element count (15) no group size here
/// divides, so the composed lowering's chunks are uneven.
pub fn check_uneven_all_reduce(group: &Group, dtype: Dtype) {
    let (r, n) = (group.rank() as i32, group.size() as i32);
    let s = cpu();
    let x: Vec<i32> = (0..15).map(|i| (r + 1) * (i + 1)).collect();
    let input = array(&x, &[3, 5], dtype, &s);
    let sum = all_sum(&input, group, &s).expect("all_sum");
    assert_eq!(sum.shape(), &[3, 5]);
    let expected: Vec<i32> = (0..15).map(|i| n * (n + 1) / 2 * (i + 1)).collect();
    assert_eq!(read(&sum, dtype, &s), expected, "uneven all_sum {dtype:?}");
    let max = all_max(&input, group, &s).expect("all_max");
    let expected: Vec<i32> = (0..15).map(|i| n * (i + 1)).collect();
    assert_eq!(read(&max, dtype, &s), expected, "uneven all_max {dtype:?}");
}

/// The reductions and `sum_scatter` under every lowering: the numbers must
/// not depend on how a collective is carried.
pub fn check_every_lowering(group: &Group) {
    use safemlx_dist::Lowering;
    for lowering in Lowering::ALL {
        let group = group.with_lowering(lowering).expect("ranks agree");
        for dtype in [Dtype::Float32, Dtype::Int32] {
            println!("{lowering} {dtype:?}");
            check_reductions(&group, dtype);
            check_uneven_all_reduce(&group, dtype);
        }
    }
}

/// A finished program's stdout then stderr, as text.
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `generate` on 2 ranks (`safemlx-launch`, 120 s) whose ranks report
/// `memory` (`SAFEMLX_DIST_MEMORY`, e.g. `3GiB,1GiB`), on the DeepSeek-V3
/// golden model (a short prompt, 4 tokens) with `args` and `--check`:
/// checks it succeeded and printed every line of `lines`.
pub fn check_generate_by_memory(memory: &str, args: &[&str], lines: &[&str]) {
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/moe/deepseek-v3");
    let out = std::process::Command::new(built("safemlx-launch"))
        .env(safemlx_dist::models::MEMORY_ENV, memory)
        .args(["-n", "2", "--timeout", "120", "--"])
        .arg(built("examples/generate"))
        .arg("--model")
        .arg(model)
        .args(["--prompt", "Hello experts", "--max-tokens", "4"])
        .args(args)
        .arg("--check")
        .output()
        .expect("safemlx-launch runs");
    let all = output_text(&out);
    assert!(out.status.success(), "{all}");
    for line in lines
        .iter()
        .chain(&["--check against one process", "greedy tokens agree"])
    {
        assert!(all.contains(line), "no `{line}`:\n{all}");
    }
}

/// `target/<profile>/NAME` (`examples/generate`, `safemlx-launch`),
/// beside the running test's directory.
pub fn built(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let path = exe.ancestors().nth(2).expect("target/<profile>").join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build --release --examples --bin safemlx-launch`",
        path.display()
    );
    path
}
