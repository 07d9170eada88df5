//! The families Kiln runs, each described once and dispatched on an enum, so that adding a family is a
//! compile error everywhere it must be handled.
//!
//! Three kinds of network flow on ComfyUI's links, one enum of families for each:
//!
//! - [`DiffusionFamily`] (`MODEL`): detection from a header ([`DiffusionDetected::detect`]: keys, shapes,
//!   metadata, every layout ComfyUI accepts), the load plan in the family's one key layout, the loaded
//!   [`DiffusionNet`], its latent format, default model sampling, LoRA key mapping, what a checkpoint of the
//!   family holds beside it, and the name `kiln model synth` writes it under.
//! - [`TextEncoderFamily`] (`CLIP`): detection, load plan, the loaded [`TextEncoderNet`] with its tokenizer and
//!   ComfyUI's prompt template.
//! - [`VaeFamily`] (`VAE`): detection, load plan, the loaded [`VaeNet`] and the latent format it encodes to.
//!
//! Vision towers (`CLIP_VISION`) and style models (`STYLE_MODEL`) feed prompts rather than a sampler:
//! [`ClipVisionDetected`] and [`StyleModelDetected`] find them (`clip_vision.rs`).
//!
//! ControlNets (`CONTROL_NET`) are not a kind of their own: [`ControlNetDetected`] finds one for a diffusion
//! family, and [`DiffusionInput::controls`] hands it to that family's forward pass; model patches
//! (`MODEL_PATCH`) likewise, through [`ModelPatchDetected`] and [`DiffusionInput::patches`].
//!
//! Each family's own facts (names, constants, config from shapes, key conversion) live in its folder
//! (`zimage/`, `qwen3/`, `flux_vae/`); these modules only route to them.

mod anima_text;
mod clip_vision;
mod control;
mod diffusion;
mod hunyuan_video1_text;
mod hunyuan_video_text;
mod kandinsky5_text;
mod patch;
mod sd3_text;
mod sdxl_text;
mod text_encoder;
mod vae;

pub use anima_text::AnimaTokens;
pub use clip_vision::{ClipVisionDetected, ClipVisionNet, StyleModelDetected, StyleModelNet};
pub use control::{ControlInput, ControlNetDetected, ControlNetNet};
pub use diffusion::{
    DiffusionDetected, DiffusionFamily, DiffusionInput, DiffusionNet, DistilledGuidance,
    SkippedBlocks,
};
pub use hunyuan_video_text::{HunyuanVideo15Encoders, HunyuanVideo15Tokens};
pub use hunyuan_video1_text::{HunyuanVideo1Encoders, HunyuanVideo1Tokens};
pub use kandinsky5_text::{Kandinsky5Encoders, Kandinsky5Tokens};
pub use patch::{ModelPatchDetected, ModelPatchNet, PatchInput};
pub use sd3_text::{Sd3Encoders, Sd3Tokens};
pub use sdxl_text::{SdxlEncoders, SdxlTokens};
pub use text_encoder::{
    BOOGU_CLIP_TYPE, CHROMA_CLIP_TYPE, EditPrompt, Encoded, HIDREAM_CLIP_TYPE,
    HUNYUAN_VIDEO_CLIP_TYPE, HUNYUAN_VIDEO15_CLIP_TYPE, HiDreamEncoders, HiDreamTokens,
    JOYIMAGE_CLIP_TYPE, KANDINSKY5_CLIP_TYPE, KANDINSKY5_IMAGE_CLIP_TYPE, KREA2_CLIP_TYPE,
    LONGCAT_CLIP_TYPE, MAGE_CLIP_TYPE, OMNIGEN2_CLIP_TYPE, OVIS_CLIP_TYPE, PIXELDIT_CLIP_TYPE,
    PromptTokens, Qwen3VlRole, Qwen25Role, SD3_CLIP_TYPE, SDXL_CLIP_TYPE, SDXL_REFINER_CLIP_KIND,
    T5Options, TextEncoderDetected, TextEncoderFamily, TextEncoderNet,
};
pub use vae::{PIXEL_SPACE_NAME, VaeDetected, VaeFamily, VaeNet};

use crate::error::Result;
use crate::header::Header;

/// The first family of `all` whose detection claims `h`, or `Ok(None)`; a family that recognises the file but
/// cannot run it answers [`crate::Error::Unsupported`], which stops the search.
fn first_detected<F: Copy, D>(
    all: &[F],
    h: &Header,
    detect: fn(F, &Header) -> Result<Option<D>>,
) -> Result<Option<D>> {
    for &family in all {
        if let Some(found) = detect(family, h)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}
