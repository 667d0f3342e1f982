//! Tensor-parallel training (`grad::value_and_grad_of`, `optim::AdamW`,
//! `optim::clip_grad_norm`) against a dense single-process loop written
//! here on plain MLX arrays: 20 steps at 1, 2 and 4 ring ranks and 2 MPI
//! ranks follow the dense loss curve (relative error at most 1e-3 per step)
//! and end at the same weights.

use safemlx::{Array, Stream};
use safemlx_dist::grad::{average_gradients, value_and_grad_of, Parameters};
use safemlx_dist::launch::Ranks;
use safemlx_dist::nn::RmsNorm;
use safemlx_dist::optim::{clip_grad_norm, AdamW};
use safemlx_dist::typed::Replicated;
use safemlx_dist::{Backend, Group, ShardedArray};
use safemlx_dist_examples::layers::SwiGluMlp;
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{host, max_relative_error, random, silu_array};
use safemlx_dist_tests::typed::Rng;

const STEPS: usize = 20;
const LR: f32 = 0.02;
const MAX_NORM: f32 = 0.5;
const T: i32 = 6;
const D: i32 = 8;
const H: i32 = 10;

struct Data {
    x: Array,
    target: Array,
    norm: Array,
    gate: Array,
    up: Array,
    down: Array,
}

fn data(s: &Stream) -> Data {
    let mut rng = Rng::new(21);
    Data {
        x: random(&mut rng, &[T, D], 1.0),
        target: random(&mut rng, &[T, D], 1.0),
        norm: random(&mut rng, &[D], 0.2)
            .add(Array::from_f32(1.0), s)
            .unwrap(),
        gate: random(&mut rng, &[D, H], 0.5),
        up: random(&mut rng, &[D, H], 0.5),
        down: random(&mut rng, &[H, D], 0.5),
    }
}

/// The reference: the same loss and AdamW on full arrays, one process.
fn dense_curve(d: &Data, s: &Stream) -> (Vec<(f32, f32)>, Vec<Array>) {
    let (x, target) = (d.x.clone(), d.target.clone());
    let loss = move |p: &[Array]| -> Vec<Array> {
        let xn = safemlx::fast::rms_norm(&x, &p[0], 1e-5, s).unwrap();
        let h = silu_array(&xn.matmul(&p[1], s).unwrap(), s)
            .multiply(xn.matmul(&p[2], s).unwrap(), s)
            .unwrap();
        let e = h.matmul(&p[3], s).unwrap().subtract(&target, s).unwrap();
        let sum = e.square(s).unwrap().sum(None, s).unwrap();
        vec![sum.multiply(Array::from_f32(0.5 / T as f32), s).unwrap()]
    };
    let mut vg = safemlx::transforms::value_and_grad_with_argnums(loss, &[0, 1, 2, 3][..]);
    let mut p = vec![d.norm.clone(), d.gate.clone(), d.up.clone(), d.down.clone()];
    let zeros = |a: &Array| safemlx::ops::zeros_like(a, s).unwrap();
    let mut m: Vec<Array> = p.iter().map(zeros).collect();
    let mut v: Vec<Array> = p.iter().map(zeros).collect();
    let mut curve = Vec::new();
    for step in 1..=STEPS as i32 {
        let (value, g) = vg(&p).unwrap();
        let norm: f32 = g
            .iter()
            .map(|g| host(&g.square(s).unwrap().sum(None, s).unwrap(), s)[0])
            .sum::<f32>()
            .sqrt();
        curve.push((host(&value[0], s)[0], norm));
        let scale = (MAX_NORM / (norm + 1e-6)).min(1.0);
        for i in 0..p.len() {
            let g = g[i].multiply(Array::from_f32(scale), s).unwrap();
            let c = |v: f32| Array::from_f32(v);
            m[i] = m[i]
                .multiply(c(0.9), s)
                .unwrap()
                .add(g.multiply(c(0.1), s).unwrap(), s)
                .unwrap();
            v[i] = v[i]
                .multiply(c(0.999), s)
                .unwrap()
                .add(g.square(s).unwrap().multiply(c(0.001), s).unwrap(), s)
                .unwrap();
            let m_hat = m[i]
                .multiply(c(1.0 / (1.0 - 0.9f32.powi(step))), s)
                .unwrap();
            let v_hat = v[i]
                .multiply(c(1.0 / (1.0 - 0.999f32.powi(step))), s)
                .unwrap();
            let update = m_hat
                .divide(v_hat.sqrt(s).unwrap().add(c(1e-8), s).unwrap(), s)
                .unwrap();
            p[i] = p[i]
                .multiply(c(1.0 - LR * 0.01), s)
                .unwrap()
                .subtract(update.multiply(c(LR), s).unwrap(), s)
                .unwrap();
        }
        safemlx::transforms::eval(p.iter().chain(&m).chain(&v)).unwrap();
    }
    (curve, p)
}

fn check(group: &Group) {
    let s = cpu();
    let d = data(&s);
    let (want_curve, want_params) = dense_curve(&d, &s);

    let norm = RmsNorm {
        weight: ShardedArray::replicated(d.norm.clone(), group),
        eps: 1e-5,
    };
    let mlp =
        SwiGluMlp::from_full(group, d.gate.clone(), d.up.clone(), d.down.clone(), &s).unwrap();
    let mut model = (norm, mlp);
    let x = ShardedArray::<Replicated>::replicated(d.x.clone(), group);
    let target = ShardedArray::<Replicated>::replicated(d.target.clone(), group);
    let mut adam = AdamW::new(LR);
    let mut curve = Vec::new();
    let mut clipped = 0;
    for _ in 0..STEPS {
        let (loss, grads) = value_and_grad_of(&model, |(norm, mlp)| {
            let e = mlp.forward(&norm.forward(&x, &s)?, &s)?.sub(&target, &s)?;
            e.mul(&e, &s)?.sum_all(&s)?.scale(0.5 / T as f32, &s)
        })
        .expect("value_and_grad_of");
        let (grads, norm) = clip_grad_norm(&grads, MAX_NORM, group, &s).expect("clip");
        curve.push((host(&loss, &s)[0], norm));
        clipped += usize::from(norm > MAX_NORM);
        model = adam.update(&model, &grads, &s).expect("AdamW");
        let locals: Vec<Array> = model.parameters().into_iter().map(|p| p.local).collect();
        safemlx_dist::eval(&locals.iter().collect::<Vec<_>>()).unwrap();
    }
    assert!(
        clipped > 0,
        "the clipping never engaged: the test would not check it"
    );
    assert_eq!(adam.steps(), STEPS as i32);
    let relative = |got: f32, want: f32| (got - want).abs() / want.abs().max(1e-6);
    for (step, (&(loss, norm), &(want_loss, want_norm))) in
        curve.iter().zip(&want_curve).enumerate()
    {
        let err = relative(loss, want_loss);
        assert!(
            err <= 1e-3,
            "step {step}: loss {loss} vs dense {want_loss} (relative error {err})"
        );
        // The global norm counts each replicated gradient once.
        let err = relative(norm, want_norm);
        assert!(
            err <= 1e-3,
            "step {step}: gradient norm {norm} vs dense {want_norm} (relative error {err})"
        );
    }
    assert!(
        curve[STEPS - 1].0 < 0.8 * curve[0].0,
        "the loss did not fall: {curve:?}"
    );
    let (norm, mlp) = &model;
    let full = mlp.gather_full(&s).unwrap();
    let got = [
        norm.weight.local().clone(),
        full[0].1.clone(),
        full[1].1.clone(),
        full[2].1.clone(),
    ];
    for ((got, want), name) in got
        .iter()
        .zip(&want_params)
        .zip(["norm", "gate", "up", "down"])
    {
        let err = max_relative_error(&host(got, &s), &host(want, &s));
        assert!(
            err <= 1e-3,
            "{name} after {STEPS} steps: relative error {err}"
        );
    }
}

#[test]
fn tensor_parallel_training_follows_the_dense_curve_at_1_2_and_4_ranks() {
    for ranks in [1, 2, 4] {
        Ranks::new(ranks)
            .run_test(check)
            .unwrap_or_else(|e| panic!("{ranks} ring ranks: {e}"));
    }
}

#[test]
fn tensor_parallel_training_follows_the_dense_curve_on_mpi() {
    Ranks::new(2)
        .backend(Backend::Mpi)
        .run_test(check)
        .unwrap_or_else(|e| panic!("2 MPI ranks: {e}"));
}

#[test]
fn mismatched_gradients_and_bad_clipping_are_errors() {
    let s = cpu();
    let group = safemlx_dist::init(false, Backend::Ring).unwrap();
    let norm = |d: i32| RmsNorm {
        weight: ShardedArray::replicated(safemlx::ops::ones::<f32>(&[d], &s).unwrap(), &group),
        eps: 1e-5,
    };
    let mut adam = AdamW::new(0.1);
    let err = adam.update(&norm(4), &norm(3), &s).unwrap_err();
    assert_eq!(
        err.to_string(),
        "AdamW: 1 gradients for 1 parameters, or of other shapes"
    );
    let err = clip_grad_norm(&norm(4), 0.0, &group, &s).unwrap_err();
    assert_eq!(
        err.to_string(),
        "clip_grad_norm: max_norm must be a positive number, got 0"
    );
    let err = norm(4).with_parameters(&[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the model has 1 parameters but 0 arrays were given"
    );
}

/// `examples/train` under `safemlx-launch -n ranks`, writing to `out`.
fn train(ranks: usize, out: &std::path::Path, extra: &[&str]) -> String {
    let (all, ok) = train_on(ranks, "ring", out, extra);
    assert!(ok, "train at {ranks} ranks {extra:?}:\n{all}");
    all
}

/// `examples/train` as `ranks` ranks of `backend`: its output and whether
/// it succeeded.
fn train_on(ranks: usize, backend: &str, out: &std::path::Path, extra: &[&str]) -> (String, bool) {
    let out_arg = out.to_str().expect("utf-8 path");
    let run = std::process::Command::new(safemlx_dist_tests::built("safemlx-launch"))
        .args([
            "-n",
            &ranks.to_string(),
            "--backend",
            backend,
            "--timeout",
            "120",
            "--",
        ])
        .arg(safemlx_dist_tests::built("examples/train"))
        .args(["--out", out_arg])
        .args(extra)
        .output()
        .expect("safemlx-launch runs");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    (all, run.status.success())
}

fn curve(path: std::path::PathBuf) -> Vec<f32> {
    serde_json::from_str(&std::fs::read_to_string(&path).expect("loss curve")).expect("json")
}

/// The example: 2 ranks, and 6 ranks sharing KV heads, follow the 1-rank
/// loss curve, 10 steps then 10 resumed from the sharded checkpoint equal
/// 20 in one go, and the picture is a PNG.
#[test]
fn the_train_example_follows_one_rank_and_resumes() {
    let base = std::env::temp_dir().join(format!("safemlx-train-{}", std::process::id()));
    let (whole, halves) = (base.join("whole"), base.join("halves"));
    let _ = std::fs::remove_dir_all(&base);
    train(1, &whole, &["--steps", "20"]);
    let out = train(2, &whole, &["--steps", "20"]);
    assert!(out.contains("ranks: 2, 20 steps of 64 tokens"), "{out}");
    let (one, two) = (
        curve(whole.join("loss-1.json")),
        curve(whole.join("loss-2.json")),
    );
    assert_eq!((one.len(), two.len()), (20, 20));
    for (step, (a, b)) in one.iter().zip(&two).enumerate() {
        let err = (a - b).abs() / a.abs();
        assert!(err <= 1e-3, "step {step}: 2 ranks {b} vs 1 rank {a}");
    }
    assert!(two[19] < 0.7 * two[0], "the loss did not fall: {two:?}");
    // 6 ranks share the model's 4 KV heads (two heads on two ranks each).
    train(6, &whole, &["--steps", "20"]);
    let six = curve(whole.join("loss-6.json"));
    for (step, (a, b)) in one.iter().zip(&six).enumerate() {
        let err = (a - b).abs() / a.abs();
        assert!(err <= 1e-3, "step {step}: 6 ranks {b} vs 1 rank {a}");
    }
    // Weighted 5:3: query heads 5 + 3 (KV head 2 on both ranks), hidden
    // columns 80 + 48.
    let weighted = base.join("weighted");
    train(2, &weighted, &["--steps", "20", "--tensor-split", "5:3"]);
    let five_three = curve(weighted.join("loss-2.json"));
    for (step, (a, b)) in one.iter().zip(&five_three).enumerate() {
        let err = (a - b).abs() / a.abs();
        assert!(err <= 1e-3, "step {step}: 2 ranks at 5:3 {b} vs 1 rank {a}");
    }
    train(2, &halves, &["--steps", "10"]);
    let out = train(2, &halves, &["--steps", "10", "--resume"]);
    assert!(out.contains("resumed after step 10"), "{out}");
    let resumed = curve(halves.join("loss-2.json"));
    assert_eq!(resumed.len(), 20);
    for (step, (a, b)) in two.iter().zip(&resumed).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs(),
            "step {step}: resumed {b} vs {a}"
        );
    }
    let png = std::fs::read(whole.join("loss.png")).expect("loss.png");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let _ = std::fs::remove_dir_all(&base);
}

/// The example through 2 pipeline stages (3 layers: 2 + 1) with 3
/// micro-batches per step, of one rank each (ring) and of two
/// tensor-parallel ranks each (MPI), follows the same schedule in one
/// process, and resumes from its per-stage checkpoints; stages of several
/// ranks on ring are refused.
#[test]
fn the_train_example_trains_through_pipeline_stages_and_resumes() {
    let base = std::env::temp_dir().join(format!("safemlx-train-pp-{}", std::process::id()));
    let (whole, halves) = (base.join("whole"), base.join("halves"));
    let _ = std::fs::remove_dir_all(&base);
    let args = |steps: &'static str, mesh: &'static str| {
        [
            "--steps",
            steps,
            "--layers",
            "3",
            "--micro-batches",
            "3",
            "--mesh",
            mesh,
        ]
    };
    train(1, &whole, &args("12", "pp=1"));
    let out = train(2, &whole, &args("12", "pp=2"));
    assert!(
        out.contains("ranks: 2 (pipeline stages, 3 micro-batches), 12 steps of 192 tokens"),
        "{out}"
    );
    let (one, two) = (
        curve(whole.join("loss-1-pp.json")),
        curve(whole.join("loss-2-pp.json")),
    );
    assert_eq!((one.len(), two.len()), (12, 12));
    for (step, (a, b)) in one.iter().zip(&two).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * a.abs(),
            "step {step}: 2 stages {b} vs 1 {a}"
        );
    }
    assert!(two[11] < 0.8 * two[0], "the loss did not fall: {two:?}");
    // 2 stages of 2 tensor-parallel ranks, under MPI (split groups) and
    // on ring (chains of send/recv).
    for backend in ["mpi", "ring"] {
        let (out, ok) = train_on(4, backend, &whole, &args("12", "pp=2,tp=2"));
        assert!(ok, "{out}");
        let four = curve(whole.join("loss-4-pp.json"));
        for (step, (a, b)) in one.iter().zip(&four).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * a.abs(),
                "step {step}: 2 x 2 stages on {backend}: {b} vs 1 {a}"
            );
        }
    }
    train(2, &halves, &args("6", "pp=2"));
    let out = train(
        2,
        &halves,
        &[&args("6", "pp=2")[..], &["--resume"]].concat(),
    );
    assert!(out.contains("resumed after step 6"), "{out}");
    let resumed = curve(halves.join("loss-2-pp.json"));
    for (step, (a, b)) in two.iter().zip(&resumed).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs(),
            "step {step}: resumed {b} vs {a}"
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// Data parallel x tensor parallel on 4 MPI ranks: 2 replicas of a model
/// split over 2 ranks each, each replica taking half of the rows; the
/// averaged gradients give the dense full-batch curve.
fn check_data_parallel(world: &Group) {
    let s = cpu();
    let d = data(&s);
    let (want_curve, _) = dense_curve(&d, &s);
    let rank = world.rank() as i32;
    let tp = world
        .split(rank / 2, Some(rank))
        .expect("tensor-parallel group");
    let dp = world
        .split(rank % 2, Some(rank))
        .expect("data-parallel group");
    assert_eq!((tp.size(), dp.size()), (2, 2));
    let replica = world.rank() / 2;
    let rows: Vec<i32> = (0..T / 2).map(|r| r + replica as i32 * T / 2).collect();
    let rows = Array::from_slice(&rows, &[T / 2]);
    let take = |a: &Array| a.take_axis(&rows, 0, &s).unwrap();
    let x = ShardedArray::<Replicated>::replicated(take(&d.x), &tp);
    let target = ShardedArray::<Replicated>::replicated(take(&d.target), &tp);
    let norm = RmsNorm {
        weight: ShardedArray::replicated(d.norm.clone(), &tp),
        eps: 1e-5,
    };
    let mlp = SwiGluMlp::from_full(&tp, d.gate.clone(), d.up.clone(), d.down.clone(), &s).unwrap();
    let mut model = (norm, mlp);
    let mut adam = AdamW::new(LR);
    for (step, &(want_loss, want_norm)) in want_curve.iter().enumerate() {
        let (loss, grads) = value_and_grad_of(&model, |(norm, mlp)| {
            let e = mlp.forward(&norm.forward(&x, &s)?, &s)?.sub(&target, &s)?;
            e.mul(&e, &s)?.sum_all(&s)?.scale(0.5 / (T / 2) as f32, &s)
        })
        .expect("value_and_grad_of");
        // A small bucket: the four arrays travel in more than one all_sum.
        let grads = average_gradients(&grads, &dp, 256, &s).expect("average");
        let (grads, norm) = clip_grad_norm(&grads, MAX_NORM, &tp, &s).expect("clip");
        model = adam.update(&model, &grads, &s).expect("AdamW");
        let mean = safemlx_dist::all_sum(&loss, &dp, &s).unwrap();
        let loss = host(&mean, &s)[0] / 2.0;
        let relative = |got: f32, want: f32| (got - want).abs() / want.abs().max(1e-6);
        assert!(
            relative(loss, want_loss) <= 1e-3,
            "step {step}: loss {loss} vs dense {want_loss}"
        );
        assert!(
            relative(norm, want_norm) <= 1e-3,
            "step {step}: norm {norm} vs dense {want_norm}"
        );
    }
}

#[test]
fn data_and_tensor_parallel_training_follows_the_dense_curve_on_mpi() {
    Ranks::new(4)
        .backend(Backend::Mpi)
        .run_test(check_data_parallel)
        .unwrap_or_else(|e| panic!("4 MPI ranks: {e}"));
}

/// Data parallelism in the example (MPI): 2 replicas of 1 rank and 2
/// replicas of 2 ranks see the same windows, so they follow the same
/// curve; on ring, where MLX cannot split a group, the error says so.
#[test]
fn the_train_example_runs_data_parallel_on_mpi() {
    let base = std::env::temp_dir().join(format!("safemlx-train-dp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let steps = ["--steps", "10", "--data-parallel", "2"];
    let (out, ok) = train_on(2, "mpi", &base, &steps);
    assert!(ok, "2 MPI ranks, 2 replicas:\n{out}");
    assert!(
        out.contains("ranks: 2 (2 replicas of 1), 10 steps of 128 tokens"),
        "{out}"
    );
    let (out, ok) = train_on(4, "mpi", &base, &steps);
    assert!(ok, "4 MPI ranks, 2 replicas:\n{out}");
    assert!(
        out.contains("ranks: 4 (2 replicas of 2), 10 steps of 128 tokens"),
        "{out}"
    );
    let (two, four) = (
        curve(base.join("loss-2-dp2.json")),
        curve(base.join("loss-4-dp2.json")),
    );
    assert_eq!((two.len(), four.len()), (10, 10));
    for (step, (a, b)) in two.iter().zip(&four).enumerate() {
        let err = (a - b).abs() / a.abs();
        assert!(err <= 1e-3, "step {step}: 2 x 2 ranks {b} vs 2 x 1 {a}");
    }
    assert!(four[9] < four[0], "the loss did not fall: {four:?}");
    let (out, ok) = train_on(2, "ring", &base.join("ring"), &steps);
    assert!(!ok, "data parallel on ring ran:\n{out}");
    assert!(
        out.contains("--data-parallel needs a backend that splits groups (MPI): "),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&base);
}
