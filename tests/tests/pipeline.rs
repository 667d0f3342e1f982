//! Pipeline stages on real processes, one rank each and two tensor-parallel
//! ranks each (`pp x tp` = 2 x 2): the prompt's logits through the stages
//! equal mlx-lm's goldens and the whole model in one process, with the prompt in one chunk and in chunks of 2 (several
//! chunks in flight); greedy generation through the stages (each stage's
//! own KV cache) gives the whole model's tokens, and each of those tokens
//! is the argmax of recomputing the whole sequence; stage boundaries check
//! what they receive; splits of uneven and weighted layer counts.

use safemlx::Stream;
use safemlx_dist::checkpoint::{HfDirectory, Weights};
use safemlx_dist::generate::{forward_stages, generate, generate_stages, Sampler};
use safemlx_dist::launch::Ranks;
use safemlx_dist::models::{LayerSplit, Llama, LlamaConfig, Stage};
use safemlx_dist::nn::{gather_logits, ExpertPlacement};
use safemlx_dist::typed::StageLink;
use safemlx_dist::{Backend, DeviceMesh, Group};
use safemlx_dist_tests::cpu;
use safemlx_dist_tests::dense::{host, max_relative_error};
use safemlx_dist_tests::models::{golden, golden_dir};

/// (golden case, what it covers).
const CASES: [(&str, &str); 7] = [
    (
        "llama/smollm2-5layers",
        "SmolLM2's heads, tied embeddings, 5 layers",
    ),
    ("llama/llama-window", "sliding-window layers, untied"),
    ("moe/mixtral", "Mixtral's experts"),
    ("llama/qwen3-qknorm", "q/k norms"),
    (
        "moe/deepseek-v3",
        "latent attention and its cache, group-limited routing",
    ),
    ("moe/gpt-oss", "sinks, alternating windows, MXFP4 experts"),
    (
        "moe/glm4-moe",
        "partial rotary, shared experts, dense first layer",
    ),
];

/// Stage `index` of `split` of the golden model `case` (the whole model
/// with `None`), read over a one-rank group, and the bytes it read.
fn load(case: &str, stage: Option<(&LayerSplit, usize)>, s: &Stream) -> (Llama, u64) {
    load_over(
        (&Group::local(), ExpertPlacement::ExpertParallel),
        case,
        stage,
        s,
    )
}

/// [`load`] tensor parallel over `tensor`, experts placed by `experts`.
fn load_over(
    (tensor, experts): (&Group, ExpertPlacement),
    case: &str,
    stage: Option<(&LayerSplit, usize)>,
    s: &Stream,
) -> (Llama, u64) {
    let dir = HfDirectory::open(golden_dir(case)).expect("opens");
    let path = dir.path().display().to_string();
    let mut config = LlamaConfig::from_hf(dir.config(), &path).expect("config");
    if let Some(moe) = &mut config.moe {
        moe.placement = experts;
    }
    let stage = match stage {
        Some((split, index)) => Stage::of(split, index, config.layers),
        None => Ok(Stage::whole(config.layers)),
    }
    .expect("stage");
    let model = Llama::load_stage(&Weights::new(&dir, tensor), config, stage, s);
    (model.expect("loads"), dir.bytes_read())
}

/// Every case whose layer count allows `split`, through the stages of
/// `tp` ranks each (an MoE's experts placed by `experts` over them).
fn check_cases(world: &Group, split: &LayerSplit, (tp, experts): (usize, ExpertPlacement)) {
    let mesh = DeviceMesh::new(world, &[("pp", world.size() / tp), ("tp", tp)]).expect("mesh");
    for (case, about) in CASES {
        let layers = serde_json::from_str::<serde_json::Value>(
            &std::fs::read_to_string(golden_dir(case).join("config.json")).unwrap(),
        )
        .unwrap()["num_hidden_layers"]
            .as_u64()
            .unwrap() as usize;
        if layers >= split.stages() {
            check_case((&mesh, experts), split, case, about);
        }
    }
}

fn check_case(
    (mesh, experts): (&DeviceMesh, ExpertPlacement),
    split: &LayerSplit,
    case: &str,
    about: &str,
) {
    let s = cpu();
    let link = StageLink::new(mesh).expect("link");
    let (rank, n) = (link.stage(), link.stages());
    assert_eq!(rank, mesh.coord("pp").unwrap());
    let tensor = mesh.axis("tp").unwrap();
    let what = format!(
        "{case} ({about}), stage {rank} of {n}, mesh {mesh}, world rank {}, split {split:?}, {experts:?}",
        mesh.world().rank()
    );
    let dir = golden_dir(case);
    let (model, _) = load_over((tensor, experts), case, Some((split, rank)), &s);
    let model = &model;
    let want_layers = split.ranges(model.config().layers).unwrap()[rank].clone();
    assert_eq!(model.stage().layers, want_layers, "{what}");
    assert_eq!(model.new_cache().layers.len(), want_layers.len(), "{what}");
    let (prompt, want) = golden(&dir.join("golden.safetensors"), &s);
    let t = prompt.len();
    // The whole model in this process: the dense reference.
    let (whole, _) = load(case, None, &s);
    let mut dense_cache = whole.new_cache();
    let dense = whole.forward(&prompt, &mut dense_cache, &s).unwrap();
    let dense = host(gather_logits(&dense, 0..t, &s).unwrap().local(), &s);
    for chunk in [t, 2] {
        let logits = forward_stages(model, &link, &prompt, chunk, &s).expect("forward");
        assert_eq!(
            logits.is_some(),
            rank + 1 == n,
            "{what}: logits on the last stage"
        );
        if let Some(logits) = logits {
            let got = host(gather_logits(&logits, 0..t, &s).unwrap().local(), &s);
            let err = max_relative_error(&got, &want);
            assert!(err <= 1e-4, "{what}, chunks of {chunk}: vs mlx-lm {err}");
            let err = max_relative_error(&got, &dense);
            assert!(
                err <= 1e-5,
                "{what}, chunks of {chunk}: vs one process {err}"
            );
        }
    }
    // Greedy generation through the stages' own caches.
    let eos = &model.config().eos_token_ids;
    let mut cache = model.new_cache();
    let got = generate_stages(
        model,
        &link,
        &mut cache,
        &prompt,
        (6, 4),
        &mut Sampler::greedy(),
        eos,
        |_| Ok(()),
        &s,
    )
    .expect("generates");
    let mut dense_cache = whole.new_cache();
    let dense = generate(
        &whole,
        &mut dense_cache,
        &prompt,
        6,
        &mut Sampler::greedy(),
        eos,
        |_| Ok(()),
        &s,
    )
    .unwrap();
    if rank == 0 || rank + 1 == n {
        assert_eq!(got.tokens, dense.tokens, "{what}: greedy tokens");
        assert_eq!(got.stopped_at_eos, dense.stopped_at_eos, "{what}");
    } else {
        assert!(
            got.tokens.is_empty(),
            "{what}: a middle stage sees rows only"
        );
    }
    let steps = dense.tokens.len() + usize::from(dense.stopped_at_eos);
    assert_eq!(
        cache.len(),
        t + steps - 1,
        "{what}: positions in this stage's cache"
    );
    // Each generated token is the argmax of recomputing the whole sequence.
    let mut all = prompt.clone();
    all.extend(&dense.tokens);
    let logits = forward_stages(model, &link, &all, 3, &s).expect("recompute");
    if let Some(logits) = logits {
        let v = model.config().vocab_size;
        let rows = host(
            gather_logits(&logits, 0..all.len(), &s).unwrap().local(),
            &s,
        );
        for (i, token) in dense.tokens.iter().enumerate() {
            let row = &rows[(t - 1 + i) * v..(t + i) * v];
            let best = (0..v).max_by(|a, b| row[*a].total_cmp(&row[*b])).unwrap();
            assert_eq!(best as u32, *token, "{what}: token {i} vs recompute");
        }
    }
}

#[test]
fn stages_equal_mlx_lm_and_one_process_on_ring() {
    for n in 2..=4 {
        Ranks::new(n)
            .backend(Backend::Ring)
            .run_test(|world| check_cases(world, &LayerSplit::Even(world.size()), ONE))
            .unwrap_or_else(|e| panic!("{n} ring stages: {e}"));
    }
    // 3:1 over 5 layers: 4 + 1.
    Ranks::new(2)
        .backend(Backend::Ring)
        .run_test(|world| check_cases(world, &"3:1".parse().unwrap(), ONE))
        .unwrap_or_else(|e| panic!("2 ring stages split 3:1: {e}"));
}

/// One rank per stage (the expert placement does not matter there).
const ONE: (usize, ExpertPlacement) = (1, ExpertPlacement::ExpertParallel);

/// 2 x 2: experts split across each stage's two ranks on ring, every
/// expert sliced across them under MPI.
#[test]
fn stages_of_two_tensor_parallel_ranks_equal_mlx_lm_on_ring_and_mpi() {
    let layouts = [
        (Backend::Ring, ExpertPlacement::ExpertParallel),
        (Backend::Mpi, ExpertPlacement::ExpertTensorParallel),
    ];
    for (backend, experts) in layouts {
        Ranks::new(4)
            .backend(backend)
            .run_test(|world| check_cases(world, &LayerSplit::Even(2), (2, experts)))
            .unwrap_or_else(|e| panic!("pp=2,tp=2 on {backend}, {experts:?}: {e}"));
    }
}

#[test]
fn stages_equal_mlx_lm_under_mpi() {
    Ranks::new(2)
        .backend(Backend::Mpi)
        .run_test(|world| check_cases(world, &LayerSplit::Even(2), ONE))
        .unwrap_or_else(|e| panic!("2 MPI stages: {e}"));
}

/// A stage that is not the one its rank holds, and a pipeline that does
/// not fit the model, are refused before any byte moves.
#[test]
fn mismatched_stages_are_refused() {
    let s = cpu();
    let error = LayerSplit::Even(3).ranges(2).unwrap_err().to_string();
    assert_eq!(
        error,
        "3 pipeline stages for a model of 2 layers: every stage needs a layer; use at most 2 stages"
    );
    let swapped = DeviceMesh::new(&Group::local(), &[("tp", 1), ("pp", 1)]).unwrap();
    assert_eq!(
        StageLink::new(&swapped).unwrap_err().to_string(),
        "pipeline stages need a mesh of axes pp then tp; got tp=1,pp=1"
    );
    let case = "llama/llama-tied-kv3";
    let (stage1, part) = load(case, Some((&LayerSplit::Even(2), 1)), &s);
    let error = stage1
        .forward(&[1, 2], &mut stage1.new_cache(), &s)
        .expect_err("stage 1 does not embed")
        .to_string();
    assert!(
        error.ends_with("the embedding is on another pipeline stage: this rank holds stage 1 of 2 (layers 1..2)"),
        "{error}"
    );
    let (_, all) = load(case, None, &s);
    // Stage 1 of 2: one layer, the final norm and the tied head.
    assert!(
        part > 0 && part < all * 3 / 4,
        "stage 1 read {part} of {all} bytes"
    );
}

/// Stage weights from the memory each rank reports: a stage weighs its
/// least memory times its ranks.
#[test]
fn memory_splits_weigh_each_stages_least_memory() {
    use safemlx_dist::models::split_by_memory;
    for (tp, reports) in [(1, [3u64, 1, 0, 0]), (2, [4, 2, 1, 1])] {
        let n = if tp == 1 { 2 } else { 4 };
        Ranks::new(n)
            .run_test(|world| {
                let mine = reports[world.rank()] << 30;
                let (split, got) = split_by_memory(world, tp, mine, &cpu()).unwrap();
                let mib: Vec<u32> = reports[..n].iter().map(|g| (g << 10) as u32).collect();
                assert_eq!(got, mib);
                // 3:1 of 5 layers is 4 + 1; 2:1 (stage 0's least, 2 GiB,
                // times 2 ranks against 1 GiB times 2) is 3 + 2.
                let (want, layers) = if tp == 1 {
                    (vec![3072, 1024], [0..4, 4..5])
                } else {
                    (vec![4096, 2048], [0..3, 3..5])
                };
                assert_eq!(split, LayerSplit::Weighted(want));
                assert_eq!(split.ranges(5).unwrap(), layers);
            })
            .unwrap_or_else(|e| panic!("{n} ranks, stages of {tp}: {e}"));
    }
}

/// `generate --split memory` on a launch whose ranks report 1 and 3 GiB
/// (`SAFEMLX_DIST_MEMORY`): DeepSeek-V3's 3 layers go 1 + 2, and the
/// pipeline's tokens and logits equal one process's.
#[test]
fn generate_splits_stages_by_the_memory_each_rank_offers() {
    safemlx_dist_tests::check_generate_by_memory(
        "1GiB,3GiB",
        &["--mesh", "pp=2", "--split", "memory"],
        &[
            "--split memory: the ranks offer [1024, 3072] MiB",
            "stage 0 of 2, layers 0..1;",
            "stage 1 of 2, layers 1..3;",
            "rank 1/2: --check against one process",
        ],
    );
}
