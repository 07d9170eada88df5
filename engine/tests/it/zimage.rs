//! The Z-Image-Turbo nodes on tiny random-weight files (the released keys and structure, `kiln_models::synth`),
//! through the executor on the CPU: the stages of `KSamplerAdvanced` compose, a checkpoint gives what the three
//! files give, LoRA patches apply to one model and not its unpatched twin, fp8 files run, image-to-image runs,
//! progress comes per step and an interrupt stops the sampler within a step, and files Kiln cannot run are
//! refused by name.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kiln_engine::cache::CachePolicy;
use kiln_engine::exec::{Event, EventSink, Outcome, Run};
use kiln_engine::nodes::{PreviewFormat, PreviewMethod};
use kiln_models::synth::{self, SynthDtype, ZImageTurboSet};
use serde_json::{Value, json};

use crate::harness::{Harness, Ran};

/// A harness whose model folders hold the tiny files in `dtype`.
fn harness(dtype: SynthDtype) -> Harness {
    let h = Harness::new(CachePolicy::Classic);
    let models = h.roots.input.join("models");
    synth::write_models_dir(&models, &ZImageTurboSet::tiny(), dtype, 3, &mut |_, _| {})
        .expect("tiny files");
    h
}

/// The default graph up to the sampler's latent (models.md §1.1), at 32² — `sampler` is the KSampler node.
fn graph(sampler: Value) -> Value {
    json!({
        "62": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_3_4b.safetensors", "type": "lumina2", "device": "default"}},
        "63": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
        "66": {"class_type": "UNETLoader", "inputs": {"unet_name": "z_image_turbo_bf16.safetensors", "weight_dtype": "default"}},
        "67": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse at dusk", "clip": ["62", 0]}},
        "71": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["67", 0]}},
        "68": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 32, "height": 32, "batch_size": 1}},
        "69": {"class_type": "ModelSamplingAuraFlow", "inputs": {"shift": 3, "model": ["66", 0]}},
        "70": sampler,
        "65": {"class_type": "VAEDecode", "inputs": {"samples": ["70", 0], "vae": ["63", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "z", "images": ["65", 0]}},
    })
}

fn ksampler(seed: u64, steps: u32, sampler: &str) -> Value {
    json!({"class_type": "KSampler", "inputs": {"seed": seed, "steps": steps, "cfg": 1, "sampler_name": sampler, "scheduler": "simple", "denoise": 1, "model": ["69", 0], "positive": ["67", 0], "negative": ["71", 0], "latent_image": ["68", 0]}})
}

/// The RGB bytes of the image node 9 saved.
fn saved(h: &Harness, ran: &Ran) -> Vec<u8> {
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    let ui = &ran.summary.outputs[&kiln_engine::graph::NodeId::from("9")];
    let path = h.roots.output.join(&ui.images[0].filename);
    image::open(&path).expect("a PNG").to_rgb8().into_raw()
}

/// The largest difference between two images, in 8-bit steps.
fn max_diff(a: &[u8], b: &[u8]) -> u8 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).max().unwrap_or(0)
}

#[test]
fn issue_11_the_default_graph_runs_and_its_stages_compose() {
    let mut h = harness(SynthDtype::Bf16);
    let one = h.run(graph(ksampler(5, 4, "euler")));
    let whole = saved(&h, &one);
    assert_eq!(whole.len(), 32 * 32 * 3);
    let progress: Vec<(f64, f64)> = one
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Progress { node, value, max } if node.0 == "70" => Some((*value, *max)),
            _ => None,
        })
        .collect();
    assert_eq!(progress, [(1.0, 4.0), (2.0, 4.0), (3.0, 4.0), (4.0, 4.0)], "one event per step");

    // Steps 0–2 with the noise left in, then 2–4 without adding noise: the same image as 4 steps at once.
    let mut staged = graph(
        json!({"class_type": "KSamplerAdvanced", "inputs": {"add_noise": "disable", "noise_seed": 0, "steps": 4, "cfg": 1, "sampler_name": "euler", "scheduler": "simple", "start_at_step": 2, "end_at_step": 10000, "return_with_leftover_noise": "disable", "model": ["69", 0], "positive": ["67", 0], "negative": ["71", 0], "latent_image": ["72", 0]}}),
    );
    staged["72"] = json!({"class_type": "KSamplerAdvanced", "inputs": {"add_noise": "enable", "noise_seed": 5, "steps": 4, "cfg": 1, "sampler_name": "euler", "scheduler": "simple", "start_at_step": 0, "end_at_step": 2, "return_with_leftover_noise": "enable", "model": ["69", 0], "positive": ["67", 0], "negative": ["71", 0], "latent_image": ["68", 0]}});
    let two = h.run(staged);
    assert!(max_diff(&saved(&h, &two), &whole) <= 1, "two stages give the one-stage image");

    // Another seed gives another image; the same seed the same one.
    let other = h.run(graph(ksampler(6, 4, "euler")));
    assert!(max_diff(&saved(&h, &other), &whole) > 1);
}

#[test]
fn issue_11_every_sampler_and_scheduler_runs() {
    let mut h = harness(SynthDtype::Bf16);
    for sampler in kiln_models::sampling::Sampler::ALL.map(|s| s.name()) {
        let ran = h.run(graph(ksampler(1, 2, sampler)));
        assert_eq!(ran.summary.outcome, Outcome::Success, "{sampler}: {:?}", ran.summary.outcome);
    }
    for scheduler in kiln_models::sampling::Scheduler::ALL.map(|s| s.name()) {
        let mut node = ksampler(1, 2, "euler");
        node["inputs"]["scheduler"] = json!(scheduler);
        let ran = h.run(graph(node));
        assert_eq!(ran.summary.outcome, Outcome::Success, "{scheduler}: {:?}", ran.summary.outcome);
    }
}

#[test]
fn issue_11_a_checkpoint_gives_what_the_three_files_give() {
    let mut h = harness(SynthDtype::Bf16);
    let checkpoints = h.roots.input.join("models/checkpoints");
    std::fs::create_dir_all(&checkpoints).expect("dir");
    synth::write_checkpoint(
        &checkpoints.join("z.safetensors"),
        &ZImageTurboSet::tiny(),
        SynthDtype::Bf16,
        3,
        &mut |_, _| {},
    )
    .expect("a checkpoint");
    let separate = h.run(graph(ksampler(9, 2, "res_multistep")));
    let separate = saved(&h, &separate);
    let mut combined = graph(ksampler(9, 2, "res_multistep"));
    combined["1"] =
        json!({"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "z.safetensors"}});
    combined["69"]["inputs"]["model"] = json!(["1", 0]);
    combined["67"]["inputs"]["clip"] = json!(["1", 1]);
    combined["65"]["inputs"]["vae"] = json!(["1", 2]);
    let ran = h.run(combined);
    // The checkpoint's VAE is the same values in bf16 (the separate one is f32).
    assert!(max_diff(&saved(&h, &ran), &separate) <= 3);
}

#[test]
fn issue_11_fp8_files_run() {
    for dtype in [SynthDtype::Fp8E4m3fn, SynthDtype::Fp8E5m2] {
        let mut h = harness(dtype);
        let ran = h.run(graph(ksampler(2, 2, "res_multistep")));
        assert_eq!(saved(&h, &ran).len(), 32 * 32 * 3, "{dtype}");
    }
}

#[test]
fn issue_11_image_to_image_runs_from_an_encoded_image() {
    let mut h = harness(SynthDtype::Bf16);
    let mut prompt = graph(ksampler(4, 2, "euler"));
    prompt["80"] = json!({"class_type": "EmptyImage", "inputs": {"width": 36, "height": 28, "batch_size": 1, "color": 0x336699}});
    prompt["81"] =
        json!({"class_type": "VAEEncode", "inputs": {"pixels": ["80", 0], "vae": ["63", 0]}});
    prompt["70"]["inputs"]["latent_image"] = json!(["81", 0]);
    prompt["70"]["inputs"]["denoise"] = json!(0.5);
    let ran = h.run(prompt);
    // 36×28 is cropped to 32×24 before encoding.
    assert_eq!(saved(&h, &ran).len(), 32 * 24 * 3);
}

/// Writes a safetensors file of `(name, safetensors dtype, shape, little-endian bytes)` tensors.
fn write_safetensors(path: &std::path::Path, tensors: &[(&str, &str, &[usize], &[u8])]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let range = [data.len(), data.len() + bytes.len()];
        header.insert(
            (*name).to_owned(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": range}),
        );
        data.extend_from_slice(bytes);
    }
    let mut header = serde_json::to_vec(&header).expect("json");
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header);
    bytes.extend(data);
    std::fs::write(path, bytes).expect("write a safetensors file");
}

/// Writes a LoRA on the first main block's attention output, kohya-named, as a safetensors file.
fn write_lora(path: &std::path::Path, dim: usize) {
    let rank = 2;
    let values = |n: usize, seed: u32| lora_values(n, seed, 0.5);
    write_safetensors(
        path,
        &[
            (
                "lora_unet_layers_0_attention_out.lora_up.weight",
                "F32",
                &[dim, rank],
                &values(dim * rank, 1),
            ),
            (
                "lora_unet_layers_0_attention_out.lora_down.weight",
                "F32",
                &[rank, dim],
                &values(rank * dim, 2),
            ),
        ],
    );
}

#[test]
fn issue_11_a_lora_changes_its_model_and_not_the_unpatched_one() {
    let mut h = harness(SynthDtype::Bf16);
    let loras = h.roots.input.join("models/loras");
    std::fs::create_dir_all(&loras).expect("dir");
    write_lora(&loras.join("style.safetensors"), ZImageTurboSet::tiny().zimage.dim);
    let plain = h.run(graph(ksampler(8, 2, "euler")));
    let plain = saved(&h, &plain);

    let with_lora = |strength: f64| {
        let mut prompt = graph(ksampler(8, 2, "euler"));
        prompt["90"] = json!({"class_type": "LoraLoaderModelOnly", "inputs": {"model": ["66", 0], "lora_name": "style.safetensors", "strength_model": strength}});
        prompt["69"]["inputs"]["model"] = json!(["90", 0]);
        prompt
    };
    let zero = h.run(with_lora(0.0));
    assert_eq!(max_diff(&saved(&h, &zero), &plain), 0, "strength 0 is the model itself");
    let patched = h.run(with_lora(1.0));
    assert!(max_diff(&saved(&h, &patched), &plain) > 1, "the LoRA changes the image");

    // The unpatched model, from the cache, samples without the patches again.
    let mut again = graph(ksampler(8, 2, "euler"));
    again["70"]["inputs"]["denoise"] = json!(0.99995);
    let again = h.run(again);
    assert!(max_diff(&saved(&h, &again), &plain) <= 1, "the plain model is unpatched");
}

#[test]
fn issue_11_an_interrupt_stops_the_sampler_within_a_step() {
    struct InterruptAtStep(Arc<std::sync::atomic::AtomicBool>, std::sync::Mutex<Vec<Event>>);
    impl EventSink for InterruptAtStep {
        fn emit(&self, _: &str, event: Event) {
            if matches!(&event, Event::Progress { node, value, .. } if node.0 == "70" && *value >= 2.0)
            {
                self.0.store(true, Ordering::SeqCst);
            }
            self.1.lock().expect("events").push(event);
        }
    }
    let mut h = harness(SynthDtype::Bf16);
    let prompt = h.validate(graph(ksampler(1, 50, "euler")));
    let sink = Arc::new(InterruptAtStep(h.executor.interrupt_flag(), Default::default()));
    let run = Run {
        prompt_id: "p",
        prompt: &prompt,
        prompt_json: Arc::new(prompt.prompt.to_json()),
        extra_pnginfo: Arc::new(json!(null)),
        preview_method: PreviewMethod::None,
        scope: None,
    };
    let summary = h.executor.run(&run, sink.clone());
    assert!(
        matches!(&summary.outcome, Outcome::Interrupted { node, .. } if node.0 == "70"),
        "{:?}",
        summary.outcome
    );
    let steps = sink
        .1
        .lock()
        .expect("events")
        .iter()
        .filter(|e| matches!(e, Event::Progress { node, .. } if node.0 == "70"))
        .count();
    assert_eq!(steps, 2, "the step under way when the interrupt came was the last");
}

/// A safetensors file of one tensor of a dtype Kiln does not compute with.
fn write_int8_file(path: &std::path::Path) {
    write_safetensors(path, &[("x_embedder.weight", "I8", &[4, 4], &[0u8; 16])]);
}

#[test]
fn issue_11_files_kiln_cannot_run_are_refused_by_name() {
    let mut h = harness(SynthDtype::Bf16);
    let dir = h.roots.input.join("models/diffusion_models");
    write_int8_file(&dir.join("int8_mixed.safetensors"));
    write_safetensors(
        &dir.join("t5.safetensors"),
        &[("encoder.block.0.layer.0.SelfAttention.q.weight", "F32", &[1], &[0u8; 4])],
    );
    std::fs::write(dir.join("model.gguf"), b"GGUF....").expect("write");
    std::fs::write(dir.join("truncated.safetensors"), [200u8, 0, 0, 0, 0, 0, 0, 0, b'{'])
        .expect("write");
    for (file, expect) in [
        ("int8_mixed.safetensors", "I8"),
        ("t5.safetensors", "T5 text encoder"),
        ("model.gguf", "GGUF"),
        ("truncated.safetensors", "truncated.safetensors"),
        ("../vae/ae.safetensors", "ae.safetensors"),
    ] {
        let mut prompt = graph(ksampler(1, 1, "euler"));
        prompt["66"]["inputs"]["unet_name"] = json!(file);
        let prompt = kiln_engine::graph::Prompt::from_json(&prompt).expect("an object");
        let Ok(validated) = kiln_engine::graph::validate(&prompt, &h.registry, None) else {
            // A name outside the folder's list is a validation error (value_not_in_list).
            assert!(file.starts_with(".."), "{file} should pass validation");
            continue;
        };
        let ran = h.run_validated(&validated, json!(null));
        let Outcome::Failed(failure) = &ran.summary.outcome else {
            panic!("{file}: {:?}", ran.summary.outcome)
        };
        assert_eq!(failure.node.0, "66");
        assert!(failure.message.contains(expect), "{file}: {}", failure.message);
    }
}

#[test]
fn issue_11_a_64_bit_seed_is_accepted_and_only_its_low_32_bits_make_the_noise() {
    // The seed widget spans 0..2^64; torch seeds its CPU generator with the low 32 bits.
    let mut h = harness(SynthDtype::Bf16);
    let low = h.run(graph(ksampler(u64::from(u32::MAX), 2, "euler")));
    let low = saved(&h, &low);
    let high = h.run(graph(ksampler(u64::MAX, 2, "euler")));
    assert_eq!(max_diff(&saved(&h, &high), &low), 0);
}

#[test]
fn issue_11_latent_previews_come_once_a_step_as_jpegs_when_asked_for() {
    let mut h = harness(SynthDtype::Bf16);
    let prompt = h.validate(graph(ksampler(1, 3, "euler")));
    let previews_with = |h: &mut Harness, method: PreviewMethod| {
        let recorder = Arc::new(crate::harness::Recorder::default());
        let run = Run {
            prompt_id: "p",
            prompt: &prompt,
            prompt_json: Arc::new(prompt.prompt.to_json()),
            extra_pnginfo: Arc::new(json!(null)),
            preview_method: method,
            scope: None,
        };
        let summary = h.executor.run(&run, recorder.clone());
        assert_eq!(summary.outcome, Outcome::Success, "{:?}", summary.outcome);
        let events = recorder.events.lock().expect("events").clone();
        events
            .into_iter()
            .filter_map(|e| match e {
                Event::Preview { node, preview } if node.0 == "70" => Some(preview),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let previews = previews_with(&mut h, PreviewMethod::Latent2Rgb);
    assert_eq!(previews.len(), 3, "one preview per step");
    for preview in &previews {
        assert_eq!(preview.format, PreviewFormat::Jpeg);
        let image = image::load_from_memory(&preview.bytes).expect("a JPEG");
        // At latent resolution: 32² pixels → a 4×4 latent.
        assert_eq!((image.width(), image.height()), (4, 4));
    }
    h.executor.cache_mut().clear();
    assert!(previews_with(&mut h, PreviewMethod::None).is_empty(), "none unless asked for");
}

/// The diffusion model file of `h` with every tensor rounded to fp8 e4m3fn, written as `z_fp8.safetensors`.
fn write_fp8_copy(h: &Harness) {
    use kiln_compute::DType;
    use kiln_compute::memory::SafetensorsFile;
    let dir = h.roots.input.join("models/diffusion_models");
    let file = SafetensorsFile::open(dir.join("z_image_turbo_bf16.safetensors")).expect("the DiT");
    let fp8: Vec<(String, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .map(|(name, info)| {
            let bytes = file.source().read_vec(info.offset, info.len).expect("read");
            let values = kiln_compute::dtype::widen(info.dtype, &bytes);
            (
                name.to_owned(),
                info.shape.clone(),
                kiln_compute::dtype::narrow(DType::F8E4M3, &values),
            )
        })
        .collect();
    let tensors: Vec<(&str, &str, &[usize], &[u8])> = fp8
        .iter()
        .map(|(n, shape, b)| (n.as_str(), "F8_E4M3", shape.as_slice(), b.as_slice()))
        .collect();
    write_safetensors(&dir.join("z_fp8.safetensors"), &tensors);
}

#[test]
fn issue_11_weight_dtype_stores_the_diffusion_model_in_fp8() {
    let mut h = harness(SynthDtype::Bf16);
    write_fp8_copy(&h);
    let plain = h.run(graph(ksampler(2, 2, "euler")));
    let plain = saved(&h, &plain);
    let mut cast = graph(ksampler(2, 2, "euler"));
    cast["66"]["inputs"]["weight_dtype"] = json!("fp8_e4m3fn");
    let cast = h.run(cast);
    let cast = saved(&h, &cast);
    let mut from_file = graph(ksampler(2, 2, "euler"));
    from_file["66"]["inputs"]["unet_name"] = json!("z_fp8.safetensors");
    let from_file = h.run(from_file);
    let from_file = saved(&h, &from_file);
    assert!(max_diff(&cast, &plain) > 0, "fp8 weights change the image");
    assert_eq!(max_diff(&cast, &from_file), 0, "the cast model is the fp8 file's model");
}

/// The custom-sampling nodes in place of `KSampler`'s node 70: noise, guider, sampler and sigmas made apart.
fn custom_sampling(prompt: &mut Value, seed: u64, steps: u32, cfg: f64, sampler: &str) {
    prompt["70"] = json!({"class_type": "SamplerCustomAdvanced", "inputs": {"noise": ["73", 0], "guider": ["74", 0], "sampler": ["75", 0], "sigmas": ["76", 0], "latent_image": ["68", 0]}});
    prompt["73"] = json!({"class_type": "RandomNoise", "inputs": {"noise_seed": seed}});
    prompt["74"] = json!({"class_type": "CFGGuider", "inputs": {"model": ["69", 0], "positive": ["67", 0], "negative": ["71", 0], "cfg": cfg}});
    prompt["75"] = json!({"class_type": "KSamplerSelect", "inputs": {"sampler_name": sampler}});
    prompt["76"] = json!({"class_type": "BasicScheduler", "inputs": {"model": ["69", 0], "scheduler": "simple", "steps": steps, "denoise": 1}});
}

#[test]
fn issue_21_custom_sampling_nodes_give_ksamplers_image_bit_for_bit() {
    let mut h = harness(SynthDtype::Bf16);
    // cfg 2 evaluates the negative too; dpmpp_2m_sde draws per-step noise from the seed.
    let mut reference = graph(ksampler(11, 3, "dpmpp_2m_sde"));
    reference["70"]["inputs"]["cfg"] = json!(2.0);
    let reference = h.run(reference);
    let reference = saved(&h, &reference);

    let mut advanced = graph(json!(null));
    custom_sampling(&mut advanced, 11, 3, 2.0, "dpmpp_2m_sde");
    let ran = h.run(advanced.clone());
    assert_eq!(max_diff(&saved(&h, &ran), &reference), 0, "SamplerCustomAdvanced");

    let mut custom = advanced.clone();
    custom["70"] = json!({"class_type": "SamplerCustom", "inputs": {"model": ["69", 0], "add_noise": true, "noise_seed": 11, "cfg": 2.0, "positive": ["67", 0], "negative": ["71", 0], "sampler": ["75", 0], "sigmas": ["76", 0], "latent_image": ["68", 0]}});
    let ran = h.run(custom);
    assert_eq!(max_diff(&saved(&h, &ran), &reference), 0, "SamplerCustom");

    // Split at step 1: the high part with noise and the low part without, as KSamplerAdvanced stages.
    let mut split = advanced.clone();
    split["77"] = json!({"class_type": "SplitSigmas", "inputs": {"sigmas": ["76", 0], "step": 1}});
    split["78"] = json!({"class_type": "SamplerCustomAdvanced", "inputs": {"noise": ["73", 0], "guider": ["74", 0], "sampler": ["75", 0], "sigmas": ["77", 0], "latent_image": ["68", 0]}});
    split["79"] = json!({"class_type": "DisableNoise", "inputs": {}});
    split["70"]["inputs"]["noise"] = json!(["79", 0]);
    split["70"]["inputs"]["sigmas"] = json!(["77", 1]);
    split["70"]["inputs"]["latent_image"] = json!(["78", 0]);
    split["75"]["inputs"]["sampler_name"] = json!("euler");
    let mut whole = advanced.clone();
    whole["75"]["inputs"]["sampler_name"] = json!("euler");
    let whole = h.run(whole);
    let split = h.run(split);
    assert!(max_diff(&saved(&h, &split), &saved(&h, &whole)) <= 1, "two halves give the whole");
}

#[test]
fn noise_turned_off_still_seeds_the_per_step_noise_as_comfyui_does() {
    // ComfyUI's KSamplerAdvanced (add_noise disable) and SamplerCustom (add_noise false) start from zeros but
    // pass their seed on to the sampler; only DisableNoise carries seed 0. An ancestral sampler shows it.
    let mut h = harness(SynthDtype::Bf16);
    let advanced = |seed: u64| {
        graph(
            json!({"class_type": "KSamplerAdvanced", "inputs": {"add_noise": "disable", "noise_seed": seed, "steps": 3, "cfg": 1, "sampler_name": "euler_ancestral", "scheduler": "simple", "start_at_step": 0, "end_at_step": 10000, "return_with_leftover_noise": "disable", "model": ["69", 0], "positive": ["67", 0], "negative": ["71", 0], "latent_image": ["68", 0]}}),
        )
    };
    let ran = h.run(advanced(11));
    let eleven = saved(&h, &ran);
    let ran = h.run(advanced(0));
    let zero = saved(&h, &ran);
    assert!(max_diff(&eleven, &zero) > 1, "the seed drives the per-step noise");

    let mut custom = graph(json!(null));
    custom_sampling(&mut custom, 11, 3, 1.0, "euler_ancestral");
    let disabled = custom.clone();
    custom["70"] = json!({"class_type": "SamplerCustom", "inputs": {"model": ["69", 0], "add_noise": false, "noise_seed": 11, "cfg": 1.0, "positive": ["67", 0], "negative": ["71", 0], "sampler": ["75", 0], "sigmas": ["76", 0], "latent_image": ["68", 0]}});
    let ran = h.run(custom);
    assert_eq!(max_diff(&saved(&h, &ran), &eleven), 0, "SamplerCustom passes its seed on");

    let mut disabled = disabled;
    disabled["73"] = json!({"class_type": "DisableNoise", "inputs": {}});
    let ran = h.run(disabled);
    assert_eq!(max_diff(&saved(&h, &ran), &zero), 0, "DisableNoise carries seed 0");
}

#[test]
fn issue_21_sigma_nodes_and_the_denoised_output_feed_a_sampler() {
    let mut h = harness(SynthDtype::Bf16);
    // ManualSigmas with BasicGuider: the positive alone, three hand-picked noise levels.
    let mut manual = graph(json!(null));
    custom_sampling(&mut manual, 3, 2, 1.0, "euler");
    manual["74"] = json!({"class_type": "BasicGuider", "inputs": {"model": ["69", 0], "conditioning": ["67", 0]}});
    manual["76"] = json!({"class_type": "ManualSigmas", "inputs": {"sigmas": "1.0, 0.6, 0.0"}});
    // The denoised output is a latent the VAE decodes too.
    manual["65"]["inputs"]["samples"] = json!(["70", 1]);
    let ran = h.run(manual.clone());
    assert_eq!(saved(&h, &ran).len(), 32 * 32 * 3);
    let progress = ran
        .events
        .iter()
        .filter(|e| matches!(e, Event::Progress { node, .. } if node.0 == "70"))
        .count();
    assert_eq!(progress, 2, "one step per pair of sigmas");

    // Karras, exponential, polyexponential, beta, Laplace, VP, OptimalSteps; flipped; and a first sigma set by
    // hand all run.
    for (class, inputs) in [
        ("KarrasScheduler", json!({"steps": 2, "sigma_max": 1.0, "sigma_min": 0.01, "rho": 7.0})),
        (
            "LaplaceScheduler",
            json!({"steps": 2, "sigma_max": 1.0, "sigma_min": 0.01, "mu": 0.0, "beta": 0.5}),
        ),
        ("VPScheduler", json!({"steps": 2, "beta_d": 19.9, "beta_min": 0.1, "eps_s": 0.001})),
        ("OptimalStepsScheduler", json!({"model_type": "FLUX", "steps": 3, "denoise": 1.0})),
        ("ExponentialScheduler", json!({"steps": 2, "sigma_max": 1.0, "sigma_min": 0.01})),
        (
            "PolyexponentialScheduler",
            json!({"steps": 2, "sigma_max": 1.0, "sigma_min": 0.01, "rho": 1.0}),
        ),
        (
            "BetaSamplingScheduler",
            json!({"model": ["69", 0], "steps": 2, "alpha": 0.6, "beta": 0.6}),
        ),
    ] {
        let mut prompt = manual.clone();
        prompt["76"] = json!({"class_type": class, "inputs": inputs});
        prompt["80"] =
            json!({"class_type": "SetFirstSigma", "inputs": {"sigmas": ["76", 0], "sigma": 0.9}});
        prompt["70"]["inputs"]["sigmas"] = json!(["80", 0]);
        let ran = h.run(prompt);
        assert_eq!(ran.summary.outcome, Outcome::Success, "{class}: {:?}", ran.summary.outcome);
    }

    // Intermediate sigmas between a schedule's steps, and a sigma for a share of the run, feed the sampler too.
    let mut extended = manual.clone();
    extended["77"] = json!({"class_type": "ExtendIntermediateSigmas", "inputs": {
        "sigmas": ["76", 0], "steps": 2, "start_at_sigma": -1.0, "end_at_sigma": 0.8, "spacing": "cosine"}});
    extended["78"] = json!({"class_type": "SamplingPercentToSigma", "inputs": {
        "model": ["69", 0], "sampling_percent": 0.25, "return_actual_sigma": false}});
    extended["80"] =
        json!({"class_type": "SetFirstSigma", "inputs": {"sigmas": ["77", 0], "sigma": ["78", 0]}});
    extended["70"]["inputs"]["sigmas"] = json!(["80", 0]);
    let ran = h.run(extended);
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    let steps = ran
        .events
        .iter()
        .filter(|e| matches!(e, Event::Progress { node, .. } if node.0 == "70"))
        .count();
    assert_eq!(steps, 3, "1.0 and 0.6 gain a sigma between them; 0.6 to 0 is below end_at_sigma");

    // Sigmas that go nowhere leave the latent as it was: an empty latent decodes to the VAE's image of zeros.
    let mut none = manual.clone();
    none["76"]["inputs"]["sigmas"] = json!("");
    let ran = h.run(none);
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
}

#[test]
fn issue_21_model_sampling_sd3_hands_the_network_timesteps_as_comfyui_does() {
    let mut h = harness(SynthDtype::Bf16);
    let aura = h.run(graph(ksampler(4, 2, "euler")));
    let aura = saved(&h, &aura);
    // The same shift with SD3's multiplier of 1000: the same sigmas, but Z-Image sees t = 1 − 1000σ, as in
    // ComfyUI, so the image differs.
    let mut sd3 = graph(ksampler(4, 2, "euler"));
    sd3["69"] =
        json!({"class_type": "ModelSamplingSD3", "inputs": {"shift": 3, "model": ["66", 0]}});
    let sd3 = h.run(sd3);
    assert!(max_diff(&saved(&h, &sd3), &aura) > 1);
}

/// The values ComfyUI computes with from a quantized file, written as a plain f32 file: each quantized weight
/// dequantized (fp8 values times their scale; MXFP8 blocks by their exponents; int8 rows by their scales and
/// rotated back for ConvRot), every other tensor widened, the quantization bookkeeping dropped.
fn dequantized_twin(scaled: &std::path::Path, twin: &std::path::Path) {
    use kiln_compute::memory::SafetensorsFile;
    let file = SafetensorsFile::open(scaled).expect("a scaled file");
    let read = |name: &str| {
        let info = file.tensor(name).expect("a tensor");
        let bytes = file.source().read_vec(info.offset, info.len).expect("bytes");
        (info.shape.clone(), kiln_compute::dtype::widen(info.dtype, &bytes))
    };
    let bookkeeping = |n: &str| {
        n == "scaled_fp8"
            || n.ends_with(".scale_weight")
            || n.ends_with(".weight_scale")
            || n.ends_with(".weight_scale_2")
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, _) in file.tensors() {
        if bookkeeping(name) {
            continue;
        }
        let (shape, mut values) = read(name);
        let layer = name.strip_suffix(".weight").unwrap_or(name);
        let scale = [".scale_weight", ".weight_scale"]
            .iter()
            .find_map(|s| file.tensor(&format!("{layer}{s}")).ok().map(|_| format!("{layer}{s}")));
        let info = file.tensor(name).expect("a tensor");
        match (scale, info.dtype) {
            (Some(scale), kiln_compute::DType::I8) => {
                let cols = shape[1];
                let scales = read(&scale).1;
                let map: Value = serde_json::from_str(&file.metadata()["_quantization_metadata"])
                    .expect("a quantization map");
                let group = map["layers"][layer]["convrot_groupsize"]
                    .as_u64()
                    .expect("a ConvRot group") as usize;
                let h = kiln_compute::quant::hadamard(group).expect("a power of 4");
                for (r, row) in values.chunks_exact_mut(cols).enumerate() {
                    row.iter_mut().for_each(|v| *v *= scales[r]);
                    for block in row.chunks_exact_mut(group) {
                        let rotated: Vec<f32> = (0..group)
                            .map(|j| (0..group).map(|i| block[i] * h[i * group + j]).sum())
                            .collect();
                        block.copy_from_slice(&rotated);
                    }
                }
            }
            (Some(scale), kiln_compute::DType::U8) => {
                let codes = file.source().read_vec(info.offset, info.len).expect("bytes");
                let table = file.raw_bytes(&scale).expect("a table");
                let global = read(&format!("{scale}_2")).1[0];
                let cols = shape[1] * 2;
                values = vec![0.0; shape[0] * cols];
                for (r, row) in values.chunks_exact_mut(cols).enumerate() {
                    let stored = &codes[r * cols / 2..(r + 1) * cols / 2];
                    kiln_compute::quant::decode_nvfp4(stored, &table, global, (r, 0, cols), row);
                }
                tensors.push((
                    name.to_owned(),
                    vec![shape[0], cols],
                    values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                ));
                continue;
            }
            (Some(scale), _) if read(&scale).1.len() > 1 => {
                let bytes = file.source().read_vec(info.offset, info.len).expect("bytes");
                let table = file.raw_bytes(&scale).expect("a table");
                let cols = shape[1];
                for (r, row) in values.chunks_exact_mut(cols).enumerate() {
                    let stored = &bytes[r * cols..(r + 1) * cols];
                    kiln_compute::quant::decode_mxfp8(stored, &table, (r, 0, cols), row);
                }
            }
            (Some(scale), _) => {
                let s = read(&scale).1[0];
                values.iter_mut().for_each(|v| *v *= s);
            }
            (None, _) => {}
        }
        tensors.push((
            name.to_owned(),
            shape,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ));
    }
    let views: Vec<(&str, &str, &[usize], &[u8])> =
        tensors.iter().map(|(n, s, b)| (n.as_str(), "F32", s.as_slice(), b.as_slice())).collect();
    write_safetensors(twin, &views);
}

/// The image of the harness's graph run on f32 files of the values ComfyUI dequantizes its quantized files to.
fn dequantized_twin_image(h: &mut Harness) -> Vec<u8> {
    let models = h.roots.input.join("models");
    for file in ["diffusion_models/z_image_turbo_bf16", "text_encoders/qwen_3_4b"] {
        let path = models.join(format!("{file}.safetensors"));
        dequantized_twin(&path, &models.join(format!("{file}_twin.safetensors")));
    }
    let mut twin = graph(ksampler(3, 2, "euler"));
    twin["66"]["inputs"]["unet_name"] = json!("z_image_turbo_bf16_twin.safetensors");
    twin["62"]["inputs"]["clip_name"] = json!("qwen_3_4b_twin.safetensors");
    let twin = h.run(twin);
    saved(h, &twin)
}

#[test]
fn issue_21_scaled_fp8_files_run_as_their_dequantized_values_in_both_encodings() {
    for dtype in [SynthDtype::Fp8Scaled, SynthDtype::Fp8Mixed] {
        let mut h = harness(dtype);
        let scaled = h.run(graph(ksampler(3, 2, "euler")));
        let scaled = saved(&h, &scaled);
        // The same graph on the values ComfyUI dequantizes to: the same image, bit for bit.
        assert_eq!(max_diff(&dequantized_twin_image(&mut h), &scaled), 0, "{dtype}");
    }
}

#[test]
fn issue_21_mxfp8_nvfp4_and_int8_convrot_files_run_quantized() {
    let twin_of = dequantized_twin_image;
    // MXFP8 and NVFP4 are dequantized on the CPU, as in ComfyUI: the image of their dequantized values, bit
    // for bit.
    for dtype in [SynthDtype::Mxfp8, SynthDtype::Nvfp4] {
        let mut h = harness(dtype);
        let quantized = h.run(graph(ksampler(3, 2, "euler")));
        let quantized = saved(&h, &quantized);
        assert_eq!(max_diff(&twin_of(&mut h), &quantized), 0, "{dtype}");
    }
    // int8 with ConvRot: the text encoder dequantizes (ComfyUI's full-precision text encoders), the diffusion
    // model quantizes its activations, so the image is near its dequantized twin's but not the same.
    let mut h = harness(SynthDtype::Int8Convrot);
    let int8 = h.run(graph(ksampler(3, 2, "euler")));
    let int8 = saved(&h, &int8);
    let diff = max_diff(&twin_of(&mut h), &int8);
    eprintln!("int8 convrot: max difference {diff} from the dequantized twin");
    assert!(diff > 0 && diff <= 8, "int8 convrot: max difference {diff} from the dequantized twin");
}

#[test]
fn issue_21_positive_and_negative_in_one_batch_give_the_images_of_two_calls() {
    let mut h = harness(SynthDtype::Bf16);
    let with_negative = |negative: Value| {
        let mut prompt = graph(ksampler(6, 2, "euler"));
        prompt["70"]["inputs"]["cfg"] = json!(3.0);
        prompt["73"] = negative;
        prompt["70"]["inputs"]["negative"] = json!(["73", 0]);
        prompt
    };
    // One prompt a side, of one length (the positive zeroed out): both run as one batch of two.
    let batched = h.run(with_negative(
        json!({"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["67", 0]}}),
    ));
    let batched = saved(&h, &batched);
    // The same negative twice: two prompts on a side run one call each, and their mean is the one
    // prediction, exactly; so the image is that of separate calls.
    let separate = h.run(with_negative(
        json!({"class_type": "ConditioningCombine", "inputs": {"conditioning_1": ["71", 0], "conditioning_2": ["71", 0]}}),
    ));
    assert_eq!(max_diff(&saved(&h, &separate), &batched), 0);
    // A negative of another length cannot share the batch, and still runs.
    let other = h.run(with_negative(
        json!({"class_type": "CLIPTextEncode", "inputs": {"text": "fog over a long grey sea at dawn", "clip": ["62", 0]}}),
    ));
    assert!(max_diff(&saved(&h, &other), &batched) > 0);
}

#[test]
fn issue_21_cfg_patches_change_how_the_sampler_combines_predictions() {
    let mut h = harness(SynthDtype::Bf16);
    let with_cfg = |patch: Option<Value>| {
        let mut prompt = graph(ksampler(6, 2, "euler"));
        prompt["70"]["inputs"]["cfg"] = json!(3.0);
        if let Some(patch) = patch {
            prompt["95"] = patch;
            prompt["70"]["inputs"]["model"] = json!(["95", 0]);
        }
        prompt
    };
    let plain = h.run(with_cfg(None));
    let plain = saved(&h, &plain);
    for patch in [
        json!({"class_type": "CFGNorm", "inputs": {"model": ["69", 0], "strength": 1.0}}),
        json!({"class_type": "CFGNorm", "inputs": {"model": ["69", 0], "strength": 0.8, "pre_cfg": true}}),
        json!({"class_type": "CFGZeroStar", "inputs": {"model": ["69", 0]}}),
        json!({"class_type": "RescaleCFG", "inputs": {"model": ["69", 0], "multiplier": 0.7}}),
    ] {
        let class = patch["class_type"].clone();
        let ran = h.run(with_cfg(Some(patch)));
        assert!(max_diff(&saved(&h, &ran), &plain) > 0, "{class} changes the image");
    }
}

/// `CFGOverride`: over the whole range the override's scale is the sampler's (the override nearest the sampler
/// winning); over part of it, another image.
#[test]
fn cfg_override_sets_the_scale_over_its_sigma_range() {
    let mut h = harness(SynthDtype::Bf16);
    let with_cfg = |cfg: f64, overrides: &[(f64, f64, f64)]| {
        let mut prompt = graph(ksampler(6, 3, "euler"));
        prompt["70"]["inputs"]["cfg"] = json!(cfg);
        let mut model = json!(["69", 0]);
        for (i, (scale, start, end)) in overrides.iter().enumerate() {
            let id = format!("{}", 90 + i);
            prompt[&id] = json!({"class_type": "CFGOverride", "inputs": {"model": model, "cfg": scale, "start_percent": start, "end_percent": end}});
            model = json!([id, 0]);
        }
        prompt["70"]["inputs"]["model"] = model;
        prompt
    };
    let mut image = |cfg, overrides: &[(f64, f64, f64)]| {
        let ran = h.run(with_cfg(cfg, overrides));
        saved(&h, &ran)
    };
    let one = image(1.0, &[]);
    let four = image(4.0, &[]);
    assert!(max_diff(&one, &four) > 0);
    assert_eq!(image(4.0, &[(1.0, 0.0, 1.0)]), one, "CFG 1 throughout is CFG 1");
    assert_eq!(image(1.0, &[(4.0, 0.0, 1.0)]), four, "and CFG 4 throughout is CFG 4");
    assert_eq!(
        image(1.0, &[(1.0, 0.0, 1.0), (4.0, 0.0, 1.0)]),
        four,
        "the nearest the sampler wins"
    );
    let part = image(4.0, &[(1.0, 0.5, 1.0)]);
    assert!(
        max_diff(&part, &one) > 0 && max_diff(&part, &four) > 0,
        "half the steps at each scale"
    );

    // BasicGuider runs the positive alone; under an override of scale 2 ComfyUI's CFG scales it by 2 (the
    // missing negative read as zeros).
    let basic = |scale: Option<f64>| {
        let mut prompt = graph(json!(null));
        custom_sampling(&mut prompt, 6, 2, 1.0, "euler");
        prompt["74"] = json!({"class_type": "BasicGuider", "inputs": {"model": ["69", 0], "conditioning": ["67", 0]}});
        if let Some(scale) = scale {
            prompt["90"] = json!({"class_type": "CFGOverride", "inputs": {"model": ["69", 0], "cfg": scale, "start_percent": 0.0, "end_percent": 1.0}});
            prompt["74"]["inputs"]["model"] = json!(["90", 0]);
        }
        prompt
    };
    let plain = h.run(basic(None));
    let plain = saved(&h, &plain);
    let same = h.run(basic(Some(1.0)));
    assert_eq!(saved(&h, &same), plain, "an override of 1 leaves BasicGuider as it is");
    let doubled = h.run(basic(Some(2.0)));
    assert!(max_diff(&saved(&h, &doubled), &plain) > 0, "an override of 2 scales its prediction");
}

/// The latent operations: `LatentApplyOperationCFG` tonemaps each step's guidance, `LatentApplyOperation`
/// tonemaps the sampled latent, and a sharpening wider than the latent is refused by name.
#[test]
fn latent_operations_apply_to_the_guidance_and_to_a_latent() {
    let mut h = harness(SynthDtype::Bf16);
    let mut prompt = graph(ksampler(6, 2, "euler"));
    prompt["70"]["inputs"]["cfg"] = json!(3.0);
    let plain = h.run(prompt.clone());
    let plain = saved(&h, &plain);
    let tonemap =
        json!({"class_type": "LatentOperationTonemapReinhard", "inputs": {"multiplier": 0.5}});
    let mut guided = prompt.clone();
    guided["96"] = tonemap.clone();
    guided["95"] = json!({"class_type": "LatentApplyOperationCFG", "inputs": {"model": ["69", 0], "operation": ["96", 0]}});
    guided["70"]["inputs"]["model"] = json!(["95", 0]);
    let ran = h.run(guided);
    assert!(max_diff(&saved(&h, &ran), &plain) > 0, "the guidance is tonemapped");

    let mut applied = prompt.clone();
    applied["96"] = tonemap;
    applied["97"] = json!({"class_type": "LatentApplyOperation", "inputs": {"samples": ["70", 0], "operation": ["96", 0]}});
    applied["65"]["inputs"]["samples"] = json!(["97", 0]);
    let ran = h.run(applied.clone());
    assert!(max_diff(&saved(&h, &ran), &plain) > 0, "the latent is tonemapped");

    applied["96"] = json!({"class_type": "LatentOperationSharpen", "inputs": {"sharpen_radius": 9, "sigma": 1.0, "alpha": 0.1}});
    let ran = h.run(applied);
    let Outcome::Failed(failure) = &ran.summary.outcome else { panic!("must fail") };
    assert!(
        failure.message.contains("sharpen_radius of 9 needs a latent larger"),
        "{}",
        failure.message
    );
}

#[test]
fn issue_21_a_noise_mask_keeps_what_it_masks_out() {
    let mut h = harness(SynthDtype::Bf16);
    // An encoded image as the latent, sampled fully, through SetLatentNoiseMask with a solid mask.
    let masked = |value: f64| {
        let mut prompt = graph(ksampler(4, 2, "euler"));
        prompt["80"] = json!({"class_type": "EmptyImage", "inputs": {"width": 32, "height": 32, "batch_size": 1, "color": 0x336699}});
        prompt["81"] =
            json!({"class_type": "VAEEncode", "inputs": {"pixels": ["80", 0], "vae": ["63", 0]}});
        prompt["82"] = json!({"class_type": "SolidMask", "inputs": {"value": value, "width": 32, "height": 32}});
        prompt["83"] = json!({"class_type": "SetLatentNoiseMask", "inputs": {"samples": ["81", 0], "mask": ["82", 0]}});
        prompt["70"]["inputs"]["latent_image"] = json!(["83", 0]);
        prompt
    };
    let mut unmasked = masked(1.0);
    unmasked["70"]["inputs"]["latent_image"] = json!(["81", 0]);
    let unmasked = h.run(unmasked);
    let unmasked = saved(&h, &unmasked);
    // A mask of 1 lets the sampler change everything: the unmasked image, bit for bit.
    let all = h.run(masked(1.0));
    assert_eq!(max_diff(&saved(&h, &all), &unmasked), 0);
    // A mask of 0 keeps the input: the sampled latent decodes to the encoded image's decode.
    let none = h.run(masked(0.0));
    let mut decoded = masked(0.0);
    decoded["65"]["inputs"]["samples"] = json!(["81", 0]);
    let decoded = h.run(decoded);
    assert!(max_diff(&saved(&h, &none), &saved(&h, &decoded)) <= 1);
    assert!(max_diff(&saved(&h, &none), &unmasked) > 1);
}

#[test]
fn issue_21_a_latent_taken_from_a_batch_keeps_its_noise() {
    let mut h = harness(SynthDtype::Bf16);
    // The second image of a batch of two...
    let mut batch = graph(ksampler(12, 2, "euler"));
    batch["68"]["inputs"]["batch_size"] = json!(2);
    batch["90"] = json!({"class_type": "ImageFromBatch", "inputs": {"image": ["65", 0], "batch_index": 1, "length": 1}});
    batch["9"]["inputs"]["images"] = json!(["90", 0]);
    let whole = h.run(batch.clone());
    let whole = saved(&h, &whole);
    // ...is the image of that latent taken from the batch before sampling (its batch index picks its noise).
    let mut one = batch.clone();
    one["91"] = json!({"class_type": "LatentFromBatch", "inputs": {"samples": ["68", 0], "batch_index": 1, "length": 1}});
    one["70"]["inputs"]["latent_image"] = json!(["91", 0]);
    one["9"]["inputs"]["images"] = json!(["65", 0]);
    let taken = h.run(one.clone());
    assert!(max_diff(&saved(&h, &taken), &whole) <= 1);
    // Repeated, the batch index carries on: the repeat's second sample has noise of its own.
    one["92"] =
        json!({"class_type": "RepeatLatentBatch", "inputs": {"samples": ["91", 0], "amount": 2}});
    one["70"]["inputs"]["latent_image"] = json!(["92", 0]);
    one["90"]["inputs"]["image"] = json!(["65", 0]);
    one["9"]["inputs"]["images"] = json!(["90", 0]);
    let repeated = h.run(one);
    assert!(max_diff(&saved(&h, &repeated), &whole) > 1);
}

#[test]
fn issue_21_dual_cfg_guider_reduces_to_the_one_scale_guiders_bit_for_bit() {
    let mut h = harness(SynthDtype::Bf16);
    let run = |h: &mut Harness, guider: Value| {
        let mut prompt = graph(json!(null));
        custom_sampling(&mut prompt, 21, 2, 2.0, "euler");
        prompt["74"] = guider;
        let ran = h.run(prompt);
        saved(h, &ran)
    };
    let dual = |cfg_conds: f64, cfg_cond2_negative: f64, style: &str| json!({"class_type": "DualCFGGuider", "inputs": {"model": ["69", 0], "cond1": ["67", 0], "cond2": ["67", 0], "negative": ["71", 0], "cfg_conds": cfg_conds, "cfg_cond2_negative": cfg_cond2_negative, "style": style}});
    let cfg = |cfg: f64| json!({"class_type": "CFGGuider", "inputs": {"model": ["69", 0], "positive": ["67", 0], "negative": ["71", 0], "cfg": cfg}});
    let basic = run(
        &mut h,
        json!({"class_type": "BasicGuider", "inputs": {"model": ["69", 0], "conditioning": ["67", 0]}}),
    );
    let cfg2 = run(&mut h, cfg(2.0));
    assert!(max_diff(&basic, &cfg2) > 0, "the negative counts at cfg 2");
    // Both scales 1: the middle and the negative are skipped, cond1 alone.
    assert_eq!(max_diff(&run(&mut h, dual(1.0, 1.0, "regular")), &basic), 0);
    // cond1 = cond2: regular is CFG from the negative at cfg_cond2_negative, whatever cfg_conds is...
    assert_eq!(max_diff(&run(&mut h, dual(3.0, 2.0, "regular")), &cfg2), 0);
    // ...and so is nested.
    assert_eq!(max_diff(&run(&mut h, dual(5.0, 2.0, "nested")), &cfg2), 0);
}

#[test]
fn issue_21_inpaint_conditioning_keeps_the_unmasked_image_and_differential_diffusion_softens_it() {
    let mut h = harness(SynthDtype::Bf16);
    // A 32² grey image outpainted by 16 on the right (a feathered mask), sampled from its encoded latent.
    let inpaint = |noise_mask: bool, differential: Option<f64>| {
        let mut prompt = graph(ksampler(8, 2, "euler"));
        prompt["80"] = json!({"class_type": "EmptyImage", "inputs": {"width": 16, "height": 32, "batch_size": 1, "color": 0x808080}});
        prompt["81"] = json!({"class_type": "ImagePadForOutpaint", "inputs": {"image": ["80", 0], "left": 0, "top": 0, "right": 16, "bottom": 0, "feathering": 4}});
        prompt["82"] = json!({"class_type": "InpaintModelConditioning", "inputs": {"positive": ["67", 0], "negative": ["71", 0], "vae": ["63", 0], "pixels": ["81", 0], "mask": ["81", 1], "noise_mask": noise_mask}});
        prompt["70"]["inputs"]["positive"] = json!(["82", 0]);
        prompt["70"]["inputs"]["negative"] = json!(["82", 1]);
        prompt["70"]["inputs"]["latent_image"] = json!(["82", 2]);
        if let Some(strength) = differential {
            prompt["83"] = json!({"class_type": "DifferentialDiffusion", "inputs": {"model": ["69", 0], "strength": strength}});
            prompt["70"]["inputs"]["model"] = json!(["83", 0]);
        }
        prompt
    };
    let free = h.run(inpaint(false, None));
    let free = saved(&h, &free);
    let masked = h.run(inpaint(true, None));
    let masked = saved(&h, &masked);
    assert!(max_diff(&free, &masked) > 1, "the noise mask keeps the image side");
    // At the latent's resolution this mask is 0 or 1, which DifferentialDiffusion's thresholds leave as is...
    let binary = h.run(inpaint(true, Some(1.0)));
    assert_eq!(max_diff(&saved(&h, &binary), &masked), 0);
    // ...and without a noise mask there is nothing to threshold.
    let unmasked = h.run(inpaint(false, Some(1.0)));
    assert_eq!(max_diff(&saved(&h, &unmasked), &free), 0);
    // A grey mask is thresholded per step (more of it changes as sampling goes), blended back by strength.
    let grey = |differential: Option<f64>| {
        let mut prompt = inpaint(true, differential);
        prompt["91"] =
            json!({"class_type": "SolidMask", "inputs": {"value": 0.5, "width": 32, "height": 32}});
        prompt["92"] = json!({"class_type": "SetLatentNoiseMask", "inputs": {"samples": ["82", 2], "mask": ["91", 0]}});
        prompt["70"]["inputs"]["latent_image"] = json!(["92", 0]);
        prompt
    };
    let plain = h.run(grey(None));
    let plain = saved(&h, &plain);
    let thresholded = h.run(grey(Some(1.0)));
    let thresholded = saved(&h, &thresholded);
    assert!(max_diff(&thresholded, &plain) > 1, "DifferentialDiffusion thresholds a grey mask");
    let half = h.run(grey(Some(0.5)));
    assert!(
        max_diff(&saved(&h, &half), &thresholded) > 0,
        "strength blends the threshold with the mask"
    );
}

#[test]
fn issue_21_values_riding_with_the_conditioning_leave_z_image_unchanged() {
    let mut h = harness(SynthDtype::Bf16);
    let plain = h.run(graph(ksampler(5, 2, "euler")));
    let plain = saved(&h, &plain);
    // Z-Image reads neither guidance nor reference latents (ComfyUI's Lumina2 has no input for them).
    let mut prompt = graph(ksampler(5, 2, "euler"));
    prompt["84"] = json!({"class_type": "FluxGuidance", "inputs": {"conditioning": ["67", 0], "guidance": 4.0}});
    prompt["85"] = json!({"class_type": "ReferenceLatent", "inputs": {"conditioning": ["84", 0], "latent": ["68", 0]}});
    prompt["86"] = json!({"class_type": "FluxKontextMultiReferenceLatentMethod", "inputs": {"conditioning": ["85", 0], "reference_latents_method": "uxo/uno"}});
    prompt["87"] = json!({"class_type": "ReferenceLatent", "inputs": {"conditioning": ["86", 0]}});
    prompt["70"]["inputs"]["positive"] = json!(["87", 0]);
    let ran = h.run(prompt);
    assert_eq!(max_diff(&saved(&h, &ran), &plain), 0);
    // InstructPixToPixConditioning gives zeros of the encoded image's latent to sample from.
    let mut prompt = graph(ksampler(5, 2, "euler"));
    prompt["88"] = json!({"class_type": "EmptyImage", "inputs": {"width": 36, "height": 33, "batch_size": 1, "color": 0x112233}});
    prompt["89"] = json!({"class_type": "InstructPixToPixConditioning", "inputs": {"positive": ["67", 0], "negative": ["71", 0], "vae": ["63", 0], "pixels": ["88", 0]}});
    prompt["90"] = json!({"class_type": "PreviewAny", "inputs": {"source": ["89", 2]}});
    prompt["70"]["inputs"]["latent_image"] = json!(["89", 2]);
    let ran = h.run(prompt);
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    assert_eq!(ran.text("90"), ["tensor[1, 16, 4, 4]"], "36×33 cropped to 32×32, a latent of 4×4");
}

#[test]
fn issue_21_multi_file_clip_loaders_name_what_they_were_given() {
    let mut h = harness(SynthDtype::Bf16);
    let dir = h.roots.input.join("models/text_encoders");
    write_safetensors(
        &dir.join("t5xxl_fp16.safetensors"),
        &[("encoder.block.0.layer.0.SelfAttention.q.weight", "F32", &[1], &[0u8; 4])],
    );
    let run = |h: &mut Harness, loader: Value| {
        let mut prompt = graph(ksampler(1, 1, "euler"));
        prompt["62"] = loader;
        let ran = h.run(prompt);
        let Outcome::Failed(failure) = &ran.summary.outcome else {
            panic!("{:?}", ran.summary.outcome)
        };
        assert_eq!(failure.node.0, "62");
        failure.message.clone()
    };
    // A file of a family Kiln lacks is named as what it is.
    let message = run(
        &mut h,
        json!({"class_type": "DualCLIPLoader", "inputs": {"clip_name1": "qwen_3_4b.safetensors", "clip_name2": "t5xxl_fp16.safetensors", "type": "flux"}}),
    );
    assert!(message.contains("t5xxl_fp16.safetensors") && message.contains("T5"), "{message}");
    // Files Kiln runs, in a combination it has no encoder for, are refused naming the combination.
    let message = run(
        &mut h,
        json!({"class_type": "QuadrupleCLIPLoader", "inputs": {"clip_name1": "qwen_3_4b.safetensors", "clip_name2": "qwen_3_4b.safetensors", "clip_name3": "qwen_3_4b.safetensors", "clip_name4": "qwen_3_4b.safetensors"}}),
    );
    assert!(message.contains("hidream") && message.contains("Qwen3 + Qwen3"), "{message}");
}

#[test]
fn issue_21_text_generate_runs_the_text_encoder_as_a_language_model() {
    let mut h = harness(SynthDtype::Bf16);
    let generate = |mode: Value| {
        let mut node = json!({"class_type": "TextGenerate", "inputs": {"clip": ["62", 0], "prompt": "a haiku about kilns", "max_length": 6}});
        for (k, v) in mode.as_object().unwrap() {
            node["inputs"][k] = v.clone();
        }
        json!({
            "62": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_3_4b.safetensors", "type": "ltxv", "device": "default"}},
            "1": node,
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
        })
    };
    let sampled = |seed: u64| {
        generate(
            json!({"sampling_mode": "on", "sampling_mode.temperature": 2.0, "sampling_mode.top_k": 0, "sampling_mode.top_p": 1.0, "sampling_mode.min_p": 0.0, "sampling_mode.repetition_penalty": 1.0, "sampling_mode.seed": seed}),
        )
    };
    let mut texts = Vec::new();
    for prompt in [generate(json!({"sampling_mode": "off"})), sampled(1), sampled(2)] {
        let ran = h.run(prompt);
        assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
        let progress: Vec<(f64, f64)> = ran
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Progress { node, value, max } if node.0 == "1" => Some((*value, *max)),
                _ => None,
            })
            .collect();
        assert!(
            !progress.is_empty() && progress.iter().all(|&(_, max)| max == 6.0),
            "{progress:?}"
        );
        texts.push(ran.text("2"));
    }
    assert_ne!(texts[1], texts[2], "another seed, another text");
    // A fresh executor (nothing cached) generates the same text from the same seed.
    let mut again = harness(SynthDtype::Bf16);
    let ran = again.run(sampled(1));
    assert_eq!(ran.text("2"), texts[1], "one seed, one text");
}

/// Deterministic f32 bytes for a LoRA factor: `n` values in ±`span`/2.
fn lora_values(n: usize, seed: u32, span: f32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| {
            let v = (((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32
                / (1u32 << 24) as f32
                - 0.5)
                * span;
            v.to_le_bytes()
        })
        .collect()
}

#[test]
fn issue_21_lora_loader_patches_the_text_encoder_and_the_model() {
    let mut h = harness(SynthDtype::Bf16);
    let loras = h.roots.input.join("models/loras");
    std::fs::create_dir_all(&loras).expect("dir");
    let qwen3 = synth::Qwen3Shape::tiny();
    let (hidden, inner, rank) = (qwen3.hidden, qwen3.intermediate, 2);
    // kohya's single-encoder names for the first layer's MLP down projection of the text encoder.
    write_safetensors(
        &loras.join("te.safetensors"),
        &[
            (
                "lora_te_layers_0_mlp_down_proj.lora_up.weight",
                "F32",
                &[hidden, rank],
                &lora_values(hidden * rank, 3, 2.0),
            ),
            (
                "lora_te_layers_0_mlp_down_proj.lora_down.weight",
                "F32",
                &[rank, inner],
                &lora_values(rank * inner, 4, 2.0),
            ),
        ],
    );
    write_lora(&loras.join("dit.safetensors"), ZImageTurboSet::tiny().zimage.dim);
    let with_lora = |file: &str, strength_model: f64, strength_clip: f64| {
        let mut prompt = graph(ksampler(8, 2, "euler"));
        prompt["90"] = json!({"class_type": "LoraLoader", "inputs": {"model": ["66", 0], "clip": ["62", 0], "lora_name": file, "strength_model": strength_model, "strength_clip": strength_clip}});
        prompt["69"]["inputs"]["model"] = json!(["90", 0]);
        prompt["67"]["inputs"]["clip"] = json!(["90", 1]);
        prompt
    };
    let plain = h.run(graph(ksampler(8, 2, "euler")));
    let plain = saved(&h, &plain);
    let te = h.run(with_lora("te.safetensors", 1.0, 1.0));
    let te = saved(&h, &te);
    assert!(max_diff(&te, &plain) > 1, "the encoder's LoRA changes the conditioning");
    let off = h.run(with_lora("te.safetensors", 1.0, 0.0));
    assert_eq!(max_diff(&saved(&h, &off), &plain), 0, "strength_clip 0 leaves the encoder");
    let dit = h.run(with_lora("dit.safetensors", 1.0, 1.0));
    assert!(max_diff(&saved(&h, &dit), &plain) > 1, "the model's LoRA still applies");
    // The unpatched encoder, from the cache, encodes a new prompt without the patches: as a fresh one does.
    let mut other = graph(ksampler(8, 2, "euler"));
    other["67"]["inputs"]["text"] = json!("a kiln at dawn");
    let again = h.run(other.clone());
    let mut fresh = harness(SynthDtype::Bf16);
    let first = fresh.run(other);
    assert_eq!(
        max_diff(&saved(&h, &again), &saved(&fresh, &first)),
        0,
        "the plain encoder is unpatched"
    );
    // A LoRA only for the encoder adapts nothing of the model alone.
    let mut model_only = graph(ksampler(8, 2, "euler"));
    model_only["90"] = json!({"class_type": "LoraLoaderModelOnly", "inputs": {"model": ["66", 0], "lora_name": "te.safetensors", "strength_model": 1.0}});
    model_only["69"]["inputs"]["model"] = json!(["90", 0]);
    let ran = h.run(model_only);
    let Outcome::Failed(failure) = &ran.summary.outcome else {
        panic!("{:?}", ran.summary.outcome)
    };
    assert!(failure.message.contains("no key adapts"), "{}", failure.message);
}

#[test]
fn issue_21_cfg_pp_samplers_step_along_the_unconditional_prediction() {
    let mut h = harness(SynthDtype::Bf16);
    // At cfg 1 the plain samplers never evaluate the negative; the CFG++ ones always do and step along it
    // (from the second step: at σ = 1 a flow model's α is 0, which makes the first step plain Euler).
    let euler = h.run(graph(ksampler(9, 4, "euler")));
    let euler = saved(&h, &euler);
    let cfg_pp = h.run(graph(ksampler(9, 4, "euler_cfg_pp")));
    assert!(max_diff(&saved(&h, &cfg_pp), &euler) > 1, "euler_cfg_pp is not euler");
    let mut twice = graph(ksampler(9, 2, "res_multistep_ancestral_cfg_pp"));
    twice["70"]["inputs"]["cfg"] = json!(2.0);
    let ran = h.run(twice);
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    // BasicGuider makes no unconditional prediction: a CFG++ sampler says so.
    let mut basic = graph(json!(null));
    custom_sampling(&mut basic, 9, 2, 1.0, "dpmpp_2m_cfg_pp");
    basic["74"] = json!({"class_type": "BasicGuider", "inputs": {"model": ["69", 0], "conditioning": ["67", 0]}});
    let ran = h.run(basic);
    let Outcome::Failed(failure) = &ran.summary.outcome else {
        panic!("{:?}", ran.summary.outcome)
    };
    assert!(failure.message.contains("BasicGuider"), "{}", failure.message);
}

#[test]
fn issue_21_sampler_nodes_with_settings_feed_samplercustomadvanced() {
    let mut h = harness(SynthDtype::Bf16);
    let run = |h: &mut Harness, sampler: Value| {
        let mut prompt = graph(json!(null));
        custom_sampling(&mut prompt, 5, 3, 2.0, "euler");
        prompt["75"] = sampler;
        let ran = h.run(prompt);
        saved(h, &ran)
    };
    let select =
        |name: &str| json!({"class_type": "KSamplerSelect", "inputs": {"sampler_name": name}});
    // At their defaults the nodes are KSampler's samplers, bit for bit.
    for (node, inputs, name) in [
        ("SamplerEulerAncestral", json!({"eta": 1.0, "s_noise": 1.0}), "euler_ancestral"),
        ("SamplerLMS", json!({"order": 4}), "lms"),
        (
            "SamplerER_SDE",
            json!({"solver_type": "ER-SDE", "max_stage": 3, "eta": 1.0, "s_noise": 1.0}),
            "er_sde",
        ),
        ("SamplerDPMPP_2S_Ancestral", json!({"eta": 1.0, "s_noise": 1.0}), "dpmpp_2s_ancestral"),
        (
            "SamplerDPMPP_SDE",
            json!({"eta": 1.0, "s_noise": 1.0, "r": 0.5, "noise_device": "gpu"}),
            "dpmpp_sde_gpu",
        ),
        (
            "SamplerDPMPP_2M_SDE",
            json!({"solver_type": "heun", "eta": 1.0, "s_noise": 1.0, "noise_device": "cpu"}),
            "dpmpp_2m_sde_heun",
        ),
        (
            "SamplerDPMPP_3M_SDE",
            json!({"eta": 1.0, "s_noise": 1.0, "noise_device": "cpu"}),
            "dpmpp_3m_sde",
        ),
    ] {
        let default = run(&mut h, select(name));
        let node_default = run(&mut h, json!({"class_type": node, "inputs": inputs}));
        assert_eq!(max_diff(&node_default, &default), 0, "{node} at its defaults is {name}");
    }
    // Other settings change the image.
    let half = run(
        &mut h,
        json!({"class_type": "SamplerEulerAncestral", "inputs": {"eta": 0.5, "s_noise": 1.0}}),
    );
    assert!(max_diff(&half, &run(&mut h, select("euler_ancestral"))) > 0, "eta 0.5");
    let ode = run(
        &mut h,
        json!({"class_type": "SamplerER_SDE", "inputs": {"solver_type": "ODE", "max_stage": 3, "eta": 1.0, "s_noise": 1.0}}),
    );
    assert!(
        max_diff(&ode, &run(&mut h, select("er_sde"))) > 0,
        "ER-SDE's ODE solver adds no noise"
    );
    // The `_gpu` twins draw the same Brownian noise on the CPU.
    let gpu = run(&mut h, select("dpmpp_3m_sde_gpu"));
    assert_eq!(max_diff(&gpu, &run(&mut h, select("dpmpp_3m_sde"))), 0, "dpmpp_3m_sde_gpu");
}

#[test]
fn issue_21_latent_composite_and_blend_mix_encoded_images() {
    let mut h = harness(SynthDtype::Bf16);
    // Two encoded 32² images, decoded after the node under test.
    let decoded = |h: &mut Harness, node: Value| {
        let mut prompt = json!({
            "63": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
            "1": {"class_type": "EmptyImage", "inputs": {"width": 32, "height": 32, "batch_size": 1, "color": 0x3366CC}},
            "2": {"class_type": "EmptyImage", "inputs": {"width": 32, "height": 32, "batch_size": 1, "color": 0xCC9933}},
            "3": {"class_type": "VAEEncode", "inputs": {"pixels": ["1", 0], "vae": ["63", 0]}},
            "4": {"class_type": "VAEEncode", "inputs": {"pixels": ["2", 0], "vae": ["63", 0]}},
            "65": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["63", 0]}},
            "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "z", "images": ["65", 0]}},
        });
        prompt["5"] = node;
        let ran = h.run(prompt);
        saved(h, &ran)
    };
    let blend = |f: f64| json!({"class_type": "LatentBlend", "inputs": {"samples1": ["3", 0], "samples2": ["4", 0], "blend_factor": f}});
    let composite = |x: i64, feather: i64| json!({"class_type": "LatentComposite", "inputs": {"samples_to": ["3", 0], "samples_from": ["4", 0], "x": x, "y": 0, "feather": feather}});
    let first = decoded(&mut h, blend(1.0));
    let second = decoded(&mut h, blend(0.0));
    assert!(max_diff(&first, &second) > 1);
    // Pasted whole at (0, 0), the second latent replaces the first.
    assert_eq!(max_diff(&decoded(&mut h, composite(0, 0)), &second), 0);
    // Pasted from x = 16 (two cells), the left stays the first image's; feathering changes the seam.
    let half = decoded(&mut h, composite(16, 0));
    let feathered = decoded(&mut h, composite(16, 16));
    assert!(max_diff(&half, &first) > 1 && max_diff(&half, &second) > 1);
    assert!(max_diff(&feathered, &half) > 0);
    let mid = decoded(&mut h, blend(0.5));
    assert!(max_diff(&mid, &first) > 1 && max_diff(&mid, &second) > 1);
}

/// The Z-Image Fun ControlNet as `image_z_image_turbo_fun_union_controlnet` wires it (`ModelPatchLoader`,
/// `QwenImageDiffsynthControlnet` on the model), on a tiny file of the release's layout: the control image
/// steers the result and strength 0 gives the image without it. (Its forward pass is compared with ComfyUI's
/// in kiln-models' tests.)
#[test]
fn issue_23_the_z_image_fun_controlnet_steers_sampling() {
    let mut h = harness(SynthDtype::Bf16);
    let path =
        h.roots.input.join("models/model_patches/Z-Image-Turbo-Fun-Controlnet-Union.safetensors");
    let family = synth::SynthFamily::ZImageFunControlNet;
    synth::write_family(
        &path,
        family,
        &ZImageTurboSet::tiny(),
        SynthDtype::Bf16,
        4,
        &mut |_, _| {},
    )
    .expect("a tiny file");
    let plain = {
        let ran = h.run(graph(ksampler(7, 2, "euler")));
        saved(&h, &ran)
    };
    // The graph with the patch applied by `node` (its image input connected or not).
    let prompt = |node: &str, colour: i64, strength: f64, image: bool| {
        let mut prompt = graph(ksampler(7, 2, "euler"));
        prompt["80"] = json!({"class_type": "ModelPatchLoader", "inputs": {"name": "Z-Image-Turbo-Fun-Controlnet-Union.safetensors"}});
        prompt["81"] = json!({"class_type": "EmptyImage", "inputs": {"width": 48, "height": 40, "batch_size": 1, "color": colour}});
        prompt["82"] = json!({"class_type": node, "inputs": {"model": ["69", 0], "model_patch": ["80", 0], "vae": ["63", 0], "strength": strength}});
        if image {
            prompt["82"]["inputs"]["image"] = json!(["81", 0]);
        }
        prompt["70"]["inputs"]["model"] = json!(["82", 0]);
        prompt
    };
    let mut image = |node: &str, colour: i64, strength: f64| {
        let ran = h.run(prompt(node, colour, strength, true));
        saved(&h, &ran)
    };
    let diffsynth = "QwenImageDiffsynthControlnet";
    let (blue, red) = (image(diffsynth, 0x3366cc, 1.0), image(diffsynth, 0xcc3333, 1.0));
    assert_ne!(blue, plain, "the ControlNet steers the result");
    assert_ne!(blue, red, "the control image matters");
    assert_eq!(image(diffsynth, 0x3366cc, 0.0), plain, "strength 0 adds nothing");
    // Z-Image's own node does the same; without an image it says what is missing.
    assert_eq!(image("ZImageFunControlnet", 0x3366cc, 1.0), blue);
    let ran = h.run(prompt("ZImageFunControlnet", 0, 1.0, false));
    let Outcome::Failed(failure) = &ran.summary.outcome else {
        panic!("{:?}", ran.summary.outcome)
    };
    assert!(failure.message.contains("connect `image`"), "{}", failure.message);
}
