//! OpenAI's request bodies, checked field by field, and its error body.
//!
//! A body is read as JSON and every field we use is checked for its type
//! and range; a field we do not support (`n` above 1, `tools`,
//! `logprobs`, ...) is refused by name rather than ignored.

use serde_json::{json, Map, Value};

use super::request::{Params, Prompt};

/// A refusal: HTTP status, message, and the field it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn field(param: &str, message: String) -> Self {
        Self {
            status: 400,
            message,
            param: Some(param.to_owned()),
            code: None,
        }
    }

    /// A refusal that is not about one field.
    pub fn new(status: u16, message: String) -> Self {
        Self {
            status,
            message,
            param: None,
            code: None,
        }
    }

    /// OpenAI's error body.
    pub fn body(&self) -> Value {
        let kind = match self.status {
            401 => "authentication_error",
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        };
        json!({"error": {
            "message": self.message,
            "type": kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// Which endpoint a body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// A checked body.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub params: Params,
    pub stream: bool,
}

/// Fields we do not support, refused when present with a value other than
/// the neutral one.
const UNSUPPORTED: [&str; 12] = [
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "response_format",
    "echo",
    "best_of",
    "suffix",
    "audio",
];

/// Checks `body` for `endpoint` and the served model's `names` (`None`:
/// any name is taken).
///
/// # Errors
/// Malformed JSON, a missing or mistyped field, a value out of range, an
/// unsupported field, or another model's name (404).
pub fn parse(
    body: &[u8],
    endpoint: Endpoint,
    names: Option<&[String]>,
) -> Result<Parsed, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(400, format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(o) = value else {
        return Err(ApiError::new(
            400,
            "the request body must be a JSON object".to_owned(),
        ));
    };
    check_model(&o, names)?;
    for name in UNSUPPORTED {
        match o.get(name) {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {}
            Some(_) => {
                return Err(ApiError::field(
                    name,
                    format!("`{name}` is not supported by this server; leave it out"),
                ))
            }
        }
    }
    if let Some(n) = o.get("n").filter(|v| !v.is_null()) {
        if n.as_u64() != Some(1) {
            return Err(ApiError::field(
                "n",
                format!("`n` is {n}; this server returns one choice: leave it out or give 1"),
            ));
        }
    }
    for name in ["presence_penalty", "frequency_penalty"] {
        if let Some(v) = o.get(name).filter(|v| !v.is_null()) {
            if v.as_f64() != Some(0.0) {
                return Err(ApiError::field(
                    name,
                    format!("`{name}` is {v}; this server supports only 0"),
                ));
            }
        }
    }
    let prompt = match endpoint {
        Endpoint::Chat => Prompt::Chat(messages(&o)?),
        Endpoint::Completions => Prompt::Text(prompt(&o)?),
    };
    let max_tokens = match (o.get("max_completion_tokens"), o.get("max_tokens")) {
        (Some(v), _) if !v.is_null() => Some(count(v, "max_completion_tokens")?),
        (_, Some(v)) if !v.is_null() => Some(count(v, "max_tokens")?),
        _ => None,
    };
    let temperature = number(&o, "temperature", 1.0)?;
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::field(
            "temperature",
            format!("`temperature` is {temperature}; give a number from 0 to 2"),
        ));
    }
    let top_p = number(&o, "top_p", 1.0)?;
    // Sampled in f32: a value that rounds to 0 there is refused here.
    if !(top_p > 0.0 && top_p <= 1.0 && top_p as f32 >= f32::MIN_POSITIVE) {
        return Err(ApiError::field(
            "top_p",
            format!(
                "`top_p` is {top_p}; give a number from {:e} to 1",
                f32::MIN_POSITIVE
            ),
        ));
    }
    let seed = match o.get("seed") {
        // Each request without a seed samples its own way.
        None | Some(Value::Null) => fresh_seed(),
        Some(v) => v
            .as_i64()
            .map(|s| s as u64)
            .ok_or_else(|| ApiError::field("seed", format!("`seed` is {v}; give an integer")))?,
    };
    let stream = match o.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(ApiError::field(
                "stream",
                format!("`stream` is {v}; give true or false"),
            ))
        }
    };
    Ok(Parsed {
        params: Params {
            prompt,
            max_tokens,
            temperature: temperature as f32,
            top_p: top_p as f32,
            seed,
            stop: stop(&o)?,
        },
        stream,
    })
}

/// A seed no other request of this process had: the process's random
/// hasher keys and a count.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    hasher.finish()
}

fn check_model(o: &Map<String, Value>, names: Option<&[String]>) -> Result<(), ApiError> {
    match o.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(_)) if names.is_none() => Ok(()),
        Some(Value::String(name)) if names.is_some_and(|n| n.contains(name)) => Ok(()),
        Some(Value::String(name)) => Err(ApiError {
            status: 404,
            message: format!(
                "the model `{name}` does not exist here; this server serves `{}` (also named {}; see GET /v1/models, or start it with --any-model-name)",
                names.and_then(|n| n.first()).map_or("", String::as_str),
                names
                    .unwrap_or_default()
                    .iter()
                    .skip(1)
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            param: Some("model".to_owned()),
            code: Some("model_not_found"),
        }),
        Some(v) => Err(ApiError::field(
            "model",
            format!("`model` is {v}; give the model's name as a string"),
        )),
    }
}

fn messages(o: &Map<String, Value>) -> Result<Vec<(String, String)>, ApiError> {
    let list = match o.get("messages") {
        Some(Value::Array(list)) if !list.is_empty() => list,
        Some(Value::Array(_)) => {
            return Err(ApiError::field(
                "messages",
                "`messages` is empty; give at least one message".to_owned(),
            ))
        }
        Some(v) => {
            return Err(ApiError::field(
                "messages",
                format!("`messages` is {v}; give an array of messages"),
            ))
        }
        None => {
            return Err(ApiError::field(
                "messages",
                "`messages` is missing; give an array of {\"role\", \"content\"} objects"
                    .to_owned(),
            ))
        }
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |field: &str| format!("messages[{i}].{field}");
            let role = m.get("role").and_then(Value::as_str).ok_or_else(|| {
                ApiError::field(&at("role"), format!("`{}` must be a string", at("role")))
            })?;
            let content = match m.get("content") {
                Some(Value::String(text)) => text.clone(),
                // Parts: only text parts are supported.
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(|p| match (p.get("type"), p.get("text")) {
                        (Some(Value::String(t)), Some(Value::String(text))) if t == "text" => {
                            Ok(text.as_str())
                        }
                        _ => Err(ApiError::field(
                            &at("content"),
                            format!("`{}` has a part that is not text", at("content")),
                        )),
                    })
                    .collect::<Result<String, _>>()?,
                _ => {
                    return Err(ApiError::field(
                        &at("content"),
                        format!("`{}` must be a string", at("content")),
                    ))
                }
            };
            Ok((role.to_owned(), content))
        })
        .collect()
}

fn prompt(o: &Map<String, Value>) -> Result<String, ApiError> {
    match o.get("prompt") {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(list)) if list.len() == 1 && list[0].is_string() => {
            Ok(list[0].as_str().unwrap_or_default().to_owned())
        }
        Some(v) => Err(ApiError::field(
            "prompt",
            format!("`prompt` is {v}; give one string"),
        )),
        None => Err(ApiError::field(
            "prompt",
            "`prompt` is missing; give the text to complete".to_owned(),
        )),
    }
}

fn count(v: &Value, name: &str) -> Result<usize, ApiError> {
    v.as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| {
            ApiError::field(
                name,
                format!("`{name}` is {v}; give a non-negative integer"),
            )
        })
}

fn number(o: &Map<String, Value>, name: &str, default: f64) -> Result<f64, ApiError> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_f64()
            .ok_or_else(|| ApiError::field(name, format!("`{name}` is {v}; give a number"))),
    }
}

fn stop(o: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let bad = |v: &Value| {
        ApiError::field(
            "stop",
            format!("`stop` is {v}; give a string or an array of at most 4 strings"),
        )
    };
    match o.get("stop") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(v @ Value::Array(list)) if list.len() <= 4 => list
            .iter()
            .map(|s| s.as_str().map(str::to_owned).ok_or_else(|| bad(v)))
            .collect(),
        Some(v) => Err(bad(v)),
    }
}
