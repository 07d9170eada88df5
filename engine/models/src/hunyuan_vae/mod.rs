//! The HunyuanVideo 1.5 VAE (`hunyuanvideo15_vae_fp16.safetensors`): a causal 3-D autoencoder with 32 latent
//! channels, 16× down in space and 4× in time, ComfyUI's `comfy.ldm.hunyuan_video.vae_refiner` (`refiner_vae`
//! on, as ComfyUI builds it).
//!
//! - [`detect`] recognises the file as ComfyUI does (`decoder.conv_in.conv.weight` with 32 input channels) and
//!   reads its level widths from the file and checks every weight against them; [`load_plan`] names every
//!   weight by its ComfyUI name.
//! - [`HunyuanVae`] decodes and encodes images (one-frame clips) and clips through [`crate::wan_vae::ClipVae`],
//!   as the Wan VAEs do, in VAE space (the latent format's scale belongs to the sampler).
//!
//! The network, in ComfyUI's terms: five levels of widths `[128, 256, 512, 1024, 1024]`, residual blocks of
//! causal 3³ convolutions with a channel RMS norm (`x / ‖x‖ · √C · γ`) and SiLU; each of the first four levels
//! ends with a resample that folds 2×2 patches (and in time frame pairs) into channels after its convolution,
//! with a parameter-free shortcut: channel-group means going down (`DnSmpl`), repeated channels going up
//! (`UpSmpl`); a clip's first frame takes its own path through a temporal resample, alone. The middle (residual
//! block, single-head attention over every position of every frame, residual block) sees the whole clip. The
//! encoder's head adds its input's channel-group means to `conv_out`, and its **mean** (the first 32 channels)
//! is the latent; the decoder's input adds z's channels repeated to `conv_in`'s width. No tanh, no clamp.
//!
//! Conventions as ComfyUI's `conv_carry_causal_3d`: every convolution pads space by replicating the edge and
//! time by replicating a clip's first frame twice in front; L frames encode to ⌊(L − 1)/4⌋ + 1 latent frames
//! (frames past the last 4k + 1 dropped) and T latent frames decode to 4T − 3.
//!
//! Invariant: weights are read only through `Model::fetch`, one block at a time; a causal convolution's history
//! is its last two padded input frames and nothing else, so chunking never changes a result.

pub(crate) mod blocks;
pub(crate) mod causal;
pub(crate) mod config;
pub mod family;
pub(crate) mod net;
mod reshape;

pub use config::{
    Config, IMAGE_CHANNELS, LEVELS, RELEASED_WIDTHS, RES_BLOCKS, RESAMPLES, Z_CHANNELS, detect,
    load_plan,
};
pub use net::HunyuanVae;

pub(crate) use config::expected;
