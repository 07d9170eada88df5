//! The HunyuanVideo 1.0 VAE (`hunyuan_video_vae_bf16.safetensors`, also Kandinsky 5's video VAE): ComfyUI's KL
//! autoencoder (`AutoencoderKL`, the Flux VAE's network) with carried 3-D convolutions, 16 latent channels, 8× down in
//! space and 4× in time, as `comfy/sd.py` builds it for a file with `decoder.conv_in.conv.weight`.
//!
//! - [`detect`] recognises the file as ComfyUI does and reads its level widths and latent width from it, checking
//!   every weight against them; [`load_plan`] names every weight by its ComfyUI name.
//! - [`KlVideoVae`] decodes and encodes images (one-frame clips) and clips through [`crate::wan_vae::ClipVae`], as
//!   the Wan VAEs do, in VAE space (the latent format's scale, 0.476986, belongs to the sampler).
//!
//! The network, in ComfyUI's terms: four levels of widths `[128, 256, 512, 512]`, residual blocks of carried 3×3×3
//! convolutions with GroupNorm (32 groups, ε 1e-6) and SiLU, a 1×1×1 shortcut where the width changes; the encoder
//! downsamples with a stride-2 convolution after levels 0 (space only), 1 and 2 (time too), the decoder upsamples
//! (nearest 2×, then a convolution) before levels 2, 1 (time too) and 0 (space only); a middle of residual block,
//! single-head attention over every position of every latent frame (no mask between frames) and residual block on
//! each side; GroupNorm, SiLU and a convolution at each side's end; 1×1×1 `quant_conv` after the encoder (its
//! **mean**, the first 16 channels, is the latent) and `post_quant_conv` before the decoder. No tanh, no clamp.
//!
//! Conventions as ComfyUI's `conv_carry_causal_3d` (the HunyuanVideo 1.5 VAE's, whose causal convolutions and
//! stream of carried frames this reuses): every 3×3×3 convolution pads space by replicating the edge and time by
//! replicating a clip's first frame twice in front, or by the chunk before's last two padded frames; a temporal
//! upsample takes a clip's first frame in space only. L frames encode to ⌊(L − 1)/4⌋ + 1 latent frames (frames past
//! the last 4k + 1 dropped) and T latent frames decode to 4T − 3.
//!
//! ComfyUI's chunks are part of its numbers, not only of its memory: the encoder's levels take a clip's first frame
//! alone, then 8 frames at a time, and the decoder's 2 latent frames at a time, and every GroupNorm normalises over
//! the frames of its chunk (the middle's over the whole latent), while a stride-2 temporal convolution reads frame
//! windows set by where the chunks start. So a clip's results differ from the original network's (diffusers'
//! `AutoencoderKLHunyuanVideo`, which also masks its middle attention causally over frames) and these chunks are
//! kept whatever chunk size a caller asks for; a one-frame clip (an image) comes out the same in all of them.
//!
//! Invariant: weights are read only through `Model::fetch`, one block at a time; the chunks are ComfyUI's, and a
//! carried convolution's history is its last two padded input frames and nothing else.

mod blocks;
mod causal;
mod config;
pub mod family;
mod net;

pub use config::{
    Config, GROUPS, IMAGE_CHANNELS, LEVELS, RELEASED_WIDTHS, RES_BLOCKS, Z_CHANNELS, detect,
    load_plan,
};
pub use net::{DECODE_LATENT_FRAMES, ENCODE_FRAMES, KlVideoVae};

pub(crate) use config::expected;
