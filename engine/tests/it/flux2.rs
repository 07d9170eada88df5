//! FLUX.2 Klein's templates on tiny random-weight files of its families (`kiln_models::synth`: the DiT, the Qwen3
//! encoder through CLIPLoader type `flux2`, the FLUX.2 VAE), through the executor on the CPU.

use kiln_engine::cache::CachePolicy;
use kiln_engine::exec::Outcome;
use kiln_models::family::{DiffusionFamily, TextEncoderFamily, VaeFamily};
use kiln_models::synth::{self, SynthDtype, SynthFamily, ZImageTurboSet};
use serde_json::{Value, json};

use crate::harness::Harness;

/// Writes the tiny FLUX.2 Klein files under `models`, named as the templates name them.
fn write_tiny_klein(models: &std::path::Path) {
    let set = ZImageTurboSet::tiny();
    for (family, path, dtype) in [
        (
            SynthFamily::Diffusion(DiffusionFamily::Flux2),
            "diffusion_models/flux-2-klein-4b-fp8.safetensors",
            SynthDtype::Fp8E4m3fn,
        ),
        (
            SynthFamily::TextEncoder(TextEncoderFamily::Qwen3),
            "text_encoders/qwen_3_4b.safetensors",
            SynthDtype::Bf16,
        ),
        (SynthFamily::Vae(VaeFamily::Flux2), "vae/flux2-vae.safetensors", SynthDtype::F32),
    ] {
        synth::write_family(&models.join(path), family, &set, dtype, 9, &mut |_, _| {})
            .expect("a tiny file");
    }
}

/// The Klein text-to-image template's graph (`image_flux2_klein_text_to_image`, the distilled subgraph):
/// CLIPLoader type `flux2`, ConditioningZeroOut as the negative, CFGGuider, EmptyFlux2LatentImage and
/// Flux2Scheduler at the image's size, euler through SamplerCustomAdvanced.
fn klein_graph(prompt: &str, cfg: f64, steps: u64, seed: u64) -> Value {
    json!({
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "flux-2-klein-4b-fp8.safetensors", "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_3_4b.safetensors", "type": "flux2", "device": "default"}},
        "3": {"class_type": "VAELoader", "inputs": {"vae_name": "flux2-vae.safetensors"}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": prompt, "clip": ["2", 0]}},
        "5": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["4", 0]}},
        "6": {"class_type": "EmptyFlux2LatentImage", "inputs": {"width": 64, "height": 48, "batch_size": 1}},
        "7": {"class_type": "Flux2Scheduler", "inputs": {"steps": steps, "width": 64, "height": 48}},
        "8": {"class_type": "CFGGuider", "inputs": {"model": ["1", 0], "positive": ["4", 0], "negative": ["5", 0], "cfg": cfg}},
        "10": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "11": {"class_type": "RandomNoise", "inputs": {"noise_seed": seed}},
        "12": {"class_type": "SamplerCustomAdvanced", "inputs": {"noise": ["11", 0], "guider": ["8", 0], "sampler": ["10", 0], "sigmas": ["7", 0], "latent_image": ["6", 0]}},
        "13": {"class_type": "VAEDecode", "inputs": {"samples": ["12", 0], "vae": ["3", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "klein", "images": ["13", 0]}},
    })
}

/// `graph` as the Klein edit templates make it: an image encoded by the VAE and given to both conditionings
/// by ReferenceLatent.
fn with_reference(mut graph: Value, colour: u32) -> Value {
    graph["20"] = json!({"class_type": "EmptyImage", "inputs": {"width": 32, "height": 48, "batch_size": 1, "color": colour}});
    graph["21"] =
        json!({"class_type": "VAEEncode", "inputs": {"pixels": ["20", 0], "vae": ["3", 0]}});
    graph["22"] = json!({"class_type": "ReferenceLatent", "inputs": {"conditioning": ["4", 0], "latent": ["21", 0]}});
    graph["23"] = json!({"class_type": "ReferenceLatent", "inputs": {"conditioning": ["5", 0], "latent": ["21", 0]}});
    graph["8"]["inputs"]["positive"] = json!(["22", 0]);
    graph["8"]["inputs"]["negative"] = json!(["23", 0]);
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

/// Runs `graph` with its sampled latent saved by `SaveLatent` and returns the latent's values: finer than the
/// 8-bit image where a tiny model's effect is small.
fn latent_of(h: &mut Harness, mut graph: Value) -> Vec<f32> {
    graph["40"] = json!({"class_type": "SaveLatent", "inputs": {"samples": ["12", 0], "filename_prefix": "latents/klein"}});
    let ran = h.run(graph);
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    let saved = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("40")].named;
    let file = h.roots.output.join("latents").join(&saved[0].1[0].filename);
    let bytes = std::fs::read(file).expect("the latent file");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let tensor = st.tensor("latent_tensor").expect("latent_tensor");
    assert_eq!(tensor.dtype(), safetensors::Dtype::F32);
    tensor.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn issue_22_flux2_klein_text_to_image_runs_on_tiny_files() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_klein(&h.roots.input.join("models"));
    let (size, pixels) = image_of(&mut h, klein_graph("a lighthouse at dusk", 1.0, 2, 5));
    assert_eq!(size, (64, 48));
    assert!(pixels.iter().any(|&p| p != pixels[0]), "the image is not one flat colour");
    let (_, other) = image_of(&mut h, klein_graph("a field of sunflowers", 1.0, 2, 5));
    assert_ne!(pixels, other, "the prompt steers the model");
    // The base model's CFG 5 with the zeroed negative is another image.
    let (_, guided) = image_of(&mut h, klein_graph("a lighthouse at dusk", 5.0, 2, 5));
    assert_ne!(pixels, guided, "CFG combines two predictions");
}

/// The edit templates: a reference image through ReferenceLatent steers the result, and FluxKVCache stores its
/// keys and values on the first step (so a one-step run equals `index_timestep_zero` without the cache) and
/// replays them on the later ones. The cached and recomputed reference differ little in a tiny random model, so
/// those two are compared as sampled latents.
#[test]
fn issue_22_flux2_klein_edits_with_a_reference_and_the_kv_cache() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_klein(&h.roots.input.join("models"));
    let (_, plain) = image_of(&mut h, klein_graph("make it blue", 1.0, 2, 6));
    let (size, red) =
        image_of(&mut h, with_reference(klein_graph("make it blue", 1.0, 2, 6), 0xcc2200));
    assert_eq!(size, (64, 48));
    assert_ne!(plain, red, "the reference image reaches the model");
    let (_, green) =
        image_of(&mut h, with_reference(klein_graph("make it blue", 1.0, 2, 6), 0x22cc00));
    assert_ne!(red, green, "the reference's content matters");

    let kv = |steps: u64| {
        let mut graph = with_reference(klein_graph("make it blue", 1.0, steps, 6), 0xcc2200);
        graph["30"] = json!({"class_type": "FluxKVCache", "inputs": {"model": ["1", 0]}});
        graph["8"]["inputs"]["model"] = json!(["30", 0]);
        graph
    };
    let timestep_zero = |steps: u64| {
        let mut graph = with_reference(klein_graph("make it blue", 1.0, steps, 6), 0xcc2200);
        graph["31"] = json!({"class_type": "FluxKontextMultiReferenceLatentMethod", "inputs": {"conditioning": ["22", 0], "reference_latents_method": "index_timestep_zero"}});
        graph["8"]["inputs"]["positive"] = json!(["31", 0]);
        graph
    };
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    let one_step_kv = bits(latent_of(&mut h, kv(1)));
    let one_step_zero = bits(latent_of(&mut h, timestep_zero(1)));
    assert_eq!(
        one_step_kv, one_step_zero,
        "the first call is an ordinary index_timestep_zero call"
    );
    let two_step_kv = latent_of(&mut h, kv(2));
    let two_step_zero = latent_of(&mut h, timestep_zero(2));
    let largest =
        two_step_kv.iter().zip(&two_step_zero).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    // In the tiny model only the blocks after the first see a reference that attended to the noisy image, so
    // the effect is small (about 2e-5) but far above rounding; without the cache's effect it would be 0.
    assert!(largest > 1e-6, "the second call attends to the stored keys and values ({largest})");
}

/// A FLUX.2 LoRA in diffusers' names (the double blocks' split q/k/v, the single blocks' fused projection)
/// patches the DiT through LoraLoaderModelOnly; strength 0 leaves it as it was.
#[test]
fn issue_22_flux2_lora_in_diffusers_names_applies() {
    let mut h = Harness::new(CachePolicy::None);
    let models = h.roots.input.join("models");
    write_tiny_klein(&models);
    synth::write_family(
        &models.join("loras/klein_style.safetensors"),
        SynthFamily::Lora(DiffusionFamily::Flux2),
        &ZImageTurboSet::tiny(),
        SynthDtype::F32,
        4,
        &mut |_, _| {},
    )
    .expect("a tiny LoRA");
    let with_lora = |strength: f64| {
        let mut graph = klein_graph("a quiet harbour", 1.0, 2, 7);
        graph["40"] = json!({"class_type": "LoraLoaderModelOnly", "inputs": {"model": ["1", 0], "lora_name": "klein_style.safetensors", "strength_model": strength}});
        graph["8"]["inputs"]["model"] = json!(["40", 0]);
        graph
    };
    let (_, plain) = image_of(&mut h, klein_graph("a quiet harbour", 1.0, 2, 7));
    let (_, zero) = image_of(&mut h, with_lora(0.0));
    let (_, full) = image_of(&mut h, with_lora(1.0));
    assert_eq!(plain, zero, "strength 0 changes nothing");
    assert_ne!(plain, full, "the LoRA reaches the weights");
}

/// FLUX.2 dev's templates (`image_flux2_text_to_image`, `image_flux2`): the Mistral Small encoder through
/// CLIPLoader type `flux2` (its Tekken tokenizer read from the file), FluxGuidance into the guidance embedding
/// (no FluxGuidance: ComfyUI's default 3.5), BasicGuider, and a reference image.
#[test]
fn issue_22_flux2_dev_runs_on_its_mistral_encoder_with_guidance_and_a_reference() {
    let mut h = Harness::new(CachePolicy::None);
    let models = h.roots.input.join("models");
    write_tiny_klein(&models);
    let set = ZImageTurboSet::tiny();
    for (family, path) in [
        (
            SynthFamily::Flux2(synth::Flux2File::Dev),
            "diffusion_models/flux2_dev_fp8mixed.safetensors",
        ),
        (
            SynthFamily::TextEncoder(TextEncoderFamily::Mistral3),
            "text_encoders/mistral_3_small_flux2_bf16.safetensors",
        ),
    ] {
        synth::write_family(&models.join(path), family, &set, SynthDtype::Bf16, 9, &mut |_, _| {})
            .expect("a tiny file");
    }
    let dev = |prompt: &str, guidance: Option<f64>| {
        let mut graph = klein_graph(prompt, 1.0, 2, 8);
        graph["1"]["inputs"]["unet_name"] = json!("flux2_dev_fp8mixed.safetensors");
        graph["2"]["inputs"]["clip_name"] = json!("mistral_3_small_flux2_bf16.safetensors");
        graph["8"] = json!({"class_type": "BasicGuider", "inputs": {"model": ["1", 0], "conditioning": ["4", 0]}});
        if let Some(g) = guidance {
            graph["30"] = json!({"class_type": "FluxGuidance", "inputs": {"conditioning": ["4", 0], "guidance": g}});
            graph["8"]["inputs"]["conditioning"] = json!(["30", 0]);
        }
        graph
    };
    let (size, pixels) = image_of(&mut h, dev("a red kite over the dunes", None));
    assert_eq!(size, (64, 48));
    assert!(pixels.iter().any(|&p| p != pixels[0]), "the image is not one flat colour");
    let (_, explicit) = image_of(&mut h, dev("a red kite over the dunes", Some(3.5)));
    assert_eq!(pixels, explicit, "no FluxGuidance is guidance 3.5");
    let (_, four) = image_of(&mut h, dev("a red kite over the dunes", Some(4.0)));
    assert_ne!(pixels, four, "the guidance embedding steers dev");
    let (_, other) = image_of(&mut h, dev("a blue boat on a lake", Some(4.0)));
    assert_ne!(four, other, "the prompt steers it through Mistral's hidden states");
    let mut edit = dev("make it night", Some(4.0));
    edit["20"] = json!({"class_type": "EmptyImage", "inputs": {"width": 32, "height": 32, "batch_size": 1, "color": 0x2266aa}});
    edit["21"] =
        json!({"class_type": "VAEEncode", "inputs": {"pixels": ["20", 0], "vae": ["3", 0]}});
    edit["22"] = json!({"class_type": "ReferenceLatent", "inputs": {"conditioning": ["30", 0], "latent": ["21", 0]}});
    edit["8"]["inputs"]["conditioning"] = json!(["22", 0]);
    let (_, edited) = image_of(&mut h, edit);
    let (_, unedited) = image_of(&mut h, dev("make it night", Some(4.0)));
    assert_ne!(edited, unedited, "the reference reaches dev");
}

/// An empty latent made for an 8× VAE (EmptySD3LatentImage, EmptyLatentImage) given to FLUX.2 becomes the
/// 16× latent of the same image size, as ComfyUI's `fix_empty_latent_channels` resizes it: the image keeps the
/// size asked for.
#[test]
fn issue_22_flux2_fits_an_eighth_scale_empty_latent_to_its_sixteenth() {
    let mut h = Harness::new(CachePolicy::None);
    write_tiny_klein(&h.roots.input.join("models"));
    for (node, channels_note) in [("EmptySD3LatentImage", "16"), ("EmptyLatentImage", "4")] {
        let mut graph = klein_graph("a lighthouse at dusk", 1.0, 2, 5);
        graph["6"] =
            json!({"class_type": node, "inputs": {"width": 64, "height": 48, "batch_size": 1}});
        let (size, _) = image_of(&mut h, graph);
        assert_eq!(size, (64, 48), "{node} ({channels_note} channels at 1/8)");
    }
}
