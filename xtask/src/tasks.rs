//! `cargo xtask test` and `cargo xtask demo`.
//!
//! Everything builds with the release profile: the native MLX build follows
//! Cargo's profile (Debug MLX for `dev`), so one profile for clippy, tests,
//! the demo and benchmarks means one native build, kept in the cache.

use std::process::Command;
use std::time::Instant;

use crate::{cmd, setup};

pub fn test() -> Result<(), String> {
    let started = Instant::now();
    setup::run()?;
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
    // Unit, integration, multi-process and doctests, including the book's
    // chapters, which `safemlx-dist` compiles through its `#[cfg(doctest)]`
    // module (see `safemlx-dist/src/book.rs`).
    cmd::run(cmd::cargo(&["test", "--release", "--workspace"]))?;
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
/// the dense block) as 4 ring ranks on loopback.
pub fn demo() -> Result<(), String> {
    setup::run()?;
    let release = build_examples_and_launcher()?;
    for (example, args) in [
        ("collectives", &[][..]),
        ("transformer_block", &["--check"][..]),
    ] {
        let mut launch = Command::new(release.join("safemlx-launch"));
        launch
            .args(["-n", "4", "--backend", "ring", "--timeout", "120", "--"])
            .arg(release.join("examples").join(example))
            .args(args)
            .current_dir(cmd::root());
        cmd::run(launch)?;
    }
    Ok(())
}
