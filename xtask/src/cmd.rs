//! Running commands with the project's environment, loudly.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

/// The workspace root (the parent of `xtask/`).
pub fn root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// Cargo's target directory: `$CARGO_TARGET_DIR`, else `<root>/target`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|dir| {
            if dir.is_absolute() {
                dir
            } else {
                root().join(dir)
            }
        })
        .unwrap_or_else(|| root().join("target"))
}

/// The project's cache: `$XDG_CACHE_HOME/safemlx-dist`, else
/// `$HOME/.cache/safemlx-dist`.
pub fn cache_root() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| root().join("target"));
    cache.join("safemlx-dist")
}

/// Where the native MLX build is kept between clean checkouts:
/// `$SAFEMLX_NATIVE_BUILD_ROOT` if set, else `<cache>/native`.
pub fn native_build_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("SAFEMLX_NATIVE_BUILD_ROOT") {
        return PathBuf::from(dir);
    }
    cache_root().join("native")
}

/// A `cargo` command in the workspace root with the native build cache set.
pub fn cargo(args: &[&str]) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(args)
        .current_dir(root())
        .env("SAFEMLX_NATIVE_BUILD_ROOT", native_build_root());
    command
}

/// Runs `command`, printing it first and its duration after; fails on a
/// non-zero exit with the command line in the message.
pub fn run(mut command: Command) -> Result<(), String> {
    let line = describe(&command);
    println!("==> {line}");
    let started = Instant::now();
    let status = command
        .status()
        .map_err(|error| format!("could not start `{line}`: {error}"))?;
    let elapsed = started.elapsed().as_secs_f64();
    if status.success() {
        println!("==> ok in {elapsed:.1} s: {line}");
        Ok(())
    } else {
        Err(format!("`{line}` failed ({status}) after {elapsed:.1} s"))
    }
}

fn describe(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|part| part.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}
