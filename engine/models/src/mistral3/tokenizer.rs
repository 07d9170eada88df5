//! [`Tokenizer`]: Mistral's Tekken BPE rebuilt from the tekken JSON a FLUX.2 dev text-encoder file carries
//! (the uint8 tensor `tekken_model`), as ComfyUI's `bpe_tokenizer.from_tekken_json` rebuilds it, and the FLUX.2
//! prompt as ComfyUI's `Flux2Tokenizer` lays it out (models-flux.md §5.2).
//!
//! The rebuild is Llama 3's ([`crate::llama3::bpe_from_ranks`]) with an offset: a regular token's id is its rank
//! plus `default_num_special_tokens`, ranks from `default_vocab_size − default_num_special_tokens` on are dropped;
//! the special tokens keep their ranks as ids and are matched as whole strings before anything else; the merges
//! are every split of a regular token into two regular tokens, ordered by the token's id, then by the ids of the
//! two halves. The text between special tokens is pre-split with the Llama-3 regex (ComfyUI's, whatever pattern
//! the JSON names) and each piece is byte-level BPE encoded.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::llama3::{base64_decode, bpe_from_ranks};

/// `<s>`: the start token ComfyUI puts before the prompt.
pub const BOS: u32 = 1;

/// `<unk>`: the pad token of ComfyUI's Mistral encoder (`special_tokens={"pad": 0}`), where its attention mask
/// starts masking when the prompt writes it.
pub const PAD: u32 = 0;

/// ComfyUI's FLUX.2 template around a prompt (`Flux2Tokenizer.llama_template`; a real newline between
/// "object" and "attribution", where BFL's and diffusers' system prompt have a space).
const FLUX2_TEMPLATE: (&str, &str) = (
    "[SYSTEM_PROMPT]You are an AI that reasons about image descriptions. You give structured responses \
     focusing on object relationships, object\nattribution and actions without speculation.\
     [/SYSTEM_PROMPT][INST]",
    "[/INST]",
);

/// The Tekken tokenizer of one file. Cheap to clone.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    vocab: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokenizer(tekken, {} ids)", self.vocab)
    }
}

impl Tokenizer {
    /// The tokenizer a tekken JSON (`tekken_model`'s bytes) describes; [`Error::Invalid`] naming what is
    /// missing or malformed.
    pub fn from_tekken_json(json: &[u8]) -> Result<Tokenizer> {
        let bad = |msg: String| Error::Invalid(format!("the tekken tokenizer JSON: {msg}"));
        let root: serde_json::Value =
            serde_json::from_slice(json).map_err(|e| bad(format!("not JSON ({e})")))?;
        let config = root.get("config").ok_or_else(|| bad("no `config`".into()))?;
        let number = |key: &str| {
            config.get(key).and_then(serde_json::Value::as_u64).ok_or_else(|| {
                bad(format!("`config.{key}` is missing or not a non-negative integer"))
            })
        };
        let offset = number("default_num_special_tokens")?;
        let vocab_size = number("default_vocab_size")?;
        let max_rank = vocab_size.checked_sub(offset).ok_or_else(|| {
            bad(format!("default_vocab_size {vocab_size} < default_num_special_tokens {offset}"))
        })?;
        let entries = |key: &str| {
            root.get(key)
                .and_then(serde_json::Value::as_array)
                .ok_or_else(|| bad(format!("no `{key}` list")))
        };

        // The regular tokens by their bytes, their ids rank + offset, capped as ComfyUI caps them.
        let mut regular: HashMap<Vec<u8>, u32> = HashMap::new();
        for entry in entries("vocab")? {
            let rank = entry.get("rank").and_then(serde_json::Value::as_u64);
            let bytes = entry.get("token_bytes").and_then(serde_json::Value::as_str);
            let (Some(rank), Some(bytes)) = (rank, bytes) else {
                return Err(bad(format!("a vocab entry without rank or token_bytes: {entry}")));
            };
            if rank >= max_rank {
                continue;
            }
            let bytes = base64_decode(bytes)
                .ok_or_else(|| bad(format!("token_bytes `{bytes}` is not base64")))?;
            regular.insert(bytes, id(rank + offset)?);
        }
        // The special tokens by their strings (ComfyUI decodes `token_bytes` ones as UTF-8, lossily).
        let mut specials: Vec<(String, u32)> = Vec::new();
        for entry in entries("special_tokens")? {
            let rank = entry.get("rank").and_then(serde_json::Value::as_u64);
            let text = match entry.get("token_bytes").and_then(serde_json::Value::as_str) {
                Some(b64) => base64_decode(b64)
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .ok_or_else(|| bad(format!("token_bytes `{b64}` is not base64")))?,
                None => entry
                    .get("token_str")
                    .and_then(serde_json::Value::as_str)
                    .ok_or_else(|| bad(format!("a special token without token_str: {entry}")))?
                    .to_owned(),
            };
            let rank = rank.ok_or_else(|| bad(format!("a special token without rank: {entry}")))?;
            specials.push((text, id(rank)?));
        }

        // The byte-level vocabulary: the specials first, the regular tokens over them (as ComfyUI fills its
        // dict: a regular token spelled like a special one takes its place, and the special's id with it).
        let inner = bpe_from_ranks(&regular, &specials).map_err(bad)?;
        Ok(Tokenizer { inner: Arc::new(inner), vocab: usize::try_from(vocab_size).unwrap_or(0) })
    }

    /// `default_vocab_size`: every id is below it.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The ids of `text`: special tokens written in it become their ids; nothing is added around it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding =
            self.inner.encode_fast(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The ids ComfyUI's FLUX.2 dev text encoder runs on for `prompt`: ComfyUI's prompt-weighting pre-pass with
    /// weights disabled (`\(` and `\)` lose their backslash, `(text:1.2)` stays text), the prompt in the FLUX.2
    /// template tokenised as one string, after [`BOS`]; no padding, no truncation.
    ///
    /// Unlike ComfyUI, `embedding:<name>` is kept as literal text (ComfyUI tokenises what follows a
    /// whitespace-preceded `embedding:` separately and drops the name when no such embedding file exists).
    pub fn flux2_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        let (before, after) = FLUX2_TEMPLATE;
        self.plain_prompt(&format!("{before}{prompt}{after}"))
    }

    /// The ids ComfyUI's ERNIE-Image encoder (and `TextGenerate` on its Ministral 3 3B) runs on for `prompt`:
    /// the weights-disabled pre-pass of [`Tokenizer::flux2_prompt`], the prompt as written (no template; the
    /// special tokens it writes become their ids) after [`BOS`]; no padding, no truncation. `embedding:<name>`
    /// stays literal text, as in [`Tokenizer::flux2_prompt`].
    pub fn plain_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        let mut ids = vec![BOS];
        ids.extend(self.encode(&crate::prompt_weights::unescape_parentheses(prompt))?);
        Ok(ids)
    }

    /// The text of generated `ids` as ComfyUI's `decode` gives it: the special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|e| Error::Tokenizer(e.to_string()))
    }
}

/// How many of `ids` ComfyUI's Mistral encoder attends to as keys (`SDClipModel.process_tokens`, pad 0, no end
/// token): those before the first [`PAD`] after the first id (always [`BOS`] here, so never ComfyUI's left
/// padding); the mask is 0 from there on.
pub fn attended_keys(ids: &[u32]) -> usize {
    match ids.iter().skip(1).position(|&id| id == PAD) {
        Some(at) => at + 1,
        None => ids.len(),
    }
}

/// A token id that fits in `u32`.
fn id(value: u64) -> Result<u32> {
    u32::try_from(value)
        .map_err(|_| Error::Invalid(format!("the tekken tokenizer JSON: id {value} is too large")))
}

/// Standard base64 with padding.
pub(super) fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{attended_keys, base64_decode, base64_encode};

    #[test]
    fn base64_round_trips() {
        assert_eq!(base64_decode("aGVsbG8="), Some(b"hello".to_vec()));
        assert_eq!(base64_decode("aGk"), Some(b"hi".to_vec()));
        assert_eq!(base64_decode("/w=="), Some(vec![255]));
        assert_eq!(base64_decode("a$=="), None);
        for bytes in [&b""[..], b"a", b"hi", b"hey", b"\xff\x00\x10\x80"] {
            assert_eq!(base64_decode(&base64_encode(bytes)), Some(bytes.to_vec()));
        }
        assert_eq!(base64_encode(b"hello"), "aGVsbG8=");
    }

    #[test]
    fn keys_are_attended_up_to_a_written_unk() {
        assert_eq!(attended_keys(&[1, 5, 6]), 3);
        assert_eq!(attended_keys(&[1, 5, 0, 6]), 2);
    }
}
