//! Mistral Small 3.x's facts as a text-encoder family (read through [`crate::family::TextEncoderFamily`]).

/// The family's name in messages.
pub const NAME: &str = "Mistral Small 3 (FLUX.2 dev)";
/// The name `kiln model synth --family` writes the encoder under.
pub const SYNTH_NAME: &str = "mistral3";
/// Ministral 3 3B's name in messages (ERNIE-Image's text encoder).
pub const MINISTRAL_NAME: &str = "ERNIE-Image's Ministral 3 3B";
/// The name `kiln model synth --family` writes Ministral 3 3B under.
pub const MINISTRAL_SYNTH_NAME: &str = "ministral3-3b";
