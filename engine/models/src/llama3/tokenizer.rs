//! [`Tokenizer`]: Llama 3's byte-level BPE rebuilt from Meta's tiktoken ranks (bundled in the binary), and HiDream's
//! llama prompt as ComfyUI lays it out ([`HIDREAM_LAYOUT`]); [`bpe_from_ranks`], the rebuild of a byte-level BPE
//! from ranks that this tokenizer and Mistral's Tekken share.
//!
//! The rebuild is ComfyUI's (`bpe_tokenizer.py`), whose merges are transformers' `TikTokenConverter`'s: a regular
//! token's id is its rank; the merges are every split of a regular token into two regular tokens, ordered by the
//! token's id, then by the ids of the two halves; special tokens are matched as whole strings before anything
//! else; the text between them is pre-split with Llama 3's regex and each piece is byte-level BPE encoded.
//!
//! Every piece is merged pair by pair, even one that is itself a vocabulary entry (`ignore_merges` off). That is
//! what ComfyUI's pure-Python tokenizer does (it never reads the flag, which Hugging Face's Llama 3 tokenizer.json
//! sets), and it is not what tiktoken does: tiktoken looks a whole piece up first. The two differ on the 588
//! entries that merging cannot reach (` việc` is tiktoken's one id 100769, ComfyUI's three, 3355 26298 66), and
//! Kiln gives ComfyUI's ids, since its encoders must see what ComfyUI's see.
//!
//! The special tokens are ComfyUI's (its `llama_tokenizer`, llava-llama-3's): ids 128000–128255 with Llama 3.0's
//! names, so 128008 is `<|reserved_special_token_4|>` where Meta's Llama 3.1 has `<|eom_id|>`, then `<unk>`,
//! `<image>` and `<pad>` at 128256–128258, past Llama 3.1 8B's 128256 embedding rows.

use std::collections::HashMap;
use std::io::Read as _;
use std::sync::{Arc, OnceLock};

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::error::{Error, Result};
use crate::prompt_weights::{self, Layout, Weighted};

/// `llama_models/llama3/tokenizer.model` of PyPI `llama-models` 0.3.0, gzip-compressed (see
/// `data/llama3-tokenizer/README.md` for its origin and licence): one `base64-token rank` line per regular token.
const BUNDLED_GZ: &[u8] = include_bytes!("../../data/llama3-tokenizer/tokenizer.model.gz");

/// How many regular tokens the rank file holds (ids 0..128000); the special tokens follow.
const REGULAR_TOKENS: u32 = 128_000;

/// Llama 3's pre-split regex (Meta's `pat_str`, ComfyUI's `_LLAMA_PATTERN`): digits in groups of up to three.
pub(crate) const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `<|begin_of_text|>`: the start of HiDream's llama prompt.
pub const BOS: u32 = 128_000;

/// `<|eot_id|>`: HiDream's pad token, and where ComfyUI's llama attention mask starts masking.
pub const EOT: u32 = 128_009;

/// ComfyUI's HiDream llama layout (`LLAMA3Tokenizer(min_length=128, pad_token=128009)`): [`BOS`], the weighted
/// words, padded with [`EOT`] to 128 tokens; no end token, never truncated (one section: ComfyUI's `max_length`
/// of 99 999 999 is never reached).
pub const HIDREAM_LAYOUT: Layout = Layout {
    start: Some(BOS),
    end: None,
    pad: EOT,
    max_length: 99_999_999,
    pad_to_max_length: false,
    min_length: Some(128),
    min_padding: None,
};

/// The parsed bundled tokenizer, shared by every [`Tokenizer::bundled`].
static BUNDLED: OnceLock<std::result::Result<Arc<tokenizers::Tokenizer>, String>> = OnceLock::new();

/// Llama 3's tokenizer as ComfyUI's HiDream runs it. Cheap to clone.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokenizer(llama3, {} tokens)", self.inner.get_vocab_size(true))
    }
}

impl Tokenizer {
    /// Meta's Llama 3 tokenizer from the bundled ranks, with ComfyUI's special tokens. Parsed once per process.
    pub fn bundled() -> Result<Tokenizer> {
        let inner = BUNDLED.get_or_init(|| parse_bundled().map(Arc::new)).clone();
        inner.map(|inner| Tokenizer { inner }).map_err(Error::Tokenizer)
    }

    /// The ids of `text` without [`BOS`], as ComfyUI's `SDTokenizer` takes a word's ids (it drops the start token
    /// its tokenizer puts first): special tokens written in the text become their ids; nothing padded.
    pub fn word_ids(&self, text: &str) -> Result<Vec<u32>> {
        let encoding =
            self.inner.encode_fast(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// ComfyUI's HiDream llama tokens for `prompt` (`HiDreamTokenizer.tokenize_with_weights(..)["llama"]`): the
    /// weights syntax applied, laid out as [`HIDREAM_LAYOUT`] says; always one section.
    pub fn hidream_prompt(&self, prompt: &str) -> Result<Vec<Vec<Weighted>>> {
        prompt_weights::tokenize(prompt, &HIDREAM_LAYOUT, |word| self.word_ids(word))
    }
}

/// The bundled rank file read and rebuilt; a message naming what is wrong.
fn parse_bundled() -> std::result::Result<tokenizers::Tokenizer, String> {
    let bad = |msg: String| format!("the bundled Llama 3 tokenizer: {msg}");
    let mut text = String::with_capacity(2_200_000);
    flate2::read::GzDecoder::new(BUNDLED_GZ)
        .read_to_string(&mut text)
        .map_err(|e| bad(format!("inflating it: {e}")))?;
    let mut regular = HashMap::with_capacity(REGULAR_TOKENS as usize);
    for (line, id) in text.lines().zip(0u32..) {
        let parsed = line.split_once(' ').and_then(|(token, rank)| {
            Some((base64_decode(token)?, rank.parse::<u32>().ok().filter(|&rank| rank == id)?))
        });
        let (token, rank) =
            parsed.ok_or_else(|| bad(format!("line {} is not `base64 {id}`", id + 1)))?;
        if regular.insert(token, rank).is_some() {
            return Err(bad(format!("the token of rank {rank} is there twice")));
        }
    }
    if regular.len() != REGULAR_TOKENS as usize {
        return Err(bad(format!("{} ranks, not {REGULAR_TOKENS}", regular.len())));
    }
    bpe_from_ranks(&regular, &special_tokens()).map_err(bad)
}

/// ComfyUI's Llama 3 special tokens and their ids (its `llama_tokenizer`): Llama 3.0's names for 128000–128255
/// (the header, end-of-turn and text markers named, the others `<|reserved_special_token_N|>` in order), then
/// llava's `<unk>`, `<image>` and `<pad>`.
fn special_tokens() -> Vec<(String, u32)> {
    let named = |id: u32| match id {
        128_000 => Some("<|begin_of_text|>"),
        128_001 => Some("<|end_of_text|>"),
        128_006 => Some("<|start_header_id|>"),
        128_007 => Some("<|end_header_id|>"),
        EOT => Some("<|eot_id|>"),
        128_256 => Some("<unk>"),
        128_257 => Some("<image>"),
        128_258 => Some("<pad>"),
        _ => None,
    };
    let mut reserved = 0;
    (REGULAR_TOKENS..=128_258)
        .map(|id| match named(id) {
            Some(name) => (name.to_owned(), id),
            None => {
                reserved += 1;
                (format!("<|reserved_special_token_{}|>", reserved - 1), id)
            }
        })
        .collect()
}

/// The byte-level BPE tokenizer of `regular` tokens (their bytes and ids) and `specials` (their strings and ids),
/// rebuilt as this module's documentation says, decoding byte-level; a message naming the step that failed.
///
/// The vocabulary holds the specials first and the regular tokens over them, as ComfyUI fills its dict: a regular
/// token spelled like a special one takes its place. A split's halves must both be regular tokens.
pub(crate) fn bpe_from_ranks(
    regular: &HashMap<Vec<u8>, u32>,
    specials: &[(String, u32)],
) -> std::result::Result<tokenizers::Tokenizer, String> {
    let chars = byte_chars();
    let spell = |bytes: &[u8]| bytes.iter().map(|&b| chars[usize::from(b)]).collect::<String>();
    let mut by_id: Vec<(&[u8], u32)> = regular.iter().map(|(b, &i)| (b.as_slice(), i)).collect();
    by_id.sort_by_key(|&(_, i)| i);
    let mut vocab: Vocab = specials.iter().cloned().collect();
    vocab.extend(by_id.iter().map(|&(bytes, i)| (spell(bytes), i)));
    let mut merges = Vec::new();
    for &(token, _) in &by_id {
        let mut splits: Vec<(u32, u32, usize)> = (1..token.len())
            .filter_map(|at| {
                let (left, right) = token.split_at(at);
                Some((*regular.get(left)?, *regular.get(right)?, at))
            })
            .collect();
        splits.sort_unstable();
        merges.extend(splits.into_iter().map(|(_, _, at)| {
            let (left, right) = token.split_at(at);
            (spell(left), spell(right))
        }));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| format!("building its BPE: {e}"))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let split = Split::new(
        SplitPattern::Regex(LLAMA3_PATTERN.to_owned()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| format!("the Llama-3 split regex: {e}"))?;
    let bytes = ByteLevel::new(false, false, false);
    inner.with_pre_tokenizer(Some(Sequence::new(vec![split.into(), bytes.into()])));
    // Decoding joins the tokens' bytes and reads them as UTF-8, invalid sequences replaced (ComfyUI's
    // `BPETokenizer.decode`).
    inner.with_decoder(Some(bytes));
    let added: Vec<AddedToken> =
        specials.iter().map(|(text, _)| AddedToken::from(text.clone(), true)).collect();
    inner.add_special_tokens(added).map_err(|e| format!("its special tokens: {e}"))?;
    Ok(inner)
}

/// GPT-2's byte-level alphabet: the printable bytes stand for themselves, the others for 256 + their order.
fn byte_chars() -> [char; 256] {
    let printable =
        |b: u8| matches!(b, b'!'..=b'~') || matches!(b, 0xA1..=0xAC) || matches!(b, 0xAE..=0xFF);
    let mut chars = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        chars[usize::from(b)] = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or('\0');
            next += 1;
            c
        };
    }
    chars
}

/// Standard base64 (with or without padding); `None` for anything else.
pub(crate) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let text = text.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in text {
        acc = (acc << 6) | u32::from(value(c)?);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    (bits < 6 && acc == 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_is_gpt2s() {
        let chars = byte_chars();
        assert_eq!(chars[usize::from(b'a')], 'a');
        assert_eq!(chars[usize::from(b' ')], 'Ġ');
        assert_eq!(chars[usize::from(b'\n')], 'Ċ');
        assert_eq!(chars[0xAD], 'Ń');
    }

    #[test]
    fn special_tokens_are_comfyuis() {
        let specials = special_tokens();
        assert_eq!(specials.len(), 259);
        let name = |id: u32| specials[(id - REGULAR_TOKENS) as usize].0.as_str();
        assert_eq!(name(BOS), "<|begin_of_text|>");
        assert_eq!(name(128_002), "<|reserved_special_token_0|>");
        assert_eq!(name(128_005), "<|reserved_special_token_3|>");
        assert_eq!(name(128_008), "<|reserved_special_token_4|>");
        assert_eq!(name(EOT), "<|eot_id|>");
        assert_eq!(name(128_010), "<|reserved_special_token_5|>");
        assert_eq!(name(128_255), "<|reserved_special_token_250|>");
        assert_eq!(name(128_258), "<pad>");
        assert!(specials.iter().zip(REGULAR_TOKENS..).all(|(&(_, id), want)| id == want));
    }

    #[test]
    fn the_hidream_layout_pads_with_eot_to_128_and_never_splits() {
        let ids = |w: &str| Ok(w.split_whitespace().map(|t| t.len() as u32).collect());
        let empty = prompt_weights::tokenize("", &HIDREAM_LAYOUT, ids).unwrap();
        assert_eq!(empty.len(), 1);
        assert_eq!(empty[0][0], (BOS, 1.0));
        assert!(empty[0][1..].iter().all(|&t| t == (EOT, 1.0)) && empty[0].len() == 128);
        let long = prompt_weights::tokenize(&"ab ".repeat(300), &HIDREAM_LAYOUT, ids).unwrap();
        assert_eq!(long.len(), 1);
        assert_eq!(long[0].len(), 301);
    }
}
