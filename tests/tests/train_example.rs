//! The `train` example under `safemlx-launch`, as a user runs it: 2 and 6
//! ranks follow the 1-rank loss curve and resume from their sharded
//! checkpoints; 2 pipeline stages (and 2 x 2 on MPI and ring) follow the
//! one-process schedule and resume; `--bench` with `--mesh` measures the
//! same training; data parallel on MPI, refused on ring. The library's
//! training against dense loops is in `training.rs`.

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
/// tensor-parallel ranks each (MPI and ring), follows the same schedule in
/// one process, benchmarks it with `--bench`, and resumes from its
/// per-stage checkpoints.
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
    // `--bench` through the stages: one JSON line, of the same training
    // (its first loss is the first step's above).
    let bench = base.join("bench.jsonl");
    let path = bench.to_str().expect("utf-8 path");
    let out = train(
        2,
        &base.join("bench"),
        &[&args("4", "pp=2")[..], &["--bench", path]].concat(),
    );
    assert!(
        out.contains("ranks: 2 (pipeline stages, 3 micro-batches): "),
        "{out}"
    );
    let line = std::fs::read_to_string(&bench).expect("the bench line");
    let line: serde_json::Value = serde_json::from_str(line.trim()).expect("one JSON line");
    assert_eq!(line["mesh"], "pp=2,tp=1", "{line}");
    assert_eq!(line["ranks"], 2, "{line}");
    assert_eq!(line["micro_batches"], 3, "{line}");
    assert!(
        line["tokens_per_s"].as_f64().is_some_and(|r| r > 0.0),
        "{line}"
    );
    let first = line["first_losses"][0].as_f64().expect("a first loss") as f32;
    assert!(
        (first - one[0]).abs() <= 1e-4 * one[0].abs(),
        "the bench's first loss {first} vs {}",
        one[0]
    );
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
