//! Mistral Small 3.x's facts as a text-encoder family (read through [`crate::family::TextEncoderFamily`]).

/// The family's name in messages.
pub const NAME: &str = "Mistral Small 3 (FLUX.2 dev)";
/// The name `kiln model synth --family` writes the encoder under.
pub const SYNTH_NAME: &str = "mistral3";
