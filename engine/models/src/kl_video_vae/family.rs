//! The HunyuanVideo 1.0 VAE's facts as an autoencoder family (for [`crate::family::VaeFamily`]).

/// Its name in messages.
pub const NAME: &str = "the HunyuanVideo 1.0 VAE";
/// The name `kiln model synth --family` writes it under.
pub const SYNTH_NAME: &str = "hunyuan-video-vae";
