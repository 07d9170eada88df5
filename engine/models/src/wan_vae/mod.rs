//! The Wan VAEs: causal 3-D autoencoders, 4× down in time.
//!
//! - The Wan 2.1 VAE (`wan_2.1_vae.safetensors`, and Qwen-Image's `qwen_image_vae.safetensors`, a fine-tune of
//!   it): 16 latent channels, 8× down in space. [`detect`] recognises the file in ComfyUI's (the original Wan)
//!   layout or diffusers' and derives its [`Config`]; [`load_plan`] names every weight by its ComfyUI name;
//!   [`WanVae`] runs it.
//! - The Wan 2.2 VAE ([`wan22`]): 48 latent channels, 16× down in space, residual blocks around a 2×2 patchify.
//!
//! Both work in VAE space (the latent format's per-channel mean and standard deviation belong to the sampler),
//! on images `[B, C, H, W]`, each a one-frame clip, and on clips `[1, C, T, H, W]`: L frames encode to
//! ⌊(L − 1)/4⌋ + 1 latent frames (frames past the last 4k + 1 are dropped) and T latent frames decode to
//! 4T − 3. A clip goes through a chunk at a time (encode 1, then 4, 4, … frames; decode one latent frame at a
//! time), a stream carrying each causal convolution's last frames between chunks (ComfyUI's `feat_cache`), so
//! memory grows with one chunk, not with the clip, and the result is the whole clip's causal computation.
//! A one-frame clip and an image take exactly the same operations, so their results are bit-identical.
//!
//! Conventions as ComfyUI: causal convolutions pad time with zeros in front only; RMS norm over channels
//! (`x / ‖x‖ · √C · γ`), SiLU, one attention head per frame in the middle block of each side, downsample =
//! zero-pad right and bottom by one then a stride-2 3×3 convolution (the temporal one then convolves frame
//! pairs after the first), upsample = the temporal one first (one frame for a clip's first, two for each later)
//! then nearest 2× and a 3×3 convolution, no tanh on the output, the encoder's **mean** (the first half of its
//! channels) as the latent.
//!
//! Invariant: weights are read only through `Model::fetch`, one block at a time; a causal convolution's history
//! is its last `kt − 1` input frames and nothing else, so chunking never changes a result.

mod blocks;
mod causal;
mod config;
pub mod family;
mod video;
mod wan21;
pub mod wan22;

pub use causal::FRAMES_TOGETHER_BYTES;
pub use config::{Config, DIM_MULT, Layout, RES_BLOCKS, TEMPORAL_DOWNSAMPLE, detect, load_plan};
pub use video::{
    ClipVae, DECODE_CHUNK, ENCODE_CHUNK, TEMPORAL_DOWNSCALE, decoded_frames, latent_frames,
};
pub use wan21::WanVae;
pub use wan22::Wan22Vae;

pub(crate) use config::{computable, expected};
pub(crate) use video::{chunks, clip_in, latent_clip_in};
