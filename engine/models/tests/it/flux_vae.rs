//! The Flux VAE against diffusers' `AutoencoderKL` (fixtures from `scripts/reference/flux_vae.py`): decode and
//! encode of a tiny Flux-shaped VAE in both key layouts, detection on the real `ae.safetensors` shapes, and the
//! clear refusals.
//!
//! The tiny weights are stored once, in ComfyUI's layout; the diffusers-layout file is rebuilt here from the
//! script's name map (its own conversion, not Kiln's), so both layouts load the same values.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kiln_compute::Backend as _;
use kiln_compute::DType;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::flux_vae::{self, Config, FluxVae, Layout};
use kiln_models::{Error, Header};

use crate::common::{assert_close, cpu, fixture, read_tensors, write_header_only};

/// `{diffusers name: (LDM name, diffusers shape)}` from one of the script's JSON maps.
fn names(relative: &str) -> BTreeMap<String, (String, Vec<usize>)> {
    let text = std::fs::read_to_string(fixture(relative)).expect("the name map");
    serde_json::from_str(&text).expect("a JSON name map")
}

/// A fresh directory for this test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-flux-vae-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// Writes a safetensors file of `tensors` (name, dtype, shape, bytes).
fn write(path: &Path, tensors: &[(String, safetensors::Dtype, Vec<usize>, Vec<u8>)]) {
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

/// The tiny fixture's tensors: name → (dtype, shape, raw bytes).
fn tiny_tensors() -> BTreeMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(fixture("flux_vae/weights.safetensors")).expect("the fixture");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors fixture");
    file.tensors()
        .into_iter()
        .map(|(name, v)| (name, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect()
}

/// The tiny fixture rewritten in diffusers' layout (attention projections as `[C, C]` Linear weights).
fn tiny_diffusers(dir: &Path) -> PathBuf {
    let ldm = tiny_tensors();
    let tensors: Vec<_> = names("flux_vae/diffusers_names.json")
        .into_iter()
        .map(|(diffusers, (ldm_name, shape))| {
            let (dtype, _, bytes) =
                ldm.get(&ldm_name).unwrap_or_else(|| panic!("no {ldm_name}")).clone();
            (diffusers, dtype, shape, bytes)
        })
        .collect();
    let path = dir.join("diffusers.safetensors");
    write(&path, &tensors);
    path
}

/// The tiny fixture with `edit` applied to its list of (name, dtype, shape, bytes).
fn tiny_edited(
    dir: &Path,
    file: &str,
    edit: impl FnOnce(&mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>),
) -> PathBuf {
    let mut tensors: Vec<_> =
        tiny_tensors().into_iter().map(|(n, (d, s, b))| (n, d, s, b)).collect();
    edit(&mut tensors);
    let path = dir.join(file);
    write(&path, &tensors);
    path
}

/// The tiny config: widths (32, 64, 32, 32), one resnet per encoder level.
fn tiny_config() -> Config {
    Config {
        ch: 32,
        decoder_ch: 32,
        ch_mult: vec![1, 2, 1, 1],
        num_res_blocks: 1,
        z_channels: 16,
        in_channels: 3,
        out_channels: 3,
        groups: 32,
        has_encoder: true,
        has_decoder: true,
        quant_conv: false,
        post_quant_conv: false,
        latent_bn: false,
    }
}

/// Detects and loads `path` as a VAE on a CPU with `device_memory` bytes of simulated VRAM.
fn load(
    path: &Path,
    device_memory: u64,
) -> (std::sync::Arc<kiln_compute::backend::cpu::Cpu>, FluxVae, Layout) {
    let (b, manager) = cpu(device_memory);
    let file = SafetensorsFile::open(path).expect("open");
    let header = Header::new(&file, "");
    let (config, layout) = flux_vae::detect(&header).expect("detect").expect("a VAE");
    let plan = flux_vae::load_plan(&header, &config, layout);
    let weights = manager.load(&plan, &mut |_, _| {}).expect("load");
    (b, FluxVae::new(config, weights), layout)
}

/// Detection of `path` under no prefix.
fn detect(path: &Path) -> kiln_models::Result<Option<(Config, Layout)>> {
    let file = SafetensorsFile::open(path).expect("open");
    flux_vae::detect(&Header::new(&file, ""))
}

/// Decodes z1, z2 and encodes x1, x2 (35×38, centre-cropped) and compares with diffusers.
fn check_outputs(vae: &FluxVae, b: &kiln_compute::backend::cpu::Cpu, what: &str) {
    let io = read_tensors("flux_vae/io.safetensors");
    let run = |input: &str, want: &str, encode: bool| {
        let (shape, values) = &io[input];
        let x = b.from_f32(shape, values, DType::F32).expect("input");
        let y = if encode { vae.encode(b, &x) } else { vae.decode(b, &x) }.expect("forward");
        let (want_shape, want_values) = &io[want];
        assert_eq!(y.shape(), want_shape.as_slice(), "{what} {want}");
        assert_eq!(y.dtype(), DType::F32);
        assert_close(&format!("{what} {want}"), &b.to_f32(&y).expect("read"), want_values, 1e-4);
    };
    run("z1", "decode_z1", false);
    run("z2", "decode_z2", false);
    run("x1", "encode_x1", true);
    run("x2", "encode_x2", true);
}

#[test]
fn ldm_layout_matches_diffusers() {
    let (b, vae, layout) = load(&fixture("flux_vae/weights.safetensors"), 64 << 20);
    assert_eq!(layout, Layout::Ldm);
    assert_eq!(vae.config, tiny_config());
    check_outputs(&vae, &b, "ldm");
}

#[test]
fn diffusers_layout_matches_diffusers() {
    let dir = scratch("diffusers");
    let (b, vae, layout) = load(&tiny_diffusers(&dir), 64 << 20);
    assert_eq!(layout, Layout::Diffusers);
    assert_eq!(vae.config, tiny_config());
    check_outputs(&vae, &b, "diffusers");
    let _ = std::fs::remove_dir_all(dir);
}

/// Encoder-only and decoder-only files load; the missing half is a clear error.
#[test]
fn one_half_only() {
    let dir = scratch("halves");
    let decoder =
        tiny_edited(&dir, "decoder.safetensors", |t| t.retain(|x| x.0.starts_with("decoder.")));
    let (b, vae, _) = load(&decoder, 64 << 20);
    assert!(vae.config.has_decoder && !vae.config.has_encoder);
    let io = read_tensors("flux_vae/io.safetensors");
    let (shape, values) = &io["z1"];
    let z = b.from_f32(shape, values, DType::F32).expect("z");
    let y = vae.decode(&*b, &z).expect("decode");
    assert_close("decoder only", &b.to_f32(&y).expect("read"), &io["decode_z1"].1, 1e-4);
    let (shape, values) = &io["x1"];
    let x = b.from_f32(shape, values, DType::F32).expect("x");
    assert!(matches!(vae.encode(&*b, &x), Err(Error::Invalid(m)) if m.contains("no encoder")));

    let encoder =
        tiny_edited(&dir, "encoder.safetensors", |t| t.retain(|x| x.0.starts_with("encoder.")));
    let (b, vae, _) = load(&encoder, 64 << 20);
    assert!(vae.config.has_encoder && !vae.config.has_decoder);
    assert_eq!(vae.config.ch_mult, [1, 2, 1, 1]);
    let x = b.from_f32(shape, values, DType::F32).expect("x");
    let y = vae.encode(&*b, &x).expect("encode");
    assert_close("encoder only", &b.to_f32(&y).expect("read"), &io["encode_x1"].1, 1e-4);
    assert!(matches!(vae.decode(&*b, &x), Err(Error::Invalid(m)) if m.contains("no decoder")));
    let _ = std::fs::remove_dir_all(dir);
}

/// Latents of the wrong channel count and images under 8×8 are input errors.
#[test]
fn bad_inputs() {
    let (b, vae, _) = load(&fixture("flux_vae/weights.safetensors"), 64 << 20);
    let z = b.full(&[1, 4, 2, 2], 0.0, DType::F32).expect("z");
    assert!(matches!(vae.decode(&*b, &z), Err(Error::Invalid(m)) if m.contains("4 channels")));
    let x = b.full(&[1, 3, 7, 16], 0.0, DType::F32).expect("x");
    assert!(matches!(vae.encode(&*b, &x), Err(Error::Invalid(_))));
}

/// The real `ae.safetensors` names and shapes (header-only files) in both layouts give the Flux config.
#[test]
fn detects_the_real_flux_vae() {
    let dir = scratch("real");
    let map = names("flux_vae/flux_names.json");
    let ldm: Vec<(String, Vec<usize>)> = map
        .values()
        .map(|(name, shape)| {
            let projection =
                name.contains(".mid.attn_1.") && !name.contains(".norm.") && shape.len() == 2;
            let shape =
                if projection { [shape.as_slice(), &[1, 1]].concat() } else { shape.clone() };
            (name.clone(), shape)
        })
        .collect();
    let diffusers: Vec<(String, Vec<usize>)> =
        map.iter().map(|(name, (_, shape))| (name.clone(), shape.clone())).collect();
    let flux = Config {
        ch: 128,
        decoder_ch: 128,
        ch_mult: vec![1, 2, 4, 4],
        num_res_blocks: 2,
        z_channels: 16,
        in_channels: 3,
        out_channels: 3,
        groups: 32,
        has_encoder: true,
        has_decoder: true,
        quant_conv: false,
        post_quant_conv: false,
        latent_bn: false,
    };
    for (file, shapes, layout) in
        [("ldm", &ldm, Layout::Ldm), ("diffusers", &diffusers, Layout::Diffusers)]
    {
        let path = dir.join(format!("{file}.safetensors"));
        write_header_only(&path, shapes);
        let found = detect(&path).expect("detect").expect("a VAE");
        assert_eq!(found, (flux.clone(), layout), "{file}");
        let sf = SafetensorsFile::open(&path).expect("open");
        let plan = flux_vae::load_plan(&Header::new(&sf, ""), &flux, layout);
        assert_eq!(plan.slots.len(), 244);
        assert!(plan.slots.iter().any(|s| s.name == "decoder.up.0.block.0.nin_shortcut.weight"));
    }
    // Under a checkpoint's prefix.
    let prefixed: Vec<(String, Vec<usize>)> =
        ldm.iter().map(|(n, s)| (format!("first_stage_model.{n}"), s.clone())).collect();
    let path = dir.join("checkpoint.safetensors");
    write_header_only(&path, &prefixed);
    let sf = SafetensorsFile::open(&path).expect("open");
    let header = Header::new(&sf, "first_stage_model.");
    let (cfg, layout) = flux_vae::detect(&header).expect("detect").expect("a VAE");
    assert_eq!(cfg, flux);
    let plan = flux_vae::load_plan(&header, &cfg, layout);
    let slot = plan.slots.iter().find(|s| s.name == "decoder.conv_in.weight").expect("conv_in");
    assert_eq!(slot.parts, [(0, "first_stage_model.decoder.conv_in.weight".to_string())]);
    let _ = std::fs::remove_dir_all(dir);
}

/// Asserts `result` is `Error::Unsupported` about `path` whose message contains every one of `words`.
#[track_caller]
fn assert_unsupported(
    result: kiln_models::Result<Option<(Config, Layout)>>,
    path: &Path,
    words: &[&str],
) {
    match result {
        Err(Error::Unsupported { path: p, msg }) => {
            assert_eq!(p, path);
            for w in words {
                assert!(msg.contains(w), "{msg:?} lacks {w:?}");
            }
            let shown = Error::Unsupported { path: p, msg }.to_string();
            assert!(shown.contains(&path.display().to_string()), "{shown}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn refuses_other_vaes_clearly() {
    let dir = scratch("refusals");
    let shape_of = |name: &str, shape: Vec<usize>| {
        let name = name.to_string();
        move |t: &mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>| {
            let x = t.iter_mut().find(|x| x.0 == name).expect("the tensor");
            let elems = shape.iter().product::<usize>();
            x.3 = vec![0; elems * x.3.len() / x.2.iter().product::<usize>()];
            x.2 = shape;
        }
    };
    // A video VAE: 5-D conv weights.
    let path = tiny_edited(
        &dir,
        "video.safetensors",
        shape_of("decoder.conv_in.weight", vec![32, 16, 1, 3, 3]),
    );
    assert_unsupported(detect(&path), &path, &["decoder.conv_in.weight", "5-D", "video"]);
    // A 64-channel latent.
    let path = tiny_edited(
        &dir,
        "c64.safetensors",
        shape_of("decoder.conv_in.weight", vec![32, 64, 3, 3]),
    );
    assert_unsupported(detect(&path), &path, &["64-channel"]);
    // A missing weight names its key.
    let path = tiny_edited(&dir, "missing.safetensors", |t| {
        t.retain(|x| x.0 != "decoder.up.1.block.0.nin_shortcut.weight")
    });
    assert_unsupported(detect(&path), &path, &["decoder.up.1.block.0.nin_shortcut.weight"]);
    // A weight of the wrong shape names it, what was found and what was expected.
    let path = tiny_edited(
        &dir,
        "shape.safetensors",
        shape_of("decoder.up.1.block.1.conv2.weight", vec![64, 64, 1, 1]),
    );
    assert_unsupported(
        detect(&path),
        &path,
        &["decoder.up.1.block.1.conv2.weight", "[64, 64, 1, 1]", "[64, 64, 3, 3]"],
    );
    // Neither a KL encoder nor decoder (a TAESD-like layout).
    let path = dir.join("taesd.safetensors");
    write_header_only(&path, &[("decoder.1.weight".into(), vec![64, 4, 3, 3])]);
    assert_unsupported(
        detect(&path),
        &path,
        &["neither", "decoder.conv_in.weight", "decoder.1.weight"],
    );
    // A dtype Kiln cannot compute with.
    let path = dir.join("f64.safetensors");
    write(
        &path,
        &[("decoder.conv_in.weight".into(), safetensors::Dtype::F64, vec![2], vec![0; 16])],
    );
    assert_unsupported(detect(&path), &path, &["decoder.conv_in.weight", "F64"]);
    // Not a VAE at all.
    let path = dir.join("dit.safetensors");
    write_header_only(&path, &[("x_embedder.weight".into(), vec![64, 64])]);
    assert!(matches!(detect(&path), Ok(None)));
    let _ = std::fs::remove_dir_all(dir);
}
