//! OmniGen2's DiT as ComfyUI runs it (`OmniGen2Transformer2DModel`): a Lumina 2-style NextDiT that edits
//! images from reference latents as well as generating them; and Boogu-Image's (`BooguTransformer2DModel`), its
//! derivative with double-stream blocks ([`Variant::Boogu`]).
//!
//! - [`detect`] tells an OmniGen2 or Boogu-Image file (ComfyUI's key layout) from other families and derives the
//!   [`Config`] from shapes (the caller applies [`crate::header::diffusion_prefix`] first);
//!   [`Config::is_boogu`] tells the two apart.
//! - [`family`]: their facts as families (names, latent format, default sampling, checkpoint prefixes).
//! - [`load_plan`] names the weights as the file does; [`expected`] lists them for `kiln model synth`.
//! - [`OmniGen2::forward`] is ComfyUI's forward: caption, reference-image and image tokens each refined on
//!   their own, (Boogu-Image) double-stream blocks on the caption and the images, then joint blocks over
//!   [caption, references, image] with 3-axis interleaved RoPE (each reference at its own time index), one
//!   block's weights at a time; the output is sign-flipped.

mod config;
pub mod family;
mod keys;
mod model;
mod rope;

pub use config::{Config, Variant, axes_dims, detect};
pub use keys::{expected, load_plan};
pub use model::OmniGen2;
