//! The Wan 2.1 / 2.2 DiT against `scripts/reference/wan.py`'s fixtures: diffusers' `WanTransformer3DModel`
//! (cross-checked there with ComfyUI's `WanModel`) on one tiny random model and the variants made from it —
//! T2V (with a padded odd latent), I2V (with and without CLIP states), FLF2V, a 2.2 I2V expert and TI2V 5B
//! (per-frame and per-sample timesteps) — the same weights in diffusers' layout, detection of every released
//! configuration, the refusal of Wan-derived models, and LoRAs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::{MemoryManager, SafetensorsFile};
use kiln_compute::{Backend as _, DType, Tensor};
use kiln_models::family::{DiffusionDetected, DiffusionFamily, DiffusionInput, DiffusionNet};
use kiln_models::header::diffusion_prefix;
use kiln_models::sampling::{ArVideo, BlockDenoiser, Scheduler, sample_ar_video};
use kiln_models::synth::{self, SynthDtype, SynthFamily, WanFile, ZImageTurboSet};
use kiln_models::wan::{self, CausalCache, CausalStep, Config, ImageEmbed, Layout, WanInput};
use kiln_models::{Error, Header, RopeOptions};

use crate::common::{TempTensors, assert_close, cpu, fixture, read_tensors, write_header_only};

pub(crate) type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// The fixture's variants (see `wan.py`): which tensors of `weights.safetensors` each keeps or replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    Flf2v,
    I2v,
    Expert,
    T2v,
    Ti2v,
}

impl Variant {
    /// The variant's config: the tiny model's widths with its channels and CLIP branch.
    pub(crate) fn config(self) -> Config {
        let base = Config {
            dim: 256,
            ffn_dim: 128,
            heads: 2,
            layers: 2,
            in_channels: 36,
            out_channels: 16,
            text_dim: 32,
            freq_dim: 256,
            eps: 1e-6,
            image: None,
            ref_channels: None,
            vace: None,
            camera: None,
            causal: false,
            humo: None,
            s2v: None,
            animate2: false,
            dancer: None,
        };
        let clip = ImageEmbed { clip_dim: 32, pos_tokens: None };
        match self {
            Variant::Flf2v => {
                Config { image: Some(ImageEmbed { pos_tokens: Some(10), ..clip }), ..base }
            }
            Variant::I2v => Config { image: Some(clip), ..base },
            Variant::Expert => base,
            Variant::T2v => Config { in_channels: 16, ..base },
            Variant::Ti2v => Config { in_channels: 48, out_channels: 48, ..base },
        }
    }

    /// The variant's weights, from the fixture's.
    pub(crate) fn tensors(self) -> Tensors {
        let mut t = read_tensors("wan/weights.safetensors");
        if self == Variant::Flf2v {
            return t;
        }
        t.remove("img_emb.emb_pos");
        if self == Variant::I2v {
            return t;
        }
        t.retain(|name, _| !name.starts_with("img_emb.") && !name.contains("_img."));
        if self == Variant::Expert {
            return t;
        }
        let patch = t.get_mut("patch_embedding.weight").expect("the patch embedding");
        let (rows, cols) = (patch.0[0], patch.0[1..].iter().product::<usize>());
        let keep = 16 * cols / patch.0[1];
        patch.1 = (0..rows).flat_map(|r| patch.1[r * cols..][..keep].to_vec()).collect();
        patch.0[1] = 16;
        if self == Variant::T2v {
            return t;
        }
        t.extend(read_tensors("wan/ti2v.safetensors"));
        t
    }
}

/// The CPU backend and the model in `path` as detection and the loader see it.
pub(crate) fn load(path: &Path) -> (Arc<Cpu>, DiffusionDetected, DiffusionNet) {
    let (b, manager) = cpu(256 << 20);
    let (detected, net) = load_on(&manager, path);
    (b, detected, net)
}

/// The model in `path` loaded by `manager` (whose backend must run it: weights live in its device memory).
pub(crate) fn load_on(
    manager: &Arc<MemoryManager>,
    path: &Path,
) -> (DiffusionDetected, DiffusionNet) {
    let file = SafetensorsFile::open(path).unwrap();
    let prefix = diffusion_prefix(file.names());
    let header = Header::new(&file, &prefix);
    let detected = DiffusionDetected::detect(&header).unwrap().expect("a Wan DiT");
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).unwrap();
    (detected.clone(), detected.build(weights))
}

/// The tensor `name` of the fixture's io file on `b`.
pub(crate) fn io_tensor(b: &Cpu, io: &Tensors, name: &str) -> Tensor<Cpu> {
    b.from_f32(&io[name].0, &io[name].1, DType::F32).unwrap()
}

/// Runs `net` on case `case` (reading the inputs of case `inputs`, and its CLIP states if `clip`) through the
/// family layer; `t.<case>` of two dimensions goes in as per-frame timesteps.
fn run(b: &Cpu, net: &DiffusionNet, case: &str, inputs: &str, clip: bool) -> Vec<f32> {
    run_with(b, net, case, inputs, clip, RopeOptions::default(), &[])
}

/// [`run`] with `ScaleROPE`'s options and in-context latents.
fn run_with(
    b: &Cpu,
    net: &DiffusionNet,
    case: &str,
    inputs: &str,
    clip: bool,
    rope: RopeOptions,
    context_latents: &[Tensor<Cpu>],
) -> Vec<f32> {
    let io = read_tensors("wan/io.safetensors");
    let x = io_tensor(b, &io, &format!("x.{inputs}"));
    let context = io_tensor(b, &io, &format!("context.{inputs}"));
    let clip_states = (clip && io.contains_key(&format!("clip.{inputs}")))
        .then(|| io_tensor(b, &io, &format!("clip.{inputs}")));
    let (t_shape, t) = io.get(&format!("t.{case}")).unwrap_or(&io[&format!("t.{inputs}")]);
    let per_frame = t_shape.len() == 2;
    let sample_t = vec![0.0; x.dim(0).unwrap()];
    let input = DiffusionInput {
        clip_vision: clip_states.as_ref(),
        frame_timesteps: per_frame.then_some(t.as_slice()),
        rope,
        context_latents,
        ..DiffusionInput::new(&x, if per_frame { &sample_t } else { t }, &context)
    };
    let out = net.forward(b, input).unwrap();
    assert_eq!(out.shape(), io[&format!("out.{case}")].0.as_slice(), "{case}");
    b.to_f32(&out).unwrap()
}

/// Checks `net` on case `case` against the fixture.
fn check(b: &Cpu, net: &DiffusionNet, case: &str, inputs: &str, clip: bool) {
    let io = read_tensors("wan/io.safetensors");
    assert_close(case, &run(b, net, case, inputs, clip), &io[&format!("out.{case}")].1, 1e-4);
}

#[test]
fn every_variant_matches_diffusers() {
    // (case, the case whose inputs it reads, whether it passes the CLIP states)
    type Runs = &'static [(&'static str, &'static str, bool)];
    let cases: [(Variant, DiffusionFamily, Runs); 5] = [
        (
            Variant::T2v,
            DiffusionFamily::Wan21,
            &[("t2v", "t2v", false), ("ragged", "ragged", false)],
        ),
        (
            Variant::I2v,
            DiffusionFamily::Wan21,
            &[("i2v", "i2v", true), ("i2v_noclip", "i2v", false)],
        ),
        (Variant::Flf2v, DiffusionFamily::Wan21, &[("flf2v", "flf2v", true)]),
        (Variant::Expert, DiffusionFamily::Wan21, &[("expert", "expert", false)]),
        (
            Variant::Ti2v,
            DiffusionFamily::Wan22,
            &[("ti2v", "ti2v", false), ("ti2v_sample", "ti2v", false)],
        ),
    ];
    for (variant, family, runs) in cases {
        let file = TempTensors::new(&format!("wan-{variant:?}"), variant.tensors());
        let (b, detected, net) = load(&file.0);
        assert_eq!(
            detected,
            DiffusionDetected::Wan(variant.config(), Layout::Comfy),
            "{variant:?}"
        );
        assert_eq!((detected.family(), net.family()), (family, family), "{variant:?}");
        assert_eq!(
            net.concat_channels(),
            variant.config().in_channels - variant.config().out_channels
        );
        for &(case, inputs, clip) in runs {
            check(&b, &net, case, inputs, clip);
        }
    }
}

#[test]
fn on_a_gpu_wan_computes_in_f16_as_comfyui_does_and_stays_near_the_reference() {
    let file = TempTensors::new("wan-f16", Variant::T2v.tensors());
    let (b, detected, net) = load(&file.0);
    // ComfyUI's `supported_inference_dtypes` for Wan start with f16: on CUDA every Wan file computes in f16,
    // whatever its weights; on the CPU in f32.
    for weights in
        [Some(DType::F16), Some(DType::BF16), Some(DType::F8E4M3), Some(DType::F32), None]
    {
        assert_eq!(detected.compute_dtype(weights, true), DType::F16, "{weights:?}");
        assert_eq!(detected.compute_dtype(weights, false), DType::F32, "{weights:?}");
    }
    // The forward pass on a backend computing in f16 runs the whole model in f16 and lands within f16's
    // rounding of the f32 reference.
    let half = b.with_compute_dtype(DType::F16).unwrap();
    let io = read_tensors("wan/io.safetensors");
    let got = run(&half, &net, "t2v", "t2v", false);
    assert!(got.iter().all(|v| v.is_finite()));
    assert_close("t2v in f16", &got, &io["out.t2v"].1, 2e-2);
    let exact = run(&b, &net, "t2v", "t2v", false);
    assert!(got != exact, "the f16 run rounds somewhere");
}

#[test]
fn scale_rope_moves_the_token_positions_as_comfyui_does() {
    // ComfyUI's t2v output with `rope_options` (`wan.py`'s ROPE_OPTIONS): time stretched 7x as ChronoEdit's
    // template does, fractional scales and shifts on every axis.
    let file = TempTensors::new("wan-rope", Variant::T2v.tensors());
    let (b, _, net) = load(&file.0);
    let rope = RopeOptions { scale: [7.0, 1.5, 0.5], shift: [0.5, -2.0, 3.0] };
    let want = read_tensors("wan/rope.safetensors");
    assert_close(
        "t2v with ScaleROPE",
        &run_with(&b, &net, "t2v", "t2v", false, rope, &[]),
        &want["out"].1,
        1e-4,
    );
}

#[test]
fn in_context_latents_follow_the_video_at_their_source_positions_as_comfyui_does() {
    // ComfyUI's t2v output with BerniniConditioning's `context_latents` (`wan.py`'s `bernini()`): a 2-frame
    // source video and a 1-frame reference of odd sides, a different one per sample.
    let file = TempTensors::new("wan-bernini", Variant::T2v.tensors());
    let (b, _, net) = load(&file.0);
    let want = read_tensors("wan/bernini.safetensors");
    let latents = [io_tensor(&b, &want, "context.0"), io_tensor(&b, &want, "context.1")];
    let rope = RopeOptions::default();
    let got = run_with(&b, &net, "t2v", "t2v", false, rope, &latents);
    assert_close("t2v with in-context latents", &got, &want["out"].1, 1e-4);

    // A latent the patch embedding cannot take is refused, naming what it reads.
    let io = read_tensors("wan/io.safetensors");
    let wrong = b.from_f32(&[1, 4, 1, 2, 2], &[0.0; 16], DType::F32).unwrap();
    let (x, context) = (io_tensor(&b, &io, "x.t2v"), io_tensor(&b, &io, "context.t2v"));
    let input = DiffusionInput {
        rope,
        context_latents: std::slice::from_ref(&wrong),
        ..DiffusionInput::new(&x, &io["t.t2v"].1, &context)
    };
    let Err(err) = net.forward(&*b, input) else { panic!("a 4-channel latent is refused") };
    let err = err.to_string();
    assert!(err.contains("in-context latents") && err.contains("16"), "{err}");
}

#[test]
fn phantom_subject_frames_follow_the_video_and_are_cut_off_as_comfyui_does() {
    // ComfyUI's t2v output with WanPhantomSubjectToVideo's `time_dim_concat` (`wan.py`'s `phantom()`): two
    // subject frames shared by a batch of two, and one frame after a latent of odd sides (padded circularly).
    let file = TempTensors::new("wan-phantom", Variant::T2v.tensors());
    let (b, _, net) = load(&file.0);
    let want = read_tensors("wan/phantom.safetensors");
    let io = read_tensors("wan/io.safetensors");
    for case in ["t2v", "ragged"] {
        let x = io_tensor(&b, &io, &format!("x.{case}"));
        let context = io_tensor(&b, &io, &format!("context.{case}"));
        let frames = io_tensor(&b, &want, &format!("concat.{case}"));
        let input = DiffusionInput {
            time_concat: Some(&frames),
            ..DiffusionInput::new(&x, &io[&format!("t.{case}")].1, &context)
        };
        let out = net.forward(&*b, input).unwrap();
        let expected = &want[&format!("out.{case}")];
        assert_eq!(out.shape(), expected.0.as_slice(), "{case}");
        let got = b.to_f32(&out).unwrap();
        assert_close(&format!("{case} with Phantom frames"), &got, &expected.1, 1e-4);
    }

    // Frames of another size than the latent's are refused, naming what they must match.
    let x = io_tensor(&b, &io, "x.t2v");
    let context = io_tensor(&b, &io, "context.t2v");
    let wrong = b.from_f32(&[1, 16, 1, 2, 2], &[0.0; 64], DType::F32).unwrap();
    let input = DiffusionInput {
        time_concat: Some(&wrong),
        ..DiffusionInput::new(&x, &io["t.t2v"].1, &context)
    };
    let Err(err) = net.forward(&*b, input) else { panic!("frames of another size are refused") };
    let err = err.to_string();
    assert!(err.contains("WanPhantomSubjectToVideo") && err.contains("width and height"), "{err}");
}

#[test]
fn a_reference_image_goes_through_ref_conv_before_the_video_as_comfyui_does() {
    // The expert with ComfyUI's reference-image convolution (Wan 2.2 Fun Control): detected with it, and its
    // output with a reference latent is ComfyUI's `WanModel(in_dim_ref_conv=16)` (`wan.py`).
    let fixture = read_tensors("wan/ref_conv.safetensors");
    let mut tensors = Variant::Expert.tensors();
    for name in ["ref_conv.weight", "ref_conv.bias"] {
        tensors.insert(name.to_owned(), fixture[name].clone());
    }
    let file = TempTensors::new("wan-ref-conv", tensors);
    let (b, detected, net) = load(&file.0);
    let config = Config { ref_channels: Some(16), ..Variant::Expert.config() };
    assert_eq!(detected, DiffusionDetected::Wan(config.clone(), Layout::Comfy));
    assert_eq!(config.variant(), "Wan 2.2 Fun");
    let DiffusionNet::Wan(model) = &net else { panic!("a Wan DiT") };
    let x = io_tensor(&b, &fixture, "x");
    let context = io_tensor(&b, &fixture, "context");
    let reference = io_tensor(&b, &fixture, "reference");
    let t = &fixture["t"].1;
    for (with, want) in [(Some(&reference), "out"), (None, "out_plain")] {
        let input = WanInput { reference: with, ..WanInput::new(&x, t, &context) };
        let out = model.forward(&*b, &input).unwrap();
        assert_eq!(out.shape(), fixture[want].0.as_slice());
        assert_close(want, &b.to_f32(&out).unwrap(), &fixture[want].1, 1e-4);
    }
    // A reference of another size is refused, naming what the model reads.
    let small = b.full(&[1, 16, 2, 2], 0.0, DType::F32).unwrap();
    let input = WanInput { reference: Some(&small), ..WanInput::new(&x, t, &context) };
    let err = model.forward(&*b, &input).expect_err("refused").to_string();
    assert!(err.contains("reference latent of 16 channels"), "{err}");
}

/// The tiny Fun Camera model's weights: the expert variant's plus a camera adapter reading one channel, built
/// from the variant's own tensors as `wan.py`'s `camera` builds them.
fn camera_tensors() -> Tensors {
    let mut t = Variant::Expert.tensors();
    let (_, v) = t["blocks.1.self_attn.v.weight"].clone();
    let v_bias = t["blocks.1.self_attn.v.bias"].clone();
    t.insert("control_adapter.conv.weight".to_owned(), (vec![256, 64, 2, 2], v));
    t.insert("control_adapter.conv.bias".to_owned(), v_bias);
    for (conv, source) in [("conv1", "q"), ("conv2", "k")] {
        let (_, w) = t[&format!("blocks.0.self_attn.{source}.weight")].clone();
        let spread: Vec<f32> = w.iter().flat_map(|&x| [x / 3.0; 9]).collect();
        let bias = t[&format!("blocks.0.self_attn.{source}.bias")].clone();
        let name = format!("control_adapter.residual_blocks.0.{conv}");
        t.insert(format!("{name}.weight"), (vec![256, 256, 3, 3], spread));
        t.insert(format!("{name}.bias"), bias);
    }
    t
}

#[test]
fn the_fun_camera_adapter_matches_comfyui() {
    // ComfyUI's `CameraWanModel` (`wan.py`'s `camera`): the camera embedding, pixel-unshuffled, convolved and
    // through the residual block, is added to the patch tokens.
    let fixture = read_tensors("wan/camera.safetensors");
    let file = TempTensors::new("wan-camera", camera_tensors());
    let (b, detected, net) = load(&file.0);
    let config = Config { camera: Some(1), ..Variant::Expert.config() };
    assert_eq!(detected, DiffusionDetected::Wan(config.clone(), Layout::Comfy));
    assert_eq!(config.variant(), "Wan 2.2 Fun Camera");
    let DiffusionNet::Wan(model) = &net else { panic!("a Wan DiT") };
    let x = io_tensor(&b, &fixture, "x");
    let context = io_tensor(&b, &fixture, "context");
    let camera = io_tensor(&b, &fixture, "camera");
    let t = &fixture["t"].1;
    let input = |camera| WanInput { camera, ..WanInput::new(&x, t, &context) };
    for (with, want) in [(Some(&camera), "out"), (None, "out_plain")] {
        let out = model.forward(&*b, &input(with)).unwrap();
        assert_eq!(out.shape(), fixture[want].0.as_slice());
        assert_close(want, &b.to_f32(&out).unwrap(), &fixture[want].1, 1e-4);
    }
    // An embedding of another size is refused, naming what the model reads.
    let small = b.full(&[1, 1, 2, 16, 16], 0.0, DType::F32).unwrap();
    let err = model.forward(&*b, &input(Some(&small))).expect_err("refused").to_string();
    assert!(err.contains("camera embedding of [1 or 1, 1, 2, 32, 48]"), "{err}");
}

/// The tiny VACE model's weights, built from the t2v variant's as `wan.py`'s `vace_weights` builds them.
fn vace_tensors() -> Tensors {
    let mut t = Variant::T2v.tensors();
    let mut extra = Tensors::new();
    for (n, source) in [(0, 1), (1, 0)] {
        let from = format!("blocks.{source}.");
        for (name, value) in &t {
            if let Some(rest) = name.strip_prefix(&from) {
                extra.insert(format!("vace_blocks.{n}.{rest}"), value.clone());
            }
        }
        for part in ["weight", "bias"] {
            let o = t[&format!("blocks.{source}.cross_attn.o.{part}")].clone();
            extra.insert(format!("vace_blocks.{n}.after_proj.{part}"), o);
        }
    }
    for part in ["weight", "bias"] {
        let o = t[&format!("blocks.0.self_attn.o.{part}")].clone();
        extra.insert(format!("vace_blocks.0.before_proj.{part}"), o);
    }
    let ti2v = read_tensors("wan/ti2v.safetensors");
    let (shape, values) = &ti2v["patch_embedding.weight"];
    let per_row = values.len() / shape[0];
    let doubled = values.chunks(per_row).flat_map(|row| row.iter().chain(row)).copied().collect();
    extra.insert(
        "vace_patch_embedding.weight".to_owned(),
        (vec![shape[0], 2 * shape[1], 1, 2, 2], doubled),
    );
    extra.insert("vace_patch_embedding.bias".to_owned(), ti2v["patch_embedding.bias"].clone());
    t.extend(extra);
    t
}

#[test]
fn vace_contexts_run_through_their_blocks_as_comfyuis_vace_model() {
    let file = TempTensors::new("wan-vace", vace_tensors());
    let (b, detected, net) = load(&file.0);
    let vace = kiln_models::wan::Vace { in_channels: 96, blocks: 2 };
    let config = Config { vace: Some(vace), ..Variant::T2v.config() };
    assert_eq!(detected, DiffusionDetected::Wan(config.clone(), Layout::Comfy));
    assert_eq!((config.variant(), net.vace_channels()), ("Wan 2.1 VACE", Some(96)));
    let DiffusionNet::Wan(model) = &net else { panic!("a Wan DiT") };
    let fixture = read_tensors("wan/vace.safetensors");
    let x = io_tensor(&b, &fixture, "x");
    let context = io_tensor(&b, &fixture, "context");
    // [1, 2, 96, T, H, W]: the two contexts side by side, each with its strength.
    let (shape, values) = &fixture["vace_context"];
    let per = values.len() / shape[1];
    let contexts: Vec<(Tensor<Cpu>, f32)> = (0..shape[1])
        .map(|j| {
            let dims = [1, shape[2], shape[3], shape[4], shape[5]];
            let t = b.from_f32(&dims, &values[j * per..][..per], DType::F32).unwrap();
            (t, fixture["vace_strength"].1[j])
        })
        .collect();
    let input = WanInput { vace: &contexts, ..WanInput::new(&x, &fixture["t"].1, &context) };
    let out = model.forward(&*b, &input).unwrap();
    assert_close("vace", &b.to_f32(&out).unwrap(), &fixture["out"].1, 1e-4);
    // A context of the wrong size is refused by name.
    let small = vec![(b.full(&[1, 96, 1, 4, 6], 0.0, DType::F32).unwrap(), 1.0)];
    let input = WanInput { vace: &small, ..input };
    let err = model.forward(&*b, &input).expect_err("refused").to_string();
    assert!(err.contains("VACE contexts of"), "{err}");
}

#[test]
fn vace_blocks_follow_every_nth_block_from_the_first() {
    // The released 14B: 8 VACE blocks after blocks 0, 5, ..., 35; 1.3B: 15 after the even ones of 30.
    let vace = kiln_models::wan::Vace { in_channels: 96, blocks: 8 };
    let after: Vec<_> = (0..40).filter_map(|i| vace.block_after(i, 40).map(|n| (i, n))).collect();
    assert_eq!(after, (0..8).map(|n| (5 * n, n)).collect::<Vec<_>>());
    let vace = kiln_models::wan::Vace { in_channels: 96, blocks: 15 };
    assert_eq!((0..30).filter(|&i| vace.block_after(i, 30).is_some()).count(), 15);
    assert_eq!(vace.block_after(28, 30), Some(14));
}

#[test]
fn clip_states_go_to_the_clip_branch_only() {
    let file = TempTensors::new("wan-expert-clip", Variant::Expert.tensors());
    let (b, _, net) = load(&file.0);
    // The expert (no img_emb) reads no CLIP states: passing some changes nothing, as in ComfyUI's t2v cross
    // attention.
    let io = read_tensors("wan/io.safetensors");
    let x = io_tensor(&b, &io, "x.expert");
    let context = io_tensor(&b, &io, "context.expert");
    let clip = b.full(&[1, 5, 32], 1.0, DType::F32).unwrap();
    let DiffusionNet::Wan(model) = &net else { panic!("a Wan DiT") };
    let input = WanInput { clip: Some(&clip), ..WanInput::new(&x, &io["t.expert"].1, &context) };
    let out = model.forward(&*b, &input).unwrap();
    assert_close("expert with CLIP", &b.to_f32(&out).unwrap(), &io["out.expert"].1, 1e-4);
}

#[test]
fn diffusers_layout_loads_to_the_same_model() {
    let names: BTreeMap<String, (String, Vec<usize>)> = serde_json::from_slice(
        &std::fs::read(fixture("wan/diffusers_names.json")).expect("the names"),
    )
    .expect("a JSON map");
    let to_diffusers: BTreeMap<&str, &str> =
        names.iter().map(|(d, (comfy, _))| (comfy.as_str(), d.as_str())).collect();
    let tensors: Tensors = Variant::Flf2v
        .tensors()
        .into_iter()
        .map(|(name, t)| (to_diffusers[name.as_str()].to_owned(), t))
        .collect();
    let file = TempTensors::new("wan-diffusers", tensors);
    let (b, detected, net) = load(&file.0);
    assert_eq!(detected, DiffusionDetected::Wan(Variant::Flf2v.config(), Layout::Diffusers));
    check(&b, &net, "flf2v", "flf2v", true);
}

/// One released configuration as `released.json` lists ComfyUI's module: every weight's name and shape,
/// sorted.
fn released(name: &str) -> Vec<(String, Vec<usize>)> {
    let all: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("wan/released.json")).expect("the list"))
            .expect("JSON");
    weight_list(&all[name], name)
}

/// The weights a reference script lists for a module (`globals`, then `block` once per block of `blocks`,
/// `keys` in all): names and shapes, sorted.
pub(crate) fn weight_list(r: &serde_json::Value, name: &str) -> Vec<(String, Vec<usize>)> {
    let shapes = |v: &serde_json::Value| -> Vec<(String, Vec<usize>)> {
        let map = v.as_object().expect("a map of shapes");
        map.iter()
            .map(|(n, s)| {
                let dims = s.as_array().expect("a shape");
                (n.clone(), dims.iter().map(|d| d.as_u64().expect("a size") as usize).collect())
            })
            .collect()
    };
    let mut out = shapes(&r["globals"]);
    let block = shapes(&r["block"]);
    for i in 0..r["blocks"].as_u64().expect("a count") {
        out.extend(block.iter().map(|(n, s)| (format!("blocks.{i}.{n}"), s.clone())));
    }
    assert_eq!(out.len() as u64, r["keys"].as_u64().expect("a count"), "{name}");
    out.sort();
    out
}

/// A scratch folder under the test binary's temporary folder.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wan").join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

#[test]
fn released_configurations_are_synths_and_are_detected() {
    let dir = scratch("released");
    let set = ZImageTurboSet::real();
    let configs = [
        ("t2v_1_3b", set.wan21.clone(), DiffusionFamily::Wan21, 825),
        ("t2v_14b", WanFile::T2vA14b.config(&set), DiffusionFamily::Wan21, 1095),
        ("i2v_14b", WanFile::I2v14b.config(&set), DiffusionFamily::Wan21, 1303),
        ("flf2v_14b", WanFile::Flf2v14b.config(&set), DiffusionFamily::Wan21, 1304),
        ("i2v_a14b", WanFile::I2vA14b.config(&set), DiffusionFamily::Wan21, 1095),
        ("ti2v_5b", set.wan22.clone(), DiffusionFamily::Wan22, 825),
    ];
    for (name, config, family, keys) in configs {
        let comfy = released(name);
        let mut synth = wan::expected_shapes(&config);
        synth.sort();
        assert_eq!(synth, comfy, "{name}: synth's tensors are ComfyUI's module's");
        assert_eq!(synth.len(), keys, "{name}");
        let path = dir.join(format!("{name}.safetensors"));
        write_header_only(&path, &comfy);
        let file = SafetensorsFile::open(&path).unwrap();
        let header = Header::new(&file, "");
        let detected = DiffusionDetected::detect(&header).unwrap().expect("a Wan DiT");
        assert_eq!(detected, DiffusionDetected::Wan(config.clone(), Layout::Comfy), "{name}");
        assert_eq!(detected.family(), family, "{name}");
        assert_eq!(detected.sampling().flow().expect("flow sampling").shift(), 8.0, "{name}");
        assert_eq!(detected.load_plan(&header).slots.len(), keys, "{name}");
        drop(file);
        std::fs::remove_file(&path).expect("removes the file");
    }
    assert_eq!(set.wan21.variant(), "Wan T2V");
    assert_eq!(WanFile::I2v14b.config(&set).variant(), "Wan 2.1 I2V");
    assert_eq!(WanFile::Flf2v14b.config(&set).variant(), "Wan 2.1 FLF2V");
    assert_eq!(WanFile::I2vA14b.config(&set).variant(), "Wan 2.2 I2V");
    assert_eq!(set.wan22.variant(), "Wan 2.2 TI2V 5B");
    assert!(set.wan22.image_to_video() && WanFile::I2v14b.config(&set).image_to_video());
    assert!(!WanFile::I2vA14b.config(&set).image_to_video() && !set.wan21.image_to_video());
}

#[test]
fn tiny_synth_files_are_detected_as_their_configuration() {
    let dir = scratch("tiny");
    let set = ZImageTurboSet::tiny();
    let files = [
        (SynthFamily::Diffusion(DiffusionFamily::Wan21), set.wan21.clone()),
        (SynthFamily::Diffusion(DiffusionFamily::Wan22), set.wan22.clone()),
    ]
    .into_iter()
    .chain(WanFile::ALL.map(|f| (SynthFamily::Wan(f), f.config(&set))));
    for (family, config) in files {
        let path = dir.join(format!("{family}.safetensors"));
        synth::write_family(&path, family, &set, SynthDtype::Bf16, 3, &mut |_, _| {}).unwrap();
        let file = SafetensorsFile::open(&path).unwrap();
        let detected = DiffusionDetected::detect(&Header::new(&file, "")).unwrap();
        assert_eq!(detected, Some(DiffusionDetected::Wan(config, Layout::Comfy)), "{family}");
    }
}

#[test]
fn humo_attends_to_each_frames_audio_and_reads_its_reference_after_the_video_as_comfyui_does() {
    // ComfyUI's HumoWanModel (`wan.py humo`): the expert's and the t2v variant's weights with tiny audio
    // weights are HuMo 17B and 1.7B; each with a reference latent and audio, the 1.7B also without audio.
    let fixture = read_tensors("wan/humo.safetensors");
    let audio_weights = || {
        fixture
            .iter()
            .filter(|(name, _)| {
                name.starts_with("audio_proj.") || name.contains(".audio_cross_attn_")
            })
            .map(|(name, t)| (name.clone(), t.clone()))
    };
    let humo = wan::Humo { channels: 4, hidden: 32, audio_dim: 24, tokens: 16 };
    for (variant, runs, name) in [
        (Variant::Expert, &["17b"][..], "HuMo 17B"),
        (Variant::T2v, &["1_7b", "1_7b_silent"][..], "HuMo 1.7B"),
    ] {
        let mut tensors = variant.tensors();
        tensors.extend(audio_weights());
        let file = TempTensors::new(&format!("wan-humo-{variant:?}"), tensors);
        let (b, detected, net) = load(&file.0);
        let config = Config { humo: Some(humo), ..variant.config() };
        assert_eq!(config.variant(), name);
        assert_eq!(detected, DiffusionDetected::Wan(config, Layout::Comfy));
        for &case in runs {
            let inputs = case.trim_end_matches("_silent");
            let io = |n: &str| io_tensor(&b, &fixture, &format!("{n}.{inputs}"));
            let (x, context, audio) = (io("x"), io("context"), io("audio"));
            let references = [io("reference")];
            let input = DiffusionInput {
                references: &references,
                audio: (case == inputs).then_some(&audio),
                ..DiffusionInput::new(&x, &fixture[&format!("t.{inputs}")].1, &context)
            };
            let got = b.to_f32(&net.forward(&*b, input).unwrap()).unwrap();
            assert_close(case, &got, &fixture[&format!("out.{case}")].1, 1e-4);
        }
    }

    // The 17B model's conditioning channels are ComfyUI's c_concat (the case's x holds them after the noise).
    let x = &fixture["x.17b"];
    let [_, _, frames, h, w] = x.0[..] else { panic!("a video latent") };
    let plane = frames * h * w;
    let concat = wan::humo::concat_channels(1, frames, h, w);
    assert_eq!(&x.1[16 * plane..], concat.as_slice());

    // Audio whose frames do not split the video's tokens is refused, naming the node that makes both.
    let mut tensors = Variant::T2v.tensors();
    tensors.extend(audio_weights());
    let file = TempTensors::new("wan-humo-bad", tensors);
    let (b, _, net) = load(&file.0);
    let io = |n: &str| io_tensor(&b, &fixture, &format!("{n}.1_7b"));
    let (x, context) = (io("x"), io("context"));
    let audio = b.full(&[1, 5, 8, 5, 4], 0.0, DType::F32).unwrap();
    let input =
        DiffusionInput { audio: Some(&audio), ..DiffusionInput::new(&x, &[1.0, 2.0], &context) };
    let Err(err) = net.forward(&*b, input) else { panic!("5 audio frames for 3 latent frames") };
    assert!(err.to_string().contains("WanHuMoImageToVideo"), "{err}");
}

#[test]
fn wan_derived_models_and_bad_inputs_are_refused_by_name() {
    let mut animate = Variant::T2v.tensors();
    animate.insert("face_adapter.fuser_blocks.0.k_norm.weight".into(), (vec![4], vec![0.0; 4]));
    let file = TempTensors::new("wan-animate", animate);
    let sf = SafetensorsFile::open(&file.0).unwrap();
    let err = DiffusionDetected::detect(&Header::new(&sf, "")).unwrap_err();
    assert!(matches!(&err, Error::Unsupported { .. }), "{err}");
    assert!(
        err.to_string().contains("Animate") && err.to_string().contains("face_adapter"),
        "{err}"
    );
    // An S2V model without its audio encoder's other tensors is refused, naming them.
    let mut s2v = Variant::T2v.tensors();
    s2v.insert(
        "casual_audio_encoder.encoder.final_linear.weight".into(),
        (vec![4, 4], vec![0.0; 16]),
    );
    let file = TempTensors::new("wan-s2v", s2v);
    let sf = SafetensorsFile::open(&file.0).unwrap();
    let err = DiffusionDetected::detect(&Header::new(&sf, "")).unwrap_err();
    assert!(err.to_string().contains("S2V") && err.to_string().contains("casual_audio"), "{err}");
    // A camera adapter whose convolution is no 2×2 one over 64-channel groups is refused, naming the tensor.
    let mut camera = Variant::T2v.tensors();
    camera.insert("control_adapter.conv.weight".into(), (vec![4, 4], vec![0.0; 16]));
    let file = TempTensors::new("wan-camera", camera);
    let sf = SafetensorsFile::open(&file.0).unwrap();
    let err = DiffusionDetected::detect(&Header::new(&sf, "")).unwrap_err();
    assert!(err.to_string().contains("`control_adapter.conv.weight` is [4, 4]"), "{err}");
    // A VACE embedding without VACE blocks is no model ComfyUI builds.
    let mut vace = Variant::T2v.tensors();
    vace.insert(
        "vace_patch_embedding.weight".into(),
        (vec![256, 96, 1, 2, 2], vec![0.0; 256 * 96 * 4]),
    );
    let file = TempTensors::new("wan-vace", vace);
    let sf = SafetensorsFile::open(&file.0).unwrap();
    let err = DiffusionDetected::detect(&Header::new(&sf, "")).unwrap_err();
    assert!(err.to_string().contains("0 VACE blocks"), "{err}");

    let mut missing = Variant::I2v.tensors();
    missing.remove("blocks.1.cross_attn.k_img.weight");
    let file = TempTensors::new("wan-missing", missing);
    let sf = SafetensorsFile::open(&file.0).unwrap();
    let err = DiffusionDetected::detect(&Header::new(&sf, "")).unwrap_err();
    assert!(err.to_string().contains("blocks.1.cross_attn.k_img.weight"), "{err}");

    let file = TempTensors::new("wan-bad-inputs", Variant::T2v.tensors());
    let (b, _, net) = load(&file.0);
    let DiffusionNet::Wan(model) = &net else { panic!("a Wan DiT") };
    let context = b.full(&[1, 3, 32], 0.0, DType::F32).unwrap();
    let x = b.full(&[1, 36, 1, 2, 2], 0.0, DType::F32).unwrap();
    let input = WanInput::new(&x, &[500.0], &context);
    let err = model.forward(&*b, &input).expect_err("36 channels for T2V");
    assert!(matches!(&err, Error::Invalid(m) if m.contains("16 channels")), "{err}");
    let x = b.full(&[1, 16, 3, 2, 2], 0.0, DType::F32).unwrap();
    let input = WanInput::new(&x, &[1.0, 2.0], &context);
    let err = model.forward(&*b, &input).expect_err("two timesteps for three frames");
    assert!(matches!(&err, Error::Invalid(m) if m.contains("one per frame (3)")), "{err}");
}

#[test]
fn text_padded_with_repeated_rows_gives_what_computing_every_row_gives() {
    // ComfyUI pads a Wan prompt's umT5 states with zero rows; the model computes the text's per-row maps (its
    // embedding, each block's cross-attention keys and values) up to the first repeated row and repeats that.
    // Moved before the prompt, the padding repeats nothing at the end, so every row is computed; cross-attention
    // does not depend on the order of its keys. Two samples with prompts of different lengths; the I2V model
    // without CLIP states also reads the text in its image attention.
    for variant in [Variant::T2v, Variant::I2v] {
        let file = TempTensors::new("wan-padded-text", variant.tensors());
        let (b, _, net) = load(&file.0);
        let DiffusionNet::Wan(model) = &net else { panic!("a Wan DiT") };
        let (len, width) = (12, 32);
        let mut seed = 11;
        let (mut padded, mut moved) = (vec![0.0; 2 * len * width], vec![0.0; 2 * len * width]);
        for (s, rows) in [(0, 3), (1, 7)] {
            let prompt = values(&mut seed, rows * width, 1.0);
            let sample = s * len * width;
            padded[sample..sample + rows * width].copy_from_slice(&prompt);
            moved[sample + (len - rows) * width..sample + len * width].copy_from_slice(&prompt);
        }
        let channels = variant.config().in_channels;
        let x = b
            .from_f32(
                &[2, channels, 2, 4, 4],
                &values(&mut seed, 2 * channels * 32, 1.0),
                DType::F32,
            )
            .unwrap();
        let out = |context: &[f32]| {
            let context = b.from_f32(&[2, len, width], context, DType::F32).unwrap();
            let y = model.forward(&*b, &WanInput::new(&x, &[500.0, 250.0], &context)).unwrap();
            b.to_f32(&y).unwrap()
        };
        assert_close(&format!("{variant:?} with padded text"), &out(&padded), &out(&moved), 1e-5);
    }
}

#[test]
fn a_batchs_samples_share_each_blocks_pass_and_each_gets_its_own_calls_output() {
    // ComfyUI runs CFG's two prompts as one batch. Kiln's blocks take a small batch's samples together, so each
    // weight is read once a pass; every sample must still get what a call of its own gives. Prompts of different
    // lengths, each sample's own CLIP states (I2V), timesteps per sample and (TI2V 5B) per frame.
    for variant in [Variant::T2v, Variant::I2v, Variant::Ti2v] {
        let file = TempTensors::new("wan-joint", variant.tensors());
        let (b, _, net) = load(&file.0);
        let DiffusionNet::Wan(model) = &net else { panic!("a Wan DiT") };
        let channels = variant.config().in_channels;
        let (len, width, frames, clip_rows) = (12, 32, 3, 5);
        let mut seed = 23;
        let mut context = vec![0.0; 2 * len * width];
        for (s, rows) in [(0, 4), (1, 9)] {
            context[s * len * width..][..rows * width].copy_from_slice(&values(
                &mut seed,
                rows * width,
                1.0,
            ));
        }
        let latent = values(&mut seed, 2 * channels * frames * 4 * 6, 1.0);
        let clip = values(&mut seed, 2 * clip_rows * width, 1.0);
        let timesteps: Vec<f32> = match variant {
            Variant::Ti2v => vec![0.0, 900.0, 900.0, 0.0, 400.0, 400.0],
            _ => vec![800.0, 300.0],
        };
        let call = |samples: std::ops::Range<usize>| {
            let n = samples.len();
            let part = |v: &[f32], shape: &[usize]| {
                let each = shape.iter().product::<usize>();
                b.from_f32(
                    &[&[n][..], shape].concat(),
                    &v[samples.start * each..samples.end * each],
                    DType::F32,
                )
                .unwrap()
            };
            let x = part(&latent, &[channels, frames, 4, 6]);
            let context = part(&context, &[len, width]);
            let clip = part(&clip, &[clip_rows, width]);
            let per = timesteps.len() / 2;
            let t = &timesteps[samples.start * per..samples.end * per];
            let input = WanInput {
                clip: (variant == Variant::I2v).then_some(&clip),
                ..WanInput::new(&x, t, &context)
            };
            b.to_f32(&model.forward(&*b, &input).unwrap()).unwrap()
        };
        let both = call(0..2);
        let alone = [call(0..1), call(1..2)].concat();
        assert_close(
            &format!("{variant:?}: the batch against each sample alone"),
            &both,
            &alone,
            1e-6,
        );
    }
}

/// A deterministic source of values in [-scale, scale).
fn values(seed: &mut u64, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Every tensor of an f32 safetensors file.
fn read_f32(path: &Path) -> Tensors {
    let bytes = std::fs::read(path).expect("the file");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors file");
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            let values = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (name, (view.shape().to_vec(), values))
        })
        .collect()
}

#[test]
fn a_synth_lora_changes_the_output_as_its_merged_weights_do() {
    let dir = scratch("lora");
    let set = ZImageTurboSet::tiny();
    let (model_path, lora_path) = (dir.join("wan21.safetensors"), dir.join("lora.safetensors"));
    let write = |path: &Path, family| {
        synth::write_family(path, family, &set, SynthDtype::F32, 5, &mut |_, _| {}).unwrap();
    };
    write(&model_path, SynthFamily::Diffusion(DiffusionFamily::Wan21));
    write(&lora_path, SynthFamily::Lora(DiffusionFamily::Wan21));

    // W + strength · B·A by hand, for every pair the LoRA file has.
    let strength = 0.8;
    let mut merged = read_f32(&model_path);
    let lora = read_f32(&lora_path);
    let mut adapted = 0;
    for (name, (a_shape, a)) in &lora {
        let Some(stem) = name.strip_suffix(".lora_A.weight") else { continue };
        let (b_shape, up) = &lora[&format!("{stem}.lora_B.weight")];
        let (rows, rank, cols) = (b_shape[0], a_shape[0], a_shape[1]);
        let target =
            format!("{}.weight", stem.strip_prefix("diffusion_model.").expect("the prefix"));
        let w = &mut merged.get_mut(&target).expect("the adapted weight").1;
        for i in 0..rows {
            for j in 0..cols {
                w[i * cols + j] +=
                    strength * (0..rank).map(|r| up[i * rank + r] * a[r * cols + j]).sum::<f32>();
            }
        }
        adapted += 1;
    }
    assert_eq!(adapted, set.wan21.layers * 8);
    let hand = TempTensors::new("wan-lora-hand", merged);

    let (b, manager) = cpu(256 << 20);
    let (_, net) = load_on(&manager, &model_path);
    let slots: Vec<(&str, &[usize])> =
        net.weights().names().map(|n| (n, net.weights().info(n).expect("a slot").1)).collect();
    let patches =
        net.lora(&SafetensorsFile::open(&lora_path).unwrap(), &slots, strength).expect("patches");
    assert!(patches.unmatched.is_empty(), "{:?}", patches.unmatched);
    assert_eq!(patches.patches.len(), adapted);
    let (_, hand_net) = load_on(&manager, &hand.0);

    let mut seed = 17;
    let x =
        b.from_f32(&[1, 16, 2, 4, 6], &values(&mut seed, 16 * 2 * 4 * 6, 1.0), DType::F32).unwrap();
    let context = b.from_f32(&[1, 3, 4096], &values(&mut seed, 3 * 4096, 1.0), DType::F32).unwrap();
    let forward = |net: &DiffusionNet| {
        let DiffusionNet::Wan(model) = net else { panic!("a Wan DiT") };
        let input = WanInput::new(&x, &[640.0], &context);
        b.to_f32(&model.forward(&*b, &input).unwrap()).unwrap()
    };
    let plain = forward(&net);
    net.weights().set_patches(patches.patches).expect("patches set");
    let patched = forward(&net);
    let want = forward(&hand_net);
    assert_close("patched vs merged", &patched, &want, 1e-4);
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let moved = plain.iter().zip(&want).fold(0f32, |m, (p, w)| m.max((p - w).abs()));
    assert!(moved > 1e-3 * scale, "the LoRA moved the output by {moved} (scale {scale})");
}

#[test]
fn lora_key_forms_name_comfyuis_weights() {
    let config = Variant::I2v.config();
    let shapes = wan::expected_shapes(&config);
    let slots: Vec<(&str, &[usize])> =
        shapes.iter().map(|(n, s)| (n.as_str(), s.as_slice())).collect();
    let d = config.dim;
    let mut seed = 3;
    let mut tensors: Tensors = BTreeMap::new();
    let mut add = |name: &str, shape: Vec<usize>| {
        let n = shape.iter().product();
        tensors.insert(name.to_owned(), (shape, values(&mut seed, n, 0.1)));
    };
    // ComfyUI's own names, kohya's, Wan Fun's doubled underscore (read because its marker key is there), a
    // bias diff, a whole-tensor diff of a modulation table, and a diffusers name ComfyUI does not read.
    add("diffusion_model.blocks.0.self_attn.q.lora_down.weight", vec![2, d]);
    add("diffusion_model.blocks.0.self_attn.q.lora_up.weight", vec![d, 2]);
    add("diffusion_model.blocks.0.self_attn.q.alpha", vec![]);
    add("diffusion_model.blocks.0.self_attn.q.diff_b", vec![d]);
    add("lora_unet_blocks_1_ffn_0.lora_A.weight", vec![2, d]);
    add("lora_unet_blocks_1_ffn_0.lora_B.weight", vec![config.ffn_dim, 2]);
    add("lora_unet__blocks_0_cross_attn_k.lora_down.weight", vec![2, d]);
    add("lora_unet__blocks_0_cross_attn_k.lora_up.weight", vec![d, 2]);
    add("lora_unet__blocks_1_cross_attn_v_img.lora_down.weight", vec![2, d]);
    add("lora_unet__blocks_1_cross_attn_v_img.lora_up.weight", vec![d, 2]);
    add("diffusion_model.blocks.1.modulation.diff", vec![1, 6, d]);
    add("diffusion_model.img_emb.emb_pos.diff", vec![1, 10, 32]);
    add("transformer.blocks.0.attn1.to_k.lora_A.weight", vec![2, d]);
    add("transformer.blocks.0.attn1.to_k.lora_B.weight", vec![d, 2]);
    let file = TempTensors::new("wan-lora-forms", tensors.clone());
    let sf = SafetensorsFile::open(&file.0).unwrap();
    let patches = wan::lora::patches(&sf, &slots, 1.0).expect("patches");
    let names: Vec<&str> = patches.patches.iter().map(|(n, _)| n.as_str()).collect();
    let mut want = vec![
        "blocks.0.self_attn.q.weight",
        "blocks.0.self_attn.q.bias",
        "blocks.0.cross_attn.k.weight",
        "blocks.1.modulation",
        "blocks.1.cross_attn.v_img.weight",
        "blocks.1.ffn.0.weight",
    ];
    // (The model above has no emb_pos: that diff names no weight.)
    let mut got = names.clone();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want);
    assert_eq!(
        patches.unmatched,
        [
            "diffusion_model.img_emb.emb_pos.diff",
            "transformer.blocks.0.attn1.to_k.lora_A.weight",
            "transformer.blocks.0.attn1.to_k.lora_B.weight"
        ]
    );

    // Without Wan Fun's marker key, the doubled underscore names nothing, as in ComfyUI.
    tensors.retain(|name, _| !name.starts_with("lora_unet__blocks_0_cross_attn_k"));
    let file = TempTensors::new("wan-lora-no-marker", tensors);
    let sf = SafetensorsFile::open(&file.0).unwrap();
    let patches = wan::lora::patches(&sf, &slots, 1.0).expect("patches");
    assert!(patches.patches.iter().all(|(n, _)| n != "blocks.1.cross_attn.v_img.weight"));
    assert!(
        patches.unmatched.iter().any(|n| n.starts_with("lora_unet__blocks_1_cross_attn_v_img"))
    );
}

/// The causal model as the `ar_video` sampler sees it, at CFG 1: x̂₀ = x − σ·v, the DiT reading σ·1000 on
/// the fixture's text.
struct CausalDenoiser<'a> {
    b: &'a Cpu,
    model: &'a kiln_models::wan::Wan,
    cache: &'a CausalCache<Cpu>,
    context: &'a Tensor<Cpu>,
}

impl BlockDenoiser for CausalDenoiser<'_> {
    fn denoise_block(
        &mut self,
        x: &[f32],
        frames: usize,
        start_frame: usize,
        sigma: f32,
    ) -> kiln_models::Result<Vec<f32>> {
        let latent = self.b.from_f32(&[1, 16, frames, 4, 6], x, DType::F32)?;
        let timesteps = [sigma * 1000.0];
        let input = WanInput {
            causal: Some(CausalStep { start_frame, cache: self.cache }),
            ..WanInput::new(&latent, &timesteps, self.context)
        };
        let v = self.b.to_f32(&self.model.forward(self.b, &input)?)?;
        Ok(x.iter().zip(v).map(|(x, v)| x - v * sigma).collect())
    }
}

#[test]
fn the_ar_video_sampler_runs_a_causal_model_block_by_block_as_comfyui_does() {
    // ComfyUI's `sample_ar_video` on its CausalWanModel (`wan.py`'s `causal()`): an image-to-video run framewise
    // after a start latent, and a text-to-video run two frames a block.
    let metadata = [("config", r#"{"transformer": {"causal_ar": true}}"#)];
    let file = TempTensors::with_metadata("wan-causal", Variant::T2v.tensors(), &metadata);
    let (b, detected, net) = load(&file.0);
    let DiffusionDetected::Wan(config, _) = &detected else { panic!("a Wan DiT") };
    assert!(config.causal, "the metadata marks a causal model");
    assert_eq!(config.variant(), "Wan 2.1 causal T2V");
    let DiffusionNet::Wan(model) = &net else { panic!("a Wan DiT") };
    let want = read_tensors("wan/causal.safetensors");
    let context = io_tensor(&b, &want, "context");
    let sigmas = &want["sigmas"].1;
    // The model starts at shift 5, as ComfyUI's causal entry: its simple schedule is the fixture's.
    assert_eq!(sigmas, &Scheduler::Simple.sigmas(&detected.sampling(), 3));
    for (case, frames_per_block, seed, initial) in
        [("i2v", 1, 42, Some(want["initial"].1.as_slice())), ("t2v", 2, 7, None)]
    {
        let cache = CausalCache::new();
        let mut denoiser = CausalDenoiser { b: &b, model, cache: &cache, context: &context };
        let run = ArVideo { shape: [1, 16, 4, 4, 6], frames_per_block, seed, initial };
        let mut steps = 0;
        let out = sample_ar_video(&mut denoiser, run, &want["noise"].1, sigmas, &mut |step| {
            assert_eq!(step.total, 3);
            steps += 1;
            Ok(())
        })
        .unwrap();
        assert_close(case, &out, &want[&format!("out.{case}")].1, 1e-4);
        assert_eq!(cache.frames(), 4, "{case}: the whole video is held, clean");
        assert_eq!(
            steps,
            3 * if initial.is_some() { 3 } else { 2 },
            "{case}: one step per sigma and block"
        );
    }

    // The same weights without the mark are a plain T2V model, which refuses a block of a causal run.
    let plain = TempTensors::new("wan-causal-plain", Variant::T2v.tensors());
    let (b, _, net) = load(&plain.0);
    let DiffusionNet::Wan(model) = &net else { panic!("a Wan DiT") };
    let context = io_tensor(&b, &want, "context");
    let cache = CausalCache::new();
    let mut denoiser = CausalDenoiser { b: &b, model, cache: &cache, context: &context };
    let err = denoiser.denoise_block(&[0.0; 16 * 24], 1, 0, 1.0).expect_err("refused").to_string();
    assert!(err.contains("ar_video") && err.contains("Wan T2V is not one"), "{err}");
}

#[test]
fn s2v_reads_audio_reference_motion_and_control_as_comfyui_does() {
    // ComfyUI's WanModel_S2V at tiny widths (`wan_s2v.py`): 5 blocks of one 128-wide head, its injectors after
    // blocks 0 and 4, 3 encoder states 8 wide.
    let (b, detected, net) = load(&fixture("wan/s2v_weights.safetensors"));
    let DiffusionDetected::Wan(config, Layout::Comfy) = detected else { panic!("a Wan DiT") };
    assert_eq!(config.variant(), "Wan 2.2 S2V");
    let s2v = wan::s2v::S2v {
        audio_dim: 8,
        audio_layers: 3,
        audio_tokens: 4,
        injectors: 2,
        cond_channels: 16,
    };
    assert_eq!((config.dim, config.layers, config.s2v), (128, 5, Some(s2v)));
    let io = read_tensors("wan/s2v.safetensors");
    let t = |name: &str| io_tensor(&b, &io, name);
    let (audio, reference, control) = (t("audio"), t("reference"), t("control"));
    let (motion, long) = (t("motion"), t("motion_long"));
    let run = |x: &str, ts: &str, context: &str, with: &[&str], motion: &Tensor<Cpu>| {
        let (x, context) = (t(x), t(context));
        let references = [reference.clone()];
        let has = |what: &str| with.contains(&what);
        let input = DiffusionInput {
            references: if has("reference") { &references } else { &[] },
            audio: has("audio").then_some(&audio),
            motion: has("motion").then_some(motion),
            control: has("control").then_some(&control),
            ..DiffusionInput::new(&x, &io[ts].1, &context)
        };
        b.to_f32(&net.forward(&*b, input).unwrap()).unwrap()
    };
    let all = ["audio", "reference", "motion", "control"];
    for (case, with, motion) in [
        ("full", &all[..], &motion),
        ("long_motion", &all[..], &long),
        ("no_motion", &["audio", "reference", "control"][..], &motion),
        ("no_audio", &["reference", "motion", "control"][..], &motion),
        ("plain", &[][..], &motion),
    ] {
        assert_close(
            case,
            &run("x", "t", "context", with, motion),
            &io[&format!("out.{case}")].1,
            1e-4,
        );
    }
    let got = run("x2", "t2", "context2", &all, &motion);
    assert_close("batch2", &got, &io["out.batch2"].1, 1e-4);
    // Both prompts in one batch of 4: each conditioning of 2 rows is read by sample s as row s mod 2.
    let twice = |name: &str| {
        let t = t(name);
        b.concat(&[&t, &t], 0).unwrap()
    };
    let (x4, context4, control2) = (twice("x2"), twice("context2"), twice("control"));
    let (audio2, reference2, motion2) = (twice("audio"), twice("reference"), twice("motion"));
    let t4: Vec<f32> = io["t2"].1.iter().chain(&io["t2"].1).copied().collect();
    let references = [reference2];
    let input = DiffusionInput {
        references: &references,
        audio: Some(&audio2),
        motion: Some(&motion2),
        control: Some(&control2),
        ..DiffusionInput::new(&x4, &t4, &context4)
    };
    let got = b.to_f32(&net.forward(&*b, input).unwrap()).unwrap();
    let want: Vec<f32> = io["out.batch2"].1.iter().chain(&io["out.batch2"].1).copied().collect();
    assert_close("batch4", &got, &want, 1e-4);

    // Audio for fewer latent frames than the video has is refused, naming the node that makes both.
    let short = b.slice(&audio, 3, 0, 8).unwrap();
    let (x, context) = (t("x"), t("context"));
    let input =
        DiffusionInput { audio: Some(&short), ..DiffusionInput::new(&x, &io["t"].1, &context) };
    let Err(err) = net.forward(&*b, input) else { panic!("8 audio frames for 3 latent frames") };
    assert!(err.to_string().contains("WanSoundImageToVideo"), "{err}");
}

#[test]
fn the_released_s2v_layout_is_detected_with_its_widths() {
    let all: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture("wan/s2v_released.json")).expect("the list"))
            .expect("JSON");
    let shapes = weight_list(&all, "WanModel_S2V");
    let dir = scratch("s2v-released");
    let path = dir.join("wan2.2_s2v_14B_bf16.safetensors");
    write_header_only(&path, &shapes);
    let file = SafetensorsFile::open(&path).unwrap();
    let (config, _) = wan::detect(&Header::new(&file, "")).unwrap().expect("a Wan DiT");
    let set = ZImageTurboSet::real();
    let want = WanFile::S2v14b.config(&set);
    assert_eq!(config, want);
    assert_eq!(config.variant(), "Wan 2.2 S2V");
    // The synthetic release writes exactly ComfyUI's weights.
    let mut synth: Vec<(String, Vec<usize>)> = wan::expected_shapes(&want);
    synth.sort();
    assert_eq!(synth, shapes);
}
