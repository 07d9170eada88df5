//! The NextDiT of the Lumina 2 family as ComfyUI runs it (models.md §2.2, §2.3, §3): Z-Image, and the original
//! Lumina Image 2.0 (NetaYume Lumina) as [`Variant::Lumina2`] (its own family, [`crate::family::DiffusionFamily`]'s
//! `Lumina2`, with its facts in [`family`] too).
//!
//! - [`detect`] tells a Z-Image or Lumina 2 file from other families in either key [`Layout`] (ComfyUI's
//!   fused-qkv one or diffusers', Z-Image's only), refuses the relatives Kiln cannot run, and derives the
//!   [`Config`] from shapes (the caller applies [`crate::header::diffusion_prefix`] first).
//! - [`family`]: its facts as a family (name, latent format, default sampling, checkpoint prefixes).
//! - [`load_plan`] names the weights in ComfyUI's layout whatever the file's, so model code has one set of
//!   names; diffusers' `to_q`/`to_k`/`to_v` are joined into the fused `qkv` by the loader.
//! - [`ZImage::forward`] is ComfyUI's forward (caption first, learned pad tokens, 3-axis interleaved RoPE,
//!   scale/tanh-gate modulation, sign-flipped output), one block's weights at a time;
//!   [`ZImage::forward_with_patches`] adds the Fun ControlNet's outputs ([`ZImageFunControl`], a model patch).

mod config;
mod control;
pub mod family;
mod keys;
mod model;
mod rope;

pub use config::{Config, Layout, Variant, axes_dims, detect};
pub(crate) use control::fun_control_expected;
pub use control::{
    FunControlConfig, FunPatch, ZImageFunControl, detect_fun_control, fun_control_load_plan,
};
pub use keys::{expected, load_plan};
pub use model::ZImage;
