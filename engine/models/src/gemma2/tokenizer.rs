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

/// The instruction ComfyUI's PixelDiT tokenizer puts before a prompt (`_PIXELDIT_CHI_PROMPT`).
const PIXELDIT_CHI_PROMPT: &str = "Given a user prompt, generate an \"Enhanced prompt\" that provides detailed visual \
    descriptions suitable for image generation. Evaluate the level of detail in the user prompt:\n\
    - If the prompt is simple, focus on adding specifics about colors, shapes, sizes, textures, and spatial \
    relationships to create vivid and concrete scenes.\n\
    - If the prompt is already detailed, refine and enhance the existing details slightly without \
    overcomplicating.\n\
    Here are examples of how to transform or refine prompts:\n\
    - User Prompt: A cat sleeping -> Enhanced: A small, fluffy white cat curled up in a round shape, sleeping \
    peacefully on a warm sunny windowsill, surrounded by pots of blooming red flowers.\n\
    - User Prompt: A busy city street -> Enhanced: A bustling city street scene at dusk, featuring glowing street \
    lamps, a diverse crowd of people in colorful clothing, and a double-decker bus passing by towering glass \
    skyscrapers.\n\
    Please generate only the enhanced description for the prompt below and avoid including any additional \
    commentary or evaluations:\n\
    User Prompt: ";
/// How a prompt that already carries the instruction starts (`_PIXELDIT_CHI_PROMPT_DETECT_PREFIX`).
const PIXELDIT_CHI_PREFIX: &str = "Given a user prompt, generate an \"Enhanced prompt\"";
/// The states PixelDiT conditions on (`_PIXELDIT_MAX_LENGTH`): `<bos>`'s and the last 299.
pub const PIXELDIT_MAX_LENGTH: usize = 300;

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

    /// The ids ComfyUI's PixelDiT tokenizer (`PixelDiTGemma2Tokenizer`) gives for `prompt`: an empty or blank
    /// prompt is `<bos>` and [`PIXELDIT_MAX_LENGTH`] − 1 pads; any other is `<bos>` and the prompt after the
    /// instruction (unless it starts with it), weights disabled, padded on the right and cut to the instruction's
    /// length (with `<bos>`) + [`PIXELDIT_MAX_LENGTH`] − 2. Unlike ComfyUI, `embedding:<name>` is kept as
    /// literal text (ComfyUI tokenises what follows a whitespace-preceded `embedding:` separately and drops the
    /// name when no such embedding file exists).
    pub fn pixeldit_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        let mut ids = vec![START];
        if prompt.trim().is_empty() {
            ids.resize(PIXELDIT_MAX_LENGTH, PAD);
            return Ok(ids);
        }
        let instruction = self.word_ids(PIXELDIT_CHI_PROMPT)?.len() + 1;
        let length = instruction + PIXELDIT_MAX_LENGTH - 2;
        let combined = if prompt.starts_with(PIXELDIT_CHI_PREFIX) {
            prompt.to_owned()
        } else {
            format!("{PIXELDIT_CHI_PROMPT}{prompt}")
        };
        ids.extend(self.word_ids(&prompt_weights::unescape_parentheses(&combined))?);
        ids.resize(length, PAD);
        Ok(ids)
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
