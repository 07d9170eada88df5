//! FLUX.1's nodes on tiny random-weight files of its families (`kiln_models::synth`: the DiT, CLIP-L, T5-XXL,
//! the Flux VAE), through the executor on the CPU.

use kiln_engine::cache::CachePolicy;
use kiln_engine::exec::Outcome;
use kiln_models::family::{DiffusionFamily, TextEncoderFamily, VaeFamily};
use kiln_models::synth::{self, FluxFile, SynthDtype, SynthFamily, ZImageTurboSet};
use serde_json::{Value, json};

use crate::harness::Harness;

/// Writes the tiny FLUX.1 files under `models`, named as the templates name them.
fn write_tiny_flux(models: &std::path::Path) {
    let set = ZImageTurboSet::tiny();
    for (family, path, dtype) in [
        (
            SynthFamily::Diffusion(DiffusionFamily::Flux),
            "diffusion_models/flux1-dev.safetensors",
            SynthDtype::Bf16,
        ),
        (
            SynthFamily::Flux(FluxFile::Schnell),
            "diffusion_models/flux1-schnell.safetensors",
            SynthDtype::Bf16,
        ),
        (
            SynthFamily::TextEncoder(TextEncoderFamily::ClipL),
            "text_encoders/clip_l.safetensors",
            SynthDtype::F16,
        ),
        (
            SynthFamily::TextEncoder(TextEncoderFamily::T5Xxl),
            "text_encoders/t5xxl_fp8_e4m3fn_scaled.safetensors",
            SynthDtype::Fp8Scaled,
        ),
        (SynthFamily::Vae(VaeFamily::Flux), "vae/ae.safetensors", SynthDtype::F32),
    ] {
        synth::write_family(&models.join(path), family, &set, dtype, 9, &mut |_, _| {})
            .expect("a tiny file");
    }
}

/// The FLUX.1 dev template's graph (`flux_dev_full_text_to_image`): DualCLIPLoader type `flux`, the prompt
/// through CLIPTextEncode, ConditioningZeroOut as the negative, cfg 1, with `guidance` from FluxGuidance
/// (`None`: no FluxGuidance node, ComfyUI's default 3.5).
fn dev_graph(unet: &str, prompt: &str, guidance: Option<f64>, seed: u64) -> Value {
    let mut graph = json!({
        "46": {"class_type": "UNETLoader", "inputs": {"unet_name": unet, "weight_dtype": "default"}},
        "47": {"class_type": "DualCLIPLoader", "inputs": {"clip_name1": "clip_l.safetensors", "clip_name2": "t5xxl_fp8_e4m3fn_scaled.safetensors", "type": "flux", "device": "default"}},
        "45": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
        "49": {"class_type": "CLIPTextEncode", "inputs": {"text": prompt, "clip": ["47", 0]}},
        "52": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["49", 0]}},
        "48": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 48, "height": 32, "batch_size": 1}},
        "50": {"class_type": "KSampler", "inputs": {"seed": seed, "steps": 2, "cfg": 1, "sampler_name": "euler", "scheduler": "simple", "denoise": 1, "model": ["46", 0], "positive": ["49", 0], "negative": ["52", 0], "latent_image": ["48", 0]}},
        "51": {"class_type": "VAEDecode", "inputs": {"samples": ["50", 0], "vae": ["45", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "flux", "images": ["51", 0]}},
    });
    if let Some(g) = guidance {
        graph["35"] = json!({"class_type": "FluxGuidance", "inputs": {"conditioning": ["49", 0], "guidance": g}});
        graph["50"]["inputs"]["positive"] = json!(["35", 0]);
    }
    graph
}

/// Runs `graph` and returns the saved image's size and pixels.
fn image_of(h: &mut Harness, graph: Value) -> ((u32, u32), Vec<u8>) {
    let ran = h.run(graph);
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    let ui = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("9")];
    let image = image::open(h.roots.output.join(&ui.images[0].filename)).expect("a PNG");
    ((image.width(), image.height()), image.to_rgb8().into_raw())
}

#[test]
fn issue_22_flux_dev_text_to_image_runs_on_tiny_files() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_flux(&h.roots.input.join("models"));
    let (size, pixels) =
        image_of(&mut h, dev_graph("flux1-dev.safetensors", "a fairy tale castle", None, 3));
    assert_eq!(size, (48, 32));
    assert!(pixels.iter().any(|&p| p != pixels[0]), "the image is not one flat colour");
    // No FluxGuidance is guidance 3.5, as ComfyUI's default; another guidance changes the image.
    let (_, explicit) =
        image_of(&mut h, dev_graph("flux1-dev.safetensors", "a fairy tale castle", Some(3.5), 3));
    assert_eq!(pixels, explicit);
    let (_, other) =
        image_of(&mut h, dev_graph("flux1-dev.safetensors", "a fairy tale castle", Some(30.0), 3));
    assert_ne!(pixels, other, "the guidance steers the dev model");
    // FluxDisableGuidance leaves the guidance embedding out: neither the default nor any value.
    let mut disabled = dev_graph("flux1-dev.safetensors", "a fairy tale castle", None, 3);
    disabled["35"] =
        json!({"class_type": "FluxDisableGuidance", "inputs": {"conditioning": ["49", 0]}});
    disabled["50"]["inputs"]["positive"] = json!(["35", 0]);
    let (_, disabled) = image_of(&mut h, disabled);
    assert!(disabled != pixels && disabled != other, "the guidance embedding is left out");
    // The prompt steers it, and so does its weighting (through T5-XXL's states).
    let (_, prompt) =
        image_of(&mut h, dev_graph("flux1-dev.safetensors", "a dark forest", None, 3));
    assert_ne!(pixels, prompt);
    let (_, weighted) =
        image_of(&mut h, dev_graph("flux1-dev.safetensors", "a fairy tale (castle:1.5)", None, 3));
    assert_ne!(pixels, weighted);
}

/// schnell (`flux_schnell_full_text_to_image`): no guidance embedding, so FluxGuidance changes nothing;
/// CLIPTextEncodeFlux's two prompts each reach their encoder.
#[test]
fn issue_22_flux_schnell_ignores_guidance_and_reads_both_prompts() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_flux(&h.roots.input.join("models"));
    let (_, plain) =
        image_of(&mut h, dev_graph("flux1-schnell.safetensors", "a red boat", None, 4));
    let (_, guided) =
        image_of(&mut h, dev_graph("flux1-schnell.safetensors", "a red boat", Some(30.0), 4));
    assert_eq!(plain, guided, "schnell has no guidance embedding");
    let mut two = |clip_l: &str, t5xxl: &str| {
        let mut graph = dev_graph("flux1-schnell.safetensors", "", None, 4);
        graph["49"] = json!({"class_type": "CLIPTextEncodeFlux", "inputs": {"clip": ["47", 0], "clip_l": clip_l, "t5xxl": t5xxl, "guidance": 3.5}});
        image_of(&mut h, graph).1
    };
    let base = two("a red boat", "a red boat");
    assert_eq!(base, plain, "CLIPTextEncodeFlux with one prompt twice is CLIPTextEncode");
    assert_ne!(two("a blue car", "a red boat"), base, "CLIP-L's prompt reaches the pooled vector");
    assert_ne!(two("a red boat", "a blue car"), base, "T5-XXL's prompt reaches the states");
}

/// Text encoders that do not make FLUX.1's pair are refused naming what they are.
#[test]
fn issue_22_dual_clip_loader_names_what_it_cannot_combine() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_flux(&h.roots.input.join("models"));
    let mut fails = |clip_name1: &str, kind: &str| {
        let ran = h.run(json!({
            "1": {"class_type": "DualCLIPLoader", "inputs": {"clip_name1": clip_name1, "clip_name2": "t5xxl_fp8_e4m3fn_scaled.safetensors", "type": kind, "device": "default"}},
            "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "x", "clip": ["1", 0]}},
            "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
        }));
        let Outcome::Failed(failure) = &ran.summary.outcome else {
            panic!("expected a failure, got {:?}", ran.summary.outcome);
        };
        failure.message.clone()
    };
    let message = fails("t5xxl_fp8_e4m3fn_scaled.safetensors", "flux");
    assert!(message.contains("CLIP-L") && message.contains("T5-XXL + T5-XXL"), "{message}");
    // (Type `sd3` pairs them as SD3's encoders, as ComfyUI does; a type Kiln has no encoders for names itself.)
    let message = fails("clip_l.safetensors", "hunyuan_image");
    assert!(message.contains("type `hunyuan_image`") && message.contains("`flux`"), "{message}");
    // A type Kiln combines otherwise names what it takes.
    let message = fails("clip_l.safetensors", "hunyuan_video");
    assert!(message.contains("a CLIP-L and a LLaVA-Llama 3 8B"), "{message}");
    // One of the pair alone conditions nothing Kiln runs.
    let ran = h.run(json!({
        "1": {"class_type": "CLIPLoader", "inputs": {"clip_name": "clip_l.safetensors", "type": "stable_diffusion", "device": "default"}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "x", "clip": ["1", 0]}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }));
    let Outcome::Failed(failure) = &ran.summary.outcome else {
        panic!("expected a failure, got {:?}", ran.summary.outcome);
    };
    assert!(failure.message.contains("DualCLIPLoader"), "{}", failure.message);
}

/// FLUX.1 Fill as its outpaint template wires it (`flux_fill_outpaint_example`, without the noise mask):
/// InpaintModelConditioning's image latent and mask reach the model as its 80 extra channels, so the mask
/// steers the result; DifferentialDiffusion on the model.
#[test]
fn issue_22_flux_fill_reads_the_image_and_its_mask() {
    let mut h = Harness::new(CachePolicy::None);
    let models = h.roots.input.join("models");
    write_tiny_flux(&models);
    let set = ZImageTurboSet::tiny();
    synth::write_family(
        &models.join("diffusion_models/flux1-fill-dev.safetensors"),
        SynthFamily::Flux(FluxFile::Fill),
        &set,
        SynthDtype::Bf16,
        9,
        &mut |_, _| {},
    )
    .expect("a tiny file");
    let mut run = |mask_value: f64, noise_mask: bool| {
        let mut graph = dev_graph("flux1-fill-dev.safetensors", "a garden", Some(30.0), 6);
        graph["20"] = json!({"class_type": "EmptyImage", "inputs": {"width": 48, "height": 32, "batch_size": 1, "color": 0x336699}});
        graph["21"] = json!({"class_type": "SolidMask", "inputs": {"value": mask_value, "width": 48, "height": 32}});
        graph["22"] = json!({"class_type": "InpaintModelConditioning", "inputs": {"positive": ["35", 0], "negative": ["52", 0], "vae": ["45", 0], "pixels": ["20", 0], "mask": ["21", 0], "noise_mask": noise_mask}});
        graph["23"] = json!({"class_type": "DifferentialDiffusion", "inputs": {"model": ["46", 0], "strength": 1.0}});
        let sampler = &mut graph["50"]["inputs"];
        sampler["model"] = json!(["23", 0]);
        sampler["positive"] = json!(["22", 0]);
        sampler["negative"] = json!(["22", 1]);
        sampler["latent_image"] = json!(["22", 2]);
        image_of(&mut h, graph)
    };
    let (size, full) = run(1.0, false);
    assert_eq!(size, (48, 32));
    let (_, half) = run(0.5, false);
    assert_ne!(full, half, "the mask reaches the model");
    // With the noise mask on and nothing masked, the image is the input image through the VAE.
    let (_, kept) = run(0.0, true);
    assert_ne!(kept, full);
}

/// FLUX.1 Canny (`flux_canny_model_example`): InstructPixToPixConditioning's image latent is the model's 16
/// extra channels, so the control image steers the result.
#[test]
fn issue_22_flux_canny_reads_its_control_image() {
    let mut h = Harness::new(CachePolicy::None);
    let models = h.roots.input.join("models");
    write_tiny_flux(&models);
    synth::write_family(
        &models.join("diffusion_models/flux1-canny-dev.safetensors"),
        SynthFamily::Flux(FluxFile::Canny),
        &ZImageTurboSet::tiny(),
        SynthDtype::Bf16,
        9,
        &mut |_, _| {},
    )
    .expect("a tiny file");
    let mut run = |colour: i64| {
        let mut graph = dev_graph("flux1-canny-dev.safetensors", "a house", Some(30.0), 7);
        graph["20"] = json!({"class_type": "EmptyImage", "inputs": {"width": 48, "height": 32, "batch_size": 1, "color": colour}});
        graph["22"] = json!({"class_type": "InstructPixToPixConditioning", "inputs": {"positive": ["35", 0], "negative": ["52", 0], "vae": ["45", 0], "pixels": ["20", 0]}});
        let sampler = &mut graph["50"]["inputs"];
        sampler["positive"] = json!(["22", 0]);
        sampler["negative"] = json!(["22", 1]);
        sampler["latent_image"] = json!(["22", 2]);
        image_of(&mut h, graph).1
    };
    assert_ne!(run(0x000000), run(0xffffff), "the control image steers the result");
}

/// A FLUX.1 LoRA in diffusers' names (ai-toolkit's `transformer.` prefix) patches the fused weights' row
/// blocks: it changes the image at strength 1, and strength 0 leaves it as it was.
#[test]
fn issue_22_flux_lora_in_diffusers_names_applies() {
    let mut h = Harness::new(CachePolicy::None);
    let models = h.roots.input.join("models");
    write_tiny_flux(&models);
    synth::write_family(
        &models.join("loras/flux_lora.safetensors"),
        SynthFamily::Lora(DiffusionFamily::Flux),
        &ZImageTurboSet::tiny(),
        SynthDtype::Bf16,
        9,
        &mut |_, _| {},
    )
    .expect("a tiny file");
    let mut run = |strength: Option<f64>| {
        let mut graph = dev_graph("flux1-dev.safetensors", "a lighthouse", None, 8);
        if let Some(strength) = strength {
            graph["60"] = json!({"class_type": "LoraLoaderModelOnly", "inputs": {"model": ["46", 0], "lora_name": "flux_lora.safetensors", "strength_model": strength}});
            graph["50"]["inputs"]["model"] = json!(["60", 0]);
        }
        image_of(&mut h, graph).1
    };
    let plain = run(None);
    assert_eq!(run(Some(0.0)), plain);
    assert_ne!(run(Some(1.0)), plain, "the LoRA changes the image");
}

/// schnell's all-in-one checkpoint (`flux_schnell`): CheckpointLoaderSimple finds the DiT, pairs CLIP-L and
/// T5-XXL from their two prefixes into one CLIP, and the VAE, and the template's graph runs.
#[test]
fn issue_22_flux_schnell_checkpoint_loads_all_four_networks() {
    let mut h = Harness::new(CachePolicy::None);
    synth::write_family(
        &h.roots.input.join("models/checkpoints/flux1-schnell-fp8.safetensors"),
        SynthFamily::Flux(FluxFile::SchnellCheckpoint),
        &ZImageTurboSet::tiny(),
        SynthDtype::Fp8E4m3fn,
        9,
        &mut |_, _| {},
    )
    .expect("a tiny file");
    let ran = h.run(json!({
        "30": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "flux1-schnell-fp8.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat in a hat", "clip": ["30", 1]}},
        "33": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["30", 1]}},
        "27": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 32, "height": 32, "batch_size": 1}},
        "31": {"class_type": "KSampler", "inputs": {"seed": 1, "steps": 2, "cfg": 1, "sampler_name": "euler", "scheduler": "simple", "denoise": 1, "model": ["30", 0], "positive": ["6", 0], "negative": ["33", 0], "latent_image": ["27", 0]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["31", 0], "vae": ["30", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "schnell", "images": ["8", 0]}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
}
