//! `cargo xtask setup`: install what a fresh Debian machine is missing.

use std::process::Command;

use crate::cmd;

/// Debian packages the native MLX build and the MPI backend need.
const DEBIAN_PACKAGES: &[&str] = &[
    "cmake",
    "libopenblas-dev",
    "liblapacke-dev",
    "openmpi-bin",
    "libopenmpi-dev",
];

/// What the tests also need: curl, the server tests' HTTP client.
const TEST_PACKAGES: &[&str] = &["curl"];

/// The mdBook release the book is built with.
const MDBOOK_VERSION: &str = "0.5.4";

pub fn run() -> Result<(), String> {
    install_debian_packages(DEBIAN_PACKAGES)?;
    install_debian_packages(TEST_PACKAGES)?;
    install_mdbook()?;
    println!(
        "setup: native MLX build cache at {}",
        cmd::native_build_root().display()
    );
    Ok(())
}

/// What the demo needs: the Debian packages, not mdbook (only the book
/// build in `cargo xtask test` uses it).
pub fn run_for_demo() -> Result<(), String> {
    install_debian_packages(DEBIAN_PACKAGES)
}

fn is_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Installs the missing packages of `packages` with apt-get (through sudo
/// when not root); prints what it installs and does nothing when all are there.
pub fn install_debian_packages(packages: &[&str]) -> Result<(), String> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !is_installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("setup: installing Debian packages: {}", missing.join(" "));
    let as_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|out| out.stdout.starts_with(b"0"))
        .unwrap_or(false);
    let apt = |args: &[&str]| {
        let mut command = if as_root {
            Command::new("apt-get")
        } else {
            let mut sudo = Command::new("sudo");
            sudo.arg("apt-get");
            sudo
        };
        command.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        command
    };
    cmd::run(apt(&["update"]))?;
    let mut install = apt(&["install", "-y", "--no-install-recommends"]);
    install.args(&missing);
    cmd::run(install)
}

fn install_mdbook() -> Result<(), String> {
    let present = Command::new("mdbook")
        .arg("--version")
        .output()
        .map(|out| out.status.success())
        .unwrap_or(false);
    if present {
        return Ok(());
    }
    println!("setup: installing mdbook {MDBOOK_VERSION} with cargo install");
    cmd::run(cmd::cargo(&[
        "install",
        "mdbook",
        "--locked",
        "--version",
        MDBOOK_VERSION,
    ]))
}
