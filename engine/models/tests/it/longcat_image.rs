//! LongCat-Image against `scripts/reference/longcat_image.py`'s fixtures, ComfyUI 0f1fa67a's own code: the DiT
//! (FLUX.1's code with LongCat's detection and RoPE placement, cross-checked there with diffusers'
//! `LongCatImageTransformer2DModel`) on a tiny model made of the FLUX.1 fixture's weights with a 3584-wide
//! `txt_in`; the tokenizer's ids for prompts with quotes; and the text encoder's conditioning (the padded prompt
//! under ComfyUI's mask, prefix and suffix cut, an image in the edit template) on the tiny Qwen2.5-VL.

use std::collections::BTreeMap;

use kiln_compute::memory::{SafetensorsFile, SlotPlan};
use kiln_compute::{Backend as _, DType};
use kiln_models::Header;
use kiln_models::family::{
    DiffusionDetected, DiffusionFamily, Qwen25Role, TextEncoderDetected, TextEncoderFamily,
};
use kiln_models::flux::{self, Config, Flux, FluxInput, Layout};
use kiln_models::qwen_vl::{self, VisionConfig, VisionInput};
use kiln_models::qwen3::{self, IMAGE_PAD, ImageTokens, Qwen3, Tokenizer};
use serde_json::Value;

use crate::common::{TempTensors, assert_close, cpu, fixture, read_tensors};

const IO: &str = "longcat_image/io.safetensors";

/// The tiny LongCat-Image DiT: the FLUX.1 fixture's widths, no pooled vector, no guidance.
fn tiny() -> Config {
    Config { text_dim: 3584, vec_dim: None, guidance: false, longcat: true, ..crate::flux::tiny() }
}

/// The FLUX.1 fixture's weights without `guidance_in` and `vector_in`, with LongCat's `txt_in`.
fn longcat_file(name: &str) -> TempTensors {
    let mut tensors = read_tensors("flux/weights.safetensors");
    tensors.retain(|name, _| !name.starts_with("guidance_in.") && !name.starts_with("vector_in."));
    tensors.extend(read_tensors("longcat_image/txt_in.safetensors"));
    TempTensors::new(name, tensors)
}

fn load_dit(
    path: &std::path::Path,
) -> (std::sync::Arc<kiln_compute::backend::cpu::Cpu>, DiffusionDetected, Flux) {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(path).unwrap();
    let header = Header::new(&file, "");
    let detected = DiffusionDetected::detect(&header).unwrap().unwrap();
    let DiffusionDetected::Flux(config, layout) = detected.clone() else {
        panic!("{detected:?} is not a FLUX DiT");
    };
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).unwrap();
    (b, detected, Flux::new(config, layout, weights))
}

#[test]
fn the_dit_is_detected_as_comfyui_does_and_matches_its_outputs() {
    let file = longcat_file("longcat-dit");
    let (b, detected, model) = load_dit(&file.0);
    assert_eq!(detected, DiffusionDetected::Flux(tiny(), Layout::Comfy));
    assert_eq!(detected.family(), DiffusionFamily::LongCatImage);
    assert_eq!(model.config.variant(), "LongCat-Image");
    // No sampling settings of its own: ModelSamplingFlux's default shift, not schnell's discrete flow.
    assert_eq!(
        detected.sampling().flow().expect("flow sampling").shift(),
        flux::family::FLUX_SHIFT
    );
    assert_eq!(detected.family().latent(), DiffusionFamily::Flux.latent());

    let io = read_tensors(IO);
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).unwrap();
    let run = |input: &str, refs: &[&str], method: Option<&str>| {
        let (x, context) = (tensor(&format!("x.{input}")), tensor(&format!("context.{input}")));
        let references: Vec<_> = refs.iter().map(|r| tensor(r)).collect();
        let out = model
            .forward(
                &*b,
                &FluxInput {
                    x: &x,
                    timesteps: &io[&format!("sigma.{input}")].1,
                    context: &context,
                    pooled: None,
                    // FluxGuidance's value reaches a model without a guidance embedding, which ignores it.
                    guidance: Some(&[4.0, 4.0][..x.shape()[0]]),
                    references: &references,
                    method,
                    kv_cache: None,
                    text_prefix: None,
                },
            )
            .unwrap();
        b.to_f32(&out).unwrap()
    };
    for case in ["t2i", "ragged"] {
        assert_close(case, &run(case, &[], None), &io[&format!("out.{case}")].1, 1e-4);
    }
    let refs = ["ref.1", "ref.2"];
    assert_close("index", &run("t2i", &refs, Some("index")), &io["out.refs_index"].1, 1e-4);
    assert_close("offset", &run("t2i", &refs, None), &io["out.refs_offset"].1, 1e-4);
}

#[test]
fn the_dit_in_diffusers_layout_gives_the_same() {
    let comfy = read_tensors("flux/weights.safetensors");
    let txt_in = read_tensors("longcat_image/txt_in.safetensors");
    // diffusers' LongCatImageTransformer2DModel: FLUX.1's diffusers names, the timestep embedder as `time_embed`.
    let mut tensors = BTreeMap::new();
    let rows = |(shape, values): &(Vec<usize>, Vec<f32>), part: usize, parts: &[usize]| {
        let cols: usize = shape[1..].iter().product();
        let start: usize = parts[..part].iter().sum();
        let mut shape = shape.clone();
        shape[0] = parts[part];
        (shape, values[start * cols..(start + parts[part]) * cols].to_vec())
    };
    for (name, value) in comfy.iter().chain(&txt_in) {
        if name.starts_with("guidance_in.") || name.starts_with("vector_in.") {
            continue;
        }
        let name = name.replace("_norm.scale", "_norm.weight");
        let (stem, suffix) = name.rsplit_once('.').unwrap();
        let put = |t: &mut BTreeMap<String, _>, to: &str, v| {
            t.insert(format!("{to}.{suffix}"), v);
        };
        let parts: Vec<&str> = stem.split('.').collect();
        match parts.as_slice() {
            ["img_in"] => put(&mut tensors, "x_embedder", value.clone()),
            ["txt_in"] => put(&mut tensors, "context_embedder", value.clone()),
            ["time_in", layer] => {
                let l = if *layer == "in_layer" { "linear_1" } else { "linear_2" };
                put(&mut tensors, &format!("time_embed.timestep_embedder.{l}"), value.clone());
            }
            ["double_blocks", i, rest @ ..] => {
                let d = format!("transformer_blocks.{i}");
                let to = match rest {
                    ["img_mod", "lin"] => vec![format!("{d}.norm1.linear")],
                    ["txt_mod", "lin"] => vec![format!("{d}.norm1_context.linear")],
                    ["img_attn", "qkv"] => {
                        ["to_q", "to_k", "to_v"].map(|p| format!("{d}.attn.{p}")).to_vec()
                    }
                    ["txt_attn", "qkv"] => ["add_q_proj", "add_k_proj", "add_v_proj"]
                        .map(|p| format!("{d}.attn.{p}"))
                        .to_vec(),
                    ["img_attn", "proj"] => vec![format!("{d}.attn.to_out.0")],
                    ["txt_attn", "proj"] => vec![format!("{d}.attn.to_add_out")],
                    ["img_attn", "norm", "query_norm"] => vec![format!("{d}.attn.norm_q")],
                    ["img_attn", "norm", "key_norm"] => vec![format!("{d}.attn.norm_k")],
                    ["txt_attn", "norm", "query_norm"] => vec![format!("{d}.attn.norm_added_q")],
                    ["txt_attn", "norm", "key_norm"] => vec![format!("{d}.attn.norm_added_k")],
                    ["img_mlp", "0"] => vec![format!("{d}.ff.net.0.proj")],
                    ["img_mlp", "2"] => vec![format!("{d}.ff.net.2")],
                    ["txt_mlp", "0"] => vec![format!("{d}.ff_context.net.0.proj")],
                    ["txt_mlp", "2"] => vec![format!("{d}.ff_context.net.2")],
                    other => panic!("{other:?}"),
                };
                let sizes = vec![value.0[0] / to.len(); to.len()];
                for (k, to) in to.iter().enumerate() {
                    put(&mut tensors, to, rows(value, k, &sizes));
                }
            }
            ["single_blocks", i, rest @ ..] => {
                let d = format!("single_transformer_blocks.{i}");
                match rest {
                    ["linear1"] => {
                        let sizes = [128, 128, 128, 512];
                        for (k, p) in
                            ["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"].iter().enumerate()
                        {
                            put(&mut tensors, &format!("{d}.{p}"), rows(value, k, &sizes));
                        }
                    }
                    ["linear2"] => put(&mut tensors, &format!("{d}.proj_out"), value.clone()),
                    ["modulation", "lin"] => {
                        put(&mut tensors, &format!("{d}.norm.linear"), value.clone())
                    }
                    ["norm", "query_norm"] => {
                        put(&mut tensors, &format!("{d}.attn.norm_q"), value.clone())
                    }
                    ["norm", "key_norm"] => {
                        put(&mut tensors, &format!("{d}.attn.norm_k"), value.clone())
                    }
                    other => panic!("{other:?}"),
                }
            }
            ["final_layer", "linear"] => put(&mut tensors, "proj_out", value.clone()),
            ["final_layer", "adaLN_modulation", "1"] => {
                // diffusers stores (scale, shift) where ComfyUI stores (shift, scale).
                let half = value.0[0] / 2;
                let (shift, scale) = (rows(value, 0, &[half, half]), rows(value, 1, &[half, half]));
                let mut joined = scale.1;
                joined.extend(shift.1);
                put(&mut tensors, "norm_out.linear", (value.0.clone(), joined));
            }
            other => panic!("{other:?}"),
        }
    }
    let file = TempTensors::new("longcat-diffusers", tensors);
    let (b, detected, model) = load_dit(&file.0);
    assert_eq!(detected, DiffusionDetected::Flux(tiny(), Layout::Diffusers));
    let io = read_tensors(IO);
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).unwrap();
    let (x, context) = (tensor("x.t2i"), tensor("context.t2i"));
    let out = model
        .forward(
            &*b,
            &FluxInput {
                x: &x,
                timesteps: &io["sigma.t2i"].1,
                context: &context,
                pooled: None,
                guidance: None,
                references: &[],
                method: None,
                kv_cache: None,
                text_prefix: None,
            },
        )
        .unwrap();
    assert_close("diffusers layout", &b.to_f32(&out).unwrap(), &io["out.t2i"].1, 1e-4);
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect()
}

fn json(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(fixture(name)).unwrap()).unwrap()
}

#[test]
fn prompts_tokenize_as_comfyuis_longcat_tokenizer() {
    let tokenizer = Tokenizer::bundled().unwrap();
    let fixture = json("longcat_image/tokenizer.json");
    let prompts = fixture["prompts"].as_object().unwrap();
    assert!(prompts.len() >= 10);
    for (name, prompt) in prompts {
        let (image, prompt) = (name.starts_with("edit."), prompt.as_str().unwrap());
        let got = tokenizer.longcat_prompt(prompt, image).unwrap();
        assert_eq!(got, ids(&fixture["ids"][name]), "{name}: {prompt:?}");
    }
}

/// The tiny Qwen2.5-VL with its vision tower (the Qwen-Image Edit fixture's).
fn tiny_encoder() -> (std::sync::Arc<kiln_compute::backend::cpu::Cpu>, Qwen3, VisionConfig) {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture("qwen25vl_vision/weights.safetensors")).unwrap();
    let header = Header::new(&file, "");
    let config = qwen3::detect_qwen25vl(&header).unwrap().unwrap();
    let vision = qwen_vl::detect(&header).unwrap().unwrap();
    let mut plan = qwen3::load_plan(&header, &config);
    plan.slots.extend(
        vision.weight_names().iter().map(|n| SlotPlan::new(n.clone(), vec![(0, n.clone())])),
    );
    let weights = manager.load(&plan, &mut |_, _| {}).unwrap();
    (b, Qwen3::new(config, weights), vision)
}

#[test]
fn the_encoder_conditions_as_comfyuis_longcat_text_encoder() {
    let (b, model, vision) = tiny_encoder();
    let io = read_tensors(IO);
    let images = read_tensors("qwen25vl_vision/io.safetensors");
    let (shape, pixels) = &images["image.wide"];
    let image = VisionInput::of_image(&vision, pixels, shape[1], shape[2], shape[3]).unwrap();
    let tokenizer = Tokenizer::bundled().unwrap();
    for (name, case) in json("longcat_image/encoder.json").as_object().unwrap() {
        let with_image = case["image"].as_bool().unwrap();
        let real = tokenizer.longcat_prompt(case["prompt"].as_str().unwrap(), with_image).unwrap();
        assert_eq!(real, ids(&case["ids"]), "{name}");
        // The tiny model's vocabulary is 1024: it reads each id modulo that, as the reference's did; the image's
        // slot stays `<|image_pad|>` for the image to take its place.
        let model_ids: Vec<u32> =
            real.iter().map(|&id| if id == IMAGE_PAD { id } else { id % 1024 }).collect();
        let tokens: Vec<ImageTokens<_>> = if with_image {
            vec![ImageTokens {
                embeds: qwen_vl::embed_image(&*b, &model.weights, &vision, &image).unwrap(),
                deepstack: Vec::new(),
                rows: image.grid_h / qwen_vl::MERGE,
                cols: image.grid_w / qwen_vl::MERGE,
            }]
        } else {
            Vec::new()
        };
        let attended = qwen3::attended_keys(&real);
        assert!(attended < real.len(), "{name}: the prompt is padded");
        let hidden =
            model.masked_hidden_state_with_images(&*b, &model_ids, &tokens, attended).unwrap();
        let n = hidden.dim(1).unwrap();
        let (start, end) = qwen3::longcat_conditioning_window(&real, n - real.len());
        let cond = b.slice(&hidden, 1, start, n - start - end).unwrap();
        let (want_shape, want) = &io[&format!("hidden.{name}")];
        assert_eq!(cond.shape(), want_shape.as_slice(), "{name}");
        assert_close(name, &b.to_f32(&cond).unwrap(), want, 1e-4);
    }
}

#[test]
fn the_conditioning_window_follows_comfyui() {
    let tokenizer = Tokenizer::bundled().unwrap();
    // Text-to-image: the 512 prompt tokens, pads included.
    let ids = tokenizer.longcat_prompt("a cat", false).unwrap();
    let (start, end) = qwen3::longcat_conditioning_window(&ids, 0);
    assert_eq!(ids.len() - start - end, qwen3::LONGCAT_PROMPT_LENGTH);
    // No `<|im_start|>`: from the first token, to the last `<|im_end|>`.
    assert_eq!(qwen3::longcat_conditioning_window(&[5, 6, 151_645, 7], 0), (0, 2));
    assert_eq!(qwen3::longcat_conditioning_window(&[5, 6, 7], 0), (0, 0));
}

#[test]
fn clip_loader_type_longcat_image_makes_qwen25vl_longcats() {
    let file = SafetensorsFile::open(fixture("qwen25vl_vision/weights.safetensors")).unwrap();
    let found = TextEncoderDetected::detect(&Header::new(&file, "")).unwrap().unwrap();
    let role = |d: TextEncoderDetected| match d {
        TextEncoderDetected::Qwen25Vl(_, _, role) => role,
        other => panic!("{other:?}"),
    };
    assert_eq!(found.family(), TextEncoderFamily::Qwen25Vl);
    assert_eq!(
        role(found.clone().for_clip_type("longcat_image").unwrap()),
        Qwen25Role::LongCatImage
    );
    assert_eq!(role(found.for_clip_type("qwen_image").unwrap()), Qwen25Role::QwenImage);
}
