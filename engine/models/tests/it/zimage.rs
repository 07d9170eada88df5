//! The Z-Image NextDiT against diffusers' `ZImageTransformer2DModel` (fixtures from
//! `scripts/reference/zimage.py`: a tiny model with Z-Image's structure, in both key layouts), its detection,
//! and the files it refuses.

use std::path::PathBuf;

use kiln_compute::Backend as _;
use kiln_compute::DType;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::header::diffusion_prefix;
use kiln_models::zimage::{Config, Layout, ZImage, detect, load_plan};
use kiln_models::{Error, Header};

use crate::common::{assert_close, cpu, fixture, read_tensors};

/// diffusers' q/k-norm ε (ComfyUI's is f32 machine epsilon).
const DIFFUSERS_QK_EPS: f32 = 1e-5;

/// The fixture cases: (name, latent shape).
const CASES: [(&str, [usize; 4]); 4] = [
    ("s1", [1, 16, 6, 10]),
    ("s05", [1, 16, 6, 10]),
    ("b2", [2, 16, 6, 10]),
    ("odd", [1, 16, 5, 7]),
];

fn detect_file(relative: &str) -> (Config, Layout) {
    let file = SafetensorsFile::open(fixture(relative)).expect("fixture opens");
    detect(&Header::new(&file, "")).expect("detection succeeds").expect("a Z-Image model")
}

#[test]
fn detects_both_layouts_with_the_same_config() {
    let (comfy, layout) = detect_file("zimage/comfy.safetensors");
    assert_eq!(layout, Layout::Comfy);
    let (diffusers, layout) = detect_file("zimage/diffusers.safetensors");
    assert_eq!(layout, Layout::Diffusers);
    assert_eq!(comfy, diffusers);
    let want = Config {
        variant: kiln_models::zimage::Variant::ZImage,
        dim: 64,
        heads: 2,
        kv_heads: 2,
        head_dim: 32,
        layers: 2,
        noise_refiners: 2,
        context_refiners: 2,
        ffn_hidden: 170,
        cap_feat_dim: 32,
        t_freq_dim: 256,
        t_hidden: 128,
        adaln_dim: 64,
        axes_dims: [8, 12, 12],
        rope_theta: 256.0,
        pad_multiple: 32,
        norm_eps: 1e-5,
        qk_norm_eps: f32::EPSILON,
        patch_size: 2,
        in_channels: 16,
        time_scale: 1000.0,
        allow_fp16: true,
    };
    assert_eq!(comfy, want);
}

#[test]
fn diffusers_plan_fuses_qkv_and_renames() {
    let file =
        SafetensorsFile::open(fixture("zimage/diffusers.safetensors")).expect("fixture opens");
    let h = Header::new(&file, "");
    let (cfg, layout) = detect(&h).expect("detects").expect("a Z-Image model");
    let plan = load_plan(&h, &cfg, layout);
    let slot = |name: &str| {
        plan.slots.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no slot {name}"))
    };
    let parts: Vec<&str> =
        slot("layers.1.attention.qkv.weight").parts.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(
        parts,
        [
            "layers.1.attention.to_q.weight",
            "layers.1.attention.to_k.weight",
            "layers.1.attention.to_v.weight"
        ]
    );
    assert_eq!(slot("x_embedder.weight").parts[0].1, "all_x_embedder.2-1.weight");
    assert_eq!(slot("final_layer.linear.bias").parts[0].1, "all_final_layer.2-1.linear.bias");
    assert_eq!(
        slot("context_refiner.0.attention.out.weight").parts[0].1,
        "context_refiner.0.attention.to_out.0.weight"
    );
    assert!(!plan.slots.iter().any(|s| s.name.starts_with("context_refiner.0.adaLN")));
    // Every slot of the ComfyUI file's plan is in the diffusers plan, and vice versa.
    let comfy_file =
        SafetensorsFile::open(fixture("zimage/comfy.safetensors")).expect("fixture opens");
    let ch = Header::new(&comfy_file, "");
    let comfy_plan = load_plan(&ch, &cfg, Layout::Comfy);
    let mut a: Vec<&str> = plan.slots.iter().map(|s| s.name.as_str()).collect();
    let mut b: Vec<&str> = comfy_plan.slots.iter().map(|s| s.name.as_str()).collect();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b);
    assert_eq!(b.len(), comfy_file.tensors().count());
}

/// Loads a fixture layout on the CPU and runs every case against diffusers.
fn check_forward(relative: &str) {
    let (b, manager) = cpu(1 << 30);
    let file = SafetensorsFile::open(fixture(relative)).expect("fixture opens");
    let mut model = ZImage::load(&manager, &Header::new(&file, ""), &mut |_, _| {}).expect("loads");
    model.config.qk_norm_eps = DIFFUSERS_QK_EPS;
    let cases = read_tensors("zimage/cases.safetensors");
    for (name, shape) in CASES {
        let get = |what: &str| &cases[&format!("{name}.{what}")];
        let (x_shape, x) = get("x");
        assert_eq!(x_shape, &shape);
        let (c_shape, context) = get("context");
        let sigmas = &get("sigmas").1;
        let x = b.from_f32(x_shape, x, DType::F32).expect("x");
        let context = b.from_f32(c_shape, context, DType::F32).expect("context");
        let out = model.forward(&*b, &x, sigmas, &context).expect("forward");
        assert_eq!(out.shape(), shape);
        assert_eq!(out.dtype(), DType::F32);
        let got = b.to_f32(&out).expect("read back");
        assert_close(&format!("{relative} {name}"), &got, &get("out").1, 1e-4);
    }
}

#[test]
fn comfy_layout_matches_diffusers() {
    check_forward("zimage/comfy.safetensors");
}

#[test]
fn diffusers_layout_matches_diffusers() {
    check_forward("zimage/diffusers.safetensors");
}

#[test]
fn comfyui_qk_eps_is_the_default_and_close() {
    let (b, manager) = cpu(1 << 30);
    let file = SafetensorsFile::open(fixture("zimage/comfy.safetensors")).expect("fixture opens");
    let model = ZImage::load(&manager, &Header::new(&file, ""), &mut |_, _| {}).expect("loads");
    assert_eq!(model.config.qk_norm_eps, f32::EPSILON);
    let cases = read_tensors("zimage/cases.safetensors");
    let (xs, x) = &cases["s05.x"];
    let (cs, c) = &cases["s05.context"];
    let x = b.from_f32(xs, x, DType::F32).expect("x");
    let c = b.from_f32(cs, c, DType::F32).expect("context");
    let out = model.forward(&*b, &x, &cases["s05.sigmas"].1, &c).expect("forward");
    assert_close(
        "ComfyUI ε vs diffusers ε",
        &b.to_f32(&out).expect("read"),
        &cases["s05.out"].1,
        1e-2,
    );
}

#[test]
fn rejects_bad_inputs() {
    let (b, manager) = cpu(1 << 30);
    let file = SafetensorsFile::open(fixture("zimage/comfy.safetensors")).expect("fixture opens");
    let model = ZImage::load(&manager, &Header::new(&file, ""), &mut |_, _| {}).expect("loads");
    let x = b.full(&[1, 16, 4, 4], 0.0, DType::F32).expect("x");
    let context = b.full(&[1, 3, 32], 0.0, DType::F32).expect("context");
    let bad_x = b.full(&[1, 4, 4, 4], 0.0, DType::F32).expect("x");
    let bad_context = b.full(&[1, 3, 16], 0.0, DType::F32).expect("context");
    for (what, result) in [
        ("channels", model.forward(&*b, &bad_x, &[1.0], &context)),
        ("sigmas", model.forward(&*b, &x, &[1.0, 0.5], &context)),
        ("context", model.forward(&*b, &x, &[1.0], &bad_context)),
    ] {
        assert!(matches!(result, Err(Error::Invalid(_))), "{what}: {result:?}");
    }
}

#[test]
fn prefix_rule() {
    let many = |p: &'static str| (0..6).map(move |i| format!("{p}layers.{i}.w"));
    let names: Vec<String> = many("model.diffusion_model.").chain(many("vae.")).collect();
    assert_eq!(diffusion_prefix(names.iter().map(String::as_str)), "model.diffusion_model.");
    let names: Vec<String> = many("net.").collect();
    assert_eq!(diffusion_prefix(names.iter().map(String::as_str)), "net.");
    // Five keys are not enough: the fallback is `model.` when keys start with it.
    let names: Vec<String> = (0..5).map(|i| format!("model.diffusion_model.x{i}")).collect();
    assert_eq!(diffusion_prefix(names.iter().map(String::as_str)), "model.");
    assert_eq!(diffusion_prefix(["cap_embedder.1.weight", "x_pad_token"]), "");
}

/// A temporary safetensors file of zero bf16 tensors, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, tensors: &[(String, Vec<usize>)]) -> TempFile {
        let path = std::env::temp_dir()
            .join(format!("kiln-zimage-{}-{name}.safetensors", std::process::id()));
        let bytes: Vec<Vec<u8>> = tensors
            .iter()
            .map(|(_, shape)| vec![0u8; 2 * shape.iter().product::<usize>()])
            .collect();
        let views = tensors.iter().zip(&bytes).map(|((name, shape), data)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, shape.clone(), data)
                    .expect("a valid view");
            (name.clone(), view)
        });
        safetensors::serialize_to_file(views, None, &path).expect("writes the file");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The ComfyUI fixture's tensor names and shapes.
fn comfy_shapes() -> Vec<(String, Vec<usize>)> {
    read_tensors("zimage/comfy.safetensors")
        .into_iter()
        .map(|(name, (shape, _))| (name, shape))
        .collect()
}

/// Detection of the fixture's tensors after `edit`, written as a file under `prefix`.
fn detect_edited(
    name: &str,
    prefix: &str,
    edit: impl FnOnce(&mut Vec<(String, Vec<usize>)>),
) -> (PathBuf, Result<Option<(Config, Layout)>, Error>) {
    let mut tensors = comfy_shapes();
    edit(&mut tensors);
    for (n, _) in &mut tensors {
        *n = format!("{prefix}{n}");
    }
    let tmp = TempFile::new(name, &tensors);
    let file = SafetensorsFile::open(&tmp.0).expect("opens");
    let result = detect(&Header::new(&file, prefix));
    (tmp.0.clone(), result)
}

#[track_caller]
fn assert_refused(name: &str, edit: impl FnOnce(&mut Vec<(String, Vec<usize>)>), finding: &str) {
    let (path, result) = detect_edited(name, "", edit);
    match result {
        Err(Error::Unsupported { path: p, msg }) => {
            assert_eq!(p, path);
            assert!(msg.contains(finding), "{name}: `{msg}` does not mention `{finding}`");
            let shown = Error::Unsupported { path: p, msg }.to_string();
            assert!(shown.contains(&path.display().to_string()), "{shown}");
        }
        other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn detects_under_a_prefix() {
    let (_, result) = detect_edited("prefixed", "model.diffusion_model.", |_| {});
    let (cfg, layout) = result.expect("detects").expect("a Z-Image model");
    assert_eq!((cfg.dim, layout), (64, Layout::Comfy));
}

#[test]
fn refuses_relatives_and_broken_files() {
    assert_refused(
        "omni",
        |t| t.push(("siglip_embedder.0.weight".into(), vec![64])),
        "siglip_embedder",
    );
    assert_refused(
        "pixel",
        |t| t.push(("dec_net.cond_embed.weight".into(), vec![64, 64])),
        "dec_net",
    );
    assert_refused(
        "lumina2",
        |t| {
            for (n, _) in t.iter_mut() {
                *n = n.replace(".adaLN_modulation.0.", ".adaLN_modulation.1.");
            }
        },
        // Read as Lumina 2 (SiLU before the adaLN), whose heads split in thirds: 32 does not.
        "Lumina 2: of 6",
    );
    assert_refused(
        "newbie",
        |t| t.push(("clip_text_pooled_proj.0.weight".into(), vec![64, 64])),
        "NewBie",
    );
    assert_refused(
        "gqa",
        |t| {
            for (n, s) in t.iter_mut() {
                if n.ends_with("attention.qkv.weight") {
                    *s = vec![128, 64];
                }
            }
        },
        "grouped-query",
    );
    assert_refused(
        "missing",
        |t| t.retain(|(n, _)| n != "layers.1.feed_forward.w2.weight"),
        "layers.1.feed_forward.w2.weight",
    );
    assert_refused(
        "shape",
        |t| {
            for (n, s) in t.iter_mut() {
                if n == "noise_refiner.1.attention.out.weight" {
                    *s = vec![64, 32];
                }
            }
        },
        "noise_refiner.1.attention.out.weight",
    );
}

#[test]
fn other_families_are_not_detected() {
    let tmp = TempFile::new("vae", &[("decoder.conv_in.weight".into(), vec![8, 16, 3, 3])]);
    let file = SafetensorsFile::open(&tmp.0).expect("opens");
    assert!(detect(&Header::new(&file, "")).expect("no error").is_none());
}

#[test]
fn rope_axes_follow_the_head_width() {
    assert_eq!(kiln_models::zimage::axes_dims(128), Some([32, 48, 48]));
    assert_eq!(kiln_models::zimage::axes_dims(32), Some([8, 12, 12]));
    assert_eq!(kiln_models::zimage::axes_dims(40), None);
}

#[test]
fn no_pad_tokens_means_no_padding() {
    let (_, result) = detect_edited("nopad", "", |t| t.retain(|(n, _)| !n.ends_with("pad_token")));
    let (cfg, _) = result.expect("detects").expect("a Z-Image model");
    assert_eq!(cfg.pad_multiple, 1);
}

#[test]
fn a_file_whose_norms_spread_little_may_compute_in_f16_as_comfyui_allows() {
    use kiln_models::family::DiffusionDetected;

    // The fixture's second-to-last block (of 2) has `ffn_norm1` weights of spread 0.163: ComfyUI adds f16 to
    // Z-Image's inference types, so a mostly-f16 file computes in f16 on a GPU. Tripled (0.49), it does not.
    let detected = |scale: f32| {
        let mut tensors = read_tensors("zimage/comfy.safetensors");
        let norm = tensors.get_mut("layers.0.ffn_norm1.weight").expect("the norm");
        norm.1.iter_mut().for_each(|v| *v *= scale);
        let file = crate::common::TempTensors::new(&format!("zimage-spread-{scale}"), tensors);
        let opened = SafetensorsFile::open(&file.0).unwrap();
        DiffusionDetected::detect(&Header::new(&opened, "")).unwrap().expect("a Z-Image model")
    };
    let narrow = detected(1.0);
    assert_eq!(narrow.inference_dtypes(), [DType::BF16, DType::F16, DType::F32]);
    assert_eq!(narrow.compute_dtype(Some(DType::F16), true), DType::F16);
    assert_eq!(narrow.compute_dtype(Some(DType::BF16), true), DType::BF16);
    let wide = detected(3.0);
    assert_eq!(wide.inference_dtypes(), [DType::BF16, DType::F32]);
    assert_eq!(wide.compute_dtype(Some(DType::F16), true), DType::BF16);
}

#[test]
fn an_f16_run_stays_finite_behind_comfyuis_clamp_fp16() {
    // A feed-forward whose output leaves f16's range in the first main block: ComfyUI's `clamp_fp16` makes its
    // infinities ±65504 before the RMSNorm after it, so the prediction stays finite where unguarded f16 would
    // end in NaN.
    let mut tensors = read_tensors("zimage/comfy.safetensors");
    let (_, w2) = tensors.get_mut("layers.0.feed_forward.w2.weight").expect("w2");
    w2.iter_mut().for_each(|v| *v *= 1e6);
    let file = crate::common::TempTensors::new("zimage-f16-overflow", tensors);
    let (b, manager) = cpu(1 << 30);
    let opened = SafetensorsFile::open(&file.0).expect("opens");
    let model = ZImage::load(&manager, &Header::new(&opened, ""), &mut |_, _| {}).expect("loads");
    let cases = read_tensors("zimage/cases.safetensors");
    let (x_shape, x) = &cases["s1.x"];
    let (c_shape, context) = &cases["s1.context"];
    let half = b.with_compute_dtype(DType::F16).expect("an f16 view");
    let x = half.from_f32(x_shape, x, DType::F32).expect("x");
    let context = half.from_f32(c_shape, context, DType::F32).expect("context");
    let out = model.forward(&half, &x, &cases["s1.sigmas"].1, &context).expect("forward");
    let got = half.to_f32(&out).expect("read back");
    assert!(got.iter().all(|v| v.is_finite()), "an f16 run without clamp_fp16");
}
