//! The declarations of the model nodes of ComfyUI's default Z-Image workflow (loaders, text encoding,
//! conditioning, latents, samplers, VAE), exactly as ComfyUI's `/object_info` serves them.
//!
//! Only the declarations live here; the nodes' execution lives with the nodes. Lists that depend on the
//! installation (model files, the samplers and schedulers Kiln implements) are the caller's: each function
//! declares exactly the choices it is given, in the order given.
//!
//! Source: ComfyUI `nodes.py` (V1 classes, `python_module` `nodes`), `comfy_extras/nodes_model_advanced.py` and
//! `comfy_extras/nodes_sd3.py` (a V3 class), checked against the golden captures of `KSampler` and
//! `CheckpointLoaderSimple`. Display names come from `NODE_DISPLAY_NAME_MAPPINGS`; a V1 class without one shows
//! its class name.

use crate::nodes::{InputDef, NodeSpec, OutputDef};

/// ComfyUI's `MAX_RESOLUTION`.
const MAX_RESOLUTION: i64 = 16384;

/// The `type` choices of `CLIPLoader`, in ComfyUI's order.
const CLIP_TYPES: [&str; 28] = [
    "stable_diffusion",
    "stable_cascade",
    "sd3",
    "stable_audio",
    "mochi",
    "ltxv",
    "pixart",
    "cosmos",
    "lumina2",
    "wan",
    "hidream",
    "chroma",
    "ace",
    "omnigen2",
    "qwen_image",
    "hunyuan_image",
    "flux2",
    "ovis",
    "longcat_image",
    "cogvideox",
    "lens",
    "pixeldit",
    "ideogram4",
    "boogu",
    "krea2",
    "joyimage",
    "mage",
    "minimax",
];

/// The description of `CLIPLoader`: which text encoder files each `type` expects.
const CLIP_LOADER_DESCRIPTION: &str = "Recipes:\n\
sd: clip-l\n\
stable cascade: clip-g\n\
sd3: t5 xxl / clip-g / clip-l\n\
stable audio: t5 base\n\
mochi: t5 xxl\n\
cogvideox: t5 xxl (226-token padding)\n\
cosmos: old t5 xxl\n\
lumina2: gemma 2 2B\n\
wan: umt5 xxl\n\
hidream: llama-3.1 (Recommend) or t5\n\
omnigen2: qwen vl 2.5 3B\n\
joyimage: qwen3-vl 8B\n\
lens: gpt-oss-20b\n\
pixeldit: gemma 2 2B elm\n\
minimax: MiniMax H3 Qwen3-VL or Music3 Qwen/RVQ";

/// A legacy combo of owned choices (`[[choices], {...}]`).
fn choices(name: &str, list: &[String]) -> InputDef {
    let refs: Vec<&str> = list.iter().map(String::as_str).collect();
    InputDef::choices(name, &refs)
}

/// The seed input of the samplers: `INT` over all of u64, with the frontend's "control after generate" widget.
fn seed(name: &str) -> InputDef {
    InputDef::int(name, 0, 0, 0).option("max", u64::MAX).option("control_after_generate", true)
}

/// The `cfg` input of the samplers.
fn cfg() -> InputDef {
    InputDef::float("cfg", 8.0, 0.0, 100.0).option("step", 0.1).option("round", 0.01)
}

/// `UNETLoader` ("Load Diffusion Model"): a diffusion model file of `diffusion_models` (`files`, sorted by the
/// caller) and the weight dtype.
pub(crate) fn unet_loader(files: Vec<String>) -> NodeSpec {
    NodeSpec::new("UNETLoader", "Load Diffusion Model", "model/loaders")
        .input(choices("unet_name", &files))
        .input(
            InputDef::choices(
                "weight_dtype",
                &["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"],
            )
            .option("advanced", true),
        )
        .output(OutputDef::new("MODEL"))
        .shared_between_partitions()
}

/// `CLIPLoader` ("Load CLIP"): a text encoder file of `text_encoders` (`files`), its `type` and the optional
/// `device`.
pub(crate) fn clip_loader(files: Vec<String>) -> NodeSpec {
    NodeSpec::new("CLIPLoader", "Load CLIP", "model/loaders")
        .description(CLIP_LOADER_DESCRIPTION)
        .input(choices("clip_name", &files))
        .input(InputDef::choices("type", &CLIP_TYPES))
        .optional(InputDef::choices("device", &["default", "cpu"]).option("advanced", true))
        .output(OutputDef::new("CLIP"))
        .shared_between_partitions()
}

/// `VAELoader` ("Load VAE"). ComfyUI lists the `vae` files, then tiny-autoencoder files of `vae_approx`, then
/// `pixel_space`; Kiln lists only what it can load, so the caller passes the `vae` folder's files (sorted) and
/// `pixel_space` (no tiny autoencoders).
pub(crate) fn vae_loader(files: Vec<String>) -> NodeSpec {
    NodeSpec::new("VAELoader", "Load VAE", "model/loaders")
        .input(choices("vae_name", &files))
        .output(OutputDef::new("VAE"))
        .shared_between_partitions()
}

/// `CheckpointLoaderSimple` ("Load Checkpoint"): a file of `checkpoints` (`files`); outputs MODEL, CLIP, VAE.
pub(crate) fn checkpoint_loader_simple(files: Vec<String>) -> NodeSpec {
    NodeSpec::new("CheckpointLoaderSimple", "Load Checkpoint", "model/loaders")
        .description(
            "Loads a diffusion model checkpoint, diffusion models are used to denoise latents.",
        )
        .input(choices("ckpt_name", &files).tooltip("The name of the checkpoint (model) to load."))
        .output(OutputDef::new("MODEL").tooltip("The model used for denoising latents."))
        .output(OutputDef::new("CLIP").tooltip("The CLIP model used for encoding text prompts."))
        .output(OutputDef::new("VAE").tooltip(
            "The VAE model used for encoding and decoding images to and from latent space.",
        ))
        .aliases(&["load model", "checkpoint", "model loader", "load checkpoint", "ckpt", "model"])
        .shared_between_partitions()
}

/// `LoraLoaderModelOnly` ("Load LoRA"): a LoRA file of `loras` (`files`) applied to a MODEL. ComfyUI's class
/// inherits `LoraLoader`'s two output tooltips (for one output) and its essentials section; both are served.
pub(crate) fn lora_loader_model_only(files: Vec<String>) -> NodeSpec {
    NodeSpec::new("LoraLoaderModelOnly", "Load LoRA", "model/loaders")
        .description(
            "This LoRAs loader is used to modify the diffusion model, altering the way in which latents are \
             denoised such as applying styles. Multiple LoRA nodes can be linked together.",
        )
        .input(InputDef::typed("model", "MODEL"))
        .input(choices("lora_name", &files))
        .input(InputDef::float("strength_model", 1.0, -100.0, 100.0).option("step", 0.01))
        .output(OutputDef::new("MODEL").tooltip("The modified diffusion model."))
        .extra_output_tooltips(&["The modified CLIP model."])
        .aliases(&["lora", "load lora", "apply lora", "lora loader", "lora model"])
        .essentials("Image Generation")
}

/// `LoraLoader` ("Load LoRA (Model and CLIP)"): a LoRA file of `loras` (`files`) applied to a MODEL and a CLIP.
pub(crate) fn lora_loader(files: Vec<String>) -> NodeSpec {
    let strength = |name: &str, tooltip: &str| {
        InputDef::float(name, 1.0, -100.0, 100.0).option("step", 0.01).tooltip(tooltip)
    };
    NodeSpec::new("LoraLoader", "Load LoRA (Model and CLIP)", "model/loaders")
        .description(
            "This LoRA loader is used to modify both diffusion and CLIP models, altering the way in which \
             latents are denoised such as applying styles. Multiple LoRA nodes can be linked together.",
        )
        .input(
            InputDef::typed("model", "MODEL")
                .tooltip("The diffusion model the LoRA will be applied to."),
        )
        .input(InputDef::typed("clip", "CLIP").tooltip("The CLIP model the LoRA will be applied to."))
        .input(choices("lora_name", &files).tooltip("The name of the LoRA."))
        .input(strength(
            "strength_model",
            "How strongly to modify the diffusion model. This value can be negative.",
        ))
        .input(strength(
            "strength_clip",
            "How strongly to modify the CLIP model. This value can be negative.",
        ))
        .output(OutputDef::new("MODEL").tooltip("The modified diffusion model."))
        .output(OutputDef::new("CLIP").tooltip("The modified CLIP model."))
        .aliases(&["lora", "load lora", "apply lora", "lora loader", "lora model"])
        .essentials("Image Generation")
}

/// `ModelSamplingAuraFlow` (no display name mapping): sets the flow shift of a MODEL.
pub(crate) fn model_sampling_aura_flow() -> NodeSpec {
    NodeSpec::new("ModelSamplingAuraFlow", "ModelSamplingAuraFlow", "model/patch")
        .python_module("comfy_extras.nodes_model_advanced")
        .input(InputDef::typed("model", "MODEL"))
        .input(InputDef::float("shift", 1.73, 0.0, 100.0).option("step", 0.01))
        .output(OutputDef::new("MODEL"))
}

/// `CLIPTextEncode` ("CLIP Text Encode (Prompt)"): a prompt encoded by a CLIP into CONDITIONING.
pub(crate) fn clip_text_encode() -> NodeSpec {
    NodeSpec::new("CLIPTextEncode", "CLIP Text Encode (Prompt)", "model/conditioning")
        .description(
            "Encodes a text prompt using a CLIP model into an embedding that can be used to guide the \
             diffusion model towards generating specific images.",
        )
        .input(
            InputDef::typed("text", "STRING")
                .option("multiline", true)
                .option("dynamicPrompts", true)
                .tooltip("The text to be encoded."),
        )
        .input(
            InputDef::typed("clip", "CLIP").tooltip("The CLIP model used for encoding the text."),
        )
        .output(OutputDef::new("CONDITIONING").tooltip(
            "A conditioning containing the embedded text used to guide the diffusion model.",
        ))
        .aliases(&[
            "text",
            "prompt",
            "text prompt",
            "positive prompt",
            "negative prompt",
            "encode text",
            "text encoder",
            "encode prompt",
        ])
}

/// `ConditioningZeroOut` ("Conditioning Zero Out"): the conditioning with its tensors zeroed.
pub(crate) fn conditioning_zero_out() -> NodeSpec {
    NodeSpec::new("ConditioningZeroOut", "Conditioning Zero Out", "model/conditioning/transform")
        .input(InputDef::typed("conditioning", "CONDITIONING"))
        .output(OutputDef::new("CONDITIONING"))
        .aliases(&["null conditioning", "clear conditioning"])
}

/// `ConditioningCombine` ("Conditioning (Combine)"): both conditionings, one after the other.
pub(crate) fn conditioning_combine() -> NodeSpec {
    NodeSpec::new("ConditioningCombine", "Conditioning (Combine)", "model/conditioning/transform")
        .input(InputDef::typed("conditioning_1", "CONDITIONING"))
        .input(InputDef::typed("conditioning_2", "CONDITIONING"))
        .output(OutputDef::new("CONDITIONING"))
        .aliases(&[
            "combine",
            "merge conditioning",
            "combine prompts",
            "merge prompts",
            "mix prompts",
            "add prompt",
        ])
        .essentials("Image Generation")
}

/// `EmptySD3LatentImage`, a V3 node without a display name: zeros `[B, 16, H/8, W/8]`.
pub(crate) fn empty_sd3_latent_image() -> NodeSpec {
    NodeSpec::new("EmptySD3LatentImage", "", "model/latent/stable diffusion")
        .v3()
        .python_module("comfy_extras.nodes_sd3")
        .input(InputDef::int("width", 1024, 16, MAX_RESOLUTION).option("step", 16))
        .input(InputDef::int("height", 1024, 16, MAX_RESOLUTION).option("step", 16))
        .input(InputDef::int("batch_size", 1, 1, 4096))
        .output(OutputDef::new("LATENT"))
}

/// `KSampler`: denoises a latent. `samplers` and `schedulers` are the choices Kiln implements, in ComfyUI's
/// order.
pub(crate) fn ksampler(samplers: &[&str], schedulers: &[&str]) -> NodeSpec {
    NodeSpec::new("KSampler", "KSampler", "model/sampling")
        .description(
            "Uses the provided model, positive and negative conditioning to denoise the latent image.",
        )
        .input(
            InputDef::typed("model", "MODEL")
                .tooltip("The model used for denoising the input latent."),
        )
        .input(seed("seed").tooltip("The random seed used for creating the noise."))
        .input(
            InputDef::int("steps", 20, 1, 10000)
                .tooltip("The number of steps used in the denoising process."),
        )
        .input(cfg().tooltip(
            "The Classifier-Free Guidance scale balances creativity and adherence to the prompt. Higher \
             values result in images more closely matching the prompt however too high values will \
             negatively impact quality.",
        ))
        .input(InputDef::choices("sampler_name", samplers).tooltip(
            "The algorithm used when sampling, this can affect the quality, speed, and style of the \
             generated output.",
        ))
        .input(
            InputDef::choices("scheduler", schedulers)
                .tooltip("The scheduler controls how noise is gradually removed to form the image."),
        )
        .input(InputDef::typed("positive", "CONDITIONING").tooltip(
            "The conditioning describing the attributes you want to include in the image.",
        ))
        .input(InputDef::typed("negative", "CONDITIONING").tooltip(
            "The conditioning describing the attributes you want to exclude from the image.",
        ))
        .input(InputDef::typed("latent_image", "LATENT").tooltip("The latent image to denoise."))
        .input(InputDef::float("denoise", 1.0, 0.0, 1.0).option("step", 0.01).tooltip(
            "The amount of denoising applied, lower values will maintain the structure of the initial \
             image allowing for image to image sampling.",
        ))
        .output(OutputDef::new("LATENT").tooltip("The denoised latent."))
        .aliases(&["sampler", "sample", "generate", "denoise", "diffuse", "txt2img", "img2img"])
}

/// `KSamplerAdvanced` ("KSampler (Advanced)"): `KSampler` with noise and step-range controls. `samplers` and
/// `schedulers` as for [`ksampler`].
pub(crate) fn ksampler_advanced(samplers: &[&str], schedulers: &[&str]) -> NodeSpec {
    NodeSpec::new("KSamplerAdvanced", "KSampler (Advanced)", "model/sampling")
        .input(InputDef::typed("model", "MODEL"))
        .input(InputDef::choices("add_noise", &["enable", "disable"]).option("advanced", true))
        .input(seed("noise_seed"))
        .input(InputDef::int("steps", 20, 1, 10000))
        .input(cfg())
        .input(InputDef::choices("sampler_name", samplers))
        .input(InputDef::choices("scheduler", schedulers))
        .input(InputDef::typed("positive", "CONDITIONING"))
        .input(InputDef::typed("negative", "CONDITIONING"))
        .input(InputDef::typed("latent_image", "LATENT"))
        .input(InputDef::int("start_at_step", 0, 0, 10000).option("advanced", true))
        .input(InputDef::int("end_at_step", 10000, 0, 10000).option("advanced", true))
        .input(
            InputDef::choices("return_with_leftover_noise", &["disable", "enable"])
                .option("advanced", true),
        )
        .output(OutputDef::new("LATENT"))
}

/// `VAEDecode` ("VAE Decode"): a LATENT decoded into an IMAGE.
pub(crate) fn vae_decode() -> NodeSpec {
    NodeSpec::new("VAEDecode", "VAE Decode", "model/latent")
        .description("Decodes latent images back into pixel space images.")
        .input(InputDef::typed("samples", "LATENT").tooltip("The latent to be decoded."))
        .input(InputDef::typed("vae", "VAE").tooltip("The VAE model used for decoding the latent."))
        .output(OutputDef::new("IMAGE").tooltip("The decoded image."))
        .aliases(&["decode", "decode latent", "latent to image", "render latent"])
}

/// `VAEEncode` ("VAE Encode"): an IMAGE encoded into a LATENT.
pub(crate) fn vae_encode() -> NodeSpec {
    NodeSpec::new("VAEEncode", "VAE Encode", "model/latent")
        .input(InputDef::typed("pixels", "IMAGE"))
        .input(InputDef::typed("vae", "VAE"))
        .output(OutputDef::new("LATENT"))
        .aliases(&["encode", "encode image", "image to latent"])
}

#[cfg(test)]
mod tests;
