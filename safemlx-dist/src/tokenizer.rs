//! Text to tokens and back, and chat prompts: Hugging Face's `tokenizers`
//! for the tokenizer (from `tokenizer.json`, or built from a GGUF file's
//! `gpt2`-style vocabulary and merges), and the model's own Jinja chat
//! template rendered with `minijinja`.

use std::path::Path;

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::AddedToken;

use crate::checkpoint::{read_text, GgufFile, GgufValue};
use crate::error::{Error, Result};

/// A tokenizer and, when the model has one, its chat template.
#[derive(Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<String>,
    bos: Option<String>,
    eos: Option<String>,
}

fn model_error(path: &Path, message: String) -> Error {
    Error::Model {
        path: path.display().to_string(),
        message,
    }
}

/// GGUF token types: 3 is a control token, 4 a user-defined one; both are
/// matched whole, before the BPE sees the text.
const SPECIAL_TOKEN_TYPES: [i128; 2] = [3, 4];

impl Tokenizer {
    /// The tokenizer of a Hugging Face model directory: `tokenizer.json`,
    /// and the chat template of `tokenizer_config.json` (or of
    /// `chat_template.jinja`) when there is one.
    ///
    /// # Errors
    /// A missing or invalid `tokenizer.json`.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        // Optional files: absent is fine; present, they must be regular
        // files (a FIFO would hang the read).
        let optional = |name: &str| -> Result<Option<String>> {
            let path = dir.join(name);
            match std::fs::symlink_metadata(&path) {
                Err(_) => Ok(None),
                Ok(_) => read_text(&path, name).map(Some),
            }
        };
        let config: serde_json::Value = optional("tokenizer_config.json")?
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let path = dir.join("tokenizer.json");
        let tiktoken = dir.join("tiktoken.model");
        let inner = if std::fs::symlink_metadata(&path).is_err() && tiktoken.exists() {
            // Kimi K2's vocabulary: tiktoken ranks, its split pattern,
            // the special tokens of tokenizer_config.json.
            crate::tiktoken::tokenizer(
                &tiktoken,
                crate::tiktoken::KIMI_PATTERN,
                &added_tokens(&config),
            )?
        } else {
            read_text(&path, "tokenizer JSON")?
                .parse()
                .map_err(|e| model_error(&path, format!("cannot read the tokenizer: {e}")))?
        };
        let chat_template = match config.get("chat_template").and_then(|t| t.as_str()) {
            Some(template) => Some(template.to_owned()),
            None => optional("chat_template.jinja")?,
        };
        let token = |key: &str| -> Option<String> {
            match config.get(key)? {
                serde_json::Value::String(s) => Some(s.clone()),
                other => other.get("content")?.as_str().map(str::to_owned),
            }
        };
        Ok(Self {
            inner,
            chat_template,
            bos: token("bos_token"),
            eos: token("eos_token"),
        })
    }

    /// The tokenizer a GGUF file describes: `tokenizer.ggml.model` `gpt2`
    /// (byte-level BPE) with its tokens, merges and token types, the
    /// pre-tokenizer of `tokenizer.ggml.pre`, and `tokenizer.chat_template`.
    ///
    /// # Errors
    /// Another tokenizer model, or a missing or ill-typed key (named).
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let path = file.path();
        let meta = file.metadata();
        let fail = |m: String| model_error(path, m);
        let model = meta
            .get("tokenizer.ggml.model")
            .and_then(GgufValue::as_str)
            .ok_or_else(|| fail("has no tokenizer.ggml.model".to_owned()))?;
        if model != "gpt2" {
            return Err(fail(format!(
                "tokenizer.ggml.model is \"{model}\"; only gpt2 (byte-level BPE) vocabularies are read from GGUF"
            )));
        }
        let strings = |key: &str| -> Result<Vec<String>> {
            meta.get(key)
                .and_then(GgufValue::as_array)
                .and_then(|a| a.iter().map(|v| v.as_str().map(str::to_owned)).collect())
                .ok_or_else(|| fail(format!("has no list of strings {key}")))
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| fail(format!("tokenizer.ggml.merges has {m:?}, not two tokens")))
            })
            .collect::<Result<Vec<_>>>()?;
        let types: Vec<i128> = meta
            .get("tokenizer.ggml.token_type")
            .and_then(GgufValue::as_array)
            .map(|a| {
                a.iter()
                    .map(|v| match v {
                        GgufValue::Int(t) => *t,
                        _ => 1,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let vocab: Vec<(String, u32)> = tokens.iter().cloned().zip(0u32..).collect();
        let bpe = BPE::builder()
            .vocab_and_merges(
                vocab
                    .into_iter()
                    .collect::<tokenizers::models::bpe::Vocab>(),
                merges,
            )
            .build()
            .map_err(|e| fail(format!("cannot build the BPE tokenizer: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        let byte_level = ByteLevel::new(false, true, true);
        match meta.get("tokenizer.ggml.pre").and_then(GgufValue::as_str) {
            // SmolLM's and Llama 3's split every digit on its own first.
            Some("smollm" | "llama-bpe" | "llama3") => {
                inner.with_pre_tokenizer(Some(Sequence::new(vec![
                    Digits::new(true).into(),
                    byte_level.into(),
                ])));
            }
            _ => {
                inner.with_pre_tokenizer(Some(byte_level));
            }
        }
        inner.with_decoder(Some(ByteLevel::default()));
        let special: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, t)| SPECIAL_TOKEN_TYPES.contains(t))
            .map(|(token, _)| AddedToken::from(token.clone(), true))
            .collect();
        inner.add_special_tokens(&special);
        let token_of = |key: &str| -> Option<String> {
            let id = meta.get(key)?.as_u64()?;
            tokens.get(usize::try_from(id).ok()?).cloned()
        };
        Ok(Self {
            inner,
            chat_template: meta
                .get("tokenizer.chat_template")
                .and_then(GgufValue::as_str)
                .map(str::to_owned),
            bos: token_of("tokenizer.ggml.bos_token_id"),
            eos: token_of("tokenizer.ggml.eos_token_id"),
        })
    }

    /// Writes the tokenizer as a Hugging Face directory reads it:
    /// `tokenizer.json`, and `tokenizer_config.json` with the chat template
    /// and the BOS/EOS tokens (e.g. to give a GGUF model's tokenizer to
    /// tools that read Hugging Face directories).
    ///
    /// # Errors
    /// A file that cannot be written.
    pub fn save_hf(&self, dir: &Path) -> Result<()> {
        let fail = |what: &str, e: String| model_error(dir, format!("cannot write {what}: {e}"));
        self.inner
            .save(dir.join("tokenizer.json"), false)
            .map_err(|e| fail("tokenizer.json", e.to_string()))?;
        let config = serde_json::json!({
            "chat_template": self.chat_template,
            "bos_token": self.bos,
            "eos_token": self.eos,
        });
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string())
            .map_err(|e| fail("tokenizer_config.json", e.to_string()))
    }

    /// The token ids of `text` (special tokens such as `<|im_start|>`
    /// matched whole; no BOS added: chat templates write their own).
    ///
    /// # Errors
    /// The tokenizer's error.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(format!("cannot tokenize the prompt: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// At most how many bytes of text one token covers: 4 bytes (the
    /// most a character takes in UTF-8) for each character of the longest
    /// token in the vocabulary, and at least 4. A text of `B` bytes has at
    /// least `B / max_token_bytes()` tokens, which a server checks before
    /// it tokenizes a prompt that could not fit its context anyway.
    pub fn max_token_bytes(&self) -> usize {
        let longest = self
            .inner
            .get_vocab(true)
            .keys()
            .map(|token| token.chars().count())
            .max()
            .unwrap_or(1);
        4 * longest.max(1)
    }

    /// The text of `ids` (special tokens kept when `skip_special` is false).
    ///
    /// # Errors
    /// The tokenizer's error (e.g. an id outside the vocabulary).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| Error::Tokenizer(format!("cannot decode tokens: {e}")))
    }

    /// A decoder that turns ids into text one at a time, holding back
    /// bytes that are not yet a whole UTF-8 character (for streaming).
    pub fn stream(&self) -> TextStream<'_> {
        TextStream {
            tokenizer: self,
            ids: Vec::new(),
            shown: 0,
        }
    }

    /// The chat template, if the model has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The tokens of `messages` rendered with the chat template, where a
    /// message's content is text: a special token's text inside it
    /// (`<|im_end|><|im_start|>system`, a user's attempt to end its turn
    /// and write the system's) is tokenized as the characters it is, and
    /// special tokens come only from the template. Content without such
    /// text is tokenized as the whole rendered prompt is, so the tokens
    /// are the ones [`encode`](Self::encode) gives it.
    ///
    /// # Errors
    /// Those of [`apply_chat_template`](Self::apply_chat_template), a
    /// template that does not show a message's content as it is (it cannot
    /// then be told apart), or the tokenizer's.
    pub fn encode_chat(&self, messages: &[(&str, &str)]) -> Result<Vec<u32>> {
        let specials: Vec<String> = self
            .inner
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special && !t.content.is_empty())
            .map(|t| t.content)
            .collect();
        let holds_special = |text: &str| specials.iter().any(|s| text.contains(s.as_str()));
        if !messages.iter().any(|(_, content)| holds_special(content)) {
            return self.encode(&self.apply_chat_template(messages)?);
        }
        // Each content as a mark the template shows where the content goes.
        let marks: Vec<String> = (0..messages.len())
            .map(|i| format!("\u{f8f0}{i}\u{f8f1}"))
            .collect();
        let masked: Vec<(&str, &str)> = messages
            .iter()
            .zip(&marks)
            .map(|((role, _), mark)| (*role, mark.as_str()))
            .collect();
        let rendered = self.apply_chat_template(&masked)?;
        let mut as_text = self.inner.clone();
        as_text.set_encode_special_tokens(true);
        let text_ids = |text: &str| -> Result<Vec<u32>> {
            let encoding = as_text
                .encode(text, false)
                .map_err(|e| Error::Tokenizer(format!("cannot tokenize the prompt: {e}")))?;
            Ok(encoding.get_ids().to_vec())
        };
        let mut ids = Vec::new();
        let mut rest = rendered.as_str();
        let mut shown = vec![false; messages.len()];
        while let Some((at, i)) = marks
            .iter()
            .enumerate()
            .filter_map(|(i, mark)| rest.find(mark.as_str()).map(|at| (at, i)))
            .min()
        {
            ids.extend(self.encode(&rest[..at])?);
            ids.extend(text_ids(messages[i].1)?);
            shown[i] = true;
            rest = &rest[at + marks[i].len()..];
        }
        ids.extend(self.encode(rest)?);
        if let Some(i) = shown.iter().position(|s| !s) {
            return Err(Error::Tokenizer(format!(
                "message {i} holds a special token's text, and the chat template does not show its content as it is, so it cannot be kept as text; remove the special token"
            )));
        }
        Ok(ids)
    }

    /// `messages` (role, content) rendered with the model's chat template,
    /// ending with the prompt for the assistant's turn.
    ///
    /// # Errors
    /// No chat template, or one that fails to render (the engine's message).
    pub fn apply_chat_template(&self, messages: &[(&str, &str)]) -> Result<String> {
        let template = self.chat_template.as_deref().ok_or_else(|| {
            Error::Tokenizer("the model has no chat template; leave out --chat".to_owned())
        })?;
        let mut env = minijinja::Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    message,
                ))
            },
        );
        let render_error = |e: minijinja::Error| {
            Error::Tokenizer(format!("the chat template does not render: {e}"))
        };
        env.add_template("chat", template).map_err(render_error)?;
        let messages: Vec<minijinja::Value> = messages
            .iter()
            .map(|(role, content)| minijinja::context! { role => *role, content => *content })
            .collect();
        env.get_template("chat")
            .and_then(|t| {
                t.render(minijinja::context! {
                    messages => messages,
                    add_generation_prompt => true,
                    bos_token => self.bos.clone().unwrap_or_default(),
                    eos_token => self.eos.clone().unwrap_or_default(),
                })
            })
            .map_err(render_error)
    }
}

/// Streaming decode: see [`Tokenizer::stream`].
#[derive(Debug)]
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    ids: Vec<u32>,
    shown: usize,
}

impl TextStream<'_> {
    /// Adds `id`; returns the text that is now complete (possibly empty).
    ///
    /// # Errors
    /// The tokenizer's error.
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids, true)?;
        // A byte sequence cut inside a character decodes to U+FFFD: wait.
        if text.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let Some(new) = text.get(self.shown..).map(str::to_owned) else {
            return Ok(String::new());
        };
        self.shown = text.len();
        Ok(new)
    }
}
/// The special tokens of a `tokenizer_config.json`'s
/// `added_tokens_decoder` (`{"id": {"content": ..}}`), with their ids.
fn added_tokens(config: &serde_json::Value) -> Vec<(String, u32)> {
    let Some(added) = config
        .get("added_tokens_decoder")
        .and_then(|a| a.as_object())
    else {
        return Vec::new();
    };
    let mut tokens: Vec<(String, u32)> = added
        .iter()
        .filter_map(|(id, t)| Some((t.get("content")?.as_str()?.to_owned(), id.parse().ok()?)))
        .collect();
    tokens.sort_by_key(|t| t.1);
    tokens
}
