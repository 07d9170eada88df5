//! The Mage-Flow DiT against `scripts/reference/mage_flow.py`'s fixtures: ComfyUI's own
//! `MageFlowTransformer2DModel` on a tiny random model, its timestep cast to bf16 as ComfyUI's
//! `MageFlow.process_timestep` casts it, for an even latent, an odd one, a batch of two at different sigmas,
//! and one and two reference latents (of other sides than the latents'); the timestep sinusoid against the one
//! ComfyUI computed; and detection, which tells Mage-Flow and Qwen-Image files apart both ways.

use std::collections::BTreeMap;

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType};
use kiln_models::family::DiffusionDetected;
use kiln_models::header::diffusion_prefix;
use kiln_models::mage_flow::{self, Config, MageFlow};
use kiln_models::{Error, Header, qwen_image};

use crate::common::{
    TempTensors, assert_close, assert_within, cpu, detect_header_only, fixture, read_tensors,
    scratch_dir,
};

const WEIGHTS: &str = "mage_flow/weights.safetensors";

/// The tiny reference model's config.
fn tiny() -> Config {
    Config {
        dim: 64,
        heads: 2,
        head_dim: 32,
        layers: 2,
        mlp_hidden: 256,
        text_dim: 64,
        axes_dims: [4, 14, 14],
    }
}

#[test]
fn outputs_match_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let config = mage_flow::detect(&header).unwrap().unwrap();
    assert_eq!(config, tiny());
    let weights = manager.load(&mage_flow::load_plan(&header, &config), &mut |_, _| {}).unwrap();
    let model = MageFlow::new(config, weights);
    let io = read_tensors("mage_flow/io.safetensors");
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).unwrap();
    let refs = [tensor("ref.1"), tensor("ref.2")];
    let cases = [
        ("even", "even", &refs[..0]),
        ("odd", "odd", &refs[..0]),
        ("batch", "batch", &refs[..0]),
        ("refs1", "even", &refs[..1]),
        ("refs2", "batch", &refs[..]),
    ];
    for (case, inputs, references) in cases {
        let (x, context) = (tensor(&format!("x.{inputs}")), tensor(&format!("context.{inputs}")));
        let sigmas = &io[&format!("sigma.{inputs}")].1;
        let out = model.forward_with_references(&*b, &x, sigmas, &context, references).unwrap();
        let (shape, want) = &io[&format!("out.{case}")];
        assert_eq!(out.shape(), shape.as_slice(), "{case}");
        assert_close(case, &b.to_f32(&out).unwrap(), want, 1e-4);
    }

    // Latents of another width, a reference of another batch, and text of another width are refused.
    let x = b.full(&[1, 16, 2, 2], 0.0, DType::F32).unwrap();
    let context = b.full(&[1, 3, 64], 0.0, DType::F32).unwrap();
    let err = model.forward(&*b, &x, &[0.5], &context).err();
    assert!(matches!(&err, Some(Error::Invalid(m)) if m.contains("128 channels")), "{err:?}");
    let (x, context) = (tensor("x.even"), tensor("context.even"));
    let reference = b.full(&[2, 128, 2, 2], 0.0, DType::F32).unwrap();
    let err = model.forward_with_references(&*b, &x, &[0.5], &context, &[reference]).err();
    assert!(matches!(err, Some(Error::Invalid(_))), "{err:?}");
    let wide = b.full(&[1, 3, 48], 0.0, DType::F32).unwrap();
    let err = model.forward(&*b, &x, &[0.5], &wide).err();
    assert!(matches!(&err, Some(Error::Invalid(m)) if m.contains("[1, N > 0, 64]")), "{err:?}");
}

/// The sinusoid ComfyUI's `MageTimestepProjEmbeddings` computed on the bf16 timestep, as the fixture's hook
/// recorded it: the same f32 values up to sin/cos's last bit (torch's vectorised kernels against Rust's).
#[test]
fn timestep_features_are_comfyuis() {
    let io = read_tensors("mage_flow/io.safetensors");
    for case in ["even", "odd", "batch"] {
        let sigmas = &io[&format!("sigma.{case}")].1;
        let (shape, want) = &io[&format!("features.{case}")];
        assert_eq!(shape, &[sigmas.len(), mage_flow::T_FREQ_DIM]);
        assert_within(case, &mage_flow::timestep_features(sigmas), want, 1e-6);
    }
}

/// The tensors of the fixture `relative` as f32, names prefixed by `prefix`.
fn tensors_of(relative: &str, prefix: &str) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    read_tensors(relative).into_iter().map(|(name, t)| (format!("{prefix}{name}"), t)).collect()
}

/// Mage-Flow's file under ComfyUI's checkpoint prefix is Mage-Flow's and not Qwen-Image's; Qwen-Image's file
/// is not Mage-Flow's; and the family dispatcher, which tries Qwen-Image, takes a Mage-Flow file without error.
#[test]
fn mage_flow_and_qwen_image_files_are_told_apart() {
    let prefixed =
        TempTensors::new("mage-flow-prefixed", tensors_of(WEIGHTS, "model.diffusion_model."));
    let file = SafetensorsFile::open(&prefixed.0).unwrap();
    let prefix = diffusion_prefix(file.names());
    assert_eq!(prefix, "model.diffusion_model.");
    let header = Header::new(&file, &prefix);
    assert_eq!(mage_flow::detect(&header).unwrap(), Some(tiny()));
    assert_eq!(qwen_image::detect(&header).unwrap(), None);
    let detected = DiffusionDetected::detect(&header).unwrap();
    assert!(!matches!(detected, Some(DiffusionDetected::QwenImage(..))), "{detected:?}");

    let file = SafetensorsFile::open(fixture("qwen_image/weights.safetensors")).unwrap();
    let header = Header::new(&file, "");
    assert_eq!(mage_flow::detect(&header).unwrap(), None);
    assert!(qwen_image::detect(&header).unwrap().is_some());
}

/// The weights of a Mage-Flow (`features` 128) or Qwen-Image (64) layout of inner width `d`, head width `hd`,
/// MLP width `f` and text width `text`, with `layers` blocks, as ComfyUI names them.
fn layout(
    features: usize,
    d: usize,
    hd: usize,
    f: usize,
    text: usize,
    layers: usize,
) -> Vec<(String, Vec<usize>)> {
    let mut all: Vec<(String, Vec<usize>)> = [
        ("img_in.weight", vec![d, features]),
        ("img_in.bias", vec![d]),
        ("txt_norm.weight", vec![text]),
        ("txt_in.weight", vec![d, text]),
        ("txt_in.bias", vec![d]),
        ("time_text_embed.timestep_embedder.linear_1.weight", vec![d, 256]),
        ("time_text_embed.timestep_embedder.linear_1.bias", vec![d]),
        ("time_text_embed.timestep_embedder.linear_2.weight", vec![d, d]),
        ("time_text_embed.timestep_embedder.linear_2.bias", vec![d]),
        ("norm_out.linear.weight", vec![2 * d, d]),
        ("norm_out.linear.bias", vec![2 * d]),
        ("proj_out.weight", vec![features, d]),
        ("proj_out.bias", vec![features]),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_owned(), s))
    .collect();
    for i in 0..layers {
        let mut linear = |name: &str, out: usize, inp: usize| {
            all.push((format!("transformer_blocks.{i}.{name}.weight"), vec![out, inp]));
            all.push((format!("transformer_blocks.{i}.{name}.bias"), vec![out]));
        };
        linear("img_mod.1", 6 * d, d);
        linear("txt_mod.1", 6 * d, d);
        for name in ["to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0"] {
            linear(&format!("attn.{name}"), d, d);
        }
        linear("attn.to_add_out", d, d);
        for stream in ["img_mlp", "txt_mlp"] {
            linear(&format!("{stream}.net.0.proj"), f, d);
            linear(&format!("{stream}.net.2"), d, f);
        }
        for name in ["norm_q", "norm_k", "norm_added_q", "norm_added_k"] {
            all.push((format!("transformer_blocks.{i}.attn.{name}.weight"), vec![hd]));
        }
    }
    all
}

/// The released sizes: Mage-Flow's 12 blocks of 24 heads of 128 over Qwen3-VL 4B's 2560-wide text (RoPE axes
/// (16, 56, 56)), and Qwen-Image's 60 blocks over 3584-wide text, each detected by its own family only; a
/// Mage-Flow file with a misshapen weight is refused by name.
#[test]
fn released_layouts_are_detected_by_their_own_family() {
    let dir = scratch_dir("mage-flow", "released");
    let mage = layout(128, 3072, 128, 12288, 2560, 12);
    let found = detect_header_only(&dir, "mage.safetensors", &mage, |h| {
        (mage_flow::detect(h).unwrap(), qwen_image::detect(h).unwrap())
    });
    let released = Config {
        dim: 3072,
        heads: 24,
        head_dim: 128,
        layers: 12,
        mlp_hidden: 12288,
        text_dim: 2560,
        axes_dims: [16, 56, 56],
    };
    assert_eq!(found, (Some(released), None));

    let qwen = layout(64, 3072, 128, 12288, 3584, 60);
    let (mage_found, qwen_found) = detect_header_only(&dir, "qwen.safetensors", &qwen, |h| {
        (mage_flow::detect(h).unwrap(), qwen_image::detect(h).unwrap())
    });
    assert_eq!(mage_found, None);
    assert_eq!(qwen_found.map(|(c, _)| (c.layers, c.text_dim)), Some((60, 3584)));

    let mut broken = layout(128, 64, 32, 256, 64, 2);
    let at = broken.iter().position(|(n, _)| n == "transformer_blocks.1.attn.to_q.weight").unwrap();
    broken[at].1 = vec![64, 32];
    let err =
        detect_header_only(&dir, "broken.safetensors", &broken, |h| mage_flow::detect(h).err());
    assert!(
        matches!(&err, Some(Error::Unsupported { msg, .. })
            if msg.contains("transformer_blocks.1.attn.to_q.weight") && msg.contains("Mage-Flow")),
        "{err:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
