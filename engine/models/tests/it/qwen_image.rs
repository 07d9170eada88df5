//! The Qwen-Image MMDiT against `scripts/reference/qwen_image.py`'s fixtures: ComfyUI's own
//! `QwenImageTransformer2DModel` (cross-checked there with diffusers' on the even grid) on a tiny random model,
//! for an even token grid, an odd one with two samples at different sigmas, an odd latent that is padded, and
//! reference latents placed by each of ComfyUI's methods.

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType};
use kiln_models::qwen_image::{self, Config, QwenImage};
use kiln_models::{Error, Header};

use crate::common::{assert_close, cpu, fixture, read_tensors};

const WEIGHTS: &str = "qwen_image/weights.safetensors";

/// The tiny reference model's config.
fn tiny() -> Config {
    Config {
        dim: 64,
        heads: 2,
        head_dim: 32,
        layers: 2,
        mlp_hidden: 256,
        text_dim: 48,
        axes_dims: [4, 14, 14],
    }
}

#[test]
fn outputs_match_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let config = qwen_image::detect(&header).unwrap().unwrap();
    assert_eq!(config, tiny());
    let weights = manager.load(&qwen_image::load_plan(&header, &config), &mut |_, _| {}).unwrap();
    let model = QwenImage::new(config, weights);
    let io = read_tensors("qwen_image/io.safetensors");
    for case in ["even", "odd", "ragged"] {
        let get = |name: &str| &io[&format!("{name}.{case}")];
        let x = b.from_f32(&get("x").0, &get("x").1, DType::F32).unwrap();
        let context = b.from_f32(&get("context").0, &get("context").1, DType::F32).unwrap();
        let out = model.forward(&*b, &x, &get("sigma").1, &context).unwrap();
        assert_eq!(out.shape(), get("out").0.as_slice(), "{case}");
        assert_close(case, &b.to_f32(&out).unwrap(), &get("out").1, 1e-4);
    }
    // Reference latents (batch 1, repeated to the batch) in each placement ComfyUI has.
    let x = b.from_f32(&io["x.odd"].0, &io["x.odd"].1, DType::F32).unwrap();
    let context = b.from_f32(&io["context.odd"].0, &io["context.odd"].1, DType::F32).unwrap();
    let refs: Vec<_> = ["ref.1", "ref.2"]
        .map(|r| b.from_f32(&io[r].0, &io[r].1, DType::F32).unwrap())
        .into_iter()
        .collect();
    for method in ["index", "negative_index", "offset"] {
        let out = model
            .forward_with_references(&*b, &x, &io["sigma.odd"].1, &context, &refs, Some(method))
            .unwrap();
        let (shape, want) = &io[&format!("out.refs.{method}")];
        assert_eq!(out.shape(), shape.as_slice(), "{method}");
        assert_close(method, &b.to_f32(&out).unwrap(), want, 1e-4);
    }
    let refused = model.forward_with_references(
        &*b,
        &x,
        &io["sigma.odd"].1,
        &context,
        &refs,
        Some("index_timestep_zero"),
    );
    assert!(matches!(refused, Err(Error::Invalid(m)) if m.contains("index_timestep_zero")));

    let x = b.full(&[1, 4, 2, 2], 0.0, DType::F32).unwrap();
    let context = b.full(&[1, 3, 48], 0.0, DType::F32).unwrap();
    assert!(
        matches!(model.forward(&*b, &x, &[0.5], &context), Err(Error::Invalid(m)) if m.contains("16 channels"))
    );
}
