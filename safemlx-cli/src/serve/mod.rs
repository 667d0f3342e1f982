//! `safemlx serve`: an OpenAI-compatible server in front of a model split
//! over the ranks of the launch.
//!
//! Rank 0 listens and schedules; every rank, rank 0 included, runs the
//! schedule's steps on its part of the model. The only thing that
//! travels between ranks besides the model's own collectives is the plan
//! of each step (see [`plan`]); no rank but rank 0 reads the network.

mod api;
mod batch;
pub(crate) mod engine;
mod first_head;
mod held;
mod http;
mod listen;
pub(crate) mod plan;
pub(crate) mod request;
mod stop;

use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use safemlx::{Array, Stream};
use safemlx_dist::{all_max, collective_timeout, eval, init, Group};

use crate::model_args::{cpu_stream, ModelArgs};
use engine::Settings;
use plan::Bounds;

/// Serve the model over HTTP with OpenAI's API: `POST
/// /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET
/// /health`. Start it under the launcher on every host:
/// `safemlx-launch -n 2 -- safemlx serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The address rank 0 listens on (the default takes local clients only)
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The port rank 0 listens on
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// A name clients may give as `model`, repeatable (vLLM's spelling;
    /// `--model-id` is the same); the first is the name in responses.
    /// The file or directory name, its stem and `default_model` are
    /// accepted too
    #[arg(
        long = "served-model-name",
        visible_alias = "model-id",
        value_name = "NAME"
    )]
    pub served_model_name: Vec<String>,
    /// Accept any `model` in requests (as llama-server does; agent clients
    /// send their own model ids) instead of a 404 for unknown names
    #[arg(long)]
    pub any_model_name: bool,
    /// Every request must send `Authorization: Bearer KEY` (401 otherwise)
    #[arg(long, env = "SAFEMLX_API_KEY", value_name = "KEY")]
    pub api_key: Option<String>,
    /// Sequences computed together at most (the batch)
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub max_concurrent: u16,
    /// Requests waiting for a place in the batch at most; more get 429
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// The largest request body, in bytes (413 beyond)
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body: usize,
    /// The KV cache all slots may reserve on one rank, in MiB (every
    /// slot grows to the longest sequence's prompt and max_tokens); a
    /// request waits until it fits
    #[arg(long, default_value_t = 2048, value_name = "MIB")]
    pub max_cache: usize,
    /// Prompt tokens fed in one step: a new prompt delays the running
    /// sequences by one such chunk at most
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub prefill_chunk: u16,
    /// max_tokens for a request that gives none (cut to the context)
    #[arg(long, default_value_t = 512)]
    pub default_max_tokens: usize,
    /// Seconds a connection has to send its request head (method, path,
    /// headers); an idle or slow client is disconnected after it
    #[arg(long, default_value_t = 10.0, value_parser = positive_seconds)]
    pub header_timeout: f64,
    /// Seconds a request body may pause between pieces (a streamed
    /// response is not bound by it)
    #[arg(long, default_value_t = 30.0, value_parser = positive_seconds)]
    pub body_timeout: f64,
    /// Client connections open at once; later ones wait to be accepted
    /// [default: the descriptor limit (ulimit -n) less 128, at most 4096]
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Drop an ended request's KV cache at once instead of keeping it for
    /// a later prompt that starts the same way (the next turn of a
    /// conversation, a shared system prompt)
    #[arg(long)]
    pub no_prompt_cache: bool,
}

/// Runs the server on this rank until rank 0 stops it.
///
/// # Errors
/// A bad option, the model's loading, the listener, or a fault of a peer.
pub fn run(args: ServeArgs) -> Result<(), crate::failure::Failure> {
    if args.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        return Err(crate::failure::Failure::Usage(
            "--api-key (or SAFEMLX_API_KEY) is empty: every request would be refused; give a key, or leave both out for a server without one"
                .to_owned(),
        ));
    }
    let limits = listen::Limits {
        header: Duration::from_secs_f64(args.header_timeout),
        body_idle: Duration::from_secs_f64(args.body_timeout),
        connections: listen::connection_cap(args.max_connections)
            .map_err(crate::failure::Failure::Usage)?,
    };
    let s = cpu_stream();
    let group = init(false, args.model.backend()?)?;
    let bounds = Bounds {
        slots: usize::from(args.max_concurrent),
        chunk: usize::from(args.prefill_chunk),
    };
    // Bind before loading, so a port in use ends the run at once.
    let listener =
        if group.rank() == 0 {
            let at = format!("{}:{}", args.host, args.port);
            Some(TcpListener::bind(&at).map_err(|e| {
                format!("cannot listen on {at}: {e}; give another --port (or --host)")
            })?)
        } else {
            None
        };
    if listener.is_none() {
        ignore_stop_signals();
    }
    let placed = args.model.load(&group, &s)?;
    let (loaded, link) = (&placed.loaded, placed.link.as_ref());
    let model = &loaded.model;
    // The KV cache of one token on the rank that holds the most (a stage
    // of more layers, a rank of more KV heads): one all_gather, every rank.
    let cache_bytes_per_token = most_over(&group, model.cache_bytes_per_token(), &s)?;
    let Some(listener) = listener else {
        return Ok(engine::follow(model, bounds, (&group, link), &s)?);
    };
    // Every rank has its part of the model before /health answers: the
    // followers' loop takes this empty plan first.
    plan::share(Some(&plan::Plan::default()), bounds, &group, &s)?;
    let config = model.config();
    // Sliding layers mask their window over the slots' full context.
    let context = config.max_position_embeddings;
    let settings = Settings {
        bounds,
        context,
        default_max_tokens: args.default_max_tokens,
        heartbeat: (collective_timeout().map_err(|e| e.to_string())? / 4)
            .min(Duration::from_secs(2)),
        max_cache: args.max_cache.saturating_mul(1 << 20),
        cache_bytes_per_token,
        prompt_cache: !args.no_prompt_cache,
    };
    let names = served_names(&args.served_model_name, &args.model.name()?);
    let name = names[0].clone();
    let (requests, queue) = mpsc::channel();
    let (stop, stopped) = tokio::sync::watch::channel(None);
    let stop = Arc::new(stop);
    let stopping = stopped.clone();
    // A wait on a peer that times out ends this process within 200 ms:
    // the open requests hear why first (their streams get an error event).
    let on_timeout = Arc::clone(&stop);
    safemlx_dist::on_timeout(move |reason| {
        on_timeout.send_replace(Some(format!("the server stopped: {reason}")));
    });
    let shared = Arc::new(http::Shared {
        stopped,
        requests,
        models: names,
        any_model_name: args.any_model_name,
        prompt_bound: (context, loaded.tokenizer.max_token_bytes()),
        api_key: args.api_key.clone(),
        limit: bounds.slots + args.max_queue,
        in_flight: AtomicUsize::new(0),
        next_id: AtomicU64::new(0),
    });
    let router = http::router(shared, args.max_body);
    let address = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listener's address: {e}"))?;
    let server = {
        std::thread::Builder::new()
            .name("safemlx-http".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot start the HTTP runtime: {e}"))?;
                runtime.block_on(listen::run(listener, router, stop, limits))
            })
            .map_err(|e| format!("cannot start the HTTP thread: {e}"))?
    };
    eprintln!(
        "safemlx serve: {name} on http://{address}/v1 ({} ranks, {}; up to {} sequences at once, prefill chunk {}, context {context})",
        group.size(),
        placed.axes,
        bounds.slots,
        bounds.chunk
    );
    let served = engine::lead(
        model,
        &loaded.tokenizer,
        settings,
        &queue,
        &stopping,
        (&group, link),
        &s,
    );
    drop(queue);
    if served.is_ok() {
        // The HTTP side stops by itself on the signal that stopped us; give
        // it a moment to send the last events.
        for _ in 0..20 {
            if server.is_finished() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if server.is_finished() {
            server
                .join()
                .map_err(|_| "the HTTP thread panicked".to_owned())??;
        }
    }
    Ok(served?)
}

/// A number of seconds above 0 (and below a year).
fn positive_seconds(text: &str) -> Result<f64, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if seconds > 0.0 && seconds < 3.2e7 {
        Ok(seconds)
    } else {
        Err(format!(
            "{text} is not a number of seconds above 0 (and below a year)"
        ))
    }
}

/// The names clients may give as `model`: the `--served-model-name`s
/// (the first one names the model in responses), else the file or
/// directory name first; then that name, a GGUF file's stem
/// (`model.gguf` -> `model`) and mlx_lm.server's `default_model`, each
/// once.
fn served_names(given: &[String], file: &str) -> Vec<String> {
    // A file's stem (`model.gguf` -> `model`); a directory's name can
    // hold dots of its own (`Qwen3-0.6B`).
    let stem = file.strip_suffix(".gguf").map(str::to_owned);
    let mut names: Vec<String> = Vec::new();
    let all = given
        .iter()
        .cloned()
        .chain([file.to_owned()])
        .chain(stem)
        .chain(["default_model".to_owned()]);
    for name in all {
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// The largest of every rank's `mine` (one `all_max` over `group`).
///
/// # Errors
/// A value beyond `i32`, or the collective's error.
fn most_over(group: &Group, mine: usize, s: &Stream) -> Result<usize, String> {
    let err = |e: safemlx_dist::Error| e.to_string();
    let mine = i32::try_from(mine).map_err(|_| format!("{mine} bytes per token exceed i32"))?;
    let most = all_max(&Array::from_slice(&[mine], &[1]), group, s).map_err(err)?;
    eval(&[&most]).map_err(err)?;
    let most = most
        .into_evaluated()
        .map_err(|e| e.to_string())?
        .try_to_vec::<i32>()
        .map_err(|e| format!("cannot read the cache sizes: {e}"))?;
    Ok(most.first().map_or(0, |&m| usize::try_from(m).unwrap_or(0)))
}

/// A follower leaves when rank 0's last plan says so: the SIGTERM or SIGINT
/// the launcher sends every rank is rank 0's to act on, which ends its
/// open requests and then sends that plan. (The launcher's SIGKILL, 2 s
/// later, and the collective timeout still end a follower whose rank 0 is
/// gone.)
fn ignore_stop_signals() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    for stop in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: SIG_IGN installs no handler code; nothing else in this
        // process sets these signals' dispositions.
        if let Err(e) = unsafe { signal(stop, SigHandler::SigIgn) } {
            eprintln!("safemlx serve: cannot ignore {stop}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::served_names;

    #[test]
    fn a_model_is_known_by_each_of_its_names() {
        assert_eq!(
            served_names(&[], "SmolLM2-135M-Instruct.Q4_1.gguf"),
            [
                "SmolLM2-135M-Instruct.Q4_1.gguf",
                "SmolLM2-135M-Instruct.Q4_1",
                "default_model"
            ]
        );
        assert_eq!(
            served_names(&["smol".into(), "gpt-4o".into()], "Qwen3-0.6B"),
            ["smol", "gpt-4o", "Qwen3-0.6B", "default_model"]
        );
    }
}
