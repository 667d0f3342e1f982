//! `cargo xtask test` and `cargo xtask demo`.
//!
//! Everything builds with the release profile: the native MLX build follows
//! Cargo's profile (Debug MLX for `dev`), so one profile for clippy, tests,
//! the demo and benchmarks means one native build, kept in the cache.

use std::process::Command;
use std::time::Instant;

use crate::{cmd, models, setup};

pub fn test() -> Result<(), String> {
    let started = Instant::now();
    setup::run()?;
    // The multi-host tests' hosts: network namespaces running sshd, with
    // faults from tc, nftables and an iptables NFQUEUE rule (delay).
    setup::install_debian_packages(&[
        "openssh-server",
        "openssh-client",
        "iproute2",
        "nftables",
        "iptables",
    ])?;
    cmd::run(cmd::cargo(&["fmt", "--all", "--check"]))?;
    cmd::run(cmd::cargo(&[
        "clippy",
        "--release",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // A program that only runs as a rank builds without the launcher.
    cmd::run(cmd::cargo(&[
        "clippy",
        "--release",
        "-p",
        "safemlx-dist",
        "--no-default-features",
        "--lib",
        "--",
        "-D",
        "warnings",
    ]))?;
    // Unit, integration, multi-process and doctests, including the book's
    // chapters, which the examples crate compiles through its
    // `#[cfg(doctest)]` module (see `examples/book.rs`).
    let model = models::fetch_smollm2()?;
    // MLX Python ranks in a group with ours (`safemlx-dist/tests/admission.rs`).
    let mlx_python = crate::mlx_python::python()?;
    // OpenAI's client against the server (`safemlx-cli/tests/serve.rs`).
    let openai_python = crate::mlx_python::openai()?;
    let mut tests = cmd::cargo(&["test", "--release", "--workspace"]);
    tests
        .env("SAFEMLX_SMOLLM2_GGUF", &model)
        .env("SAFEMLX_DIST_MLX_PYTHON", &mlx_python)
        .env("SAFEMLX_OPENAI_PYTHON", &openai_python)
        .env("SAFEMLX_DIST_REQUIRE_NETNS", "1");
    cmd::run(tests)?;
    let mut docs = cmd::cargo(&["doc", "--release", "--workspace", "--no-deps"]);
    docs.env("RUSTDOCFLAGS", "-D warnings");
    cmd::run(docs)?;
    let mut book = Command::new("mdbook");
    book.args(["build", "book"]).current_dir(cmd::root());
    cmd::run(book)?;
    println!(
        "xtask test: all checks passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Builds the examples and `safemlx-launch` in release; returns the
/// release directory they are in.
pub fn build_examples_and_launcher() -> Result<std::path::PathBuf, String> {
    cmd::run(cmd::cargo(&[
        "build",
        "--release",
        "--package",
        "safemlx-dist-examples",
        "--examples",
        "--package",
        "safemlx-dist",
        "--bin",
        "safemlx-launch",
    ]))?;
    Ok(cmd::target_dir().join("release"))
}

/// Builds the examples and `safemlx-launch` in release, then runs the
/// collectives example and the transformer block (with `--check` against
/// the dense block) as 4 ring ranks on loopback, and SmolLM2 answering a
/// chat prompt on 1 rank, then on 2 and 3 ranks with `--check`.
pub fn demo() -> Result<(), String> {
    setup::run_for_demo()?;
    let model = models::fetch_smollm2()?;
    let release = build_examples_and_launcher()?;
    let launch = |ranks: &str, example: &str, args: &[&str]| {
        let mut launch = Command::new(release.join("safemlx-launch"));
        launch
            .args(["-n", ranks, "--backend", "ring", "--timeout", "300", "--"])
            .arg(release.join("examples").join(example))
            .args(args)
            .current_dir(cmd::root());
        cmd::run(launch)
    };
    launch("4", "collectives", &[])?;
    launch("4", "transformer_block", &["--check"])?;
    let model = model.display().to_string();
    let chat = [
        "--model",
        &model,
        "--chat",
        "--prompt",
        DEMO_PROMPT,
        "--max-tokens",
        "48",
    ];
    launch("1", "generate", &chat)?;
    for ranks in ["2", "3"] {
        let mut args = chat.to_vec();
        args.push("--check");
        launch(ranks, "generate", &args)?;
    }
    // The same model as pipeline stages: pp=2 (15 + 15 layers), pp=3, and
    // 2 stages of 2 tensor-parallel ranks each.
    for (ranks, mesh) in [("2", "pp=2"), ("3", "pp=3"), ("4", "pp=2,tp=2")] {
        let mut args = chat.to_vec();
        args.extend(["--mesh", mesh, "--check"]);
        launch(ranks, "generate", &args)?;
    }
    Ok(())
}

/// The demo's chat prompt.
const DEMO_PROMPT: &str = "What is the capital of France, and what is it famous for?";
