//! Rank 0's HTTP side (axum on a one-thread tokio runtime): OpenAI's
//! endpoints in front of the scheduler. A request is checked here, handed
//! to the scheduler, and answered from its events, whole or as
//! server-sent events.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request as HttpRequest, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::{stream, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::watch;

use super::api::{parse, ApiError, Endpoint};
use super::request::{Event, Prompt, Request, Usage};

/// What every handler shares.
#[derive(Debug)]
pub struct Shared {
    /// Set on SIGINT or SIGTERM, or when a wait on a peer timed out (the
    /// process exits next): open requests end at once with a 503 saying
    /// why.
    pub stopped: tokio::sync::watch::Receiver<Option<String>>,
    /// The scheduler's queue.
    pub requests: Sender<Request>,
    /// The names clients may give as `model`; the first names it in
    /// responses.
    pub models: Vec<String>,
    /// `--any-model-name`: any `model` is taken.
    pub any_model_name: bool,
    /// The model's context in tokens, and at most how many bytes a token
    /// covers: a longer prompt is refused before it is tokenized (the
    /// scheduler tokenizes, and a megabyte of text held every stream).
    pub prompt_bound: (usize, usize),
    /// `--api-key`.
    pub api_key: Option<String>,
    /// Requests running or waiting at most (`--max-concurrent` plus
    /// `--max-queue`); beyond, 429.
    pub limit: usize,
    pub in_flight: AtomicUsize,
    pub next_id: AtomicU64,
}

type AppState = Arc<Shared>;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_REQUEST);
        (status, Json(self.body())).into_response()
    }
}

/// The routes: `/v1/*` (behind the API key when one is set), `/health`.
pub fn router(state: AppState, max_body: usize) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .merge(v1)
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .fallback(|| async {
            ApiError::new(404, "no such endpoint; see GET /v1/models".to_owned())
        })
        .method_not_allowed_fallback(|request: HttpRequest| async move {
            let allowed = match request.uri().path() {
                "/v1/models" | "/health" => "GET",
                _ => "POST",
            };
            ApiError::new(
                405,
                format!(
                    "{} is not allowed on {}; use {allowed}",
                    request.method(),
                    request.uri().path()
                ),
            )
        })
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

async fn auth(
    State(state): State<AppState>,
    headers: HeaderMap,
    request: HttpRequest,
    next: Next,
) -> Response {
    if let Some(key) = &state.api_key {
        let given = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token);
        if given != Some(key.as_str()) {
            let mut response = ApiError::new(
                401,
                "this server needs `Authorization: Bearer KEY` with the key it was started with (--api-key)"
                    .to_owned(),
            )
            .into_response();
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"safemlx\""),
            );
            return response;
        }
    }
    next.run(request).await
}

/// The token of an `Authorization` value: the scheme `Bearer` in any case
/// (RFC 7235), then one or more spaces.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}

async fn models(State(state): State<AppState>) -> Json<Value> {
    let data: Vec<Value> = state
        .models
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "safemlx"}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn chat(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    complete(state, body, Endpoint::Chat).await
}

async fn completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(state, body, Endpoint::Completions).await
}

/// Counts a request in flight while it lives.
struct InFlight(AppState);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn complete(
    state: AppState,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            return ApiError::new(rejection.status().as_u16(), rejection.body_text())
                .into_response()
        }
    };
    let names = (!state.any_model_name).then_some(state.models.as_slice());
    let parsed = match parse(&body, endpoint, names) {
        Ok(parsed) => parsed,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = fits_context(&parsed.params.prompt, state.prompt_bound) {
        return e.into_response();
    }
    if state.in_flight.fetch_add(1, Ordering::AcqRel) >= state.limit {
        state.in_flight.fetch_sub(1, Ordering::AcqRel);
        return ApiError::new(
            429,
            format!(
                "the server has {} requests running or queued, its limit (--max-concurrent and --max-queue); retry later",
                state.limit
            ),
        )
        .into_response();
    }
    let guard = InFlight(Arc::clone(&state));
    let (events, mut rx) = unbounded_channel();
    let stream_it = parsed.stream;
    let request = Request {
        params: parsed.params,
        events,
    };
    if state.requests.send(request).is_err() {
        return ApiError::new(503, STOPPING.to_owned()).into_response();
    }
    let mut stopped = state.stopped.clone();
    match next_event(&mut rx, &mut stopped).await {
        Some(Event::Started) => {}
        Some(Event::Failed { status, message }) => {
            return ApiError::new(status, message).into_response()
        }
        _ => return ApiError::new(500, "the server stopped".to_owned()).into_response(),
    };
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let reply = Reply {
        id: match endpoint {
            Endpoint::Chat => format!("chatcmpl-{id}"),
            Endpoint::Completions => format!("cmpl-{id}"),
        },
        endpoint,
        model: state.models[0].clone(),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    if stream_it {
        let stopped = state.stopped.clone();
        return sse(reply, rx, stopped, guard);
    }
    let mut text = String::new();
    let mut stopped = state.stopped.clone();
    while let Some(event) = next_event(&mut rx, &mut stopped).await {
        match event {
            Event::Text(piece) => text.push_str(&piece),
            Event::Done { finish, usage } => {
                let usage = usage_json(&usage);
                return Json(reply.whole(&text, finish.as_str(), usage)).into_response();
            }
            Event::Failed { status, message } => {
                return ApiError::new(status, message).into_response()
            }
            Event::Started => {}
        }
    }
    ApiError::new(500, "the server stopped".to_owned()).into_response()
}

/// Refuses a prompt whose bytes cannot fit `context` tokens of at most
/// `token_bytes` bytes each (`(context, token_bytes)`; 0: no bound).
fn fits_context(prompt: &Prompt, (context, token_bytes): (usize, usize)) -> Result<(), ApiError> {
    let bytes = match prompt {
        Prompt::Text(text) => text.len(),
        Prompt::Chat(messages) => messages.iter().map(|(_, content)| content.len()).sum(),
    };
    let most = context.saturating_mul(token_bytes);
    if context == 0 || bytes <= most {
        return Ok(());
    }
    Err(ApiError::new(
        400,
        format!(
            "the prompt has {bytes} bytes: more than the model's context of {context} tokens holds (a token covers at most {token_bytes} bytes); give a shorter prompt"
        ),
    ))
}

/// The scheduler's next event, or a 503 once the server is stopping (the
/// HTTP side answers at once: the scheduler may be inside a step, and the
/// launcher kills the ranks 2 s after its SIGTERM).
async fn next_event(
    rx: &mut UnboundedReceiver<Event>,
    stopped: &mut watch::Receiver<Option<String>>,
) -> Option<Event> {
    let stopping = |message: String| Event::Failed {
        status: 503,
        message,
    };
    // Checked first: `select!` may take a ready event over a stop.
    let why = stopped.borrow().clone();
    if let Some(why) = why {
        return Some(stopping(why));
    }
    tokio::select! {
        event = rx.recv() => event,
        why = stopped.wait_for(Option::is_some) => Some(stopping(
            why.ok().and_then(|why| (*why).clone()).unwrap_or_else(|| STOPPING.to_owned()),
        )),
    }
}

/// Why open requests end when the server is stopped by a signal.
pub const STOPPING: &str = "the server is stopping";

fn usage_json(u: &Usage) -> Value {
    json!({"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
           "total_tokens": u.prompt_tokens + u.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": u.cached_tokens}})
}

/// The fields every response and chunk of one request shares.
struct Reply {
    id: String,
    endpoint: Endpoint,
    model: String,
    created: u64,
}

impl Reply {
    fn whole(&self, text: &str, finish: &str, usage: Value) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({"index": 0, "finish_reason": finish,
                "message": {"role": "assistant", "content": text}}),
            Endpoint::Completions => json!({"index": 0, "finish_reason": finish,
                "text": text, "logprobs": null}),
        };
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion",
            Endpoint::Completions => "text_completion",
        };
        json!({"id": self.id, "object": object, "created": self.created,
               "model": self.model, "choices": [choice], "usage": usage})
    }

    /// One streamed chunk: `text` as a delta, or the end.
    fn chunk(&self, text: Option<&str>, finish: Option<&str>, usage: Option<Value>) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let delta = match text {
                    Some(t) => json!({"role": "assistant", "content": t}),
                    None => json!({}),
                };
                json!({"index": 0, "delta": delta, "finish_reason": finish})
            }
            Endpoint::Completions => json!({"index": 0, "text": text.unwrap_or(""),
                "finish_reason": finish, "logprobs": null}),
        };
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        };
        let mut chunk = json!({"id": self.id, "object": object, "created": self.created,
                               "model": self.model, "choices": [choice]});
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        chunk
    }
}

/// The stream's state: the scheduler's events, then `[DONE]`, then the end.
enum Phase {
    Open(UnboundedReceiver<Event>, watch::Receiver<Option<String>>),
    Ending,
    Ended,
}

/// Server-sent events in OpenAI's chunk format; the usage rides on the
/// chunk with the finish reason. A client that leaves drops the receiver,
/// which the scheduler sees at its next step.
fn sse(
    reply: Reply,
    rx: UnboundedReceiver<Event>,
    stopped: watch::Receiver<Option<String>>,
    guard: InFlight,
) -> Response {
    let first = Sse::default().data(reply.chunk(Some(""), None, None).to_string());
    let events = stream::unfold(
        (Phase::Open(rx, stopped), reply, guard),
        |(phase, reply, guard)| async move {
            let Phase::Open(mut rx, mut stopped) = phase else {
                return match phase {
                    Phase::Ending => Some((
                        Ok(Sse::default().data("[DONE]")),
                        (Phase::Ended, reply, guard),
                    )),
                    _ => None,
                };
            };
            loop {
                let (event, next) = match next_event(&mut rx, &mut stopped).await {
                    Some(Event::Text(piece)) => (
                        reply.chunk(Some(&piece), None, None),
                        Phase::Open(rx, stopped),
                    ),
                    Some(Event::Done { finish, usage }) => (
                        reply.chunk(None, Some(finish.as_str()), Some(usage_json(&usage))),
                        Phase::Ending,
                    ),
                    Some(Event::Failed { status, message }) => {
                        (ApiError::new(status, message).body(), Phase::Ended)
                    }
                    Some(Event::Started) => continue,
                    None => (
                        ApiError::new(500, "the server stopped".to_owned()).body(),
                        Phase::Ended,
                    ),
                };
                let sse: Result<Sse, Infallible> = Ok(Sse::default().data(event.to_string()));
                return Some((sse, (next, reply, guard)));
            }
        },
    );
    let all = stream::iter([Ok::<_, Infallible>(first)]).chain(events);
    axum::response::Sse::new(all)
        .keep_alive(KeepAlive::default())
        .into_response()
}
