//! Qwen3-VL's vision tower and its language model reading images (the Krea 2, Mage-Flow and Boogu text encoders
//! with reference images) against `scripts/reference/qwen3vl_vision.py`'s fixtures, recorded from ComfyUI's own
//! classes on a tiny random model in transformers' layout: ComfyUI's preprocessing of an image into patches, the
//! tower's merged tokens and DeepStack features, and the language model's tapped hidden states with the images'
//! tokens placed, positioned by interleaved M-RoPE and given their DeepStack features.

use kiln_compute::memory::{Model, SafetensorsFile};
use kiln_compute::{Backend as _, DType};
use kiln_models::qwen_vl::VisionInput;
use kiln_models::qwen3::{self, IMAGE_PAD, ImageTokens, Qwen3, Variant};
use kiln_models::qwen3vl_vision::{self, Config};
use kiln_models::{Error, Header};

use crate::common::{self, Io, assert_close, cpu, fixture, json, read_tensors};

const WEIGHTS: &str = "qwen3vl_vision/weights.safetensors";
const IO: &str = "qwen3vl_vision/io.safetensors";

/// The tiny reference tower as detected: every width from the shapes, ComfyUI's 16 heads, DeepStack evenly
/// spaced (4 blocks, 2 mergers: after blocks 0 and 2).
fn detected() -> Config {
    Config {
        hidden: 32,
        depth: 4,
        heads: qwen3vl_vision::HEADS,
        intermediate: 64,
        out_hidden: 128,
        patch: 16,
        temporal_patch: 2,
        position_side: 8,
        deepstack: vec![0, 2],
    }
}

/// The tiny reference tower as it ran: 4 heads of 8 (the shapes do not tell heads; ComfyUI fixes 16, which the
/// reference patched to give each RoPE axis two frequencies).
fn tiny() -> Config {
    Config { heads: 4, ..detected() }
}

/// Fixture image `case` (`[1, H, W, 3]`) as the tower's input.
fn image(io: &Io, case: &str) -> VisionInput {
    let (shape, values) = &io[&format!("image.{case}")];
    VisionInput::patched(&tiny().patching(), values, shape[1], shape[2], shape[3]).unwrap()
}

/// The fixture's weights (tower and language model) under ComfyUI's names.
fn weights(plan_language_model: bool) -> (std::sync::Arc<kiln_compute::backend::cpu::Cpu>, Model) {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let mut plan = qwen3vl_vision::load_plan(&header, &tiny());
    if plan_language_model {
        let config = qwen3::detect_qwen3vl(&header).unwrap().unwrap();
        plan.slots.extend(qwen3::load_plan(&header, &config).slots);
    }
    let weights = manager.load(&plan, &mut |_, _| {}).unwrap();
    (b, weights)
}

#[test]
fn detects_the_tower_its_widths_and_deepstack() {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    assert_eq!(qwen3vl_vision::detect(&header).unwrap(), Some(detected()));
    assert_eq!(qwen3vl_vision::load_plan(&header, &detected()).slots.len(), 3 + 4 * 12 + 6 * 3);
    // Qwen2.5-VL's tower and a text-only file are not Qwen3-VL's.
    for other in ["qwen25vl_vision/weights.safetensors", "qwen3/weights.safetensors"] {
        let file = SafetensorsFile::open(fixture(other)).unwrap();
        assert_eq!(qwen3vl_vision::detect(&Header::new(&file, "")).unwrap(), None, "{other}");
    }
    // ComfyUI's released towers have fixed indexes; others are evenly spaced.
    assert_eq!(qwen3vl_vision::deepstack_indexes(1024, 24, 3), Some(vec![5, 11, 17]));
    assert_eq!(qwen3vl_vision::deepstack_indexes(1152, 27, 3), Some(vec![8, 16, 24]));
    assert_eq!(qwen3vl_vision::deepstack_indexes(1152, 27, 2), None);
    assert_eq!(qwen3vl_vision::deepstack_indexes(8, 2, 2), Some(vec![0, 1]));
    assert_eq!(qwen3vl_vision::deepstack_indexes(64, 12, 3), Some(vec![0, 4, 8]));
}

/// The released towers (ComfyUI's `QWEN3VL_VISION`), in transformers' layout beside a language model, as
/// header-only files: their widths and ComfyUI's DeepStack indexes; a broken one named.
#[test]
fn detects_the_released_towers() {
    let dir = common::scratch_dir("qwen3vl-vision", "released");
    let released = |hidden: usize,
                    depth: usize,
                    intermediate: usize,
                    out_hidden: usize,
                    deepstack: Vec<usize>| {
        Config {
            hidden,
            depth,
            heads: 16,
            intermediate,
            out_hidden,
            patch: 16,
            temporal_patch: 2,
            position_side: 48,
            deepstack,
        }
    };
    let shapes = |config: &Config| -> Vec<(String, Vec<usize>)> {
        let mut shapes = vec![(
            "model.language_model.embed_tokens.weight".to_owned(),
            vec![151_936, config.out_hidden],
        )];
        shapes.extend(config.expected().into_iter().map(|(n, s)| (format!("model.{n}"), s)));
        shapes
    };
    for (name, config) in [
        ("4b", released(1024, 24, 4096, 2560, vec![5, 11, 17])),
        ("8b", released(1152, 27, 4304, 4096, vec![8, 16, 24])),
    ] {
        let found = common::detect_header_only(
            &dir,
            &format!("{name}.safetensors"),
            &shapes(&config),
            |h| qwen3vl_vision::detect(h).unwrap(),
        );
        assert_eq!(found, Some(config.clone()), "{name}");
        assert_eq!(config.patch_values(), 1536);
        // A released tower with a DeepStack merger missing, and one with a 47 × 47 + 1 position table.
        let mut short = shapes(&config);
        short.retain(|(n, _)| !n.contains("deepstack_merger_list.2."));
        let refused =
            common::detect_header_only(&dir, "short.safetensors", &short, qwen3vl_vision::detect);
        assert!(
            matches!(refused, Err(Error::Unsupported { msg, .. }) if msg.contains("2 DeepStack"))
        );
        let mut odd = shapes(&config);
        for (n, s) in &mut odd {
            if n.ends_with("pos_embed.weight") {
                s[0] = 47 * 47 + 1;
            }
        }
        let refused =
            common::detect_header_only(&dir, "odd.safetensors", &odd, qwen3vl_vision::detect);
        assert!(
            matches!(refused, Err(Error::Unsupported { msg, .. }) if msg.contains("not a square"))
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn images_become_comfyui_patches_tokens_and_deepstack_features() {
    let (b, weights) = weights(false);
    let io = read_tensors(IO);
    for case in ["wide", "small"] {
        let input = image(&io, case);
        let (_, grid) = &io[&format!("grid.{case}")];
        assert_eq!(
            [1, input.grid_h, input.grid_w],
            [grid[0], grid[1], grid[2]].map(|g| g as usize)
        );
        let (_, patches) = &io[&format!("patches.{case}")];
        assert_close(&format!("patches.{case}"), &input.patches, patches, 1e-5);

        let got = qwen3vl_vision::embed_image(&*b, &weights, &tiny(), &input).unwrap();
        let (shape, want) = &io[&format!("merged.{case}")];
        assert_eq!(got.merged.shape(), shape.as_slice(), "{case}");
        assert_eq!(got.merged.dtype(), DType::F32);
        assert_close(&format!("merged.{case}"), &b.to_f32(&got.merged).unwrap(), want, 1e-4);
        assert_eq!(got.deepstack.len(), 2);
        for (k, feature) in got.deepstack.iter().enumerate() {
            let (shape, want) = &io[&format!("deepstack{k}.{case}")];
            assert_eq!(feature.shape(), shape.as_slice(), "{case} {k}");
            assert_close(&format!("deepstack{k}.{case}"), &b.to_f32(feature).unwrap(), want, 1e-4);
        }
        // The tower computes in f32 on every device, as ComfyUI's does: a bf16 backend gives the same tokens.
        let bf16 = b.with_compute_dtype(DType::BF16).unwrap();
        let again = qwen3vl_vision::embed_image(&bf16, &weights, &tiny(), &input).unwrap();
        assert_eq!(
            b.to_f32(&again.merged).unwrap(),
            b.to_f32(&got.merged).unwrap(),
            "{case} on bf16"
        );
    }
    // ComfyUI's 16 heads do not split this tiny width into RoPE-able heads; Qwen2.5-VL's 14-pixel patches are
    // not this tower's.
    let input = image(&io, "small");
    let refused = qwen3vl_vision::embed_image(&*b, &weights, &detected(), &input);
    assert!(matches!(refused, Err(Error::Invalid(m)) if m.contains("16 heads")));
    let (shape, values) = &io["image.small"];
    let patching = kiln_models::qwen_vl::Patching { patch: 14, ..tiny().patching() };
    let other = VisionInput::patched(&patching, values, shape[1], shape[2], shape[3]).unwrap();
    let refused = qwen3vl_vision::embed_image(&*b, &weights, &tiny(), &other);
    assert!(matches!(refused, Err(Error::Invalid(m)) if m.contains("1536 values a patch")));
}

/// The tiny reference language model as detected (head width 128, as released).
const LANGUAGE_MODEL: qwen3::Config = qwen3::Config {
    vocab: 256,
    hidden: 128,
    layers: 4,
    heads: 2,
    kv_heads: 1,
    head_dim: 128,
    intermediate: 64,
    rms_eps: 1e-6,
    rope_theta: 5e6,
    variant: Variant::Qwen3Vl,
};

/// The tiny model, tower and language model, as [`qwen3::detect_qwen3vl`] reads it.
fn language_model() -> (std::sync::Arc<kiln_compute::backend::cpu::Cpu>, Qwen3) {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let config = qwen3::detect_qwen3vl(&Header::new(&file, "")).unwrap().unwrap();
    assert_eq!(config, LANGUAGE_MODEL);
    let (b, weights) = weights(true);
    (b, Qwen3::new(config, weights))
}

/// A fixture prompt case: its ids (an image's one `<|image_pad|>` in its place) and its images through the tower.
fn prompt(
    b: &kiln_compute::backend::cpu::Cpu,
    model: &Qwen3,
    io: &Io,
    pieces: &serde_json::Value,
) -> (Vec<u32>, Vec<ImageTokens<kiln_compute::backend::cpu::Cpu>>) {
    let mut ids = Vec::new();
    let mut images = Vec::new();
    for piece in pieces.as_array().unwrap() {
        match piece.get("image") {
            Some(case) => {
                let input = image(io, case.as_str().unwrap());
                let out = qwen3vl_vision::embed_image(b, &model.weights, &tiny(), &input).unwrap();
                images.push(ImageTokens {
                    embeds: out.merged,
                    deepstack: out.deepstack,
                    rows: input.grid_h / 2,
                    cols: input.grid_w / 2,
                });
                ids.push(IMAGE_PAD);
            }
            None => ids.extend(common::ids(piece)),
        }
    }
    (ids, images)
}

/// ComfyUI's taps `taps` of prompt case `name`, side by side per token → `[1, N', taps · hidden]`.
fn want_taps(io: &Io, name: &str, taps: &[usize]) -> (Vec<usize>, Vec<f32>) {
    let states: Vec<&(Vec<usize>, Vec<f32>)> =
        taps.iter().map(|t| &io[&format!("tap{t}.{name}")]).collect();
    let (n, d) = (states[0].0[1], states[0].0[2]);
    let mut values = Vec::with_capacity(n * d * taps.len());
    for token in 0..n {
        for (_, state) in &states {
            values.extend_from_slice(&state[token * d..(token + 1) * d]);
        }
    }
    (vec![1, n, d * taps.len()], values)
}

#[test]
fn the_language_model_reads_images_as_comfyui() {
    let (b, mut model) = language_model();
    let io = read_tensors(IO);
    let cases = json("qwen3vl_vision/cases.json");
    let all: Vec<usize> =
        cases["taps"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as usize).collect();
    for (name, pieces) in cases["cases"].as_object().unwrap() {
        let (ids, images) = prompt(&b, &model, &io, pieces);
        // Krea 2's way (every tap, the last normed), Mage-Flow's and Boogu's (the last, normed), one inner tap.
        for taps in [all.as_slice(), &[4], &[2], &[3, 1]] {
            let (shape, want) = want_taps(&io, name, taps);
            let got =
                model.tapped_hidden_states_with_images(&*b, &ids, &images, None, taps).unwrap();
            assert_eq!(got.shape(), shape.as_slice(), "{name} {taps:?}");
            assert_eq!(got.dtype(), DType::F32);
            assert_close(&format!("{name} {taps:?}"), &b.to_f32(&got).unwrap(), &want, 1e-4);
        }
        // The hidden state is the last layer's output through the final norm.
        let (_, want) = want_taps(&io, name, &[4]);
        let got = model.hidden_state_with_images(&*b, &ids, &images).unwrap();
        assert_close(&format!("{name} hidden state"), &b.to_f32(&got).unwrap(), &want, 1e-4);
        if images.is_empty() {
            continue;
        }
        // The DeepStack features matter: without them the taps after layer 0 differ.
        let plain: Vec<_> =
            images.iter().map(|i| ImageTokens { deepstack: Vec::new(), ..(*i).clone() }).collect();
        let got = model.tapped_hidden_states_with_images(&*b, &ids, &plain, None, &[1]).unwrap();
        let (_, want) = want_taps(&io, name, &[1]);
        let got = b.to_f32(&got).unwrap();
        let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
        assert!(worst > 0.1, "{name}: DeepStack changes tap 1 by {worst}");
        // A feature of another shape than the image's tokens is refused, so is an image with another number
        // of features than the first's, and so are images for Qwen3.
        let mut misshapen = images.clone();
        let first = b.slice(&misshapen[0].deepstack[0], 0, 0, 1).unwrap();
        misshapen[0].deepstack[0] = first;
        let refused = model.tapped_hidden_states_with_images(&*b, &ids, &misshapen, None, &[4]);
        assert!(matches!(refused, Err(Error::Invalid(m)) if m.contains("DeepStack")), "{name}");
        if images.len() > 1 {
            let mut uneven = images.clone();
            uneven[1].deepstack.pop();
            let refused = model.tapped_hidden_states_with_images(&*b, &ids, &uneven, None, &[4]);
            assert!(
                matches!(refused, Err(Error::Invalid(m)) if m.contains("2 features")),
                "{name}"
            );
        }
        model.config.variant = Variant::Qwen3;
        let refused = model.tapped_hidden_states_with_images(&*b, &ids, &images, None, &[4]);
        model.config.variant = Variant::Qwen3Vl;
        assert!(
            matches!(refused, Err(Error::Invalid(m)) if m.contains("reads no images")),
            "{name}"
        );
    }
}

/// For text, Qwen3-VL's interleaved M-RoPE is plain RoPE: [`Variant::Qwen3Vl`] and [`Variant::Qwen3`] with the
/// same θ give the same states, and both ComfyUI's.
#[test]
fn text_alone_is_qwen3_with_qwen3vl_theta() {
    let (b, mut model) = language_model();
    let io = read_tensors(IO);
    let cases = json("qwen3vl_vision/cases.json");
    let ids = common::ids(&cases["cases"]["text"][0]);
    let taps = [1, 2, 3, 4];
    let mut pick = |logits: Vec<f32>| {
        logits
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |m, (i, &l)| if l > m.1 { (i, l) } else { m })
            .0 as u32
    };
    let vl = b.to_f32(&model.tapped_hidden_states(&*b, &ids, ids.len(), &taps).unwrap()).unwrap();
    let (_, want) = want_taps(&io, "text", &taps);
    assert_close("text", &vl, &want, 1e-4);
    let with_no_images =
        model.tapped_hidden_states_with_images(&*b, &ids, &[], None, &taps).unwrap();
    assert_eq!(b.to_f32(&with_no_images).unwrap(), vl);
    let hidden = b.to_f32(&model.hidden_state(&*b, &ids).unwrap()).unwrap();
    let generated = model.generate(&*b, &ids, 3, &[], &mut pick, &mut |_| Ok(())).unwrap();

    model.config.variant = Variant::Qwen3;
    let plain =
        b.to_f32(&model.tapped_hidden_states(&*b, &ids, ids.len(), &taps).unwrap()).unwrap();
    assert_eq!(vl, plain);
    // Text generation runs the same layers.
    assert_eq!(model.generate(&*b, &ids, 3, &[], &mut pick, &mut |_| Ok(())).unwrap(), generated);
    // Qwen3's own hidden state is layer `layers − 2`'s output (tap 3), Qwen3-VL's the last, normed (tap 4).
    let (_, qwen3_hidden) = want_taps(&io, "text", &[3]);
    assert_close(
        "Qwen3's hidden state",
        &b.to_f32(&model.hidden_state(&*b, &ids).unwrap()).unwrap(),
        &qwen3_hidden,
        1e-4,
    );
    let (_, last) = want_taps(&io, "text", &[4]);
    assert_close("Qwen3-VL's hidden state", &hidden, &last, 1e-4);
}
