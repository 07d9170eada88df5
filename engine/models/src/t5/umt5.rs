//! umT5-XXL as Wan's text encoder (`CLIPLoader` type `wan`; models-wan-video.md §2.4, §5): [`Umt5File`], a umT5
//! file found in a header with where its tokenizer is, ComfyUI's prompt layout for it ([`UMT5_PROMPT_LAYOUT`],
//! [`umt5_tokens`]) and its attention mask ([`attention_mask`]).
//!
//! The tokenizer is the file's own: ComfyUI's files carry the SentencePiece model as the uint8 tensor
//! [`SPIECE_MODEL`], which [`Umt5File::tokenizer`] reads (a file without it is refused, as ComfyUI fails on it).

use std::path::PathBuf;

use kiln_compute::memory::SafetensorsFile;

use super::config::{Config, detect_umt5};
use super::spiece::SentencePiece;
use super::{EOS, PAD};
use crate::error::{Error, Result};
use crate::header::Header;
use crate::prompt_weights::{self, Layout, Weighted};

/// The uint8 tensor holding the serialised SentencePiece model (ComfyUI's `tokenizer_data["spiece_model"]`).
pub const SPIECE_MODEL: &str = "spiece_model";

/// umT5's prompt layout in ComfyUI's Wan tokenizer (`UMT5XXlTokenizer`): no start token, EOS, one section padded
/// with [`PAD`] to at least 512 tokens, never truncated.
pub const UMT5_PROMPT_LAYOUT: Layout = Layout {
    start: None,
    end: Some(EOS),
    pad: PAD,
    max_length: 99_999_999,
    pad_to_max_length: false,
    min_length: Some(512),
    min_padding: None,
};

/// A umT5 encoder file as detected.
#[derive(Debug, Clone, PartialEq)]
pub struct Umt5File {
    /// The encoder's widths (each block has its own position bias table).
    pub config: Config,
    /// The file.
    pub path: PathBuf,
    /// The full key of its [`SPIECE_MODEL`] tensor, when it carries one.
    pub spiece_key: Option<String>,
}

impl Umt5File {
    /// The umT5 encoder in `h` ([`super::detect_umt5`]), or `None`.
    pub fn detect(h: &Header) -> Result<Option<Umt5File>> {
        let Some(config) = detect_umt5(h)? else {
            return Ok(None);
        };
        let spiece_key = h.has(SPIECE_MODEL).then(|| h.key(SPIECE_MODEL));
        Ok(Some(Umt5File { config, path: h.path().to_path_buf(), spiece_key }))
    }

    /// The tokenizer the file's [`SPIECE_MODEL`] describes; an error naming the file when it carries none, a
    /// malformed one, or one with more pieces than the embedding table has rows.
    pub fn tokenizer(&self) -> Result<SentencePiece> {
        let unsupported = |msg: String| Error::Unsupported { path: self.path.clone(), msg };
        let Some(key) = &self.spiece_key else {
            return Err(unsupported(format!(
                "this umT5 file has no `{SPIECE_MODEL}` tensor, the SentencePiece tokenizer ComfyUI reads from it \
                 (ComfyUI's repackaged umT5 files carry it)"
            )));
        };
        file_spiece(&SafetensorsFile::open(&self.path)?, key, self.config.vocab)
    }
}

/// The SentencePiece model `file` carries as the uint8 tensor `key` (umT5's, Gemma 2's), for an encoder whose
/// embedding table has `vocab` rows: an error naming the file and the tensor when the model is malformed or has
/// more pieces than the table has rows.
pub(crate) fn file_spiece(
    file: &SafetensorsFile,
    key: &str,
    vocab: usize,
) -> Result<SentencePiece> {
    let unsupported = |msg: String| Error::Unsupported { path: file.path().to_path_buf(), msg };
    let tokenizer = SentencePiece::from_proto(&file.raw_bytes(key)?)
        .map_err(|e| unsupported(format!("its `{key}` tensor: {e}")))?;
    if tokenizer.vocab_size() > vocab {
        return Err(unsupported(format!(
            "its `{key}` has {} pieces, more than the {vocab} rows of its embedding table",
            tokenizer.vocab_size()
        )));
    }
    Ok(tokenizer)
}

/// The word prefix ComfyUI splits a prompt segment before (after whitespace).
const EMBEDDING: &str = "embedding:";

/// A prompt's weighted tokens as ComfyUI's `UMT5XXlTokenizer.tokenize_with_weights` lays them out: its weight
/// syntax parsed ([`prompt_weights::segments`]), each segment split before every whitespace-preceded
/// `embedding:` and each piece tokenised by `word_ids` on its own, then one section of all the tokens, EOS, and
/// [`PAD`] up to 512 ([`UMT5_PROMPT_LAYOUT`]: never truncated).
///
/// Unlike the CLIP-style encoders' ([`prompt_weights::tokenize`]), an `embedding:name` stays text: ComfyUI's
/// `UMT5XXlTokenizer` does not hand its embeddings folder to `SDTokenizer`, so no name is ever looked up.
pub fn umt5_tokens(
    prompt: &str,
    word_ids: impl Fn(&str) -> Result<Vec<u32>>,
) -> Result<Vec<Vec<Weighted>>> {
    umt5_tokens_in(prompt, &UMT5_PROMPT_LAYOUT, word_ids)
}

/// [`umt5_tokens`] padded as `layout` says (`min_padding` pads after EOS, then up to `min_length`), as
/// `T5TokenizerOptions` changes [`UMT5_PROMPT_LAYOUT`].
pub fn umt5_tokens_in(
    prompt: &str,
    layout: &Layout,
    word_ids: impl Fn(&str) -> Result<Vec<u32>>,
) -> Result<Vec<Vec<Weighted>>> {
    let mut section = Vec::new();
    for (segment, weight) in prompt_weights::segments(prompt) {
        for word in split_embeddings(&segment) {
            section.extend(word_ids(word)?.into_iter().map(|id| (id, weight)));
        }
    }
    section.push((EOS, 1.0));
    if let Some(pads) = layout.min_padding {
        section.extend(std::iter::repeat_n((PAD, 1.0), pads));
    }
    if let Some(min) = layout.min_length
        && section.len() < min
    {
        section.resize(min, (PAD, 1.0));
    }
    Ok(vec![section])
}

/// `segment` split before every `embedding:` that follows whitespace (Python's `re.split(r'(?<=\s)embedding:')`
/// with the prefix put back), empty pieces dropped.
fn split_embeddings(segment: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    for (i, _) in segment.match_indices(EMBEDDING) {
        if i > start && segment[..i].chars().next_back().is_some_and(char::is_whitespace) {
            pieces.push(&segment[start..i]);
            start = i;
        }
    }
    pieces.push(&segment[start..]);
    pieces.retain(|p| !p.is_empty());
    pieces
}

/// Which positions of `ids` ComfyUI attends to and keeps (`SDClipModel.process_tokens` with EOS [`EOS`] and pad
/// [`PAD`]): every token up to and including the first EOS, none after it; leading pads are left out too.
pub fn attention_mask(ids: &[u32]) -> Vec<bool> {
    let mut mask = Vec::with_capacity(ids.len());
    let (mut eos, mut left_pad) = (false, false);
    for (i, &id) in ids.iter().enumerate() {
        if i == 0 && id == PAD {
            left_pad = true;
        }
        if eos || (left_pad && id == PAD) {
            mask.push(false);
        } else {
            mask.push(true);
            left_pad = false;
        }
        if !eos && id == EOS && !left_pad {
            eos = true;
        }
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_split_before_embedding_names_which_stay_text() {
        assert_eq!(split_embeddings("a embedding:x b"), ["a ", "embedding:x b"]);
        assert_eq!(split_embeddings("embedding:x b"), ["embedding:x b"]);
        assert_eq!(split_embeddings("aembedding:x"), ["aembedding:x"]);
        assert_eq!(split_embeddings(""), Vec::<&str>::new());
        let ids = |w: &str| Ok(w.split_whitespace().map(|t| t.len() as u32 + 10).collect());
        let sections = umt5_tokens("ab (c:2) embedding:d", ids).unwrap();
        assert_eq!(sections.len(), 1);
        assert_eq!(sections[0][..4], [(12, 1.0), (11, 2.0), (21, 1.0), (EOS, 1.0)]);
        assert_eq!(sections[0].len(), 512);
        // Without `embedding:` the layout is the CLIP-style encoders' with umT5's.
        let prompt = "a (b:1.5) ((c)) \\(d\\)";
        let ours = umt5_tokens(prompt, ids).unwrap();
        assert_eq!(ours, prompt_weights::tokenize(prompt, &UMT5_PROMPT_LAYOUT, ids).unwrap());
        let long: String = "x ".repeat(600);
        assert_eq!(umt5_tokens(&long, ids).unwrap()[0].len(), 601);
    }

    #[test]
    fn the_mask_ends_after_the_first_eos() {
        assert_eq!(attention_mask(&[7, 8, EOS, PAD, PAD]), [true, true, true, false, false]);
        assert_eq!(attention_mask(&[EOS, PAD, PAD]), [true, false, false]);
        assert_eq!(attention_mask(&[7, EOS, 9, EOS]), [true, true, false, false]);
        // Left padding is masked until the first other token.
        assert_eq!(attention_mask(&[PAD, PAD, 7, EOS, PAD]), [false, false, true, true, false]);
        assert_eq!(attention_mask(&[]), Vec::<bool>::new());
    }
}
