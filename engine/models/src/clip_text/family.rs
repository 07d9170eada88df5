//! The CLIP text towers' facts as a text-encoder family (their names in messages).

/// CLIP-L's name in messages (OpenAI ViT-L/14's text tower: SD1.x, Flux.1, SDXL's first encoder).
pub const NAME: &str = "CLIP-L";
/// The name `kiln model synth --family` writes a CLIP-L encoder under.
pub const SYNTH_NAME: &str = "clip-l";
/// CLIP-H's name in messages (OpenCLIP ViT-H/14's text tower: SD2.x).
pub const H_NAME: &str = "CLIP-H";
/// CLIP-G's name in messages (OpenCLIP ViT-bigG/14's text tower: SDXL's second encoder).
pub const G_NAME: &str = "CLIP-G";
