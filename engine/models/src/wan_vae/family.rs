//! The Wan 2.1 VAE's facts as an autoencoder family (read through [`crate::family::VaeFamily`]).

/// The family's name in messages.
pub const NAME: &str = "the Wan 2.1 VAE";
/// The name `kiln model synth --family` writes the autoencoder under.
pub const SYNTH_NAME: &str = "wan21-vae";
