//! ComfyUI's `LuminaTokenizer` (`Gemma2BTokenizer`, an `SDTokenizer` over `SPieceTokenizer`): the prompt's weights
//! parsed, each piece tokenised by the file's SentencePiece model, one section opened by `<bos>`, never padded.

use crate::error::Result;
use crate::prompt_weights::{self, Layout, Weighted};
use crate::t5::SentencePiece;

/// `<bos>`, which opens the prompt (`special_tokens["start"]`).
pub const START: u32 = 2;
/// `<pad>` (`special_tokens["pad"]`): where ComfyUI's padding mask starts.
pub const PAD: u32 = 0;
/// `<end_of_turn>` as `Gemma2BTokenizer` names it: written in a prompt, it is this id, not text.
pub const END_OF_TURN: u32 = 107;
/// Its text.
const END_OF_TURN_TEXT: &str = "<end_of_turn>";

/// Gemma 2's prompt layout in ComfyUI's `Gemma2BTokenizer`: the start token, no end token, one section never
/// truncated nor padded (`min_length` 1).
pub const PROMPT_LAYOUT: Layout = Layout {
    start: Some(START),
    end: None,
    pad: PAD,
    max_length: 99_999_999,
    pad_to_max_length: false,
    min_length: Some(1),
    min_padding: None,
};

/// The Gemma 2 tokenizer of a file.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    spiece: SentencePiece,
}

impl Tokenizer {
    /// The tokenizer of the SentencePiece model `spiece`.
    pub fn new(spiece: SentencePiece) -> Tokenizer {
        Tokenizer { spiece }
    }

    /// The weighted tokens ComfyUI's `LuminaTokenizer.tokenize_with_weights` gives for `prompt`: one section.
    pub fn tokens(&self, prompt: &str) -> Result<Vec<Vec<Weighted>>> {
        prompt_weights::tokenize(prompt, &PROMPT_LAYOUT, |word| self.word_ids(word))
    }

    /// The ids `SDTokenizer` keeps of `word`: `SPieceTokenizer`'s ids (with `<bos>`) less the first. A word
    /// holding `<end_of_turn>` is cut around it, the pieces encoded without `<bos>` and the marker made its id,
    /// and then the first id is dropped all the same, as ComfyUI drops it.
    pub fn word_ids(&self, word: &str) -> Result<Vec<u32>> {
        if !word.contains(END_OF_TURN_TEXT) {
            return self.spiece.word_ids(word);
        }
        let mut ids = Vec::new();
        for (i, part) in word.split(END_OF_TURN_TEXT).enumerate() {
            if i > 0 {
                ids.push(END_OF_TURN);
            }
            if !part.is_empty() {
                ids.extend(self.spiece.word_ids(part)?);
            }
        }
        ids.remove(0);
        Ok(ids)
    }
}

/// How many of `ids` ComfyUI's padding mask lets the encoder attend to: all before the first [`PAD`] (the empty
/// prompt a weighted one is measured against is `<bos>` then pads).
pub fn attended_keys(ids: &[u32]) -> usize {
    match ids.iter().position(|&id| id == PAD) {
        Some(0) | None => ids.len(),
        Some(at) => at,
    }
}
