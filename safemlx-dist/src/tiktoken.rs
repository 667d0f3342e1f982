//! tiktoken vocabularies (Kimi K2's `tiktoken.model`: one `base64(bytes)
//! rank` per line) as a `tokenizers` byte-level BPE, as Transformers'
//! `TikTokenConverter` builds one: every token's bytes in GPT-2's
//! printable characters, the merges of each token from pairs of tokens of
//! lower rank (in rank order), the split pattern before the byte-level
//! step, and the special tokens of `tokenizer_config.json`'s
//! `added_tokens_decoder` at their ids.

use std::collections::HashMap;
use std::path::Path;

use base64::Engine as _;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::error::{Error, Result};

/// Kimi K2's split pattern (`pat_str` in Moonshot's `tokenization_kimi.py`):
/// runs of Han characters, words with their case and contractions (the
/// letter classes without Han, by class intersection), 1 to 3 digits,
/// punctuation runs, line breaks, and spaces not before a non-space.
pub const KIMI_PATTERN: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+",
    r"|\s+(?!\S)",
    r"|\s+",
);

/// GPT-2's map of bytes to printable characters (what byte-level BPE
/// vocabularies are written in).
fn byte_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
    let mut chars = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        chars[usize::from(b)] = if printable(b) {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or('\u{fffd}')
        };
    }
    chars
}

/// The tokenizer of the tiktoken file `path` with the split `pattern` and
/// `special` tokens (text, id).
///
/// # Errors
/// A line that is not `base64 rank`, a rank out of order, or a pattern
/// the regex engine refuses; the message names the file and the line.
pub fn tokenizer(
    path: &Path,
    pattern: &str,
    special: &[(String, u32)],
) -> Result<tokenizers::Tokenizer> {
    let fail = |message: String| Error::Model {
        path: path.display().to_string(),
        message,
    };
    let text = crate::checkpoint::read_text(path, "tiktoken vocabulary")?;
    let mut ranks: HashMap<Vec<u8>, u32> = HashMap::new();
    let mut tokens: Vec<Vec<u8>> = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let parsed = line.split_once(' ').and_then(|(token, rank)| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(token)
                .ok()?;
            Some((bytes, rank.trim().parse::<u32>().ok()?))
        });
        match parsed {
            Some((bytes, rank)) if rank as usize == tokens.len() => {
                ranks.insert(bytes.clone(), rank);
                tokens.push(bytes);
            }
            _ => {
                return Err(fail(format!(
                    "line {} is {line:?}, not `base64(bytes) rank` with rank {} (ranks count up from 0)",
                    n + 1,
                    tokens.len()
                )))
            }
        }
    }
    let chars = byte_chars();
    let text_of = |b: &[u8]| -> String { b.iter().map(|&x| chars[usize::from(x)]).collect() };
    // Each token's merges: the splits into two lower-ranked tokens, the
    // pairs in the order of their parts' ranks; all in the token's rank.
    let mut merges = Vec::new();
    for (rank, token) in tokens.iter().enumerate().filter(|(_, t)| t.len() > 1) {
        let mut local: Vec<(u32, u32, usize)> = (1..token.len())
            .filter_map(|i| Some((*ranks.get(&token[..i])?, *ranks.get(&token[i..])?, i)))
            .collect();
        local.sort_unstable();
        merges.extend(
            local
                .into_iter()
                .map(|(_, _, i)| (rank, text_of(&token[..i]), text_of(&token[i..]))),
        );
    }
    merges.sort_by_key(|m| m.0);
    let mut vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(rank, t)| (text_of(t), rank as u32))
        .collect();
    vocab.extend(special.iter().cloned());
    let merges = merges.into_iter().map(|(_, a, b)| (a, b)).collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| fail(format!("cannot build the BPE tokenizer: {e}")))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let split = Split::new(
        SplitPattern::Regex(pattern.to_owned()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| fail(format!("the split pattern does not compile: {e}")))?;
    inner.with_pre_tokenizer(Some(Sequence::new(vec![
        split.into(),
        ByteLevel::new(false, false, false).into(),
    ])));
    inner.with_decoder(Some(ByteLevel::default()));
    let added: Vec<AddedToken> = special
        .iter()
        .map(|(t, _)| AddedToken::from(t.clone(), true))
        .collect();
    inner.add_special_tokens(&added);
    Ok(inner)
}
