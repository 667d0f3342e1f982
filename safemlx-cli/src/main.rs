//! `safemlx`: generate, chat and serve with a model split over the ranks
//! of a `safemlx-launch` run (`safemlx-launch -n 2 -- safemlx serve`).
//! Without the launcher it runs as one rank.

mod chat;
mod failure;
mod generate;
mod model_args;
mod serve;

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run a Llama-family or MoE model (Hugging Face directory or GGUF file)
/// split over the ranks of a launch: `safemlx-launch -n N -- safemlx
/// COMMAND`, or alone as one rank.
#[derive(Debug, Parser)]
#[command(name = "safemlx", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate text for one prompt and report the speed
    Generate(generate::GenerateArgs),
    /// Chat in the terminal: the conversation is kept between turns
    Chat(chat::ChatArgs),
    /// Serve the model over HTTP with OpenAI's API
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (name, result) = match cli.command {
        Command::Generate(args) => ("generate", generate::run(args)),
        Command::Chat(args) => ("chat", chat::run(args)),
        Command::Serve(args) => ("serve", serve::run(args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            // One write: under mpirun every write is its own tagged line.
            let line = format!("safemlx {name}: {}\n", failure.message());
            let _ = std::io::stderr().write_all(line.as_bytes());
            ExitCode::from(failure.exit_code())
        }
    }
}
