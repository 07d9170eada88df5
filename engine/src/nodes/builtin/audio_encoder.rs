//! Audio encoders (`comfy_extras.nodes_audio_encoder`): `AudioEncoderLoader` loads one from `audio_encoders/`
//! (Whisper large-v3, [`kiln_models::whisper`]), and `AudioEncoderEncode` runs a clip through it as ComfyUI's
//! `encode_audio` does: resampled to 16 kHz, the channels averaged, padded or cut to 30 s, log-mel features,
//! the encoder; its output is every layer's state (what HuMo reads) and the resampled clip's length.

use std::sync::Arc;

use kiln_compute::{Backend, DType};

use super::loaders::{find, progress};
use super::video::audio_input;
use crate::compute::Compute;
use crate::media::Audio;
use crate::models::device::{OnDevice, on_device};
use crate::models::{AudioEncoder, AudioEncoderOutput, ModelEnv, load};
use crate::nodes::error::node_error;
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef,
};
use crate::tensor::Tensor;
use crate::value::Value;

/// ComfyUI's module of these nodes.
const MODULE: &str = "comfy_extras.nodes_audio_encoder";

/// `AudioEncoderLoader`: an audio encoder from `audio_encoders/`.
pub(super) struct AudioEncoderLoader(pub(super) ModelEnv);

impl Node for AudioEncoderLoader {
    fn spec(&self) -> Arc<NodeSpec> {
        let files = self.0.files.list("audio_encoders");
        let files: Vec<&str> = files.iter().map(String::as_str).collect();
        Arc::new(
            NodeSpec::new("AudioEncoderLoader", "Load Audio Encoder", "model/loaders")
                .python_module(MODULE)
                .v3()
                .input(InputDef::v3_combo("audio_encoder_name", &files))
                .output(OutputDef::new("AUDIO_ENCODER"))
                .shared_between_partitions(),
        )
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let path = find(&self.0, "audio_encoders", inputs, "audio_encoder_name")?;
        let net =
            load::load_audio_encoder(&self.0, &path, &mut progress(ctx)).map_err(node_error)?;
        Ok(NodeResult::values([Value::AudioEncoder(Arc::new(net))]))
    }
}

/// `AudioEncoderEncode`.
pub(super) struct AudioEncoderEncode {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl AudioEncoderEncode {
    pub(super) fn new(compute: Arc<Compute>) -> AudioEncoderEncode {
        let spec = NodeSpec::new("AudioEncoderEncode", "", "model/conditioning")
            .python_module(MODULE)
            .v3()
            .input(InputDef::typed("audio_encoder", "AUDIO_ENCODER"))
            .input(InputDef::typed("audio", "AUDIO"))
            .output(OutputDef::new("AUDIO_ENCODER_OUTPUT"));
        AudioEncoderEncode { spec: Arc::new(spec), compute }
    }
}

impl Node for AudioEncoderEncode {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let encoder = inputs.audio_encoder("audio_encoder")?;
        let audio = audio_input(inputs, "audio")?.ok_or_else(|| {
            NodeError::of_kind(ErrorKind::WrongType, "input `audio` is missing".to_owned())
        })?;
        let output = encode(&self.compute, encoder, audio)?;
        Ok(NodeResult::values([Value::AudioEncoderOutput(Arc::new(output))]))
    }
}

/// `audio` through `encoder` on the compute device, its states brought back to the host.
pub(crate) fn encode(
    compute: &Compute,
    encoder: &AudioEncoder,
    audio: &Audio,
) -> Result<AudioEncoderOutput, NodeError> {
    on_device(compute.device(), Encode { encoder, audio }).map_err(node_error)
}

/// One clip batch through the encoder.
struct Encode<'a> {
    encoder: &'a AudioEncoder,
    audio: &'a Audio,
}

impl OnDevice for Encode<'_> {
    type Output = Result<AudioEncoderOutput, kiln_models::Error>;
    fn run<B: Backend>(self, b: &B) -> Self::Output {
        // As ComfyUI loads the model before it encodes: top residency priority.
        self.encoder.net.weights.activate()?;
        let waveform = self.audio.waveform();
        let shape = [self.audio.batch(), self.audio.channels(), self.audio.samples()];
        let encoding =
            self.encoder.net.encode_audio(b, waveform.data(), shape, self.audio.sample_rate())?;
        let host = |t: &kiln_compute::Tensor<B>| -> kiln_models::Result<Tensor> {
            let values = b.to_f32(&b.cast(t, DType::F32)?)?;
            Tensor::new(t.shape().to_vec(), values)
                .map_err(|e| kiln_models::Error::Invalid(e.to_string()))
        };
        let output = encoding.output;
        Ok(AudioEncoderOutput {
            last: host(&output.last)?,
            layers: output.states.iter().map(host).collect::<kiln_models::Result<_>>()?,
            samples: encoding.samples,
        })
    }
}
