//! Training through pipeline stages (GPipe micro-batches) on real
//! processes: each stage's gradients of the mean micro-batch loss equal
//! the whole model's dense gradients in one process for that stage's
//! parameters (the tied embedding's: the sum of its use as embedding and
//! as LM head), and the last stage's loss equals the dense loss; on one
//! stage (the same schedule in one process), 2 and 3 ring stages and 2 MPI
//! stages, for a tied and an untied model; and 2 stages of 2
//! tensor-parallel ranks on MPI and on ring.

use safemlx::{Array, Stream};
use safemlx_dist::checkpoint::{HfDirectory, Weights};
use safemlx_dist::grad::{value_and_grad_of, Parameters};
use safemlx_dist::launch::Ranks;
use safemlx_dist::models::{LayerSplit, Llama, LlamaConfig, Stage};
use safemlx_dist::nn::gather_logits;
use safemlx_dist::train::{clip_grad_norm_stages, value_and_grad_stages};
use safemlx_dist::typed::StageLink;
use safemlx_dist::{Backend, DeviceMesh, Group, Replicated, Sharded, ShardedArray};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{host, max_relative_error};
use safemlx_dist_tests::models::golden_dir;

/// (golden case, tied embeddings).
const CASES: [(&str, bool); 2] = [
    ("llama/smollm2-5layers", true),
    ("llama/llama-window", false),
];

/// Three micro-batches of 5 tokens and their targets.
fn batches(vocab: usize) -> Vec<(Vec<u32>, Vec<i32>)> {
    (0..3)
        .map(|m| {
            let tokens = (0..5)
                .map(|i| ((m * 7 + i * 3 + 1) % vocab) as u32)
                .collect();
            let targets = (0..5)
                .map(|i| ((m * 5 + i * 11 + 2) % vocab) as i32)
                .collect();
            (tokens, targets)
        })
        .collect()
}

fn cross_entropy(
    logits: &ShardedArray<Sharded<1>>,
    targets: &[i32],
    s: &Stream,
) -> safemlx_dist::Result<ShardedArray<Replicated>> {
    let t = targets.len();
    let full = gather_logits(logits, 0..t, s)?;
    let l = full.local();
    let lse = safemlx::ops::logsumexp_axis(l, -1, false, s)?;
    let targets = Array::from_slice(targets, &[t as i32, 1]);
    let picked = l
        .take_along_axis(&targets, -1, s)?
        .reshape(&[t as i32], s)?;
    let mean = lse.subtract(&picked, s)?.mean(None, s)?;
    ShardedArray::from_local(mean, &Group::local(), &[])
}

fn load(case: &str, stage: Option<(&LayerSplit, usize)>, s: &Stream) -> Llama {
    load_over(&Group::local(), case, stage, s)
}

fn load_over(tensor: &Group, case: &str, stage: Option<(&LayerSplit, usize)>, s: &Stream) -> Llama {
    let dir = HfDirectory::open(golden_dir(case)).expect("opens");
    let path = dir.path().display().to_string();
    let config = LlamaConfig::from_hf(dir.config(), &path).expect("config");
    let stage = match stage {
        Some((split, index)) => Stage::of(split, index, config.layers),
        None => Ok(Stage::whole(config.layers)),
    }
    .expect("stage");
    Llama::load_stage(&Weights::new(&dir, tensor), config, stage, s).expect("loads")
}

/// Which of the whole model's parameter arrays stage `stage` holds, in
/// its order: the embedding (first stage; last too when tied), its
/// layers' arrays, then the final norm and the untied LM head (last).
fn stage_indices(whole: usize, layers: usize, tied: bool, stage: &Stage) -> Vec<usize> {
    let head = usize::from(!tied);
    let per_layer = (whole - 2 - head) / layers;
    let mut picked = Vec::new();
    if stage.is_first() || (stage.is_last() && tied) {
        picked.push(0);
    }
    picked.extend(1 + stage.layers.start * per_layer..1 + stage.layers.end * per_layer);
    if stage.is_last() {
        picked.push(1 + layers * per_layer);
        if !tied {
            picked.push(whole - 1);
        }
    }
    picked
}

fn check(world: &Group, case: &str, tied: bool) {
    let s = cpu();
    let n = world.size();
    let mesh = DeviceMesh::new(world, &[("pp", n), ("tp", 1)]).unwrap();
    let link = StageLink::new(&mesh).unwrap();
    let split = LayerSplit::Even(n);
    let model = load(case, Some((&split, link.stage())), &s);
    let what = format!("{case}, stage {} of {n}", link.stage());
    let (loss, grads) = through_stages(&model, &link, &s);
    let (dense_loss, dense) = dense_gradients(case, &s);
    assert_eq!(
        loss.is_some(),
        link.stage() + 1 == n,
        "{what}: loss on the last stage"
    );
    if let Some(loss) = loss {
        let err = max_relative_error(&host(&loss, &s), &[dense_loss]);
        assert!(err <= 1e-5, "{what}: loss vs dense {err}");
    }
    let got: Vec<Array> = grads.parameters().into_iter().map(|p| p.local).collect();
    let indices = stage_indices(dense.len(), model.config().layers, tied, model.stage());
    assert_eq!(got.len(), indices.len(), "{what}: parameter count");
    for (k, (g, &i)) in got.iter().zip(&indices).enumerate() {
        assert_eq!(g.shape(), dense[i].shape(), "{what}: parameter {k}");
        let err = max_relative_error(&host(g, &s), &host(&dense[i], &s));
        assert!(err <= 1e-4, "{what}: gradient {k} (dense {i}) off by {err}");
    }
    // The norm over every stage counts the tied embedding once.
    let (_, norm) = clip_grad_norm_stages(&grads, 1.0, &link, &s).unwrap();
    let want = norm_of(&dense, &s);
    assert!(
        (norm - want).abs() <= 1e-4 * want,
        "{what}: norm {norm} vs dense {want}"
    );
}

/// The mean micro-batch loss (on the last stage) and this stage's
/// gradients, through the stages `link` carries.
fn through_stages(model: &Llama, link: &StageLink, s: &Stream) -> (Option<Array>, Llama) {
    let data = batches(model.config().vocab_size);
    let tokens: Vec<&[u32]> = data.iter().map(|(t, _)| t.as_slice()).collect();
    value_and_grad_stages(
        model,
        link,
        &tokens,
        |m, logits| cross_entropy(logits, &data[m].1, s),
        s,
    )
    .expect("pipeline gradients")
}

/// The dense reference: the mean micro-batch loss of the whole model of
/// `case` in one process, and its gradients in parameter order.
fn dense_gradients(case: &str, s: &Stream) -> (f32, Vec<Array>) {
    let whole = load(case, None, s);
    let data = batches(whole.config().vocab_size);
    let (loss, grads) = value_and_grad_of(&whole, |w| {
        let mut total: Option<ShardedArray<Replicated>> = None;
        for (tokens, targets) in &data {
            let logits = w.forward(tokens, &mut w.new_cache(), s)?;
            let l = cross_entropy(&logits, targets, s)?.scale(1.0 / data.len() as f32, s)?;
            total = Some(match total {
                None => l,
                Some(t) => t.add(&l, s)?,
            });
        }
        Ok(total.expect("batches"))
    })
    .unwrap();
    let grads = grads.parameters().into_iter().map(|p| p.local).collect();
    (host(&loss, s)[0], grads)
}

/// The norm of the dense gradients.
fn norm_of(grads: &[Array], s: &Stream) -> f32 {
    grads
        .iter()
        .map(|g| host(g, s).iter().map(|v| v * v).sum::<f32>())
        .sum::<f32>()
        .sqrt()
}

/// 2 stages of 2 tensor-parallel ranks: the loss and the norm over every
/// stage's gradient shards equal the dense ones.
fn check_tensor_parallel_stages(world: &Group, case: &str) {
    let s = cpu();
    let mesh = DeviceMesh::new(world, &[("pp", 2), ("tp", 2)]).unwrap();
    let link = StageLink::new(&mesh).unwrap();
    let split = LayerSplit::Even(2);
    let model = load_over(
        mesh.axis("tp").unwrap(),
        case,
        Some((&split, link.stage())),
        &s,
    );
    let what = format!("{case}, 2 x 2, world rank {}", world.rank());
    let (loss, grads) = through_stages(&model, &link, &s);
    let (dense_loss, dense) = dense_gradients(case, &s);
    let dense_norm = norm_of(&dense, &s);
    if let Some(loss) = loss {
        let got = host(&loss, &s)[0];
        assert!(
            (got - dense_loss).abs() <= 1e-5 * dense_loss,
            "{what}: loss {got} vs {dense_loss}"
        );
    }
    let (_, norm) = clip_grad_norm_stages(&grads, 1.0, &link, &s).unwrap();
    assert!(
        (norm - dense_norm).abs() <= 1e-4 * dense_norm,
        "{what}: norm {norm} vs dense {dense_norm}"
    );
}

#[test]
fn stages_of_tensor_parallel_ranks_train_on_mpi_and_ring() {
    // On MPI each stage's ranks are a split MLX group; on ring a chain of
    // send/recv whose collectives take MLX's gradient rules from ours.
    for backend in [Backend::Mpi, Backend::Ring] {
        Ranks::new(4)
            .backend(backend)
            .run_test(|world| {
                for (case, _) in CASES {
                    check_tensor_parallel_stages(world, case);
                }
            })
            .unwrap_or_else(|e| panic!("2 x 2 on {backend}: {e}"));
    }
}

#[test]
fn stage_gradients_equal_dense_on_ring_and_mpi() {
    let layouts = [
        (Backend::Ring, 1),
        (Backend::Ring, 2),
        (Backend::Ring, 3),
        (Backend::Mpi, 2),
    ];
    for (backend, stages) in layouts {
        Ranks::new(stages)
            .backend(backend)
            .run_test(|world| {
                for (case, tied) in CASES {
                    check(world, case, tied);
                }
            })
            .unwrap_or_else(|e| panic!("{stages} stages on {backend}: {e}"));
    }
}
