//! Qwen3's facts as a text-encoder family (read through [`crate::family::TextEncoderFamily`]).

/// The family's name in messages.
pub const NAME: &str = "Qwen3";
/// The name `kiln model synth --family` writes the encoder under.
pub const SYNTH_NAME: &str = "qwen3";
/// The name `kiln model synth --family` writes a Qwen3 of 0.6B's width under (Anima's encoder).
pub const QWEN3_06B_SYNTH_NAME: &str = "qwen3-0.6b";
/// Qwen2.5-VL's language model's name in messages (Qwen-Image's text encoder).
pub const QWEN25VL_NAME: &str = "Qwen2.5-VL";
/// The name `kiln model synth --family` writes Qwen2.5-VL's language model under.
pub const QWEN25VL_SYNTH_NAME: &str = "qwen25vl";
/// FLUX.2 Klein's encoder's name in messages (a Qwen3 file loaded with CLIPLoader type `flux2` or `flux`).
pub const KLEIN_NAME: &str = "FLUX.2 Klein's Qwen3";
/// Qwen3-8B's hidden width: ComfyUI makes any Qwen3 of this width FLUX.2 Klein's encoder (its `QWEN3_8B`),
/// whatever the CLIPLoader type but `ideogram4`.
pub const QWEN3_8B_HIDDEN: usize = 4096;
/// Qwen3-4B's (and Qwen3-VL 4B's) hidden width: ComfyUI's `detect_te_model` calls a Qwen3-VL whose vision merger
/// gives this many features (the language model's width) Qwen3-VL 4B, any other Qwen3-VL 8B.
pub const QWEN3_4B_HIDDEN: usize = 2560;
/// Qwen3 2B's hidden width (Ovis 2.5's language model): ComfyUI makes any Qwen3 of this width Ovis-Image's encoder
/// (its `QWEN3_2B`), whatever the CLIPLoader type.
pub const QWEN3_2B_HIDDEN: usize = 2048;
/// Qwen3-VL 32B's hidden width (MiniMax H3's conditioning encoder, which Kiln does not run).
pub const QWEN3VL_32B_HIDDEN: usize = 5120;
/// The name `kiln model synth` gives FLUX.2 Klein's encoder: a Qwen3 file deep enough for Klein's taps (not yet
/// a `--family` of its own: `SynthFamily::all` lists the detected families).
pub const KLEIN_SYNTH_NAME: &str = "qwen3-klein";

/// Qwen3-VL's RoPE base θ (ComfyUI's `Qwen3VL_8BConfig`; text positions make its interleaved M-RoPE plain RoPE).
pub const QWEN3VL_ROPE_THETA: f64 = 5_000_000.0;

/// The name `kiln model synth --family` writes a Qwen3-VL 4B under (transformers' layout, its language model
/// nested under `model.language_model.`; Krea 2's and Mage-Flow's encoder).
pub const QWEN3VL_4B_SYNTH_NAME: &str = "qwen3vl-4b";

/// The hidden states Krea 2 conditions on, in Hugging Face's numbering (ComfyUI's `KREA2_TAP_LAYERS`: `k` is layer
/// `k − 1`'s output, none through the final norm).
pub const KREA2_TAPS: [usize; 12] = [2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35];
