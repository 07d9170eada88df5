//! The Wan 2.1 VAE (Qwen-Image's too) against diffusers' `AutoencoderKLQwenImage` (fixtures from
//! `scripts/reference/wan_vae.py`): decode and encode of a tiny one in both key layouts, detection on the
//! released shapes, and the clear refusals.
//!
//! The tiny weights are stored once, in ComfyUI's layout; the diffusers-layout file is rebuilt here from the
//! script's name map (its own conversion, not Kiln's), so both layouts load the same values. The fixtures are
//! one-frame videos `[B, C, 1, H, W]`; Kiln's images are `[B, C, H, W]`, the same values.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kiln_compute::Backend as _;
use kiln_compute::DType;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::wan_vae::{self, ClipVae, Config, Layout, WanVae};
use kiln_models::{Error, Header};

use crate::common::{assert_close, cpu, fixture, read_tensors};

/// `{diffusers name: (ComfyUI name, shape)}` from one of the script's JSON maps.
fn names(relative: &str) -> BTreeMap<String, (String, Vec<usize>)> {
    let text = std::fs::read_to_string(fixture(relative)).expect("the name map");
    serde_json::from_str(&text).expect("a JSON name map")
}

/// A fresh directory for this test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-wan-vae-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

type Tensors = Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>;

/// Writes a safetensors file of `tensors`.
fn write(path: &Path, tensors: &Tensors) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes)
                .expect("a consistent tensor");
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).expect("writing a safetensors file");
}

/// The tiny fixture's tensors in ComfyUI's layout.
fn tiny() -> Tensors {
    let bytes = std::fs::read(fixture("wan_vae/weights.safetensors")).expect("the fixture");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors fixture");
    file.tensors()
        .into_iter()
        .map(|(name, v)| (name, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect()
}

/// The tiny fixture, optionally edited, renamed into diffusers' layout with the script's map when asked.
fn tiny_file(dir: &Path, file: &str, diffusers: bool, edit: impl FnOnce(&mut Tensors)) -> PathBuf {
    let mut tensors = tiny();
    if diffusers {
        let map: BTreeMap<String, String> = names("wan_vae/diffusers_names.json")
            .into_iter()
            .map(|(d, (comfy, _))| (comfy, d))
            .collect();
        for t in &mut tensors {
            t.0 = map.get(&t.0).unwrap_or_else(|| panic!("no diffusers name for {}", t.0)).clone();
        }
    }
    edit(&mut tensors);
    let path = dir.join(file);
    write(&path, &tensors);
    path
}

/// The tiny config: base width 8.
fn tiny_config() -> Config {
    Config {
        dim: 8,
        z_channels: 16,
        in_channels: 3,
        out_channels: 3,
        has_encoder: true,
        has_decoder: true,
    }
}

/// Detection of `path` under no prefix.
fn detect(path: &Path) -> kiln_models::Result<Option<(Config, Layout)>> {
    let file = SafetensorsFile::open(path).expect("open");
    wan_vae::detect(&Header::new(&file, ""))
}

/// Detects and loads `path`.
fn load(path: &Path) -> (std::sync::Arc<kiln_compute::backend::cpu::Cpu>, WanVae, Layout) {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(path).expect("open");
    let header = Header::new(&file, "");
    let (config, layout) = wan_vae::detect(&header).expect("detect").expect("a Wan VAE");
    let plan = wan_vae::load_plan(&header, &config, layout);
    let weights = manager.load(&plan, &mut |_, _| {}).expect("load");
    (b, WanVae::new(config, weights), layout)
}

/// A fixture tensor `[B, C, 1, H, W]` as the image or latent `[B, C, H, W]` it stands for.
fn frame(shape: &[usize]) -> Vec<usize> {
    assert_eq!(shape[2], 1, "one frame");
    vec![shape[0], shape[1], shape[3], shape[4]]
}

/// Decodes z1, z2 and encodes x1, x2 (35×38, centre-cropped) and compares with diffusers.
fn check_outputs(vae: &WanVae, b: &kiln_compute::backend::cpu::Cpu, what: &str) {
    let io = read_tensors("wan_vae/io.safetensors");
    let run = |input: &str, want: &str, encode: bool| {
        let (shape, values) = &io[input];
        let x = b.from_f32(&frame(shape), values, DType::F32).expect("input");
        let y = if encode { vae.encode(b, &x) } else { vae.decode(b, &x) }.expect("forward");
        let (want_shape, want_values) = &io[want];
        assert_eq!(y.shape(), frame(want_shape).as_slice(), "{what} {want}");
        assert_eq!(y.dtype(), DType::F32);
        assert_close(&format!("{what} {want}"), &b.to_f32(&y).expect("read"), want_values, 1e-4);
    };
    run("z1", "decode_z1", false);
    run("z2", "decode_z2", false);
    run("x1", "encode_x1", true);
    run("x2", "encode_x2", true);
}

#[test]
fn comfy_layout_matches_diffusers() {
    let (b, vae, layout) = load(&fixture("wan_vae/weights.safetensors"));
    assert_eq!(layout, Layout::Comfy);
    assert_eq!(vae.config, tiny_config());
    check_outputs(&vae, &b, "comfy");
}

#[test]
fn diffusers_layout_matches_diffusers() {
    let dir = scratch("diffusers");
    let (b, vae, layout) = load(&tiny_file(&dir, "diffusers.safetensors", true, |_| {}));
    assert_eq!(layout, Layout::Diffusers);
    assert_eq!(vae.config, tiny_config());
    check_outputs(&vae, &b, "diffusers");
    let _ = std::fs::remove_dir_all(dir);
}

/// A decoder-only file decodes and refuses to encode.
#[test]
fn a_decoder_only_file_decodes() {
    let dir = scratch("decoder");
    let path = tiny_file(&dir, "decoder.safetensors", false, |t| {
        t.retain(|x| x.0.starts_with("decoder.") || x.0.starts_with("conv2."))
    });
    let (b, vae, _) = load(&path);
    assert!(vae.config.has_decoder && !vae.config.has_encoder);
    let io = read_tensors("wan_vae/io.safetensors");
    let (shape, values) = &io["z1"];
    let z = b.from_f32(&frame(shape), values, DType::F32).expect("z");
    let y = vae.decode(&*b, &z).expect("decode");
    assert_close("decoder only", &b.to_f32(&y).expect("read"), &io["decode_z1"].1, 1e-4);
    assert!(matches!(vae.encode(&*b, &z), Err(Error::Invalid(m)) if m.contains("no encoder")));
    let _ = std::fs::remove_dir_all(dir);
}

/// Latents of the wrong channel count and images under 8×8 are input errors.
#[test]
fn bad_inputs_are_errors() {
    let (b, vae, _) = load(&fixture("wan_vae/weights.safetensors"));
    let z = b.full(&[1, 4, 2, 2], 0.0, DType::F32).expect("z");
    assert!(matches!(vae.decode(&*b, &z), Err(Error::Invalid(m)) if m.contains("4 channels")));
    let x = b.full(&[1, 3, 7, 16], 0.0, DType::F32).expect("x");
    assert!(matches!(vae.encode(&*b, &x), Err(Error::Invalid(_))));
}

/// The released VAE's names and shapes (header-only files, both layouts) give base width 96; a missing
/// weight and the Wan 2.2 VAE's latent width are refused by name; the Flux VAE is not claimed.
#[test]
fn detects_the_released_vae_and_refuses_others() {
    let dir = scratch("real");
    let map = names("wan_vae/wan_names.json");
    let real = Config { dim: 96, ..tiny_config() };
    for (file, layout) in [("comfy", Layout::Comfy), ("diffusers", Layout::Diffusers)] {
        let shapes: Vec<(String, Vec<usize>)> = map
            .iter()
            .map(|(d, (comfy, shape))| {
                (if layout == Layout::Comfy { comfy.clone() } else { d.clone() }, shape.clone())
            })
            .collect();
        let path = dir.join(format!("{file}.safetensors"));
        crate::common::write_header_only(&path, &shapes);
        assert_eq!(detect(&path).expect("detect"), Some((real.clone(), layout)), "{file}");
        let sf = SafetensorsFile::open(&path).expect("open");
        let plan = wan_vae::load_plan(&Header::new(&sf, ""), &real, layout);
        assert_eq!(plan.slots.len(), 194);
    }
    let missing = tiny_file(&dir, "missing.safetensors", false, |t| {
        t.retain(|x| x.0 != "decoder.upsamples.5.residual.6.weight")
    });
    let err = detect(&missing).expect_err("a weight is missing");
    assert!(err.to_string().contains("decoder.upsamples.5.residual.6.weight"), "{err}");
    let wide = tiny_file(&dir, "wide.safetensors", false, |t| {
        for x in t.iter_mut().filter(|x| x.0 == "decoder.conv1.weight") {
            x.2[1] = 48;
            x.3 = vec![0; x.2.iter().product::<usize>() * 2];
        }
    });
    let err = detect(&wide).expect_err("48 channels");
    assert!(err.to_string().contains("Wan 2.2"), "{err}");
    assert_eq!(detect(&fixture("flux_vae/weights.safetensors")).expect("detect"), None);
    let _ = std::fs::remove_dir_all(dir);
}
