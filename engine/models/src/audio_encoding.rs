//! What ComfyUI's audio encoders give (`AudioEncoderModel.encode_audio`), whichever the model: every layer's
//! state and the clip's length after resampling.

use kiln_compute::{Backend, Tensor};

/// An audio encoder's states for a clip batch, f32 `[B, frames, width]` each: ComfyUI's `(x, all_x)`.
#[derive(Clone)]
pub struct EncoderStates<B: Backend> {
    /// The encoder's output (the last of [`EncoderStates::states`]).
    pub last: Tensor<B>,
    /// ComfyUI's tuple of states, one more than the layers: each layer's input, then
    /// [`EncoderStates::last`].
    pub states: Vec<Tensor<B>>,
}

impl<B: Backend> std::fmt::Debug for EncoderStates<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncoderStates")
            .field("last", &self.last.shape())
            .field("states", &self.states.len())
            .finish()
    }
}

/// ComfyUI's `encode_audio` dictionary: `encoded_audio` and `encoded_audio_all_layers` ([`EncoderStates`])
/// and `audio_samples`.
#[derive(Clone, Debug)]
pub struct AudioEncoding<B: Backend> {
    /// The states.
    pub output: EncoderStates<B>,
    /// The clip's length after resampling to the encoder's rate (16 kHz).
    pub samples: usize,
}
