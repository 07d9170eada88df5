//! The Wan 2.1 / 2.2 video diffusion transformer (`wan2.1_t2v_1.3B`, `wan2.1_i2v_480p_14B`,
//! `wan2.1_flf2v_720p_14B`, `wan2.2_ti2v_5B`, the `wan2.2_{t2v,i2v}_{high,low}_noise_14B` experts): 1×2×2 patches
//! of the video latent, one token sequence over all frames, blocks of self-attention with a 3-D RoPE, cross
//! attention on umT5-XXL's text (and, for I2V and FLF2V, on CLIP-ViT-H's image states through their own keys and
//! values), and a GELU feed-forward, modulated by the timestep (models-wan-video.md §2–§3).
//!
//! - [`detect`] recognises the file in ComfyUI's (the original Wan release's) layout or diffusers' and derives
//!   its [`Config`] from shapes; [`load_plan`] names the weights by ComfyUI's names whatever the file's.
//! - [`Wan::forward`]: ComfyUI's model output, the flow velocity v = ε − x₀, for latents already concatenated
//!   with their conditioning channels, with one timestep per sample or (TI2V 5B) per latent frame.
//! - [`CausalCache`] and [`CausalStep`]: a causal model (Causal Forcing) run a block of frames at a time by the
//!   `ar_video` sampler, its self-attention reading the keys and values of the frames before.
//! - [`humo`]: HuMo (human video from text, a reference image and audio): its audio projection and audio
//!   cross-attention, its reference latent after the video, and the 17B model's conditioning channels.
//! - [`infinite_talk`]: InfiniteTalk's model patch (talking video from one or two speakers' audio): its audio
//!   projection and the audio cross-attention it adds to every block.
//! - [`s2v`]: Wan 2.2 S2V (speech to video): its audio encoder and injectors, the packed motion latent, the
//!   reference and control video, and the timesteps it spreads over all of them.
//! - [`animate2`]: Wan Animate 2 (a character animated by a driving video): its pose branch feeding each block's
//!   self-attention, frame by frame; [`PoseCache`] keeps the branch's block inputs across a run's steps.
//! - [`dancer`]: WanDancer, a Wan 2.1 I2V body dancing to music: the music encoder and its injectors, a
//!   second patch embedding and head for music at another frame rate, the reference image's CLIP projection.
//! - [`phantom`]: Phantom's subject frames (`WanPhantomSubjectToVideo`), run after the video's along time.
//! - [`lora::patches`]: a LoRA file's patches, by ComfyUI's key forms for Wan.
//! - [`family`]: the names, latent formats and default model sampling of the two ComfyUI entries, `WAN21` and
//!   `WAN22`.

pub mod animate2;
mod config;
pub mod dancer;
pub mod family;
pub mod humo;
pub mod infinite_talk;
pub mod lora;
mod model;
pub mod phantom;
mod pose_cache;
pub mod s2v;

pub use config::{
    CAMERA_UNSHUFFLE, Config, Dancer, EPS, HEAD_DIM, Humo, IMAGE_EPS, ImageEmbed, Layout, PATCH,
    ROPE_THETA, Vace, animate2_metadata, causal_metadata, detect, expected_shapes, load_plan,
};
pub use model::{CausalCache, CausalStep, Wan, WanInput};
pub use pose_cache::{CacheDtype, CacheSettings, PoseCache, pose_key};
