//! Python environments the tests use, each made once in the user's cache
//! directory from PyPI: MLX Python for the tests of mixed groups (MLX
//! Python ranks beside ours), and OpenAI's client for the server's tests.

use std::path::PathBuf;
use std::process::Command;

use crate::{cmd, setup};

/// The wheel: the MLX release our native build is wire-compatible with.
const PACKAGE: &str = "mlx[cpu]==0.32.4";

/// OpenAI's Python client, which the server's tests drive.
const OPENAI: &str = "openai==3.63.0";

/// The MLX Python environment's `python`, made the first time.
pub fn python() -> Result<PathBuf, String> {
    venv("mlx-python", PACKAGE)
}

/// The OpenAI client's environment's `python`, made the first time.
pub fn openai() -> Result<PathBuf, String> {
    venv("openai-python", OPENAI)
}

/// The `python` of the environment `name` in the cache with `package`.
fn venv(name: &str, package: &str) -> Result<PathBuf, String> {
    let venv = cmd::cache_root().join(name);
    let python = venv.join("bin").join("python");
    let ready = venv.join(".ready");
    if std::fs::read_to_string(&ready).is_ok_and(|p| p == package) {
        return Ok(python);
    }
    let venv_made = |venv: &PathBuf| {
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(venv)
            .status()
            .is_ok_and(|s| s.success())
    };
    if !venv_made(&venv) {
        setup::install_debian_packages(&["python3-venv", "python3-pip"])?;
        if !venv_made(&venv) {
            return Err(format!("python3 -m venv {} failed", venv.display()));
        }
    }
    println!("xtask: installing {package} in {} (once)", venv.display());
    let mut pip = Command::new(&python);
    pip.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "-q",
        package,
    ]);
    cmd::run(pip)?;
    std::fs::write(&ready, package)
        .map_err(|e| format!("cannot write {}: {e}", ready.display()))?;
    Ok(python)
}
