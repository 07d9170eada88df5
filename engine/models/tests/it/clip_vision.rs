//! The CLIP and SigLIP vision towers and FLUX.1 Redux against `scripts/reference/clip_vision.py`'s fixtures,
//! recorded from ComfyUI itself: its `clip_preprocess` (crop "center" and "none", shrinking, growing and exact
//! sizes, a batch of two), its `encode_image` outputs (`last_hidden_state`, `penultimate_hidden_states`,
//! `image_embeds`) on tiny f16 towers in the Hugging Face layout, and `StyleModelApply`'s conditioning with a
//! tiny Redux model; and detection of good, foreign and broken files.

use std::collections::BTreeMap;
use std::sync::Arc;

use kiln_compute::Backend as _;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::{MemoryManager, SafetensorsFile};
use kiln_models::clip_vision::{self, ClipVision, Config, Redux, ReduxConfig, Variant};
use kiln_models::family::{ClipVisionDetected, StyleModelDetected};
use kiln_models::{Error, Header};

use crate::common::{assert_close, cpu, fixture, read_tensors, write_header_only};

type Io = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// The tiny CLIP tower as detection reads it: a class token, so a CLIP ViT; 3 layers, below any release, so
/// run as ViT-H (exact GELU).
const CLIP: Config = Config {
    variant: Variant::H,
    hidden: 64,
    layers: 3,
    heads: 16,
    intermediate: 128,
    patch: 14,
    image_size: 42,
    projection: Some(32),
    eps: 1e-5,
};

/// The tiny SigLIP tower: no class token.
const SIGLIP: Config = Config { variant: Variant::Siglip, projection: None, ..CLIP };

/// The fixture's image cases and their batch sizes.
const IMAGES: [(&str, usize); 4] = [("wide", 2), ("tall", 1), ("small", 1), ("exact", 1)];

/// The tower in a fixture file, detected and loaded.
fn load(manager: &Arc<MemoryManager>, file: &str) -> ClipVision {
    let file = SafetensorsFile::open(fixture(file)).unwrap();
    let header = Header::new(&file, "");
    let config = clip_vision::detect(&header).unwrap().expect("a vision tower");
    let weights = manager.load(&clip_vision::load_plan(&header, &config), &mut |_, _| {}).unwrap();
    ClipVision::new(config, weights)
}

#[test]
fn detection_reads_both_towers_and_the_redux_model() {
    let open = |f: &str| SafetensorsFile::open(fixture(f)).unwrap();
    let clip = open("clip_vision/clip.safetensors");
    assert_eq!(clip_vision::detect(&Header::new(&clip, "")).unwrap(), Some(CLIP));
    // SigLIP's file carries transformers' pooling head, which is not read.
    let siglip = open("clip_vision/siglip.safetensors");
    let h = Header::new(&siglip, "");
    assert!(h.names().any(|n| n.starts_with("vision_model.head.")));
    assert_eq!(clip_vision::detect(&h).unwrap(), Some(SIGLIP));
    assert!(clip_vision::load_plan(&h, &SIGLIP).slots.iter().all(|s| !s.name.contains(".head.")));
    let redux = open("clip_vision/redux.safetensors");
    let want = ReduxConfig { input: 64, hidden: 96, output: 32 };
    assert_eq!(clip_vision::detect_redux(&Header::new(&redux, "")).unwrap(), Some(want));
    assert_eq!(
        StyleModelDetected::detect(&Header::new(&redux, "")).unwrap(),
        Some(StyleModelDetected::FluxRedux(want))
    );
    // Neither is the other; a text encoder is neither.
    assert_eq!(ClipVisionDetected::detect(&Header::new(&redux, "")).unwrap(), None);
    assert_eq!(clip_vision::detect_redux(&Header::new(&clip, "")).unwrap(), None);
    let text = open("clip_text/weights.safetensors");
    assert_eq!(clip_vision::detect(&Header::new(&text, "")).unwrap(), None);
}

#[test]
fn released_configs_follow_comfyuis_rules() {
    let dir = std::env::temp_dir().join(format!("kiln-clip-vision-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let detect = |config: &Config| {
        let path = dir.join("tower.safetensors");
        write_header_only(&path, &config.expected());
        let file = SafetensorsFile::open(&path).unwrap();
        clip_vision::detect(&Header::new(&file, ""))
    };
    // ViT-H/14 (clip_vision_h), SigLIP so400m 384, ViT-L/14 336 and ViT-bigG.
    let h = Config {
        variant: Variant::H,
        hidden: 1280,
        layers: 32,
        intermediate: 5120,
        image_size: 224,
        projection: Some(1024),
        ..CLIP
    };
    assert_eq!(detect(&h).unwrap(), Some(h));
    let siglip = Config {
        variant: Variant::Siglip,
        hidden: 1152,
        layers: 27,
        intermediate: 4304,
        image_size: 384,
        projection: None,
        ..CLIP
    };
    assert_eq!(detect(&siglip).unwrap(), Some(siglip));
    assert_eq!(siglip.tokens(), 729);
    let l = Config { variant: Variant::L, hidden: 1024, layers: 24, image_size: 336, ..h };
    assert_eq!(detect(&l).unwrap(), Some(l));
    assert_eq!(l.variant.activation(), kiln_models::clip_text::Activation::QuickGelu);
    let g = Config { variant: Variant::G, hidden: 1664, layers: 48, projection: Some(1280), ..h };
    assert_eq!(detect(&g).unwrap(), Some(g));
    // `kiln model synth` writes the released towers and Redux.
    let real = kiln_models::synth::ZImageTurboSet::real();
    assert_eq!((real.clip_vision_h, real.siglip), (h, siglip));
    assert_eq!(real.redux, ReduxConfig { input: 1152, hidden: 12288, output: 4096 });

    // Broken files are refused naming the problem.
    let mut missing = CLIP.expected();
    missing.retain(|(n, _)| !n.ends_with("layers.1.mlp.fc2.weight"));
    let path = dir.join("broken.safetensors");
    write_header_only(&path, &missing);
    let file = SafetensorsFile::open(&path).unwrap();
    let err = clip_vision::detect(&Header::new(&file, "")).unwrap_err();
    assert!(
        matches!(&err, Error::Unsupported { msg, .. } if msg.contains("layers.1.mlp.fc2.weight")),
        "{err}"
    );
    let mut odd = CLIP.expected();
    odd.iter_mut()
        .filter(|(n, _)| n.ends_with("position_embedding.weight"))
        .for_each(|(_, s)| s[0] = 12);
    write_header_only(&path, &odd);
    let file = SafetensorsFile::open(&path).unwrap();
    let err = clip_vision::detect(&Header::new(&file, "")).unwrap_err();
    assert!(err.to_string().contains("12 positions"), "{err}");
    write_header_only(
        &path,
        &[("visual.transformer.resblocks.0.attn.in_proj_weight".into(), vec![3, 1])],
    );
    let file = SafetensorsFile::open(&path).unwrap();
    let err = clip_vision::detect(&Header::new(&file, "")).unwrap_err();
    assert!(err.to_string().contains("OpenCLIP"), "{err}");
    write_header_only(&path, &[("style_embedding".into(), vec![8, 768])]);
    let file = SafetensorsFile::open(&path).unwrap();
    let err = clip_vision::detect_redux(&Header::new(&file, "")).unwrap_err();
    assert!(err.to_string().contains("T2I style adapter"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn preprocessing_matches_comfyuis_clip_preprocess() {
    let io = read_tensors("clip_vision/io.safetensors");
    let (mut values, mut steps) = (0, 0);
    for (tower, variant) in [("clip", Variant::H), ("siglip", Variant::Siglip)] {
        let (mean, std) = variant.normalisation();
        for (case, batch) in IMAGES {
            let (shape, image) = &io[&format!("image.{case}")];
            let shape: [usize; 4] = shape.as_slice().try_into().unwrap();
            assert_eq!(shape[0], batch);
            for crop in ["center", "none"] {
                let name = format!("pixels.{tower}.{case}.{crop}");
                let got =
                    clip_vision::preprocess(image, shape, 42, mean, std, crop == "center").unwrap();
                let want = &io[&name].1;
                assert_eq!(got.len(), want.len(), "{name}");
                // The resize agrees with torch's to ~1e-7 but not bit for bit, so a value that lands within
                // that of an 8-bit rounding boundary may round the other way: one step, rarely.
                for (i, (g, w)) in got.iter().zip(want).enumerate() {
                    let step = 1.0 / 255.0 / std[i / (42 * 42) % 3];
                    let d = (g - w).abs();
                    assert!(d <= 1e-5 || (d - step).abs() <= 1e-5, "{name}[{i}]: {g} vs {w}");
                    steps += usize::from(d > 1e-5);
                }
                values += got.len();
            }
        }
    }
    assert!(steps * 1000 < values, "{steps} of {values} values a rounding step off");
}

/// Runs a tower on every case of the fixture (on ComfyUI's pixel values, which the preprocessing test compares
/// Kiln's with) and compares the three outputs.
fn check_tower(io: &Io, b: &Cpu, tower: &ClipVision, name: &str) {
    for (case, batch) in IMAGES {
        let (shape, _) = &io[&format!("image.{case}")];
        for crop in ["center", "none"] {
            let key = |what: &str| format!("{what}.{name}.{case}.{crop}");
            assert_eq!(shape[0], batch);
            let pixels = &io[&key("pixels")].1;
            let out = tower.encode(b, pixels, batch).unwrap();
            for (what, got) in [
                ("last", Some(&out.last)),
                ("penultimate", out.penultimate.as_ref()),
                ("embeds", Some(&out.embeds)),
            ] {
                let got = got.expect(what);
                let (want_shape, want) = &io[&key(what)];
                assert_eq!(got.shape(), want_shape.as_slice(), "{}", key(what));
                assert_close(&key(what), &b.to_f32(got).unwrap(), want, 1e-4);
            }
        }
    }
}

#[test]
fn clip_tower_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let io = read_tensors("clip_vision/io.safetensors");
    check_tower(&io, &b, &load(&manager, "clip_vision/clip.safetensors"), "clip");
}

#[test]
fn siglip_tower_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let io = read_tensors("clip_vision/io.safetensors");
    check_tower(&io, &b, &load(&manager, "clip_vision/siglip.safetensors"), "siglip");
}

#[test]
fn redux_tokens_make_comfyuis_style_model_apply_conditioning() {
    let (b, manager) = cpu(64 << 20);
    let io = read_tensors("clip_vision/io.safetensors");
    let file = SafetensorsFile::open(fixture("clip_vision/redux.safetensors")).unwrap();
    let header = Header::new(&file, "");
    let config = clip_vision::detect_redux(&header).unwrap().unwrap();
    let weights =
        manager.load(&clip_vision::redux_load_plan(&header, &config), &mut |_, _| {}).unwrap();
    let redux = Redux::new(config, weights);
    let (shape, last) = &io["last.siglip.wide.center"];
    let last = b.from_f32(shape, last, kiln_compute::DType::F32).unwrap();
    let tokens = b.to_f32(&redux.encode(&*b, &last).unwrap()).unwrap();
    assert_eq!(tokens.len(), 2 * 9 * 32);
    // StyleModelApply: the batch's tokens flattened into one sequence after the prompt's, times the strength
    // with `multiply`, unscaled with `attn_bias` at strength 1.
    let (_, cond) = &io["cond"];
    for (case, strength) in [("multiply_0.7", 0.7f32), ("attn_bias_1", 1.0)] {
        let (want_shape, want) = &io[&format!("redux.{case}")];
        assert_eq!(want_shape, &[1, 5 + 18, 32]);
        let got: Vec<f32> =
            cond.iter().copied().chain(tokens.iter().map(|t| t * strength)).collect();
        assert_close(case, &got, want, 1e-4);
    }
    // A CLIP tower's output is the wrong width.
    let clip = b.from_f32(&[1, 10, 48], &[0.0; 480], kiln_compute::DType::F32).unwrap();
    let err = redux.encode(&*b, &clip).unwrap_err();
    assert!(err.to_string().contains("48 wide"), "{err}");
}
