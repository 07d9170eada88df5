//! The model loaders: `UNETLoader`, `CLIPLoader` (and its multi-file kin), `VAELoader`,
//! `CheckpointLoaderSimple` and the LoRA loaders. Each lists the files of its model folder in its combo and
//! loads the chosen one through the memory manager; the output cache keeps the loaded model, so a second
//! prompt with the same file reads nothing from disk.

use std::path::PathBuf;
use std::sync::Arc;

use kiln_compute::DType;
use kiln_models::family::PIXEL_SPACE_NAME;

use super::model_specs;
use crate::models::{ModelEnv, load};
use crate::nodes::error::node_error;
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef,
};
use crate::value::Value;

/// The path of a file chosen in a loader's combo.
pub(super) fn find(
    env: &ModelEnv,
    folder: &str,
    inputs: &Inputs,
    input: &str,
) -> Result<PathBuf, NodeError> {
    let name = inputs.string(input)?;
    env.files.find(folder, name).ok_or_else(|| {
        NodeError::of_kind(
            ErrorKind::FileNotFound,
            format!("`{name}` is not in the {folder} folder (anymore)"),
        )
    })
}

/// Load progress, in bytes, as the node's progress bar.
pub(super) fn progress(ctx: &Context) -> impl FnMut(u64, u64) + '_ {
    |done, total| {
        if total > 0 {
            ctx.progress(done as f64, total as f64);
        }
    }
}

/// `UNETLoader`: a diffusion model from `diffusion_models/`.
pub(super) struct UnetLoader(pub(super) ModelEnv);

impl Node for UnetLoader {
    fn spec(&self) -> Arc<NodeSpec> {
        Arc::new(model_specs::unet_loader(self.0.files.list("diffusion_models")))
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let path = find(&self.0, "diffusion_models", inputs, "unet_name")?;
        // As ComfyUI, the weights are stored in this dtype. `fp8_e4m3fn_fast` is stored the same way; ComfyUI
        // also multiplies in fp8 where the GPU can, while Kiln widens fp8 weights a layer at a time.
        let weight_dtype = match inputs.string("weight_dtype")? {
            "default" => None,
            "fp8_e4m3fn" | "fp8_e4m3fn_fast" => Some(DType::F8E4M3),
            "fp8_e5m2" => Some(DType::F8E5M2),
            other => {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!(
                        "weight_dtype `{other}` is not one of default, fp8_e4m3fn, fp8_e4m3fn_fast, fp8_e5m2"
                    ),
                ));
            }
        };
        let model = load::load_diffusion_model(&self.0, &path, weight_dtype, &mut progress(ctx))
            .map_err(node_error)?;
        Ok(NodeResult::values([Value::Model(Arc::new(model))]))
    }
}

/// `CLIPLoader`: a text encoder from `text_encoders/`.
pub(super) struct ClipLoader(pub(super) ModelEnv);

impl Node for ClipLoader {
    fn spec(&self) -> Arc<NodeSpec> {
        Arc::new(model_specs::clip_loader(self.0.files.list("text_encoders")))
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let path = find(&self.0, "text_encoders", inputs, "clip_name")?;
        let kind = inputs.string("type")?;
        let clip = load::load_text_encoder(&self.0, &path, kind, &mut progress(ctx))
            .map_err(node_error)?;
        Ok(NodeResult::values([Value::Clip(Arc::new(clip))]))
    }
}

/// `VAELoader`: a VAE from `vae/`.
pub(super) struct VaeLoader(pub(super) ModelEnv);

impl Node for VaeLoader {
    fn spec(&self) -> Arc<NodeSpec> {
        let mut names = self.0.files.list("vae");
        names.push(PIXEL_SPACE_NAME.to_owned());
        Arc::new(model_specs::vae_loader(names))
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        if inputs.string("vae_name")? == PIXEL_SPACE_NAME {
            let vae = load::pixel_space_vae(&self.0).map_err(node_error)?;
            return Ok(NodeResult::values([Value::Vae(Arc::new(vae))]));
        }
        let path = find(&self.0, "vae", inputs, "vae_name")?;
        let vae = load::load_vae(&self.0, &path, &mut progress(ctx)).map_err(node_error)?;
        Ok(NodeResult::values([Value::Vae(Arc::new(vae))]))
    }
}

/// `CheckpointLoaderSimple`: model, text encoder and VAE from one file in `checkpoints/`.
pub(super) struct CheckpointLoaderSimple(pub(super) ModelEnv);

impl Node for CheckpointLoaderSimple {
    fn spec(&self) -> Arc<NodeSpec> {
        Arc::new(model_specs::checkpoint_loader_simple(self.0.files.list("checkpoints")))
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let path = find(&self.0, "checkpoints", inputs, "ckpt_name")?;
        let (model, clip, vae) =
            load::load_checkpoint(&self.0, &path, &mut progress(ctx)).map_err(node_error)?;
        let missing = |what: &str| {
            NodeError::new(format!(
                "{} holds no {what}; load one with its own loader node",
                path.display()
            ))
        };
        let clip = clip.ok_or_else(|| missing("text encoder"))?;
        let vae = vae.ok_or_else(|| missing("VAE"))?;
        Ok(NodeResult::values([
            Value::Model(Arc::new(model)),
            Value::Clip(Arc::new(clip)),
            Value::Vae(Arc::new(vae)),
        ]))
    }
}

/// `LoraLoader`: the model and the text encoder with a LoRA from `loras/` applied to their weights (in place,
/// while they run; the unpatched ones stay usable by other nodes).
pub(super) struct LoraLoader(pub(super) ModelEnv);

impl Node for LoraLoader {
    fn spec(&self) -> Arc<NodeSpec> {
        Arc::new(model_specs::lora_loader(self.0.files.list("loras")))
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let model = inputs.model("model")?;
        let clip = inputs.clip("clip")?;
        let strength_model = inputs.float("strength_model")? as f32;
        let strength_clip = inputs.float("strength_clip")? as f32;
        if strength_model == 0.0 && strength_clip == 0.0 {
            // As ComfyUI: both strengths 0 are the inputs themselves, the file unread.
            return Ok(NodeResult::values([
                Value::Model(model.clone()),
                Value::Clip(clip.clone()),
            ]));
        }
        let path = find(&self.0, "loras", inputs, "lora_name")?;
        let (model, clip) =
            load::load_lora_for_both(model, clip, &path, strength_model, strength_clip)
                .map_err(node_error)?;
        Ok(NodeResult::values([Value::Model(Arc::new(model)), Value::Clip(Arc::new(clip))]))
    }
}

/// `LoraLoaderModelOnly`: the model with a LoRA from `loras/` applied to its weights (in place, while it
/// samples; the unpatched model stays usable by other nodes).
pub(super) struct LoraLoaderModelOnly(pub(super) ModelEnv);

impl Node for LoraLoaderModelOnly {
    fn spec(&self) -> Arc<NodeSpec> {
        Arc::new(model_specs::lora_loader_model_only(self.0.files.list("loras")))
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let model = inputs.model("model")?;
        let strength = inputs.float("strength_model")? as f32;
        if strength == 0.0 {
            // As ComfyUI: strength 0 is the model itself, the file unread.
            return Ok(NodeResult::values([Value::Model(model.clone())]));
        }
        let path = find(&self.0, "loras", inputs, "lora_name")?;
        let lora = load::load_lora(model, &path, strength).map_err(node_error)?;
        Ok(NodeResult::values([Value::Model(Arc::new(lora))]))
    }
}

/// The `type` choices of `DualCLIPLoader`, in ComfyUI's order.
const DUAL_CLIP_TYPES: [&str; 12] = [
    "sdxl",
    "sd3",
    "flux",
    "hunyuan_video",
    "hidream",
    "hunyuan_image",
    "hunyuan_video_15",
    "kandinsky5",
    "kandinsky5_image",
    "ltxv",
    "newbie",
    "ace",
];

/// Which multi-file text-encoder loader.
#[derive(Clone, Copy)]
pub(super) enum MultiClip {
    /// `DualCLIPLoader` (`nodes.py`): two files and a `type`.
    Dual,
    /// `TripleCLIPLoader` (`comfy_extras.nodes_sd3`): SD3's three.
    Triple,
    /// `QuadrupleCLIPLoader` (`comfy_extras.nodes_hidream`): HiDream's four.
    Quadruple,
}

/// A text encoder made of several files of `text_encoders/`.
pub(super) struct MultiClipLoader {
    env: ModelEnv,
    kind: MultiClip,
}

impl MultiClipLoader {
    pub(super) fn new(env: ModelEnv, kind: MultiClip) -> MultiClipLoader {
        MultiClipLoader { env, kind }
    }

    /// The file inputs.
    fn inputs(&self) -> &'static [&'static str] {
        match self.kind {
            MultiClip::Dual => &["clip_name1", "clip_name2"],
            MultiClip::Triple => &["clip_name1", "clip_name2", "clip_name3"],
            MultiClip::Quadruple => &["clip_name1", "clip_name2", "clip_name3", "clip_name4"],
        }
    }
}

impl Node for MultiClipLoader {
    fn spec(&self) -> Arc<NodeSpec> {
        let files = self.env.files.list("text_encoders");
        let refs: Vec<&str> = files.iter().map(String::as_str).collect();
        let v3 = |name: &str, display: &str, module: &str, description: &str| {
            let mut spec = NodeSpec::new(name, display, "model/loaders")
                .python_module(module)
                .v3()
                .description(description);
            for input in self.inputs() {
                spec = spec.input(InputDef::v3_combo(input, &refs));
            }
            spec
        };
        let spec = match self.kind {
            MultiClip::Dual => NodeSpec::new("DualCLIPLoader", "Load CLIP (Dual)", "model/loaders")
                .description(
                    "Recipes:\nsdxl: clip-l, clip-g\nsd3: clip-l, clip-g / clip-l, t5 / clip-g, t5\n\
                     flux: clip-l, t5\nhidream: at least one of t5 or llama, recommended t5 and llama\n\
                     hunyuan_image: qwen2.5vl 7b and byt5 small\nnewbie: gemma-3-4b-it, jina clip v2",
                )
                .input(InputDef::choices("clip_name1", &refs))
                .input(InputDef::choices("clip_name2", &refs))
                .input(InputDef::choices("type", &DUAL_CLIP_TYPES))
                .optional(InputDef::choices("device", &["default", "cpu"]).option("advanced", true)),
            MultiClip::Triple => v3(
                "TripleCLIPLoader",
                "Load CLIP (Triple)",
                "comfy_extras.nodes_sd3",
                "Recipes:\nsd3: clip-l, clip-g, t5",
            ),
            MultiClip::Quadruple => v3(
                "QuadrupleCLIPLoader",
                "Load CLIP (Quadruple)",
                "comfy_extras.nodes_hidream",
                "Recipes:\nhidream: long clip-l, long clip-g, t5xxl, llama_8b_3.1_instruct",
            ),
        };
        Arc::new(spec.output(OutputDef::new("CLIP")).shared_between_partitions())
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let paths = self
            .inputs()
            .iter()
            .map(|input| find(&self.env, "text_encoders", inputs, input))
            .collect::<Result<Vec<_>, _>>()?;
        let kind = match self.kind {
            MultiClip::Dual => inputs.string("type")?,
            MultiClip::Triple => "sd3",
            MultiClip::Quadruple => "hidream",
        };
        let clip = load::load_text_encoders(&self.env, &paths, kind, &mut progress(ctx))
            .map_err(node_error)?;
        Ok(NodeResult::values([Value::Clip(Arc::new(clip))]))
    }
}
