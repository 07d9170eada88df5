//! Stable Diffusion 3 / 3.5 (`sd3.5_large*.safetensors`; ComfyUI's `OpenAISignatureMMDITWrapper`,
//! `comfy/ldm/modules/diffusionmodules/mmdit.py`): Stability's MMDiT, joint blocks in which the text tokens
//! (CLIP-L's and CLIP-G's states padded to T5-XXL's width, then T5-XXL's) and the image patches attend together,
//! each stream with its own adaLN-modulated weights, conditioned on the timestep and the pooled CLIP vectors.
//!
//! - [`detect`] recognises the file and derives its [`Config`] from shapes; [`load_plan`] names the weights.
//! - [`Sd3::forward`]: ComfyUI's `MMDiT.forward`: the latent patch-embedded (padded circularly to the patch
//!   size) plus the centred crop of the learned position table, the joint blocks, the final adaLN layer and the
//!   channels-last unpatchify, cropped back to the latent's size; a ControlNet's outputs added after the blocks.
//! - [`Sd3ControlNet`]: SD3.5 Large's ControlNets (blur, canny, depth).

mod config;
mod control;
pub mod family;
mod model;

pub use config::expected;
pub use config::{Config, HEAD_DIM, LN_EPS, MARKER, PATCH, QK_EPS, T_FREQ_DIM, detect, load_plan};
pub use control::{
    ControlConfig, ControlType, Sd3ControlNet, control_file_tensors, control_load_plan,
    detect_control,
};
pub use model::{Sd3, Sd3Input};
