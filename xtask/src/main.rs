//! `cargo xtask <command>`: the project's automation.
//!
//! - `setup`   install missing Debian prerequisites and mdbook
//! - `test`    setup, fmt, clippy, the whole test suite, the book
//! - `demo`    setup, fetch SmolLM2, release build, run the collectives,
//!   a transformer block and SmolLM2 on 1, 2 and 3 ranks
//! - `bindgen` regenerate `ffi/src/bindings.rs` from the MLX-C headers
//! - `bench collectives` measure every collective and lowering (JSON lines)
//! - `bench layers` measure the parallel layers against dense (JSON lines)
//! - `bench generate` SmolLM2 generation at 1-3 ranks beside mlx-lm and llama.cpp
//! - `bench moe [deepseek|gpt-oss|glm|quantized]` the MoE layer, a small MoE model, DeepSeek-, gpt-oss- and GLM-shaped models, both placements; a Qwen3-MoE-shaped model as mlx-lm's 4-bit directory and llama.cpp's Q4_K_M beside both
//! - `bench serve` `safemlx serve` under 1-16 clients beside mlx_lm.server and llama.cpp's server
//! - `bench train` tensor-parallel training at 1-4 ranks beside MLX Python
//! - `faults [TRIALS]` kill the launcher at random times; check nothing survives it;
//!   then stop a rank mid-decode, run two runs on the same ports, pass non-UTF-8
//!   arguments and close the launcher's stdout

mod bench;
mod bindings;
mod cmd;
mod faults;
mod faults_cases;
mod mlx_python;
mod models;
mod setup;
mod tasks;

use std::process::ExitCode;

const USAGE: &str =
    "usage: cargo xtask <setup|test|demo|bindgen|bench collectives|bench layers|bench generate|bench moe [deepseek|gpt-oss|glm|quantized]|bench serve|bench train|faults [TRIALS]>";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("setup") => setup::run(),
        Some("test") => tasks::test(),
        Some("demo") => tasks::demo(),
        Some("bindgen") => bindings::generate(),
        Some("bench") => bench::run(&args[1..]),
        Some("faults") => faults::run(&args[1..]),
        Some(other) => Err(format!("unknown command {other:?}\n{USAGE}")),
        None => Err(USAGE.to_owned()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}
