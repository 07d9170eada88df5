//! Lotus depth's UNet against diffusers' `UNet2DConditionModel` (fixtures from `scripts/reference/lotus.py`,
//! which also checks ComfyUI's `UNetModel` agrees on the same weights): the forward of a tiny Lotus-shaped UNet
//! in both key layouts, odd sizes, its discrete-time sampling against ComfyUI's table, and the refusals.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kiln_compute::Backend as _;
use kiln_compute::DType;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::family::{DiffusionDetected, DiffusionFamily};
use kiln_models::sampling::{DiscreteSampling, ModelSampling, Prediction, Sampler};
use kiln_models::unet::{self, Config, InputBlock, Shape, Unet};
use kiln_models::{Error, Header};

use crate::common::{assert_close, cpu, fixture, read_tensors};

/// The tiny fixture's structure: widths (32, 32, 64), 2 ResBlocks a level, attention on the first two levels,
/// heads of 8, context 32, Lotus's 4-wide `label_emb`.
fn tiny_shape() -> Shape {
    Shape {
        model_channels: 32,
        channel_mult: vec![1, 1, 2],
        res_blocks: 2,
        depths: vec![1, 1, 0],
        context_dim: 32,
        head_channels: 8,
        ..Shape::lotus()
    }
}

/// A fresh directory for this test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-lotus-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// The fixture's tensors: name → (dtype, shape, raw bytes).
fn tiny_tensors() -> BTreeMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(fixture("lotus/weights.safetensors")).expect("the fixture");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors fixture");
    file.tensors()
        .into_iter()
        .map(|(name, v)| (name, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect()
}

/// Writes the fixture's tensors under the names `rename` gives (`None` drops one) to `path`.
fn rewrite(path: &Path, rename: impl Fn(&str) -> Option<String>) {
    reshape(path, |name, shape| Some((rename(name)?, shape.to_vec())));
}

/// Writes the fixture's tensors under the names and shapes `edit` gives (`None` drops one) to `path`.
fn reshape(path: &Path, edit: impl Fn(&str, &[usize]) -> Option<(String, Vec<usize>)>) {
    let tensors = tiny_tensors();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .filter_map(|(name, (dtype, shape, bytes))| {
            let (name, shape) = edit(name, shape)?;
            let view = safetensors::tensor::TensorView::new(*dtype, shape, bytes)
                .expect("a consistent tensor");
            Some((name, view))
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).expect("writing a safetensors file");
}

/// Detects `path` as a diffusion model and loads it on a CPU.
fn load(path: &Path) -> (std::sync::Arc<kiln_compute::backend::cpu::Cpu>, Unet) {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(path).expect("open");
    let header = Header::new(&file, "");
    let detected = DiffusionDetected::detect(&header).expect("detect").expect("a UNet");
    assert_eq!(detected.family(), DiffusionFamily::Lotus);
    let DiffusionDetected::Unet(config) = detected.clone() else {
        panic!("not a UNet: {detected:?}")
    };
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).expect("load");
    (b, Unet::new(config, weights))
}

/// The tiny config as detection derives it: the fixture's heads are 8 wide, detection's 64.
fn detected_config(unet: &Unet) -> Config {
    Config { head_channels: 8, ..unet.config.clone() }
}

/// Runs both fixture cases through `unet` and compares with diffusers.
fn check_cases(b: &kiln_compute::backend::cpu::Cpu, unet: &Unet, what: &str) {
    let io = read_tensors("lotus/io.safetensors");
    for case in ["a", "b"] {
        let t = |name: &str| &io[&format!("{case}.{name}")];
        let x = b.from_f32(&t("x").0, &t("x").1, DType::F32).expect("x");
        let context = b.from_f32(&t("context").0, &t("context").1, DType::F32).expect("context");
        let y = b.from_f32(&t("y").0, &t("y").1, DType::F32).expect("y");
        let out = unet.forward(b, &x, &t("t").1, &context, Some(&y)).expect("forward");
        assert_eq!(out.shape(), t("out").0.as_slice(), "{what} {case}");
        assert_close(&format!("{what} {case}"), &b.to_f32(&out).expect("read"), &t("out").1, 1e-4);
    }
}

#[test]
fn ldm_layout_matches_diffusers() {
    let (b, mut unet) = load(&fixture("lotus/weights.safetensors"));
    assert_eq!(unet.config.head_channels, unet::HEAD_CHANNELS);
    unet.config = detected_config(&unet);
    assert_eq!(unet.config, Config::build(&tiny_shape()));
    assert!(unet.config.input_blocks.contains(&InputBlock::Down { channels: 32 }));
    check_cases(&b, &unet, "ldm");
}

#[test]
fn diffusers_layout_matches_diffusers() {
    let text =
        std::fs::read_to_string(fixture("lotus/diffusers_names.json")).expect("the name map");
    let map: BTreeMap<String, String> = serde_json::from_str(&text).expect("a JSON name map");
    let by_ldm: BTreeMap<String, String> = map.into_iter().map(|(d, l)| (l, d)).collect();
    let dir = scratch("diffusers");
    let path = dir.join("diffusers.safetensors");
    rewrite(&path, |name| by_ldm.get(name).cloned());
    let (b, mut unet) = load(&path);
    unet.config = detected_config(&unet);
    assert_eq!(unet.config, Config::build(&tiny_shape()));
    check_cases(&b, &unet, "diffusers");
    let _ = std::fs::remove_dir_all(dir);
}

/// Lotus's task embedding is ComfyUI's `[sin 1, sin 0, cos 1, cos 0]`, the fixture's case `a` vector.
#[test]
fn task_embedding_is_comfyuis() {
    let io = read_tensors("lotus/io.safetensors");
    assert_eq!(unet::lotus_task_embedding().as_slice(), io["a.y"].1.as_slice());
}

/// The released Lotus structure: 12 input blocks after the conv, 12 output blocks, upsamples where SD 2 has
/// them, the time embedding 1280 wide.
#[test]
fn released_structure() {
    let config = Config::build(&Shape::lotus());
    assert_eq!(config.input_blocks.len(), 11);
    assert_eq!(config.output_blocks.len(), 12);
    assert_eq!(config.time_embed_dim, 1280);
    let upsamples: Vec<(usize, usize)> = config
        .output_blocks
        .iter()
        .enumerate()
        .filter_map(|(j, o)| Some((j, o.upsample?)))
        .collect();
    assert_eq!(upsamples, [(2, 1), (5, 2), (8, 2)]);
    let names = unet::tensors(&config);
    let weights: usize = names.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    // SD 2's UNet (865,910,724 weights) and the 4-wide label_emb (4·1280 + 1280 + 1280² + 1280).
    assert_eq!(weights, 865_910_724 + 1_646_080, "{weights}");
}

/// The SD UNets Kiln does not run are refused by name; a tensor of the wrong shape names itself.
#[test]
fn other_unets_are_refused() {
    let dir = scratch("refused");
    let sd2 = dir.join("sd2.safetensors");
    rewrite(&sd2, |name| (!name.starts_with("label_emb.")).then(|| name.to_owned()));
    let file = SafetensorsFile::open(&sd2).expect("open");
    let err = DiffusionDetected::detect(&Header::new(&file, "")).expect_err("refused");
    assert!(matches!(&err, Error::Unsupported { msg, .. } if msg.contains("SD 2.x UNet")), "{err}");

    let broken = dir.join("broken.safetensors");
    rewrite(&broken, |name| (name != "output_blocks.5.2.conv.weight").then(|| name.to_owned()));
    let file = SafetensorsFile::open(&broken).expect("open");
    let err = DiffusionDetected::detect(&Header::new(&file, "")).expect_err("refused");
    assert!(err.to_string().contains("output_blocks.5"), "{err}");

    // A tensor of another rank is named, not indexed past its end.
    let flat = dir.join("flat.safetensors");
    reshape(&flat, |name, shape| {
        let shape = match name {
            "time_embed.0.weight" => vec![shape.iter().product()],
            _ => shape.to_vec(),
        };
        Some((name.to_owned(), shape))
    });
    let file = SafetensorsFile::open(&flat).expect("open");
    let err = DiffusionDetected::detect(&Header::new(&file, "")).expect_err("refused");
    assert!(err.to_string().contains("`time_embed.0.weight` is [4096], expected rank 2"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// SD's discrete table (`ModelSamplingDiscrete`, linear β 0.00085..0.012) against ComfyUI's figures (torch on
/// the CPU, `ModelSamplingDiscrete()` at 0f1fa67a): the table's ends, the nearest-index timestep, the
/// interpolated sigma, `percent_to_sigma`, and the normal schedules Lotus's template asks for.
#[test]
fn discrete_sampling_is_comfyuis() {
    let close = |got: f32, want: f64, what: &str| {
        assert!((f64::from(got) - want).abs() <= want.abs() * 2e-7, "{what}: {got} against {want}");
    };
    let ms = DiscreteSampling::new(Prediction::ImageToImage);
    close(ms.sigmas()[0], 0.029167158529162407, "sigma_min");
    close(ms.sigmas()[999], 14.614641189575195, "sigma_max");
    close(ms.sigma_of_timestep(999.0), 14.614640235900879, "sigma(999)");
    close(ms.sigma_of_timestep(500.5), 1.6209832429885864, "sigma(500.5)");
    close(ms.percent_to_sigma(0.3) as f32, 3.325068950653076, "percent_to_sigma(0.3)");
    assert_eq!(ms.timestep(999.0), 999.0);
    assert_eq!(ms.timestep(ms.sigmas()[500]), 500.0);
    let ms = ModelSampling::from(ms);
    let one = kiln_models::sampling::Scheduler::Normal.sigmas(&ms, 1);
    close(one[0], 14.614640235900879, "normal(1)");
    assert_eq!(one[1], 0.0);
    let three = kiln_models::sampling::Scheduler::Normal.sigmas(&ms, 3);
    for (got, want) in
        three.iter().zip([14.614640235900879, 1.6155803203582764, 0.029167160391807556, 0.0])
    {
        close(*got, want, "normal(3)");
    }
    // A first sigma above the table's largest is a full denoise: √(1 + σ²)·noise + latent.
    let x = ms.noise_scaling(&[999.0, 0.0], &[1.0], &[0.5]);
    assert!((x[0] - ((1.0f32 + 999.0 * 999.0).sqrt() + 0.5)).abs() < 1e-3);
    let x = ms.noise_scaling(&[1.0, 0.0], &[1.0], &[0.5]);
    assert_eq!(x, [1.5]);
    // IMG_TO_IMG: the model's output is x̂₀.
    assert_eq!(ms.calculate_denoised(999.0, &[3.0], &[2.0]), [2.0]);
    assert_eq!(ms.inverse_noise_scaling(0.0, &[2.0]), [2.0]);
}

/// Samplers that read a flow model's half-log-SNR refuse a discrete model with the list of those that run it.
#[test]
fn flow_only_samplers_refuse_discrete_models() {
    let ms = ModelSampling::from(DiscreteSampling::new(Prediction::ImageToImage));
    struct Echo;
    impl kiln_models::sampling::Denoiser for Echo {
        fn denoise(&mut self, x: &[f32], _sigma: f32) -> kiln_models::Result<Vec<f32>> {
            Ok(x.iter().map(|v| v * 0.5).collect())
        }
        fn denoise_cfg_pp(
            &mut self,
            _x: &[f32],
            _sigma: f32,
        ) -> kiln_models::Result<(Vec<f32>, Vec<f32>)> {
            Err(Error::Invalid("no unconditional side".to_owned()))
        }
    }
    let mut sigmas = vec![999.0, 0.0];
    let err = kiln_models::sampling::sample(
        Sampler::ErSde,
        &ms,
        &mut Echo,
        vec![1.0],
        &mut sigmas,
        0,
        &mut |_| Ok(()),
    )
    .expect_err("refused");
    assert!(err.to_string().contains("er_sde") && err.to_string().contains("euler"), "{err}");
    // The DPM-Solver++ SDE samplers take a discrete model's half-log-SNR (−ln σ) and run it.
    assert!(err.to_string().contains("dpmpp_2m_sde"), "listed among those that run it: {err}");
    let out = kiln_models::sampling::sample(
        Sampler::Euler,
        &ms,
        &mut Echo,
        vec![1.0],
        &mut sigmas,
        0,
        &mut |_| Ok(()),
    )
    .expect("euler");
    // One Euler step to σ 0 lands on the model's x̂₀.
    assert_eq!(out, [0.5]);
}
