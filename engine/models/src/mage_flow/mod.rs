//! Mage-Flow's native-resolution MMDiT (ComfyUI's `MageFlowTransformer2DModel`): Qwen-Image's double-stream
//! blocks and final layer, 12 of them, over the FLUX.2 VAE's 128-channel latents with one token a latent pixel
//! (patch 1, no padding), Qwen3-VL 4B's text through `txt_norm` and `txt_in`, and a timestep embedding of its
//! own that ComfyUI computes on a bf16 timestep.
//!
//! - [`detect`] recognises the file (told from Qwen-Image's by its 128-channel `img_in` and `proj_out`) and
//!   derives its [`Config`] from shapes; [`load_plan`] names the weights.
//! - [`MageFlow::forward`]: ComfyUI's model output v = ε − x₀; [`MageFlow::forward_with_references`] adds
//!   reference latents (`ReferenceLatent`) at RoPE frames 1, 2, ...
//! - [`family`]: the family's facts (latent format, flow shift).
//!
//! Mage-Flow reuses `qwen_image`'s trunk (`DoubleStream`: blocks, attention, text and timestep MLPs, final
//! layer) and weight list; what differs is here: the token grid (channels of a pixel, centred at
//! −⌈n/2⌉ where Qwen-Image centres at −⌊n/2⌋), text tokens left unrotated (all at position 0), a frame per
//! reference, and [`timestep_features`].

mod config;
pub mod family;
mod model;

pub use config::{Config, LATENT_CHANNELS, T_FREQ_DIM, detect, load_plan};
pub use model::{MageFlow, timestep_features};
