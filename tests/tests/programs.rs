//! The command lines of the programs the project ships: `--help` prints the usage,
//! an unknown or mistyped flag is an error that names it (and the closest
//! known one), and nothing runs then.

use std::process::Command;

use safemlx_dist_tests::built;

#[test]
fn generate_explains_itself_and_refuses_unknown_flags() {
    let generate = built("examples/generate");
    let out = Command::new(&generate).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    assert!(
        help.starts_with(
            "Text generation with a Llama-family model split over the ranks of its launch"
        ),
        "{help}"
    );
    assert!(help.contains("Usage: generate [OPTIONS]"), "{help}");
    for flag in [
        "--model",
        "--prompt",
        "--chat",
        "--max-tokens",
        "--temperature",
        "--top-p",
        "--seed",
        "--dequantize",
        "--experts",
        "--check",
        "--backend",
    ] {
        assert!(help.contains(flag), "{flag} is not in the help: {help}");
    }
    let out = Command::new(&generate)
        .args(["--max-token", "3"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("error: unexpected argument '--max-token' found"),
        "{err}"
    );
    assert!(
        err.contains("tip: a similar argument exists: '--max-tokens'"),
        "{err}"
    );
    let out = Command::new(&generate)
        .arg("--bogus-flag")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("error: unexpected argument '--bogus-flag' found"),
        "{err}"
    );
    let out = Command::new(&generate)
        .args(["--max-tokens", "many"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("error: invalid value 'many' for '--max-tokens <MAX_TOKENS>'"),
        "{err}"
    );
}

#[test]
fn the_launcher_refuses_remote_options_without_hosts() {
    let launch = built("safemlx-launch");
    for (flag, value) in [("--ssh", "ssh -F config"), ("--starting-port", "5000")] {
        let out = Command::new(&launch)
            .args(["-n", "2", flag, value, "--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.starts_with(&format!("safemlx-launch: {flag} is for ranks on other hosts: give --hosts or an mlx.launch --hostfile, or leave {flag} out")),
            "{err}"
        );
    }
}

/// Every program the project ships answers `--help` and refuses a flag it
/// does not know, before it joins a group or reads a file.
#[test]
fn every_program_answers_help_and_refuses_unknown_flags() {
    for program in [
        "collectives",
        "tp_mlp",
        "moe",
        "transformer_block",
        "generate",
        "train",
        "bench",
        "bench_layers",
        "bench_generate",
    ] {
        let exe = built(&format!("examples/{program}"));
        let out = Command::new(&exe).arg("--help").output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{program}: {help}");
        assert!(
            help.contains(&format!("Usage: {program}")),
            "{program}: {help}"
        );
        assert!(help.contains("--backend"), "{program}: {help}");
        let out = Command::new(&exe).arg("--checkpont").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{program}: {err}");
        assert!(
            err.starts_with("error: unexpected argument '--checkpont' found"),
            "{program}: {err}"
        );
    }
    let launch = built("safemlx-launch");
    let out = Command::new(&launch).arg("--help").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("usage: safemlx-launch"));
}
