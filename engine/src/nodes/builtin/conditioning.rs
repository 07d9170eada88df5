//! Conditioning nodes: `CLIPTextEncode` (a prompt through the text encoder), `CLIPTextEncodeFlux` (FLUX.1's
//! two prompts), `CLIPTextEncodeLumina2` (a named system prompt before the user's), `ConditioningZeroOut`,
//! `ConditioningCombine`, and the nodes that set what rides along with a prompt (`FluxGuidance`,
//! `ReferenceLatent`, `FluxKontextMultiReferenceLatentMethod`).

use std::sync::Arc;

use kiln_compute::{Backend, DType};
use kiln_models::family::PromptTokens;
use kiln_models::qwen_vl::VisionInput;

use super::model_specs;
use super::pure::Pure;
use crate::compute::Compute;
use crate::models::device::{OnDevice, on_device};
use crate::models::{Cond, CondExtras, Conditioning, TextEncoder};
use crate::nodes::error::node_error;
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::Value;

/// What the text encoder makes of a prompt's tokens (with images where the ids have their slots): the
/// encoded prompt, its states `[1, N, D]` and pooled vector on the host.
pub(super) struct Encode<'a> {
    pub(super) clip: &'a TextEncoder,
    pub(super) tokens: &'a PromptTokens,
    pub(super) images: &'a [VisionInput],
}

impl OnDevice for Encode<'_> {
    type Output = Result<Cond, kiln_models::Error>;
    fn run<B: Backend>(self, b: &B) -> Self::Output {
        // As ComfyUI loads the encoder before it encodes: top residency priority.
        self.clip.activate()?;
        let encoded = self.clip.net.encode_with_images(b, self.tokens, self.images)?;
        let to_host = |t: &kiln_compute::Tensor<B>| -> Result<Tensor, kiln_models::Error> {
            let t = b.cast(t, DType::F32)?;
            let shape = t.shape().to_vec();
            Tensor::new(shape, b.to_f32(&t)?)
                .map_err(|e| kiln_models::Error::Invalid(e.to_string()))
        };
        let pooled = encoded.pooled.as_ref().map(to_host).transpose()?;
        let mut cond = Cond::new(to_host(&encoded.cond)?, pooled);
        cond.extras.llama = encoded.llama.as_ref().map(to_host).transpose()?;
        cond.extras.t5_tokens = encoded.t5_tokens;
        cond.extras.byt5 = encoded.byt5.as_ref().map(to_host).transpose()?;
        Ok(cond)
    }
}

/// `CLIPTextEncode`: encodes a prompt with ComfyUI's template for the family.
pub(super) struct ClipTextEncode {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl ClipTextEncode {
    pub(super) fn new(compute: Arc<Compute>) -> ClipTextEncode {
        ClipTextEncode { spec: Arc::new(model_specs::clip_text_encode()), compute }
    }
}

impl Node for ClipTextEncode {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let clip = inputs.clip("clip")?;
        let text = inputs.string("text")?;
        let tokens = clip.net.tokenize_with(text, clip.t5_options).map_err(node_error)?;
        let cond = on_device(self.compute.device(), Encode { clip, tokens: &tokens, images: &[] })
            .map_err(node_error)?;
        let conditioning = Conditioning { entries: vec![cond] };
        Ok(NodeResult::values([Value::Conditioning(Arc::new(conditioning))]))
    }
}

/// `CLIPTextEncodeFlux`: FLUX.1's two prompts, `clip_l` through CLIP-L (its pooled vector) and `t5xxl` through
/// T5-XXL (the states), with the distilled guidance set.
pub(super) struct ClipTextEncodeFlux {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl ClipTextEncodeFlux {
    pub(super) fn new(compute: Arc<Compute>) -> ClipTextEncodeFlux {
        let prompt = |name: &str| {
            InputDef::typed(name, "STRING").option("multiline", true).option("dynamicPrompts", true)
        };
        let spec =
            v3_spec("CLIPTextEncodeFlux", "", "model/conditioning/flux", "comfy_extras.nodes_flux")
                .input(InputDef::typed("clip", "CLIP"))
                .input(prompt("clip_l"))
                .input(prompt("t5xxl"))
                .input(InputDef::float("guidance", 3.5, 0.0, 100.0).option("step", 0.1))
                .output(OutputDef::new("CONDITIONING"));
        ClipTextEncodeFlux { spec: Arc::new(spec), compute }
    }
}

impl Node for ClipTextEncodeFlux {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let clip = inputs.clip("clip")?;
        let (clip_l, t5xxl) = (inputs.string("clip_l")?, inputs.string("t5xxl")?);
        let tokens =
            clip.net.tokenize_flux_with(clip_l, t5xxl, clip.t5_options).map_err(node_error)?;
        let mut cond =
            on_device(self.compute.device(), Encode { clip, tokens: &tokens, images: &[] })
                .map_err(node_error)?;
        cond.extras.guidance = Some(Some(inputs.float("guidance")?));
        let conditioning = Conditioning { entries: vec![cond] };
        Ok(NodeResult::values([Value::Conditioning(Arc::new(conditioning))]))
    }
}

/// `CLIPTextEncodeHiDream`: HiDream's four prompts, each through its own encoder (CLIP-L's and CLIP-G's for the
/// pooled vector, T5-XXL's and Llama's for the states).
pub(super) struct ClipTextEncodeHiDream {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl ClipTextEncodeHiDream {
    pub(super) fn new(compute: Arc<Compute>) -> ClipTextEncodeHiDream {
        let prompt = |name: &str| {
            InputDef::typed(name, "STRING").option("multiline", true).option("dynamicPrompts", true)
        };
        let spec = v3_spec(
            "CLIPTextEncodeHiDream",
            "CLIP Text Encode (HiDream)",
            "model/conditioning/hidream",
            "comfy_extras.nodes_hidream",
        )
        .aliases(&["hidream prompt"])
        .input(InputDef::typed("clip", "CLIP"))
        .input(prompt("clip_l"))
        .input(prompt("clip_g"))
        .input(prompt("t5xxl"))
        .input(prompt("llama"))
        .output(OutputDef::new("CONDITIONING"));
        ClipTextEncodeHiDream { spec: Arc::new(spec), compute }
    }
}

impl Node for ClipTextEncodeHiDream {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let clip = inputs.clip("clip")?;
        let prompts = [
            inputs.string("clip_l")?,
            inputs.string("clip_g")?,
            inputs.string("t5xxl")?,
            inputs.string("llama")?,
        ];
        let tokens = clip.net.tokenize_hidream(prompts, clip.t5_options).map_err(node_error)?;
        let cond = on_device(self.compute.device(), Encode { clip, tokens: &tokens, images: &[] })
            .map_err(node_error)?;
        let conditioning = Conditioning { entries: vec![cond] };
        Ok(NodeResult::values([Value::Conditioning(Arc::new(conditioning))]))
    }
}

/// `CLIPTextEncodeLumina2`: Lumina 2's system prompt (by name), ` <Prompt Start> ` and the user's prompt, encoded as
/// one prompt (ComfyUI's `comfy_extras.nodes_lumina2`).
pub(super) struct ClipTextEncodeLumina2 {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

/// Lumina 2's system prompts, by the names `CLIPTextEncodeLumina2` offers.
const LUMINA2_SYSTEM_PROMPTS: [(&str, &str); 2] = [
    (
        "superior",
        "You are an assistant designed to generate superior images with the superior degree of image-text \
         alignment based on textual prompts or user prompts.",
    ),
    (
        "alignment",
        "You are an assistant designed to generate high-quality images with the highest degree of image-text \
         alignment based on textual prompts.",
    ),
];

impl ClipTextEncodeLumina2 {
    pub(super) fn new(compute: Arc<Compute>) -> ClipTextEncodeLumina2 {
        let tooltip = format!(
            "Lumina2 provide two types of system prompts:Superior: {} Alignment: {}",
            LUMINA2_SYSTEM_PROMPTS[0].1, LUMINA2_SYSTEM_PROMPTS[1].1
        );
        let names: Vec<String> =
            LUMINA2_SYSTEM_PROMPTS.iter().map(|(n, _)| (*n).to_owned()).collect();
        let spec = v3_spec(
            "CLIPTextEncodeLumina2",
            "CLIP Text Encode (Lumina 2)",
            "model/conditioning/lumina",
            "comfy_extras.nodes_lumina2",
        )
        .description(
            "Encodes a system prompt and a user prompt using a CLIP model into an embedding that can be used to \
             guide the diffusion model towards generating specific images.",
        )
        .aliases(&["lumina prompt"])
        .input(
            InputDef::bare("system_prompt", "COMBO")
                .tooltip(&tooltip)
                .option("multiselect", false)
                .option("options", names),
        )
        .input(
            InputDef::bare("user_prompt", "STRING")
                .tooltip("The text to be encoded.")
                .option("multiline", true)
                .option("dynamicPrompts", true),
        )
        .input(
            InputDef::typed("clip", "CLIP").tooltip("The CLIP model used for encoding the text."),
        )
        .output(OutputDef::new("CONDITIONING").tooltip(
            "A conditioning containing the embedded text used to guide the diffusion model.",
        ));
        ClipTextEncodeLumina2 { spec: Arc::new(spec), compute }
    }
}

impl Node for ClipTextEncodeLumina2 {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let clip = inputs.clip("clip")?;
        let name = inputs.string("system_prompt")?;
        let Some((_, system)) = LUMINA2_SYSTEM_PROMPTS.iter().find(|(n, _)| *n == name) else {
            return Err(NodeError::new(format!(
                "`system_prompt` must be `superior` or `alignment`, got `{name}`"
            )));
        };
        let prompt = format!("{system} <Prompt Start> {}", inputs.string("user_prompt")?);
        let tokens = clip.net.tokenize_with(&prompt, clip.t5_options).map_err(node_error)?;
        let cond = on_device(self.compute.device(), Encode { clip, tokens: &tokens, images: &[] })
            .map_err(node_error)?;
        let conditioning = Conditioning { entries: vec![cond] };
        Ok(NodeResult::values([Value::Conditioning(Arc::new(conditioning))]))
    }
}

/// `T5TokenizerOptions`: the CLIP with its T5 tokens (T5-XXL's, umT5-XXL's) padded after the end token by
/// `min_padding` and to at least `min_length` (ComfyUI's `t5xxl_min_padding` / `t5xxl_min_length` tokenizer options
/// and their umT5 twins; 0 is a setting too: `min_length` 0 drops FLUX.1's padding to 256 and Wan's to 512).
pub(super) fn t5_tokenizer_options() -> Pure {
    Pure::new(
        v3_spec(
            "T5TokenizerOptions",
            "T5 Tokenizer Options",
            "model/conditioning",
            "comfy_extras.nodes_cond",
        )
        .experimental()
        .input(InputDef::typed("clip", "CLIP"))
        .input(InputDef::int("min_padding", 0, 0, 10000).option("step", 1))
        .input(InputDef::int("min_length", 0, 0, 10000).option("step", 1))
        .output(OutputDef::new("CLIP")),
        |inputs| {
            let count = |name: &str| -> Result<usize, NodeError> {
                usize::try_from(inputs.int(name)?)
                    .map_err(|_| NodeError::new(format!("`{name}` must be 0 or more")))
            };
            let mut clip = TextEncoder::clone(inputs.clip("clip")?);
            clip.t5_options = kiln_models::family::T5Options {
                min_padding: Some(count("min_padding")?),
                min_length: Some(count("min_length")?),
            };
            Ok(vec![Value::Clip(Arc::new(clip))])
        },
    )
}

/// `ConditioningZeroOut`: the same conditioning with every tensor zeroed (same shapes, so the same token
/// count as the prompt it came from).
pub(super) struct ConditioningZeroOut(Arc<NodeSpec>);

impl ConditioningZeroOut {
    pub(super) fn new() -> ConditioningZeroOut {
        ConditioningZeroOut(Arc::new(model_specs::conditioning_zero_out()))
    }
}

impl Node for ConditioningZeroOut {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let zero = |t: &Tensor| Tensor::full(t.shape().to_vec(), 0.0);
        let entries = inputs
            .conditioning("conditioning")?
            .entries
            .iter()
            .map(|c| Cond { cond: zero(&c.cond), pooled: c.pooled.as_ref().map(zero), ..c.clone() })
            .collect();
        Ok(NodeResult::values([Value::Conditioning(Arc::new(Conditioning { entries }))]))
    }
}

/// `ConditioningCombine`: both lists in one (the sampler averages their predictions).
pub(super) struct ConditioningCombine(Arc<NodeSpec>);

impl ConditioningCombine {
    pub(super) fn new() -> ConditioningCombine {
        ConditioningCombine(Arc::new(model_specs::conditioning_combine()))
    }
}

impl Node for ConditioningCombine {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let mut entries = inputs.conditioning("conditioning_1")?.entries.clone();
        entries.extend(inputs.conditioning("conditioning_2")?.entries.iter().cloned());
        Ok(NodeResult::values([Value::Conditioning(Arc::new(Conditioning { entries }))]))
    }
}

/// A V3 conditioning node of `module`.
fn v3_spec(name: &str, display: &str, category: &str, module: &str) -> NodeSpec {
    NodeSpec::new(name, display, category).python_module(module).v3()
}

/// The conditioning with `set` applied to each entry's extras, as the one output.
fn set_extras(inputs: &Inputs, set: impl Fn(&mut CondExtras)) -> Result<Vec<Value>, NodeError> {
    let conditioning = inputs.conditioning("conditioning")?.with_extras(set);
    Ok(vec![Value::Conditioning(Arc::new(conditioning))])
}

/// The nodes that set values riding along with a conditioning (`comfy_extras.nodes_flux`,
/// `comfy_extras.nodes_edit_model`), in ComfyUI's registration order.
pub(super) fn extras_nodes() -> Vec<Pure> {
    const FLUX: &str = "comfy_extras.nodes_flux";
    vec![
        Pure::new(
            v3_spec("FluxGuidance", "", "model/conditioning/flux", FLUX)
                .input(InputDef::typed("conditioning", "CONDITIONING"))
                .input(InputDef::float("guidance", 3.5, 0.0, 100.0).option("step", 0.1))
                .output(OutputDef::new("CONDITIONING")),
            |inputs| {
                let guidance = inputs.float("guidance")?;
                set_extras(inputs, |e| e.guidance = Some(Some(guidance)))
            },
        ),
        Pure::new(
            v3_spec("FluxDisableGuidance", "", "model/conditioning/flux", FLUX)
                .description(
                    "This node completely disables the guidance embed on Flux and Flux like models",
                )
                .input(InputDef::typed("conditioning", "CONDITIONING"))
                .output(OutputDef::new("CONDITIONING")),
            |inputs| set_extras(inputs, |e| e.guidance = Some(None)),
        ),
        Pure::new(
            v3_spec(
                "FluxKontextMultiReferenceLatentMethod",
                "Edit Model Reference Method",
                "model/conditioning/flux",
                FLUX,
            )
            .experimental()
            .input(InputDef::typed("conditioning", "CONDITIONING"))
            .input(
                InputDef::bare("reference_latents_method", "COMBO")
                    .option("advanced", true)
                    .option("multiselect", false)
                    .option("options", vec!["offset", "index", "uxo/uno", "index_timestep_zero"]),
            )
            .output(OutputDef::new("CONDITIONING")),
            |inputs| {
                let method = match inputs.string("reference_latents_method")? {
                    // As ComfyUI: both spellings of the UXO/UNO method are one.
                    m if m.contains("uxo") || m.contains("uso") => "uxo",
                    m => m,
                }
                .to_owned();
                set_extras(inputs, |e| e.reference_latents_method = Some(method.clone()))
            },
        ),
        Pure::new(
            v3_spec(
                "ReferenceLatent",
                "Set Reference Latent",
                "model/conditioning",
                "comfy_extras.nodes_edit_model",
            )
            .description(
                "This node sets the guiding latent for an edit model. If the model supports it you can \
                 chain multiple to set multiple reference images.",
            )
            .input(InputDef::typed("conditioning", "CONDITIONING"))
            .optional(InputDef::typed("latent", "LATENT"))
            .output(OutputDef::new("CONDITIONING")),
            |inputs| match inputs.get("latent") {
                Some(Value::Latent(latent)) => {
                    let samples = latent.samples.clone();
                    set_extras(inputs, |e| e.reference_latents.push(samples.clone()))
                }
                _ => Ok(vec![Value::Conditioning(inputs.conditioning("conditioning")?.clone())]),
            },
        ),
    ]
}
