//! MLX Python for the tests of mixed groups (MLX Python ranks beside ours):
//! a virtual environment with the `mlx[cpu]` wheel from PyPI, in the user's
//! cache directory, made once.

use std::path::PathBuf;
use std::process::Command;

use crate::{cmd, setup};

/// The wheel: the MLX release our native build is wire-compatible with.
const PACKAGE: &str = "mlx[cpu]==0.32.4";

/// The environment's `python`, making the environment the first time.
pub fn python() -> Result<PathBuf, String> {
    let venv = cmd::cache_root().join("mlx-python");
    let python = venv.join("bin").join("python");
    let ready = venv.join(".ready");
    if std::fs::read_to_string(&ready).is_ok_and(|p| p == PACKAGE) {
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
    println!(
        "mlx-python: installing {PACKAGE} in {} (once)",
        venv.display()
    );
    let mut pip = Command::new(&python);
    pip.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "-q",
        PACKAGE,
    ]);
    cmd::run(pip)?;
    std::fs::write(&ready, PACKAGE)
        .map_err(|e| format!("cannot write {}: {e}", ready.display()))?;
    Ok(python)
}
