//! The Wan VAEs' facts as autoencoder families (read through [`crate::family::VaeFamily`]).

/// The Wan 2.1 VAE's name in messages.
pub const NAME: &str = "the Wan 2.1 VAE";
/// The name `kiln model synth --family` writes the Wan 2.1 VAE under.
pub const SYNTH_NAME: &str = "wan21-vae";
/// The Wan 2.2 VAE's name in messages.
pub const WAN22_NAME: &str = "the Wan 2.2 VAE";
/// The name `kiln model synth --family` writes the Wan 2.2 VAE under.
pub const WAN22_SYNTH_NAME: &str = "wan22-vae";
