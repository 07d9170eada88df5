//! The autoregressive video nodes (`comfy_extras.nodes_ar_video`) for causal Wan models (Causal Forcing,
//! Self-Forcing): `EmptyARVideoLatent`, `SamplerARVideo` (the `ar_video` sampler, run by the sampler nodes with
//! the model's cache: see `sampler.rs`) and `ARVideoI2V`, which encodes a start image that the sampler shows
//! the model first.

use std::sync::Arc;

use kiln_models::sampling::{Sampler, SamplerChoice, SamplerSettings};

use super::pure::Pure;
use super::resize::resize;
use super::vae::encode_video;
use super::wan::{WAN21_CHANNELS, latent_frames, size};
use crate::compute::Compute;
use crate::models::DiffusionModel;
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// ComfyUI's module of these nodes.
const MODULE: &str = "comfy_extras.nodes_ar_video";

/// The inputs `EmptyARVideoLatent` and `ARVideoI2V` share, in their order: the video's size and batch.
fn video_inputs(spec: NodeSpec) -> NodeSpec {
    let side = |name: &str, default: i64| InputDef::int(name, default, 16, 8192).option("step", 16);
    spec.input(side("width", 832))
        .input(side("height", 480))
        .input(InputDef::int("length", 81, 1, 1024).option("step", 4))
        .input(InputDef::int("batch_size", 1, 1, 64))
}

/// The zero latent `[batch_size, 16, ⌊(length − 1)/4⌋ + 1, height/8, width/8]` both nodes make.
fn zero_latent(inputs: &Inputs) -> Result<Latent, NodeError> {
    let (width, height) = (size(inputs, "width")?, size(inputs, "height")?);
    let (length, batch) = (size(inputs, "length")?, size(inputs, "batch_size")?);
    let shape = vec![batch, WAN21_CHANNELS, latent_frames(length), height / 8, width / 8];
    Ok(Latent::new(Tensor::full(shape, 0.0)))
}

/// `EmptyARVideoLatent` and `SamplerARVideo`, which compute from their inputs alone.
pub(super) fn builders() -> Vec<Pure> {
    vec![
        Pure::new(
            video_inputs(
                NodeSpec::new("EmptyARVideoLatent", "", "model/latent/autoregressive")
                    .python_module(MODULE)
                    .v3(),
            )
            .output(OutputDef::new("LATENT")),
            |inputs| Ok(vec![Value::Latent(zero_latent(inputs)?)]),
        ),
        Pure::new(
            NodeSpec::new("SamplerARVideo", "Sampler AR Video", "model/sampling/samplers")
                .python_module(MODULE)
                .v3()
                .input(
                    InputDef::bare("num_frame_per_block", "INT")
                        .tooltip(
                            "Frames per autoregressive block. 1 = framewise, 3 = chunkwise. Must match the \
                             checkpoint's training mode.",
                        )
                        .option("default", 1)
                        .option("min", 1)
                        .option("max", 64),
                )
                .output(OutputDef::new("SAMPLER")),
            |inputs| {
                let frames_per_block = size(inputs, "num_frame_per_block")?.max(1);
                let settings = SamplerSettings { frames_per_block, ..SamplerSettings::default() };
                Ok(vec![Value::Sampler(SamplerChoice { sampler: Sampler::ArVideo, settings })])
            },
        ),
    ]
}

/// `ARVideoI2V`: the start image (its first), resized to the video's size (bilinear, centre crop), encoded and
/// given to the model for the `ar_video` sampler; a zero latent of the video.
pub(super) struct ArVideoI2v {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl ArVideoI2v {
    pub(super) fn new(compute: Arc<Compute>) -> ArVideoI2v {
        let spec = NodeSpec::new("ARVideoI2V", "", "model/conditioning/autoregressive")
            .python_module(MODULE)
            .v3()
            .input(InputDef::typed("model", "MODEL"))
            .input(InputDef::typed("vae", "VAE"))
            .input(InputDef::typed("start_image", "IMAGE"));
        let spec =
            video_inputs(spec).output(OutputDef::new("MODEL")).output(OutputDef::new("LATENT"));
        ArVideoI2v { spec: Arc::new(spec), compute }
    }
}

impl Node for ArVideoI2v {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let model = inputs.model("model")?;
        let vae = inputs.vae("vae")?;
        let image = inputs.image("start_image")?;
        let (width, height) = (size(inputs, "width")?, size(inputs, "height")?);
        let first = super::wan::frame_range(image, ..1)?;
        let start = resize(&first, width, height, "bilinear", true)?;
        let encoded = encode_video(&self.compute, vae, &start, ctx)?;
        let patched =
            DiffusionModel { ar_start: Some(Arc::new(encoded)), ..model.as_ref().clone() };
        Ok(NodeResult::values([
            Value::Model(Arc::new(patched)),
            Value::Latent(zero_latent(inputs)?),
        ]))
    }
}
