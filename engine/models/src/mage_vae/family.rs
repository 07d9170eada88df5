//! The Mage-Flow VAE's facts as an autoencoder family (for [`crate::family::VaeFamily`]).

use crate::latent::LatentFormat;

/// Its name in messages.
pub const NAME: &str = "the Mage-Flow VAE";
/// The name `kiln model synth --family` writes it under.
pub const SYNTH_NAME: &str = "mage-flow-vae";
/// The latent space it encodes to: FLUX.2's (128 channels at 16×, the identity map to the model's space), as
/// ComfyUI's Mage-Flow model reads it (`latent_formats.Flux2`); Mage-VAE's latents are anchored to the FLUX.2
/// VAE's.
pub const LATENT: LatentFormat = LatentFormat::FLUX2;
