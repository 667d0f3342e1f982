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
