//! The Flux VAE's and the FLUX.2 VAE's facts as autoencoder families (read through
//! [`crate::family::VaeFamily`]): one network, told apart by [`super::Config::latent_bn`].

/// The family's name in messages.
pub const NAME: &str = "the Flux VAE";
/// The name `kiln model synth --family` writes the autoencoder under.
pub const SYNTH_NAME: &str = "flux-vae";

/// The FLUX.2 VAE's name in messages.
pub const FLUX2_NAME: &str = "the FLUX.2 VAE";
/// The name `kiln model synth --family` writes the FLUX.2 VAE under.
pub const FLUX2_SYNTH_NAME: &str = "flux2-vae";
