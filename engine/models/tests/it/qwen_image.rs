//! The Qwen-Image MMDiT against `scripts/reference/qwen_image.py`'s fixtures: ComfyUI's own
//! `QwenImageTransformer2DModel` (cross-checked there with diffusers' on the even grid) on a tiny random model,
//! for an even token grid, an odd one with two samples at different sigmas, an odd latent that is padded, and
//! reference latents placed by each of ComfyUI's methods (Edit 2511's `index_timestep_zero` too, also as the
//! default of a file marked `__index_timestep_zero__`).

use std::path::PathBuf;
use std::sync::Arc;

use kiln_compute::memory::{MemoryManager, SafetensorsFile};
use kiln_compute::{Backend as _, DType};
use kiln_models::family::{DiffusionDetected, DiffusionInput, DiffusionNet};
use kiln_models::header::diffusion_prefix;
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
        additional_t_cond: false,
    }
}

/// The tiny reference model of [`WEIGHTS`] under `manager` (the ControlNet tests' base model too).
pub(crate) fn tiny_model(manager: &Arc<MemoryManager>) -> QwenImage {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let (config, _) = qwen_image::detect(&header).unwrap().unwrap();
    let weights = manager.load(&qwen_image::load_plan(&header, &config), &mut |_, _| {}).unwrap();
    QwenImage::new(config, weights)
}

#[test]
fn outputs_match_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let (config, method) = qwen_image::detect(&header).unwrap().unwrap();
    assert_eq!((&config, method), (&tiny(), "index"));
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
    for method in ["index", "negative_index", "offset", "index_timestep_zero"] {
        let out = model
            .forward_with_references(&*b, &x, &io["sigma.odd"].1, &context, &refs, Some(method))
            .unwrap();
        let (shape, want) = &io[&format!("out.refs.{method}")];
        assert_eq!(out.shape(), shape.as_slice(), "{method}");
        assert_close(method, &b.to_f32(&out).unwrap(), want, 1e-4);
    }

    let x = b.full(&[1, 4, 2, 2], 0.0, DType::F32).unwrap();
    let context = b.full(&[1, 3, 48], 0.0, DType::F32).unwrap();
    assert!(
        matches!(model.forward(&*b, &x, &[0.5], &context), Err(Error::Invalid(m)) if m.contains("16 channels"))
    );
}

/// A copy of the reference weights under ComfyUI's checkpoint prefix with Edit 2511's empty marker tensor,
/// removed on drop.
struct VariantFile(PathBuf);

impl VariantFile {
    /// The fixture's weights and `extra` (name, shape, f32 values) under ComfyUI's checkpoint prefix, in a
    /// temporary file named after `variant`.
    fn new(variant: &str, extra: (&str, Vec<usize>, &[f32])) -> VariantFile {
        let path = std::env::temp_dir()
            .join(format!("kiln-qwen-image-{variant}-{}.safetensors", std::process::id()));
        let bytes = std::fs::read(fixture(WEIGHTS)).expect("the fixture");
        let file = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors fixture");
        let (name, shape, values) = extra;
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape, &data)
            .expect("a tensor");
        let views = file
            .tensors()
            .into_iter()
            .chain([(name.to_owned(), view)])
            .map(|(name, view)| (format!("model.diffusion_model.{name}"), view));
        safetensors::serialize_to_file(views, None, &path).expect("writes the file");
        VariantFile(path)
    }
}

impl Drop for VariantFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn edit_2511_defaults_to_index_timestep_zero() {
    let (b, manager) = cpu(64 << 20);
    let path = VariantFile::new("2511", ("__index_timestep_zero__", vec![0], &[]));
    let file = SafetensorsFile::open(&path.0).unwrap();
    let prefix = diffusion_prefix(file.names());
    let header = Header::new(&file, &prefix);
    let detected = DiffusionDetected::detect(&header).unwrap().unwrap();
    assert_eq!(detected, DiffusionDetected::QwenImage(tiny(), "index_timestep_zero"));
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).unwrap();
    let net = detected.build(weights);
    assert!(
        matches!(&net, DiffusionNet::QwenImage(m) if m.default_method == "index_timestep_zero")
    );

    // With no method from the conditioning the file's default applies; a named one still wins.
    let io = read_tensors("qwen_image/io.safetensors");
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).unwrap();
    let (x, context) = (tensor("x.odd"), tensor("context.odd"));
    let refs = [tensor("ref.1"), tensor("ref.2")];
    for (method, want) in [(None, "index_timestep_zero"), (Some("index"), "index")] {
        let input = DiffusionInput {
            references: &refs,
            reference_method: method,
            ..DiffusionInput::new(&x, &io["sigma.odd"].1, &context)
        };
        let out = net.forward(&*b, input).unwrap();
        assert_close(want, &b.to_f32(&out).unwrap(), &io[&format!("out.refs.{want}")].1, 1e-4);
    }
}

/// Qwen-Image-Layered against ComfyUI's `use_additional_t_cond` model: the file's `addition_t_embedding`
/// (detected by name, row 0 added to the timestep embedding) and latents of three frames (layers) at RoPE
/// frames 0, 1, 2, with and without a reference.
#[test]
fn layered_frames_match_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let io = read_tensors("qwen_image/io.safetensors");
    let (shape, table) = &io["layered.addition_t_embedding"];
    let path =
        VariantFile::new("layered", (qwen_image::ADDITION_T_EMBEDDING, shape.clone(), table));
    let file = SafetensorsFile::open(&path.0).unwrap();
    let prefix = diffusion_prefix(file.names());
    let header = Header::new(&file, &prefix);
    let detected = DiffusionDetected::detect(&header).unwrap().unwrap();
    let layered = Config { additional_t_cond: true, ..tiny() };
    assert_eq!(detected, DiffusionDetected::QwenImage(layered, "index"));
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).unwrap();
    let net = detected.build(weights);
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).unwrap();
    let (x, context) = (tensor("x.layered"), tensor("context.layered"));
    let refs = [tensor("ref.2")];
    for (references, want) in [(&refs[..0], "out.layered"), (&refs[..], "out.layered.ref")] {
        let input = DiffusionInput {
            references,
            ..DiffusionInput::new(&x, &io["sigma.layered"].1, &context)
        };
        let out = net.forward(&*b, input).unwrap();
        assert_eq!(out.shape(), io[want].0.as_slice(), "{want}");
        assert_close(want, &b.to_f32(&out).unwrap(), &io[want].1, 1e-4);
    }
}

/// Prompts of different lengths in one call (`text_lens`: text `[1, ΣNᵢ, D]`): each sample's output is the one
/// its own call gives, up to the GEMM kernels' rounding, without references and with them (Edit 2511's
/// timestep-zero modulation too); lengths that do not add up to the text's rows are refused.
#[test]
fn prompts_of_different_lengths_share_one_call() {
    let (b, manager) = cpu(64 << 20);
    let model = tiny_model(&manager);
    let io = read_tensors("qwen_image/io.safetensors");
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).unwrap();
    // Sample 0 reads 4 rows of text, sample 1 reads 5.
    let x = tensor("x.odd");
    let sigmas = &io["sigma.odd"].1;
    let short = b.slice(&tensor("context.odd"), 0, 0, 1).unwrap();
    let long = tensor("context.even");
    let lens = [4, 5];
    let joined = b.concat(&[&short, &long], 1).unwrap();
    let refs = [tensor("ref.1"), tensor("ref.2")];
    for (references, method) in
        [(&refs[..0], None), (&refs[..], Some("index")), (&refs[..], Some("index_timestep_zero"))]
    {
        let extras = qwen_image::Extras {
            references,
            method,
            text_lens: Some(&lens),
            ..qwen_image::Extras::default()
        };
        let out = model.forward_with_extras(&*b, &x, sigmas, &joined, &extras).unwrap();
        let out = b.to_f32(&out).unwrap();
        let per_sample = out.len() / 2;
        for (i, context) in [&short, &long].into_iter().enumerate() {
            let xi = b.slice(&x, 0, i, 1).unwrap();
            let alone = model
                .forward_with_references(&*b, &xi, &sigmas[i..=i], context, references, method)
                .unwrap();
            let alone = b.to_f32(&alone).unwrap();
            // A text's 4 rows alone take the few-rows kernel, the 9 joined rows the packed one.
            let what = format!("sample {i} with {method:?}");
            assert_close(&what, &out[i * per_sample..(i + 1) * per_sample], &alone, 1e-6);
        }
    }

    let extras = qwen_image::Extras { text_lens: Some(&[4, 4]), ..qwen_image::Extras::default() };
    let err = model.forward_with_extras(&*b, &x, sigmas, &joined, &extras).err();
    assert!(
        matches!(&err, Some(Error::Invalid(m)) if m.contains("[4, 4]") && m.contains("[1, 9, 48]")),
        "{err:?}"
    );
}
