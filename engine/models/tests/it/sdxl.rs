//! SDXL against ComfyUI 0f1fa67a's own classes (`scripts/reference/sdxl.py`; fixtures in `fixtures/sdxl/`): a
//! tiny SDXL checkpoint and a tiny refiner checkpoint in the released single-file layouts (the UNet under
//! `model.diffusion_model.`, CLIP-L in transformers' layout, CLIP-G in OpenCLIP's), the text encoding
//! (`SDXLClipModel`, `SDXLRefinerClipModel`), the class vectors (`encode_adm`, and what a sampler hands it) and
//! the UNet's EPS prediction through ComfyUI's model sampling.

use std::sync::Arc;

use kiln_compute::memory::{MemoryManager, SafetensorsFile};
use kiln_compute::{Backend, DType};
use kiln_models::clip_text::{self, Activation, ClipText, Layout, Variant};
use kiln_models::family::{DiffusionDetected, DiffusionFamily, SdxlEncoders, SdxlTokens};
use kiln_models::header::Header;
use kiln_models::sampling::{DiscreteSampling, Prediction};
use kiln_models::unet::{self, AdmSize, Unet, UnetKind};

use crate::common::{assert_close, cpu, fixture, ids, json, read_tensors};

/// The tiny CLIP-L: 32 wide in 2 heads of 16, 3 layers, quick-GELU, vocabulary 1000 ending in BOS 998, EOS 999.
const TINY_L: clip_text::Config = clip_text::Config {
    variant: Variant::L,
    layout: Layout::Transformers,
    vocab: 1000,
    hidden: 32,
    layers: 3,
    heads: 2,
    head_dim: 16,
    intermediate: 64,
    positions: 77,
    activation: Activation::QuickGelu,
    eps: 1e-5,
    eos: 999,
};

/// The tiny CLIP-G in OpenCLIP's layout: 48 wide in 3 heads of 16, exact GELU, a 48 × 48 projection.
const TINY_G: clip_text::Config = clip_text::Config {
    variant: Variant::G,
    layout: Layout::OpenClip,
    hidden: 48,
    heads: 3,
    intermediate: 96,
    activation: Activation::Gelu,
    ..TINY_L
};

/// The CLIP tower of `config` under `prefix` of the fixture `file`.
fn clip(
    manager: &Arc<MemoryManager>,
    file: &str,
    prefix: &str,
    config: clip_text::Config,
) -> ClipText {
    let file = SafetensorsFile::open(fixture(&format!("sdxl/{file}"))).expect("open");
    let header = Header::new(&file, prefix);
    let weights =
        manager.load(&clip_text::load_plan(&header, &config), &mut |_, _| {}).expect("load");
    ClipText::new(config, weights)
}

/// A case's token ids as unweighted sections.
fn section(ids: Vec<u32>) -> Vec<Vec<(u32, f32)>> {
    vec![ids.into_iter().map(|id| (id, 1.0)).collect()]
}

#[test]
fn text_encoding_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let cases = json("sdxl/cases.json");
    let out = read_tensors("sdxl/outputs.safetensors");
    let base = SdxlEncoders::new(
        Some(clip(
            &manager,
            "checkpoint.safetensors",
            unet::family::SDXL_CHECKPOINT_CLIP_L_PREFIX,
            TINY_L,
        )),
        clip(
            &manager,
            "checkpoint.safetensors",
            unet::family::SDXL_CHECKPOINT_CLIP_G_PREFIX,
            TINY_G,
        ),
    )
    .expect("SDXL's encoders");
    let refiner = SdxlEncoders::new(
        None,
        clip(
            &manager,
            "refiner.safetensors",
            unet::family::REFINER_CHECKPOINT_CLIP_G_PREFIX,
            TINY_G,
        ),
    )
    .expect("the refiner's encoder");
    for case in ["a", "b"] {
        let text = &cases["text"][case];
        let tokens = SdxlTokens {
            clip_l: section(ids(&text["l_ids"])),
            clip_g: section(ids(&text["g_ids"])),
        };
        for (what, encoders) in [("text", &base), ("refiner_text", &refiner)] {
            let encoded = encoders.encode(b.as_ref(), &tokens).expect("encode");
            let cond = b.to_f32(&encoded.cond).expect("read");
            let want = &out[&format!("{what}.{case}.cond")];
            assert_eq!(encoded.cond.shape(), want.0.as_slice(), "{what} {case}");
            assert_close(&format!("{what} {case} cond"), &cond, &want.1, 1e-4);
            let pooled = b.to_f32(&encoded.pooled.expect("a pooled vector")).expect("read");
            let want = &out[&format!("{what}.{case}.pooled")].1;
            assert_close(&format!("{what} {case} pooled"), &pooled, want, 1e-4);
        }
    }
}

#[test]
fn class_vectors_match_comfyui() {
    let out = read_tensors("sdxl/outputs.safetensors");
    let pooled = &out["text.a.pooled"].1;
    let refiner_pooled = &out["refiner_text.a.pooled"].1;
    let check = |name: &str, kind, pooled: &[f32], size: AdmSize| {
        let got = unet::sdxl::adm(kind, pooled, pooled.len(), &size).expect("adm");
        // The embeddings' arguments reach 1024 rad, where an ulp of torch's f32 `exp` (Sleef's) in a
        // frequency moves a cosine by ~3e-5.
        assert_close(name, &got, &out[name].1, 1e-4);
    };
    // A node's size (CLIPTextEncodeSDXL's fields): 1024 × 768, no crop.
    let sized = |negative| AdmSize::of_latent(1024, 768, negative);
    check("adm.base", UnetKind::Sdxl, pooled, sized(false));
    check("adm.refiner_pos", UnetKind::SdxlRefiner, refiner_pooled, sized(false));
    check("adm.refiner_neg", UnetKind::SdxlRefiner, refiner_pooled, sized(true));
    // What a sampler gives a plain prompt on a [1, 4, 6, 10] latent: 80 × 48 pixels.
    check("adm.sampling", UnetKind::Sdxl, pooled, AdmSize::of_latent(80, 48, false));
    let negative = AdmSize::of_latent(80, 48, true);
    check("adm.refiner_sampling_neg", UnetKind::SdxlRefiner, refiner_pooled, negative);
}

/// The UNet of the fixture `file` as detection finds it under the checkpoint prefix, its heads 8 wide (the
/// released models' are 64).
fn unet_of(manager: &Arc<MemoryManager>, file: &str, family: DiffusionFamily) -> Unet {
    let file = SafetensorsFile::open(fixture(&format!("sdxl/{file}"))).expect("open");
    let header = Header::new(&file, "model.diffusion_model.");
    let detected = DiffusionDetected::detect(&header).expect("detect").expect("a UNet");
    assert_eq!(detected.family(), family);
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).expect("load");
    let DiffusionDetected::Unet(config) = detected else { panic!("not a UNet: {detected:?}") };
    Unet::new(unet::Config { head_channels: 8, ..config }, weights)
}

/// Runs the fixture's model case `key` (`model.a`) through `unet` with ComfyUI's EPS model sampling.
fn check_model_case(b: &kiln_compute::backend::cpu::Cpu, unet: &Unet, key: &str) {
    let cases = json("sdxl/cases.json");
    let out = read_tensors("sdxl/outputs.safetensors");
    let t = |name: &str| &out[&format!("{key}.{name}")];
    let sampling = DiscreteSampling::new(Prediction::Eps);
    let (shape, x) = t("x");
    let sigmas = &t("sigma").1;
    let timesteps: Vec<f32> = sigmas.iter().map(|&s| sampling.timestep(s)).collect();
    assert_eq!(timesteps, t("t").1, "{key}: timesteps");
    // Each sample's input scaled by its own sigma.
    let per_sample = x.len() / sigmas.len();
    let input: Vec<f32> = x
        .chunks(per_sample)
        .zip(sigmas)
        .flat_map(|(x, &s)| sampling.calculate_input(s, x).into_owned())
        .collect();
    let (case, name) = key.split_once('.').map(|(m, c)| (c, m)).expect("a model case key");
    let mut context = Vec::new();
    let mut rows = 0;
    for cond in cases[name][case]["cond"].as_array().expect("the case's conds") {
        let (cond_shape, values) = &out[cond.as_str().expect("a name")];
        context.extend_from_slice(values);
        rows += cond_shape[0];
        assert_eq!(cond_shape[1..], [77, unet.config.context_dim]);
    }
    let context =
        b.from_f32(&[rows, 77, unet.config.context_dim], &context, DType::F32).expect("context");
    let x_in = b.from_f32(shape, &input, DType::F32).expect("x");
    let y = b.from_f32(&t("y").0, &t("y").1, DType::F32).expect("y");
    let eps = unet.forward(b, &x_in, &timesteps, &context, Some(&y)).expect("forward");
    let eps = b.to_f32(&eps).expect("read");
    assert_close(&format!("{key} eps"), &eps, &t("eps").1, 1e-4);
    let denoised: Vec<f32> = x
        .chunks(per_sample)
        .zip(eps.chunks(per_sample))
        .zip(sigmas)
        .flat_map(|((x, e), &s)| sampling.calculate_denoised(s, x, e))
        .collect();
    assert_close(&format!("{key} denoised"), &denoised, &t("denoised").1, 1e-4);
}

#[test]
fn base_unet_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let unet = unet_of(&manager, "checkpoint.safetensors", DiffusionFamily::Sdxl);
    assert_eq!(unet.config.kind(), Some(UnetKind::Sdxl));
    check_model_case(&b, &unet, "model.a");
    check_model_case(&b, &unet, "model.b");
}

#[test]
fn refiner_unet_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let unet = unet_of(&manager, "refiner.safetensors", DiffusionFamily::SdxlRefiner);
    assert_eq!(unet.config.kind(), Some(UnetKind::SdxlRefiner));
    check_model_case(&b, &unet, "refiner_model.a");
}

/// ComfyUI's sigma table for SD's schedule is the one Kiln's EPS sampling steps through.
#[test]
fn schedule_is_comfyuis() {
    let out = read_tensors("sdxl/outputs.safetensors");
    let sampling = DiscreteSampling::new(Prediction::Eps);
    assert_close("sigmas", sampling.sigmas(), &out["schedule.sigmas"].1, 1e-6);
}

/// The released shapes: SDXL's base is 2816-wide `label_emb` on a 2048-wide context, the refiner's 2560 on
/// 1280, and both are told apart from Lotus by those widths.
#[test]
fn released_shapes_are_told_apart() {
    let base = unet::Config::build(&unet::Shape::sdxl());
    assert_eq!((base.adm_in_channels, base.context_dim), (Some(2816), 2048));
    assert_eq!(base.kind(), Some(UnetKind::Sdxl));
    let refiner = unet::Config::build(&unet::Shape::sdxl_refiner());
    assert_eq!((refiner.adm_in_channels, refiner.context_dim), (Some(2560), 1280));
    assert_eq!(refiner.kind(), Some(UnetKind::SdxlRefiner));
    assert_eq!(unet::Config::build(&unet::Shape::lotus()).kind(), Some(UnetKind::Lotus));
    // SDXL's base: 2.567 billion weights.
    let count: usize = unet::tensors(&base).iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    assert_eq!(count, 2_567_463_684);
}
