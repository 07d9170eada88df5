//! HiDream-I1 and E1 (`hidream_i1_*.safetensors`, `hidream_e1_*.safetensors`; ComfyUI's
//! `comfy/ldm/hidream/model.py`): a DiT of double- and single-stream blocks whose image feed-forwards are a
//! mixture of experts, conditioned on T5-XXL's states, one Llama 3.1 state per block and a pooled CLIP vector.
//!
//! - [`detect`] recognises the file and derives its [`Config`] from shapes; [`load_plan`] names the weights.
//! - [`HiDream::forward`]: ComfyUI's model output (its sign flip included); E1's image latent joins the latents
//!   along the width.

mod config;
pub mod family;
pub mod lora;
mod model;

pub(crate) use config::expected;
pub use config::{
    ACTIVE_EXPERTS, AXES_DIMS, Config, HEAD_DIM, LATENT_CHANNELS, LN_EPS, MARKER, PATCH, QK_EPS,
    ROPE_THETA, T_FREQ_DIM, detect, load_plan,
};
pub use model::{HiDream, HiDreamInput};
