//! [`Tokenizer`]: CLIP's byte-level BPE, built from the merges bundled in the binary, as transformers'
//! `CLIPTokenizer` builds it from ComfyUI's `comfy/sd1_tokenizer` folder (models-flux.md §5.1).
//!
//! Invariant: the vocabulary is derived from the merges exactly as OpenAI's CLIP derives it (the 256 byte
//! characters, the same with `</w>`, one entry per merge, then `<|startoftext|>` and `<|endoftext|>`), which is
//! entry for entry ComfyUI's `vocab.json` (`scripts/reference/clip_text.py` asserts it).

use std::io::Read as _;
use std::sync::{Arc, OnceLock};

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::replace::ReplacePattern;
use tokenizers::normalizers::{Lowercase, NFC, NormalizerWrapper, Replace, Sequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{Error, Result};

/// OpenAI CLIP's merges (`bpe_simple_vocab_16e6`), gzip-compressed (see `data/clip-tokenizer/README.md` for
/// their origin and licences).
const MERGES_GZ: &[u8] = include_bytes!("../../data/clip-tokenizer/merges.txt.gz");

/// The merges CLIP uses: the first 49152 − 256 − 2 lines after the `#version` header.
const MERGES: usize = 49_152 - 256 - 2;

/// `<|startoftext|>`: the id ComfyUI puts before a chunk's tokens.
pub const BOS: u32 = 49_406;
/// `<|endoftext|>`: the id after a chunk's tokens, and its padding.
pub const EOS: u32 = 49_407;

/// CLIP's pre-tokenising pattern, as transformers' `CLIPTokenizer` sets it (the pieces kept, the rest removed).
const SPLIT: &str =
    r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+";

/// The built bundled tokenizer, shared by every [`Tokenizer::bundled`].
static BUNDLED: OnceLock<std::result::Result<Arc<tokenizers::Tokenizer>, String>> = OnceLock::new();

/// CLIP's tokenizer (the vocabulary of CLIP-L, CLIP-H and CLIP-G alike): NFC, runs of whitespace made one
/// space, lower case, CLIP's split pattern, byte-level BPE with `</w>` ending each word. Cheap to clone.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokenizer(clip, {} tokens)", self.inner.get_vocab_size(true))
    }
}

impl Tokenizer {
    /// The tokenizer built from the bundled merges (ComfyUI's `sd1_tokenizer`: same vocabulary and merges).
    /// Built once per process.
    pub fn bundled() -> Result<Tokenizer> {
        let inner = BUNDLED.get_or_init(|| build().map(Arc::new)).clone();
        inner.map(|inner| Tokenizer { inner }).map_err(Error::Tokenizer)
    }

    /// The ids of `text` without BOS and EOS: what ComfyUI's SDTokenizer keeps of each piece of a prompt it
    /// tokenises (`tokenizer(text)["input_ids"][1:-1]`). `<|startoftext|>` and `<|endoftext|>` written in the
    /// text become their ids (the first also in upper case, as it is matched after normalisation). Nothing is
    /// weighted, chunked or padded.
    pub fn word_ids(&self, text: &str) -> Result<Vec<u32>> {
        let encoding =
            self.inner.encode_fast(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }
}

/// Builds the tokenizer from the bundled merges, as transformers' `CLIPTokenizer` configures it.
fn build() -> std::result::Result<tokenizers::Tokenizer, String> {
    let mut text = String::with_capacity(600 << 10);
    flate2::read::GzDecoder::new(MERGES_GZ)
        .read_to_string(&mut text)
        .map_err(|e| format!("inflating the bundled CLIP merges: {e}"))?;
    let merges = parse_merges(&text)?;
    let vocab = vocabulary(&merges);
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .unk_token("<|endoftext|>".into())
        .continuing_subword_prefix(String::new())
        .end_of_word_suffix("</w>".into())
        .build()
        .map_err(|e| format!("building the CLIP BPE: {e}"))?;
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    let whitespace = Replace::new(ReplacePattern::Regex(r"\s+".into()), " ")
        .map_err(|e| format!("the CLIP whitespace pattern: {e}"))?;
    let normalizer = Sequence::new(vec![
        NormalizerWrapper::from(NFC),
        NormalizerWrapper::from(whitespace),
        NormalizerWrapper::from(Lowercase),
    ]);
    tokenizer
        .with_normalizer(Some(normalizer))
        .map_err(|e| format!("setting the CLIP normaliser: {e}"))?;
    let split =
        Split::new(SplitPattern::Regex(SPLIT.into()), SplitDelimiterBehavior::Removed, true)
            .map_err(|e| format!("the CLIP split pattern: {e}"))?;
    tokenizer.with_pre_tokenizer(Some(PreSequence::new(vec![
        PreTokenizerWrapper::from(split),
        PreTokenizerWrapper::from(ByteLevel::new(false, true, true)),
    ])));
    // As transformers registers them: the start token matched after normalisation, the end token before.
    tokenizer
        .add_special_tokens([
            AddedToken::from("<|startoftext|>", true).normalized(true),
            AddedToken::from("<|endoftext|>", true).normalized(false),
        ])
        .map_err(|e| format!("adding CLIP's special tokens: {e}"))?;
    Ok(tokenizer)
}

/// The first [`MERGES`] merge pairs of a `merges.txt` (its `#version` line skipped).
fn parse_merges(text: &str) -> std::result::Result<Vec<(String, String)>, String> {
    let mut lines = text.lines();
    if !lines.next().is_some_and(|l| l.starts_with("#version")) {
        return Err("the bundled CLIP merges lack their #version line".into());
    }
    let merges: Vec<(String, String)> = lines
        .take(MERGES)
        .map(|line| {
            line.split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| format!("CLIP merge line {line:?} is not a pair"))
        })
        .collect::<std::result::Result<_, _>>()?;
    if merges.len() == MERGES {
        Ok(merges)
    } else {
        Err(format!("the bundled CLIP merges hold {} pairs, not {MERGES}", merges.len()))
    }
}

/// CLIP's vocabulary from its merges: the byte characters in [`byte_chars`] order, the same with `</w>`, each
/// merge's concatenation, then `<|startoftext|>` ([`BOS`]) and `<|endoftext|>` ([`EOS`]).
fn vocabulary(merges: &[(String, String)]) -> Vocab {
    let chars = byte_chars();
    let tokens = chars
        .iter()
        .map(char::to_string)
        .chain(chars.iter().map(|c| format!("{c}</w>")))
        .chain(merges.iter().map(|(a, b)| format!("{a}{b}")))
        .chain(["<|startoftext|>".to_owned(), "<|endoftext|>".to_owned()]);
    tokens.zip(0u32..).collect()
}

/// The characters GPT-2's byte-level encoding gives bytes, in CLIP's vocabulary order: the printable bytes
/// `!`..=`~`, `¡`..=`¬`, `®`..=`ÿ` as themselves, then every other byte, in increasing order, as U+0100 onwards.
fn byte_chars() -> Vec<char> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut chars: Vec<char> = (0..=255u8).filter(|&b| printable(b)).map(char::from).collect();
    let others = (0..=255u8).filter(|&b| !printable(b)).zip(0u32..);
    chars.extend(others.filter_map(|(_, n)| char::from_u32(256 + n)));
    chars
}

#[cfg(test)]
mod tests {
    use super::{BOS, EOS, Tokenizer, byte_chars};

    #[test]
    fn the_byte_characters_are_a_permutation_of_256() {
        let chars = byte_chars();
        assert_eq!(chars.len(), 256);
        assert_eq!(chars[0], '!');
        assert_eq!(chars[188], '\u{100}');
        assert_eq!(chars[255], '\u{143}');
    }

    #[test]
    fn the_special_tokens_have_their_ids() {
        let tokenizer = Tokenizer::bundled().unwrap();
        assert_eq!(tokenizer.inner.get_vocab_size(true), 49_408);
        assert_eq!(tokenizer.inner.token_to_id("<|startoftext|>"), Some(BOS));
        assert_eq!(tokenizer.inner.token_to_id("<|endoftext|>"), Some(EOS));
        assert_eq!(tokenizer.word_ids("a photo of a cat").unwrap(), [320, 1125, 539, 320, 2368]);
    }
}
