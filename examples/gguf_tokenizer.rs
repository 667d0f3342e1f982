//! Writes a GGUF file's tokenizer and chat template as the Hugging Face
//! files tools read (`tokenizer.json`, `tokenizer_config.json`): how
//! `cargo xtask bench serve` gives `mlx_lm.server` the same tokenizer as
//! ours on weights converted from the GGUF.
//!
//! ```text
//! target/release/examples/gguf_tokenizer --model FILE.gguf --out DIR
//! ```

use std::process::ExitCode;

use safemlx_dist::checkpoint::GgufFile;
use safemlx_dist::tokenizer::Tokenizer;
use safemlx_dist_examples::flag;

fn main() -> ExitCode {
    safemlx_dist_examples::exit("gguf_tokenizer", run())
}

fn run() -> Result<(), String> {
    safemlx_dist_examples::command_line(
        "gguf_tokenizer",
        "Write a GGUF file's tokenizer as Hugging Face files",
        &[
            ("--model", Some("FILE.gguf"), "The GGUF file"),
            ("--out", Some("DIR"), "The directory to write into"),
        ],
    );
    let model = flag("--model").ok_or("--model FILE.gguf is required")?;
    let out = flag("--out").ok_or("--out DIR is required")?;
    let file = GgufFile::open(&model).map_err(|e| e.to_string())?;
    let tokenizer = Tokenizer::from_gguf(&file).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {out}: {e}"))?;
    tokenizer
        .save_hf(std::path::Path::new(&out))
        .map_err(|e| e.to_string())?;
    println!("gguf_tokenizer: wrote {out}/tokenizer.json and tokenizer_config.json");
    Ok(())
}
