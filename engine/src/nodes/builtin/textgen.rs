//! `TextGenerate` (`comfy_extras.nodes_textgen`): text from the language model a `CLIP` is made of (Qwen3-4B
//! for Z-Image and Flux.2 Klein), greedy or sampled as ComfyUI does on the CPU (`kiln_models::textgen`).
//!
//! As in ComfyUI, a Qwen3 `CLIP` puts the prompt in its chat template (Z-Image's, or FLUX.2 Klein's with thinking
//! disabled, unpadded, for a `CLIPLoader` type `flux2` or a Qwen3-8B) and ignores `image`, `video`,
//! `audio`, `thinking` and `use_default_template` (its tokenizer reads none of them); a Qwen3-VL frames it by
//! `thinking` and `use_default_template`, and the generic Qwen3-VL encoder and JoyImage's show it `image` (each
//! image of the batch through the vision tower, in the template's image slots); Krea 2's, Mage-Flow's and
//! Boogu's refuse an image (their tokenizers' image layouts for generation are not wired). The text comes back
//! as generated, a `<think>` block included.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kiln_compute::Backend;
use kiln_models::family::TextEncoderFamily;
use kiln_models::qwen_vl::VisionInput;
use kiln_models::textgen::{ChatOptions, Decoding, SamplingSettings};

use crate::compute::Compute;
use crate::models::TextEncoder;
use crate::models::device::{OnDevice, on_device};
use crate::nodes::error::node_error;
use crate::nodes::{
    Context, DYNAMIC_COMBO, DynamicOption, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec,
    OutputDef,
};
use crate::tensor::Tensor;
use crate::value::Value;

/// One generation run on the device.
struct Generate<'a> {
    clip: &'a TextEncoder,
    prompt: &'a str,
    images: &'a [VisionInput],
    chat: ChatOptions,
    max_new: usize,
    decoding: Decoding,
    on_token: &'a mut dyn FnMut(usize) -> kiln_models::Result<()>,
}

impl OnDevice for Generate<'_> {
    type Output = kiln_models::Result<String>;
    fn run<B: Backend>(self, b: &B) -> Self::Output {
        self.clip.activate()?;
        let ids = self.clip.net.generate(
            b,
            self.prompt,
            self.images,
            self.chat,
            self.max_new,
            self.decoding,
            self.on_token,
        )?;
        self.clip.net.decode(&ids)
    }
}

/// `TextGenerate`.
pub(super) struct TextGenerate {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl TextGenerate {
    pub(super) fn new(compute: Arc<Compute>) -> TextGenerate {
        let float = |name: &str, default: f64, min: f64, max: f64, step: f64| {
            InputDef::float(name, default, min, max).option("step", step)
        };
        let on = DynamicOption {
            key: "on",
            required: vec![
                float("temperature", 0.7, 0.01, 2.0, 0.000001),
                InputDef::int("top_k", 64, 0, 1000),
                float("top_p", 0.95, 0.0, 1.0, 0.01),
                float("min_p", 0.05, 0.0, 1.0, 0.01),
                float("repetition_penalty", 1.05, 0.0, 5.0, 0.01),
                InputDef::int("seed", 0, 0, 0).option("max", u64::MAX),
            ],
            optional: vec![float("presence_penalty", 0.0, 0.0, 5.0, 0.01)],
        };
        let off = DynamicOption { key: "off", required: Vec::new(), optional: Vec::new() };
        let spec = NodeSpec::new("TextGenerate", "Generate Text", "text")
            .python_module("comfy_extras.nodes_textgen")
            .v3()
            .input(InputDef::typed("clip", "CLIP"))
            .input(
                InputDef::string("prompt", "")
                    .option("multiline", true)
                    .option("dynamicPrompts", true),
            )
            .input(InputDef::int("max_length", 512, 1, 32768))
            .dynamic_combo_of(
                InputDef::bare("sampling_mode", DYNAMIC_COMBO)
                    .option("display_name", "Sampling Mode"),
                &[on, off],
            )
            .optional(InputDef::typed("image", "IMAGE"))
            .optional(InputDef::typed("video", "IMAGE").tooltip(
                "Video frames as image batch. Assumed to be 24 FPS; subsampled to 1 FPS internally.",
            ))
            .optional(InputDef::typed("audio", "AUDIO"))
            .optional(
                InputDef::bare("thinking", "BOOLEAN")
                    .tooltip("Operate in thinking mode if the model supports it.")
                    .option("default", false),
            )
            .optional(
                InputDef::bare("use_default_template", "BOOLEAN")
                    .tooltip("Use the built in system prompt/template if the model has one.")
                    .option("advanced", true)
                    .option("default", true),
            )
            .output(OutputDef::new("STRING").named("generated_text"))
            .aliases(&["LLM", "gemma"]);
        TextGenerate { spec: Arc::new(spec), compute }
    }
}

/// How the prompt is framed: `thinking` (default off) and `use_default_template` (default on).
fn chat_options(inputs: &Inputs) -> Result<ChatOptions, NodeError> {
    let flag = |name: &str, default: bool| -> Result<bool, NodeError> {
        if inputs.has(name) { inputs.bool(name) } else { Ok(default) }
    };
    let defaults = ChatOptions::default();
    Ok(ChatOptions {
        thinking: flag("thinking", defaults.thinking)?,
        default_template: flag("use_default_template", defaults.default_template)?,
    })
}

/// The decoding `sampling_mode` chose.
fn decoding(inputs: &Inputs) -> Result<Decoding, NodeError> {
    if inputs.string("sampling_mode")? != "on" {
        return Ok(Decoding::Greedy);
    }
    let float = |name: &str| -> Result<f32, NodeError> {
        Ok(inputs.float(&format!("sampling_mode.{name}"))? as f32)
    };
    let top_k = inputs.int("sampling_mode.top_k")?;
    Ok(Decoding::Sample(SamplingSettings {
        temperature: float("temperature")?,
        top_k: usize::try_from(top_k)
            .map_err(|_| NodeError::new(format!("`top_k` must be 0 or more, got {top_k}")))?,
        top_p: float("top_p")?,
        min_p: float("min_p")?,
        repetition_penalty: float("repetition_penalty")?,
        presence_penalty: if inputs.has("sampling_mode.presence_penalty") {
            float("presence_penalty")?
        } else {
            0.0
        },
        // The widget spans all of u64 (carried as its bits).
        seed: inputs.int("sampling_mode.seed")? as u64,
    }))
}

impl Node for TextGenerate {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let clip = inputs.clip("clip")?;
        // The tokenizers of Krea 2's, Mage-Flow's and Boogu's Qwen3-VL read the image (ComfyUI shows it to the
        // vision tower) in layouts Kiln does not generate with yet, so they refuse rather than ignore it; the
        // generic Qwen3-VL's and JoyImage's take it (and ignore a video, as theirs do); the others read neither.
        let images = match clip.net.family() {
            TextEncoderFamily::Krea2 | TextEncoderFamily::MageFlow | TextEncoderFamily::Boogu
                if ["image", "video"].iter().any(|name| inputs.has(name)) =>
            {
                return Err(NodeError::new(format!(
                    "TextGenerate with an image and {}'s encoder is not supported yet (Kiln generates from the \
                     prompt alone with it)",
                    clip.net.family().name()
                )));
            }
            TextEncoderFamily::Qwen3Vl | TextEncoderFamily::JoyImage if inputs.has("image") => {
                batch_vision_inputs(clip, inputs.image("image")?)?
            }
            _ => Vec::new(),
        };
        let max_length = inputs.int("max_length")?;
        let max_new = usize::try_from(max_length).ok().filter(|&n| n > 0).ok_or_else(|| {
            NodeError::new(format!("`max_length` must be positive, got {max_length}"))
        })?;
        let interrupted = AtomicBool::new(false);
        let on_token = &mut |done: usize| -> kiln_models::Result<()> {
            ctx.progress(done as f64, max_new as f64);
            if ctx.check_interrupt().is_err() {
                interrupted.store(true, Ordering::Relaxed);
                return Err(kiln_models::Error::Invalid("interrupted".to_owned()));
            }
            Ok(())
        };
        let run = Generate {
            clip,
            prompt: inputs.string("prompt")?,
            images: &images,
            chat: chat_options(inputs)?,
            max_new,
            decoding: decoding(inputs)?,
            on_token,
        };
        match on_device(self.compute.device(), run) {
            Ok(text) => Ok(NodeResult::values([Value::String(text)])),
            Err(_) if interrupted.load(Ordering::Relaxed) => Err(crate::nodes::Interrupted.into()),
            Err(e) => Err(node_error(e)),
        }
    }
}

/// Each image of `image`'s batch as `clip`'s vision tower reads it (ComfyUI's tokenizer takes the batch as
/// that many images).
fn batch_vision_inputs(clip: &TextEncoder, image: &Tensor) -> Result<Vec<VisionInput>, NodeError> {
    let &[batch, h, w, c] = image.shape() else {
        return Err(NodeError::new(format!(
            "expected an IMAGE [B, H, W, C], got {:?}",
            image.shape()
        )));
    };
    image
        .data()
        .chunks_exact(h * w * c)
        .take(batch)
        .map(|one| clip.net.vision_input(one, h, w, c).map_err(node_error))
        .collect()
}
