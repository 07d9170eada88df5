//! The FLUX.1 DiT against `scripts/reference/flux.py`'s fixtures: ComfyUI's own `Flux` (cross-checked there
//! with diffusers' `FluxTransformer2DModel`) on a tiny random model, for an even latent, an odd one with two
//! samples at different σ and guidance, a padded one, schnell (no guidance embedding), Fill (96 input
//! channels), Kontext's reference latents by `offset` and `index`, and the same weights in diffusers' layout.

use std::collections::BTreeMap;
use std::sync::Arc;

use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType};
use kiln_models::family::{
    DiffusionDetected, DiffusionFamily, DiffusionInput, DiffusionNet, ModelPatchDetected,
    ModelPatchNet,
};
use kiln_models::flux::{self, Config, Flux, FluxInput, Layout};
use kiln_models::header::diffusion_prefix;
use kiln_models::{Error, Header};

use crate::common::{TempTensors, assert_close, cpu, fixture, read_tensors};

const WEIGHTS: &str = "flux/weights.safetensors";

/// The tiny reference model's config (the LongCat-Image and Chroma fixtures' too, at their text widths).
pub(crate) fn tiny() -> Config {
    Config {
        generation: flux::Generation::One,
        dim: 128,
        heads: 1,
        double_blocks: 2,
        single_blocks: 2,
        mlp_hidden: 512,
        in_channels: 16,
        text_dim: 32,
        vec_dim: Some(16),
        guidance: true,
        longcat: false,
        approximator: None,
        ovis: false,
    }
}

/// The fixture's weights, changed by `edit` (name → values with shape), written to a temporary file removed
/// on drop.
fn edited_weights(
    variant: &str,
    edit: impl FnOnce(&mut BTreeMap<String, (Vec<usize>, Vec<f32>)>),
) -> TempTensors {
    let mut tensors = read_tensors(WEIGHTS);
    edit(&mut tensors);
    TempTensors::new(&format!("flux-{variant}"), tensors)
}

/// The CPU backend the model in `path` was loaded on, and the model as detection and the loader see it.
fn load(path: &std::path::Path) -> (Arc<Cpu>, DiffusionDetected, Flux) {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(path).unwrap();
    let prefix = diffusion_prefix(file.names());
    let header = Header::new(&file, &prefix);
    let detected = DiffusionDetected::detect(&header).unwrap().unwrap();
    let DiffusionDetected::Flux(config, layout) = detected.clone() else {
        panic!("{detected:?} is not FLUX.1");
    };
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).unwrap();
    (b, detected, Flux::new(config, layout, weights))
}

/// Runs `model` on the fixture's case `case` (inputs `x.<input>` ...) with `refs` and compares with `out.<case>`.
fn check(b: &Cpu, model: &Flux, case: &str, input: &str, refs: &[&str], method: Option<&str>) {
    let (shape, want) = &read_tensors("flux/io.safetensors")[&format!("out.{case}")];
    let (got_shape, got) = output(b, model, input, refs, method);
    assert_eq!(&got_shape, shape, "{case}");
    assert_close(case, &got, want, 1e-4);
}

/// `model`'s output (shape, values) on the fixture's inputs `x.<input>` ... with `refs`.
fn output(
    b: &Cpu,
    model: &Flux,
    input: &str,
    refs: &[&str],
    method: Option<&str>,
) -> (Vec<usize>, Vec<f32>) {
    let io = read_tensors("flux/io.safetensors");
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).unwrap();
    let (x, context, pooled) = (
        tensor(&format!("x.{input}")),
        tensor(&format!("context.{input}")),
        tensor(&format!("y.{input}")),
    );
    let references: Vec<_> = refs.iter().map(|r| tensor(r)).collect();
    let guidance = io.get(&format!("guidance.{input}")).map(|g| g.1.as_slice());
    let out = model
        .forward(
            b,
            &FluxInput {
                x: &x,
                timesteps: &io[&format!("sigma.{input}")].1,
                context: &context,
                pooled: Some(&pooled),
                guidance,
                references: &references,
                method,
                kv_cache: None,
                text_prefix: None,
            },
        )
        .unwrap();
    (out.shape().to_vec(), b.to_f32(&out).unwrap())
}

#[test]
fn outputs_match_comfyui() {
    let (b, detected, model) = load(&fixture(WEIGHTS));
    assert_eq!(detected, DiffusionDetected::Flux(tiny(), Layout::Comfy));
    assert_eq!(detected.family(), DiffusionFamily::Flux);
    assert_eq!(
        detected.sampling().flow().expect("flow sampling").shift(),
        flux::family::FLUX_SHIFT
    );
    for case in ["even", "odd", "ragged"] {
        check(&b, &model, case, case, &[], None);
    }
    // Kontext's references: `offset` is FLUX.1's default.
    check(&b, &model, "refs.offset", "odd", &["ref.1", "ref.2"], None);
    check(&b, &model, "refs.offset", "odd", &["ref.1", "ref.2"], Some("offset"));
    check(&b, &model, "refs.index", "odd", &["ref.1", "ref.2"], Some("index"));
}

#[test]
fn an_f16_file_computes_in_f16_on_a_gpu_behind_comfyuis_nan_to_num_guards() {
    let (b, detected, model) = load(&fixture(WEIGHTS));
    // FLUX.1's supported types start with bf16: on CUDA an f16 file computes in f16 (ComfyUI keeps the file's
    // type), any other in bf16; Fill has no f16; on the CPU everything computes in f32.
    for (weights, want) in [
        (Some(DType::F16), DType::F16),
        (Some(DType::BF16), DType::BF16),
        (Some(DType::F8E4M3), DType::BF16),
        (Some(DType::F32), DType::BF16),
        (None, DType::BF16),
    ] {
        assert_eq!(detected.compute_dtype(weights, true), want, "{weights:?}");
        assert_eq!(detected.compute_dtype(weights, false), DType::F32, "{weights:?}");
    }
    let fill = DiffusionDetected::Flux(Config { in_channels: 96, ..tiny() }, Layout::Comfy);
    assert_eq!(fill.compute_dtype(Some(DType::F16), true), DType::BF16);

    let half = b.with_compute_dtype(DType::F16).unwrap();
    let io = read_tensors("flux/io.safetensors");
    let (_, got) = output(&half, &model, "even", &[], None);
    assert_close("even in f16", &got, &io["out.even"].1, 2e-2);

    // A text stream past f16's range: ComfyUI's guards turn its infinities into ±65504 after each block, so the
    // prediction stays finite where unguarded f16 would end in NaN.
    let loud = edited_weights("f16-overflow", |t| {
        let (_, w) = t.get_mut("double_blocks.0.txt_mlp.2.weight").unwrap();
        w.iter_mut().for_each(|v| *v *= 1e6);
    });
    let (b, _, model) = load(&loud.0);
    let (_, got) = output(&b.with_compute_dtype(DType::F16).unwrap(), &model, "even", &[], None);
    assert!(got.iter().all(|v| v.is_finite()), "an f16 run without guards");
}

#[test]
fn schnell_has_no_guidance_embedding_and_its_own_sampling() {
    let file = edited_weights("schnell", |t| t.retain(|name, _| !name.starts_with("guidance_in.")));
    let (b, detected, model) = load(&file.0);
    assert_eq!(
        detected,
        DiffusionDetected::Flux(Config { guidance: false, ..tiny() }, Layout::Comfy)
    );
    assert_eq!(model.config.variant(), "FLUX.1 schnell");
    // ModelSamplingDiscreteFlow with shift 1: σ(t) = t.
    assert_eq!(detected.sampling().flow().expect("flow sampling").shift(), 1.0);
    check(&b, &model, "schnell", "schnell", &[], None);
}

#[test]
fn fill_reads_96_channels() {
    let fill = read_tensors("flux/fill_img_in.safetensors");
    let file = edited_weights("fill", |t| {
        t.insert("img_in.weight".into(), fill["fill.img_in.weight"].clone());
        t.insert("img_in.bias".into(), fill["fill.img_in.bias"].clone());
    });
    let (b, detected, model) = load(&file.0);
    assert_eq!(
        detected,
        DiffusionDetected::Flux(Config { in_channels: 96, ..tiny() }, Layout::Comfy)
    );
    assert_eq!(model.config.variant(), "FLUX.1 Fill");
    check(&b, &model, "fill", "fill", &[], None);
}

/// The fixture's weights renamed to diffusers' `FluxTransformer2DModel` (models-flux.md §3.4): fused
/// projections split by rows, the final modulation's halves swapped.
fn to_diffusers(t: &mut BTreeMap<String, (Vec<usize>, Vec<f32>)>) {
    let old = std::mem::take(t);
    let rows = |(shape, values): &(Vec<usize>, Vec<f32>), start: usize, len: usize| {
        let cols: usize = shape[1..].iter().product();
        let mut shape = shape.clone();
        shape[0] = len;
        (shape, values[start * cols..(start + len) * cols].to_vec())
    };
    let d = tiny().dim;
    for (name, tensor) in &old {
        let (stem, kind) = name.rsplit_once('.').unwrap();
        let mut put = |new: String, value| {
            t.insert(new, value);
        };
        let split = |names: &[&str],
                     sizes: &[usize],
                     put: &mut dyn FnMut(String, (Vec<usize>, Vec<f32>))| {
            let mut start = 0;
            for (n, &len) in names.iter().zip(sizes) {
                put(format!("{n}.{kind}"), rows(tensor, start, len));
                start += len;
            }
        };
        let parts: Vec<&str> = stem.split('.').collect();
        match parts.as_slice() {
            ["img_in"] => put(format!("x_embedder.{kind}"), tensor.clone()),
            ["txt_in"] => put(format!("context_embedder.{kind}"), tensor.clone()),
            [embedder, layer] if embedder.ends_with("_in") => {
                let which = match *embedder {
                    "time_in" => "timestep_embedder",
                    "guidance_in" => "guidance_embedder",
                    _ => "text_embedder",
                };
                let linear = if *layer == "in_layer" { "linear_1" } else { "linear_2" };
                put(format!("time_text_embed.{which}.{linear}.{kind}"), tensor.clone());
            }
            ["final_layer", "linear"] => put(format!("proj_out.{kind}"), tensor.clone()),
            ["final_layer", "adaLN_modulation", "1"] => {
                let (scale, shift) = (rows(tensor, d, d), rows(tensor, 0, d));
                let mut values = scale.1;
                values.extend(shift.1);
                put(format!("norm_out.linear.{kind}"), (tensor.0.clone(), values));
            }
            ["double_blocks", i, rest @ ..] => {
                let q = format!("transformer_blocks.{i}");
                let name = match rest {
                    ["img_mod", "lin"] => format!("{q}.norm1.linear"),
                    ["txt_mod", "lin"] => format!("{q}.norm1_context.linear"),
                    ["img_attn", "qkv"] => {
                        let names = ["to_q", "to_k", "to_v"].map(|n| format!("{q}.attn.{n}"));
                        split(&names.each_ref().map(String::as_str), &[d, d, d], &mut put);
                        continue;
                    }
                    ["txt_attn", "qkv"] => {
                        let names = ["add_q_proj", "add_k_proj", "add_v_proj"]
                            .map(|n| format!("{q}.attn.{n}"));
                        split(&names.each_ref().map(String::as_str), &[d, d, d], &mut put);
                        continue;
                    }
                    ["img_attn", "proj"] => format!("{q}.attn.to_out.0"),
                    ["txt_attn", "proj"] => format!("{q}.attn.to_add_out"),
                    ["img_attn", "norm", "query_norm"] => format!("{q}.attn.norm_q"),
                    ["img_attn", "norm", "key_norm"] => format!("{q}.attn.norm_k"),
                    ["txt_attn", "norm", "query_norm"] => format!("{q}.attn.norm_added_q"),
                    ["txt_attn", "norm", "key_norm"] => format!("{q}.attn.norm_added_k"),
                    ["img_mlp", "0"] => format!("{q}.ff.net.0.proj"),
                    ["img_mlp", "2"] => format!("{q}.ff.net.2"),
                    ["txt_mlp", "0"] => format!("{q}.ff_context.net.0.proj"),
                    ["txt_mlp", "2"] => format!("{q}.ff_context.net.2"),
                    other => panic!("unexpected {other:?}"),
                };
                let kind = if kind == "scale" { "weight" } else { kind };
                put(format!("{name}.{kind}"), tensor.clone());
            }
            ["single_blocks", i, rest @ ..] => {
                let q = format!("single_transformer_blocks.{i}");
                let name = match rest {
                    ["linear1"] => {
                        let names = ["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"]
                            .map(|n| format!("{q}.{n}"));
                        let mlp = tiny().mlp_hidden;
                        split(&names.each_ref().map(String::as_str), &[d, d, d, mlp], &mut put);
                        continue;
                    }
                    ["linear2"] => format!("{q}.proj_out"),
                    ["modulation", "lin"] => format!("{q}.norm.linear"),
                    ["norm", "query_norm"] => format!("{q}.attn.norm_q"),
                    ["norm", "key_norm"] => format!("{q}.attn.norm_k"),
                    other => panic!("unexpected {other:?}"),
                };
                let kind = if kind == "scale" { "weight" } else { kind };
                put(format!("{name}.{kind}"), tensor.clone());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn diffusers_layout_loads_to_the_same_model() {
    let file = edited_weights("diffusers", to_diffusers);
    let (b, detected, model) = load(&file.0);
    assert_eq!(detected, DiffusionDetected::Flux(tiny(), Layout::Diffusers));
    check(&b, &model, "even", "even", &[], None);
    check(&b, &model, "refs.index", "odd", &["ref.1", "ref.2"], Some("index"));
}

#[test]
fn the_family_forward_defaults_guidance_to_3_5() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let detected = DiffusionDetected::detect(&header).unwrap().unwrap();
    let net = detected.build(
        manager.load(&flux::load_plan(&header, &tiny(), Layout::Comfy), &mut |_, _| {}).unwrap(),
    );
    assert!(matches!(net, DiffusionNet::Flux(_)));
    // The even case was recorded at guidance 3.5: no guidance from the conditioning gives the same output.
    let io = read_tensors("flux/io.safetensors");
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).unwrap();
    let (x, context, pooled) = (tensor("x.even"), tensor("context.even"), tensor("y.even"));
    let input = |rope| DiffusionInput {
        pooled: Some(&pooled),
        rope,
        ..DiffusionInput::new(&x, &io["sigma.even"].1, &context)
    };
    let out = net.forward(&*b, input(kiln_models::RopeOptions::default())).unwrap();
    assert_close("default guidance", &b.to_f32(&out).unwrap(), &io["out.even"].1, 1e-4);
    // ComfyUI's FLUX moves its positions by ScaleROPE's options; Kiln does not yet, and says so rather than
    // ignoring them.
    let rope = kiln_models::RopeOptions { scale: [1.0, 2.0, 1.0], shift: [0.0; 3] };
    let err = net.forward(&*b, input(rope)).expect_err("refused").to_string();
    assert!(err.contains("ScaleROPE") && err.contains("FLUX"), "{err}");
}

#[test]
fn bad_inputs_and_other_flux_files_are_refused_by_name() {
    let (b, _, model) = load(&fixture(WEIGHTS));
    let x = b.full(&[1, 4, 2, 2], 0.0, DType::F32).unwrap();
    let context = b.full(&[1, 3, 32], 0.0, DType::F32).unwrap();
    let input = FluxInput {
        x: &x,
        timesteps: &[0.5],
        context: &context,
        pooled: None,
        guidance: None,
        references: &[],
        method: None,
        kv_cache: None,
        text_prefix: None,
    };
    assert!(
        matches!(model.forward(&*b, &input), Err(Error::Invalid(m)) if m.contains("16 channels"))
    );

    // A FLUX.1 file with FLUX.2's shared modulation is read as FLUX.2, whose 128-channel input it lacks.
    let flux2 = edited_weights("flux2", |t| {
        t.insert(
            "double_stream_modulation_img.lin.weight".into(),
            (vec![768, 128], vec![0.0; 768 * 128]),
        );
    });
    let file = SafetensorsFile::open(&flux2.0).unwrap();
    let err = DiffusionDetected::detect(&Header::new(&file, "")).unwrap_err();
    assert!(
        err.to_string().contains("FLUX.2") && err.to_string().contains("128 channels"),
        "{err}"
    );
    // Chroma Radiance has Chroma's distilled guidance layer and no latent input: it is refused by name.
    let radiance = edited_weights("chroma-radiance", |t| {
        t.remove("img_in.weight");
        t.insert("distilled_guidance_layer.norms.0.scale".into(), (vec![128], vec![1.0; 128]));
    });
    let file = SafetensorsFile::open(&radiance.0).unwrap();
    let err = DiffusionDetected::detect(&Header::new(&file, "")).unwrap_err();
    assert!(err.to_string().contains("Chroma Radiance"), "{err}");
}

/// Every key of a diffusers-named FLUX.1 LoRA (synth's: the fused qkv's and linear1's row blocks, linear1's
/// four of unequal sizes) adapts a weight, and each fused weight gets one patch of its full shape.
#[test]
fn a_diffusers_lora_patches_the_fused_weights_row_blocks() {
    let dir = std::env::temp_dir().join(format!("kiln-flux-lora-{}", std::process::id()));
    let path = dir.join("lora.safetensors");
    let set = kiln_models::synth::ZImageTurboSet::tiny();
    let family = kiln_models::synth::SynthFamily::Lora(DiffusionFamily::Flux);
    kiln_models::synth::write_family(
        &path,
        family,
        &set,
        kiln_models::synth::SynthDtype::F32,
        1,
        &mut |_, _| {},
    )
    .unwrap();
    let lora = SafetensorsFile::open(&path).unwrap();
    let cfg = set.flux.clone();
    let expected = kiln_models::flux::expected_shapes(&cfg);
    let slots: Vec<(&str, &[usize])> =
        expected.iter().map(|(n, s)| (n.as_str(), s.as_slice())).collect();
    let found = kiln_models::flux::lora::patches(&lora, &cfg, &slots, 1.0).unwrap();
    assert!(found.unmatched.is_empty(), "{:?}", found.unmatched);
    let patched: Vec<&str> = found.patches.iter().map(|(n, _)| n.as_str()).collect();
    assert!(patched.contains(&"double_blocks.0.img_attn.qkv.weight"), "{patched:?}");
    assert!(patched.contains(&"double_blocks.0.txt_attn.qkv.weight"), "{patched:?}");
    assert!(patched.contains(&"single_blocks.1.linear1.weight"), "{patched:?}");
    assert_eq!(patched.len(), cfg.double_blocks * 2 + cfg.single_blocks);
    let _ = std::fs::remove_dir_all(&dir);
}

/// USO's style projector (`scripts/reference/flux_uso.py`: ComfyUI's `SigLIPMultiFeatProjModel`) makes
/// ComfyUI's style tokens of three SigLIP states, and the DiT with them before the text (what
/// `USOStyleReference`'s patch does after `txt_in`) gives ComfyUI's output.
#[test]
fn uso_style_tokens_and_the_dit_with_them_match_comfyui() {
    let (b, _, model) = load(&fixture(WEIGHTS));
    let file = SafetensorsFile::open(fixture("flux_uso/projector.safetensors")).unwrap();
    let header = Header::new(&file, "");
    let found = ModelPatchDetected::detect(&header).unwrap().unwrap();
    let ModelPatchDetected::Uso(config) = &found else {
        panic!("{found:?} is not USO's projector")
    };
    assert_eq!(
        (config.siglip_tokens, config.style_tokens, config.siglip_dim, config.hidden),
        (9, 4, 32, 128)
    );
    let manager = kiln_compute::memory::MemoryManager::new(
        b.memory().clone(),
        kiln_compute::memory::ManagerConfig::for_this_machine(false),
    )
    .unwrap();
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).unwrap();
    let net = found.build(weights);
    assert_eq!(net.family(), DiffusionFamily::Flux);
    let ModelPatchNet::Uso(projector) = &net else { unreachable!() };

    let io = read_tensors("flux_uso/io.safetensors");
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).unwrap();
    let states = ["states.low", "states.mid", "states.high"].map(tensor);
    let tokens = projector.forward(&*b, [&states[0], &states[1], &states[2]]).unwrap();
    assert_close("style tokens", &b.to_f32(&tokens).unwrap(), &io["tokens"].1, 1e-4);

    let flux = read_tensors("flux/io.safetensors");
    let input = |name: &str| b.from_f32(&flux[name].0, &flux[name].1, DType::F32).unwrap();
    let (x, context, pooled) = (input("x.even"), input("context.even"), input("y.even"));
    let out = model
        .forward(
            &*b,
            &FluxInput {
                x: &x,
                timesteps: &flux["sigma.even"].1,
                context: &context,
                pooled: Some(&pooled),
                guidance: Some(&flux["guidance.even"].1),
                references: &[],
                method: None,
                kv_cache: None,
                text_prefix: Some(&tokens),
            },
        )
        .unwrap();
    assert_close("the DiT with USO's tokens", &b.to_f32(&out).unwrap(), &io["out"].1, 1e-4);
}
