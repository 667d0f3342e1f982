//! `safemlx chat`: a conversation in the terminal. Rank 0 reads the
//! user's lines and runs the server's scheduler with one client, the
//! terminal; the other ranks follow its plans as under `serve`. Each turn
//! reuses the cache the last one left: only the new message is computed.

use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::time::Duration;

use safemlx_dist::{collective_timeout, init};
use tokio::sync::mpsc::unbounded_channel;

use crate::model_args::{cpu_stream, ModelArgs, SamplingArgs};
use crate::serve::engine::{follow, lead, Settings};
use crate::serve::plan::Bounds;
use crate::serve::request::{Event, Params, Prompt, Request};

/// Chat in the terminal (rank 0 reads standard input; an empty line or
/// end of input ends the chat).
#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A system message that starts the conversation
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens of one reply at most
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

const BOUNDS: Bounds = Bounds {
    slots: 1,
    chunk: 256,
};

/// Runs the chat on this rank.
///
/// # Errors
/// A bad option, the model's loading, or a fault of a peer.
pub fn run(args: ChatArgs) -> Result<(), crate::failure::Failure> {
    let s = cpu_stream();
    let group = init(false, args.model.backend()?)?;
    let placed = args.model.load(&group, &s)?;
    let (loaded, link) = (&placed.loaded, placed.link.as_ref());
    if group.rank() != 0 {
        return Ok(follow(&loaded.model, BOUNDS, (&group, link), &s)?);
    }
    let config = loaded.model.config();
    let settings = Settings {
        bounds: BOUNDS,
        context: config.max_position_embeddings,
        default_max_tokens: args.max_tokens,
        heartbeat: (collective_timeout().map_err(|e| e.to_string())? / 4)
            .min(Duration::from_secs(2)),
        max_cache: usize::MAX,
        cache_bytes_per_token: 0,
        prompt_cache: true,
    };
    let (requests, queue) = mpsc::channel();
    let terminal = std::thread::spawn(move || talk(&args, &requests));
    lead(
        &loaded.model,
        &loaded.tokenizer,
        settings,
        &queue,
        // Never stopped: the chat ends with its input.
        &tokio::sync::watch::channel(None).1,
        (&group, link),
        &s,
    )?;
    Ok(terminal
        .join()
        .map_err(|_| "the terminal thread panicked".to_owned())??)
}

/// The terminal's side: reads a line, sends the conversation, prints the
/// reply as it comes.
fn talk(args: &ChatArgs, requests: &mpsc::Sender<Request>) -> Result<(), String> {
    let mut conversation: Vec<(String, String)> = args
        .system
        .iter()
        .map(|text| ("system".to_owned(), text.clone()))
        .collect();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    loop {
        let _ = write!(out, "> ");
        let _ = out.flush();
        let mut line = String::new();
        let read = stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        let line = line.trim_end_matches(['\n', '\r']);
        if read == 0 || line.is_empty() {
            return Ok(());
        }
        conversation.push(("user".to_owned(), line.to_owned()));
        let (events, mut rx) = unbounded_channel();
        let request = Request {
            params: Params {
                prompt: Prompt::Chat(conversation.clone()),
                max_tokens: None,
                temperature: args.sampling.temperature,
                top_p: args.sampling.top_p,
                seed: args.sampling.seed,
                stop: Vec::new(),
            },
            events,
        };
        requests
            .send(request)
            .map_err(|_| "the model stopped".to_owned())?;
        let mut reply = String::new();
        let started = std::time::Instant::now();
        while let Some(event) = rx.blocking_recv() {
            match event {
                Event::Text(piece) => {
                    let _ = out.write_all(piece.as_bytes());
                    let _ = out.flush();
                    reply.push_str(&piece);
                }
                Event::Done { usage, .. } => {
                    let _ = writeln!(out);
                    // The figures go to standard error: the reply alone
                    // is standard output.
                    eprintln!(
                        "[{} tokens in {:.1} s; prompt {} tokens, {} of them from the cache]",
                        usage.completion_tokens,
                        started.elapsed().as_secs_f64(),
                        usage.prompt_tokens,
                        usage.cached_tokens
                    );
                    break;
                }
                Event::Failed { message, .. } => return Err(message),
                Event::Started => {}
            }
        }
        conversation.push(("assistant".to_owned(), reply));
    }
}
