//! What the HTTP side hands the scheduler, and what comes back.

use tokio::sync::mpsc::UnboundedSender;

/// The prompt of a request.
#[derive(Debug, Clone)]
pub enum Prompt {
    /// `/v1/completions`: the text as it is.
    Text(String),
    /// `/v1/chat/completions`: (role, content) pairs, rendered with the
    /// model's chat template.
    Chat(Vec<(String, String)>),
}

/// What a request asks for, checked.
#[derive(Debug, Clone)]
pub struct Params {
    pub prompt: Prompt,
    /// Tokens to generate at most (`None`: the server's default).
    pub max_tokens: Option<usize>,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
    /// Strings that end the text (not shown).
    pub stop: Vec<String>,
}

/// One request, as the scheduler takes it.
#[derive(Debug)]
pub struct Request {
    pub params: Params,
    /// Where the scheduler reports; dropped by a client that left.
    pub events: UnboundedSender<Event>,
}

/// Why a sequence ended, in OpenAI's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` or the context's end.
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

/// What the scheduler reports about a request, in order: `Started`, then
/// `Text` pieces, then `Done`; or `Failed` alone.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The prompt is tokenized and accepted.
    Started,
    /// Generated text.
    Text(String),
    /// The end, with the usage counts.
    Done { finish: Finish, usage: Usage },
    /// Refused or ended by a fault: the HTTP status and the message.
    Failed { status: u16, message: String },
}

/// A request's token counts, as OpenAI's `usage` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens found in a cache an ended sequence left (not
    /// computed again).
    pub cached_tokens: usize,
}
