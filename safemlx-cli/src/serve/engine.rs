//! Rank 0's scheduler: continuous batching.
//!
//! Every step, the sequences that ended leave their slots (their caches
//! stay, for a later prompt that starts the same way: [`Held`]), waiting
//! requests take slots, and one batch runs: one token for every decoding
//! sequence and at most one prefill chunk of prompt tokens (so a new
//! prompt stalls the others' decode by one chunk at most). Rank 0 samples
//! each sequence's next token with the request's own sampler and streams
//! its text; the plan goes to every rank first. While nothing runs, an
//! empty plan goes out every heartbeat, so the followers' wait stays
//! within the collective timeout.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use safemlx::Stream;
use safemlx_dist::generate::Sampler;
use safemlx_dist::models::Llama;
use safemlx_dist::tokenizer::{TextStream, Tokenizer};
use safemlx_dist::typed::StageLink;
use safemlx_dist::Group;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

use super::batch::Slots;
use super::held::Held;
use super::plan::{share, Bounds, Plan, Work};
use super::request::{Event, Finish, Prompt, Request, Usage};
use super::stop::StopText;

/// How the scheduler runs.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub bounds: Bounds,
    /// Positions a sequence may reach (prompt and generated tokens).
    pub context: usize,
    /// `max_tokens` when a request gives none (cut to the context).
    pub default_max_tokens: usize,
    /// The longest wait between two plans while idle.
    pub heartbeat: Duration,
    /// The KV cache bytes all sequences may reserve on a rank.
    pub max_cache: usize,
    /// The KV cache bytes of one token on the rank that holds the most.
    pub cache_bytes_per_token: usize,
    /// Ended sequences' caches stay for later prompts that start the same
    /// way ([`Held`]); otherwise they are dropped at once.
    pub prompt_cache: bool,
}

/// A request from its acceptance to its end.
struct Sequence<'t> {
    slot: Option<usize>,
    prompt: Vec<u32>,
    /// Prompt tokens fed so far (or found in the slot's cache).
    fed: usize,
    /// Prompt tokens found in the slot's cache.
    cached: usize,
    /// The tokens in the slot's cache, in order.
    history: Vec<u32>,
    generated: usize,
    /// The token fed at the next decode step.
    last: u32,
    max_tokens: usize,
    sampler: Sampler,
    text: TextStream<'t>,
    stop: StopText,
    events: UnboundedSender<Event>,
    ended: bool,
}

impl Sequence<'_> {
    fn send(&self, event: Event) {
        // A client that left is noticed at the next step (`is_closed`).
        let _ = self.events.send(event);
    }

    /// Ends the sequence with a server error (a sampler's or tokenizer's).
    fn fail(&mut self, error: &safemlx_dist::Error) {
        self.send(Event::Failed {
            status: 500,
            message: error.to_string(),
        });
        self.ended = true;
    }

    fn end(&mut self, finish: Finish, flush: bool) {
        if flush {
            let rest = self.stop.finish();
            if !rest.is_empty() {
                self.send(Event::Text(rest));
            }
        }
        self.send(Event::Done {
            finish,
            usage: Usage {
                prompt_tokens: self.prompt.len(),
                completion_tokens: self.generated,
                cached_tokens: self.cached,
            },
        });
        self.ended = true;
    }
}

/// Rank 0's loop: takes requests until `requests` closes (and nothing
/// runs) or `shutdown` is set (open requests end with a 503), then tells
/// every rank to stop. `group` is the world; `link`, the pipeline's
/// boundaries when the model is a stage.
///
/// # Errors
/// A collective's or the model's error; every open request gets it too.
pub fn lead<'t>(
    model: &Llama,
    tokenizer: &'t Tokenizer,
    settings: Settings,
    requests: &Receiver<Request>,
    shutdown: &watch::Receiver<Option<String>>,
    (group, link): (&Group, Option<&StageLink>),
    s: &Stream,
) -> Result<(), String> {
    let mut slots = Slots::new(model, settings.bounds.slots);
    let mut seqs: Vec<Sequence<'t>> = Vec::new();
    let mut held = Held::new(settings.bounds.slots);
    let mut free: Vec<usize> = Vec::new();
    let admit =
        |r: Request, seqs: &mut Vec<Sequence<'t>>| match accept(r, model, tokenizer, &settings) {
            Ok(seq) => seqs.push(seq),
            Err((events, status, message)) => {
                let _ = events.send(Event::Failed { status, message });
            }
        };
    loop {
        let why = shutdown.borrow().clone();
        if let Some(why) = why {
            // The launcher gives ranks 2 s between SIGTERM and SIGKILL:
            // the open requests end now, with a message.
            for seq in &seqs {
                seq.send(Event::Failed {
                    status: 503,
                    message: why.clone(),
                });
            }
            // The followers may have had the signal too.
            let _ = share(Some(&STOP), settings.bounds, group, s);
            return Ok(());
        }
        if seqs.is_empty() {
            match requests.recv_timeout(settings.heartbeat) {
                Ok(r) => admit(r, &mut seqs),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        while let Ok(r) = requests.try_recv() {
            admit(r, &mut seqs);
        }
        // Ended sequences and clients that left leave their caches.
        let (ended, running) = std::mem::take(&mut seqs)
            .into_iter()
            .partition::<Vec<_>, _>(|q| q.ended || q.events.is_closed());
        seqs = running;
        for seq in ended {
            match seq.slot {
                Some(slot) if settings.prompt_cache => held.keep(slot, seq.history),
                Some(slot) => free.push(slot),
                None => {}
            }
        }
        assign_slots(&mut seqs, &mut held, &mut free, &settings);
        let plan = Plan {
            stop: false,
            free: std::mem::take(&mut free),
            work: batch(&seqs, settings.bounds.chunk),
        };
        let step = share(Some(&plan), settings.bounds, group, s)
            .and_then(|plan| slots.run(model, &plan, (true, link), s));
        let rows = match step {
            Ok(rows) => rows,
            Err(e) => {
                for seq in &seqs {
                    seq.send(Event::Failed {
                        status: 500,
                        message: format!("the server failed: {e}"),
                    });
                }
                return Err(e);
            }
        };
        for (w, row) in plan.work.iter().zip(rows) {
            let Some(seq) = seqs.iter_mut().find(|q| q.slot == Some(w.slot)) else {
                continue;
            };
            seq.history.extend_from_slice(&w.tokens);
            if seq.fed < seq.prompt.len() {
                seq.fed += w.tokens.len();
                if seq.fed < seq.prompt.len() {
                    continue;
                }
            }
            next_token(seq, &row, &model.config().eos_token_ids);
        }
    }
    share(Some(&STOP), settings.bounds, group, s).map(drop)
}

/// The last plan.
const STOP: Plan = Plan {
    stop: true,
    free: Vec::new(),
    work: Vec::new(),
};

/// A follower's loop: runs rank 0's plans (over the world `group`) until
/// it says stop, on its stage when `link` joins the pipeline's.
///
/// # Errors
/// A collective's or the model's error, or a plan that does not decode.
pub fn follow(
    model: &Llama,
    bounds: Bounds,
    (group, link): (&Group, Option<&StageLink>),
    s: &Stream,
) -> Result<(), String> {
    let mut slots = Slots::new(model, bounds.slots);
    loop {
        let plan = share(None, bounds, group, s)?;
        if plan.stop {
            return Ok(());
        }
        slots.run(model, &plan, (false, link), s)?;
    }
}

/// Checks and tokenizes a request: the sequence, or the HTTP status and
/// message of its refusal.
fn accept<'t>(
    r: Request,
    model: &Llama,
    tokenizer: &'t Tokenizer,
    settings: &Settings,
) -> Result<Sequence<'t>, (UnboundedSender<Event>, u16, String)> {
    let Request { params: r, events } = r;
    let refuse = |message: String| (events.clone(), 400, message);
    // A completion's text is the prompt as written (special tokens too);
    // a chat message's content is text (see `Tokenizer::encode_chat`).
    let prompt = match &r.prompt {
        Prompt::Text(text) => tokenizer.encode(text),
        Prompt::Chat(messages) => {
            let pairs: Vec<(&str, &str)> = messages
                .iter()
                .map(|(role, content)| (role.as_str(), content.as_str()))
                .collect();
            tokenizer.encode_chat(&pairs)
        }
    }
    .map_err(|e| refuse(e.to_string()))?;
    let (context, vocab) = (settings.context, model.config().vocab_size);
    if prompt.is_empty() {
        return Err(refuse("the prompt has no tokens".to_owned()));
    }
    if let Some(t) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(refuse(format!(
            "the prompt's token {t} is outside the model's vocabulary of {vocab}"
        )));
    }
    if prompt.len() >= context {
        return Err(refuse(format!(
            "the prompt has {} tokens; the model's context is {context}, so give at most {}",
            prompt.len(),
            context - 1
        )));
    }
    let room = context - prompt.len();
    let max_tokens = r
        .max_tokens
        .unwrap_or_else(|| settings.default_max_tokens.min(room));
    if max_tokens > room {
        return Err(refuse(format!(
            "max_tokens is {max_tokens}, but the prompt has {} of the context's {context} tokens: give max_tokens at most {room}",
            prompt.len()
        )));
    }
    let slots = settings.bounds.slots;
    let reserve = (prompt.len() + max_tokens)
        .saturating_mul(settings.cache_bytes_per_token)
        .saturating_mul(slots);
    if reserve > settings.max_cache {
        return Err(refuse(format!(
            "the prompt's {} tokens and max_tokens {max_tokens} need {reserve} bytes of KV cache (the server's {slots} slots each grow to the longest sequence), more than its --max-cache of {} bytes: give a smaller max_tokens, or start the server with a larger --max-cache or a smaller --max-concurrent",
            prompt.len(),
            settings.max_cache
        )));
    }
    let sampler =
        Sampler::new(r.temperature, r.top_p, r.seed).map_err(|e| refuse(e.to_string()))?;
    let _ = events.send(Event::Started);
    let mut seq = Sequence {
        slot: None,
        prompt,
        fed: 0,
        cached: 0,
        history: Vec::new(),
        generated: 0,
        last: 0,
        max_tokens,
        sampler,
        text: tokenizer.stream(),
        stop: StopText::new(r.stop),
        events,
        ended: false,
    };
    if max_tokens == 0 {
        seq.end(Finish::Length, false);
    }
    Ok(seq)
}

/// Gives waiting sequences, oldest first, slots no running sequence
/// holds (reusing the longest prefix an ended one left, [`Held::place`])
/// while the KV cache fits `--max-cache`: every slot grows to the longest
/// sequence (running ones at their prompt plus max_tokens, held caches at
/// what they hold). Held caches are dropped, oldest first, to make room
/// (their slots go to `free`, so every rank drops them).
fn assign_slots(
    seqs: &mut [Sequence],
    held: &mut Held,
    free: &mut Vec<usize>,
    settings: &Settings,
) {
    let bytes = |positions: usize| {
        positions
            .saturating_mul(settings.cache_bytes_per_token)
            .saturating_mul(settings.bounds.slots)
    };
    let mut longest = seqs
        .iter()
        .filter(|q| q.slot.is_some())
        .map(|q| q.prompt.len() + q.max_tokens)
        .max()
        .unwrap_or(0);
    let mut taken: Vec<usize> = seqs.iter().filter_map(|q| q.slot).collect();
    for seq in seqs.iter_mut().filter(|q| q.slot.is_none() && !q.ended) {
        let Some(place) = held.place(&seq.prompt, &taken) else {
            return;
        };
        let need = longest.max(seq.prompt.len() + seq.max_tokens);
        let mut keep_out = taken.clone();
        keep_out.push(place.slot);
        while bytes(need.max(held.longest_except(place.slot))) > settings.max_cache {
            let Some(slot) = held.evict(&keep_out) else {
                return;
            };
            free.push(slot);
        }
        held.take(place.slot);
        longest = need;
        taken.push(place.slot);
        seq.slot = Some(place.slot);
        seq.fed = place.reuse;
        seq.cached = place.reuse;
        seq.history = seq.prompt[..place.reuse].to_vec();
    }
}

/// This step's batch: every decoding sequence's last token, then prompt
/// chunks of prefilling sequences up to `chunk` tokens in all.
fn batch(seqs: &[Sequence], chunk: usize) -> Vec<Work> {
    let mut work: Vec<Work> = seqs
        .iter()
        .filter(|q| q.fed == q.prompt.len())
        .filter_map(|q| {
            q.slot.map(|slot| Work {
                slot,
                start: q.history.len(),
                tokens: vec![q.last],
            })
        })
        .collect();
    let mut budget = chunk;
    for q in seqs.iter().filter(|q| q.fed < q.prompt.len()) {
        let (Some(slot), true) = (q.slot, budget > 0) else {
            continue;
        };
        let n = (q.prompt.len() - q.fed).min(budget);
        budget -= n;
        work.push(Work {
            slot,
            start: q.history.len(),
            tokens: q.prompt[q.fed..q.fed + n].to_vec(),
        });
    }
    work
}

/// Samples `seq`'s next token from `row` and streams its text.
fn next_token(seq: &mut Sequence, row: &[f32], eos: &[u32]) {
    let token = match seq.sampler.sample(row) {
        Ok(token) => token,
        Err(e) => return seq.fail(&e),
    };
    if eos.contains(&token) {
        return seq.end(Finish::Stop, true);
    }
    seq.generated += 1;
    seq.last = token;
    let piece = match seq.text.push(token) {
        Ok(piece) => piece,
        Err(e) => return seq.fail(&e),
    };
    let (shown, stopped) = seq.stop.push(&piece);
    if !shown.is_empty() {
        seq.send(Event::Text(shown));
    }
    if stopped {
        return seq.end(Finish::Stop, false);
    }
    if seq.generated >= seq.max_tokens {
        seq.end(Finish::Length, true);
    }
}
