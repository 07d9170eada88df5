//! The FLUX.2 VAE against diffusers' `AutoencoderKLFlux2` and its pipeline's latent patchify and BatchNorm
//! (fixtures from `scripts/reference/flux2_vae.py`, checked there against ComfyUI's `AutoencoderKL` too): encode
//! and decode of a tiny FLUX.2-shaped VAE whose decoder is narrower than its encoder, in the released key
//! layout, ComfyUI's renamed one and diffusers'; its halves alone; detection on the real shapes; the FLUX.1 VAE
//! kept apart; the synthetic file.
//!
//! The tiny weights are stored once, in the released layout; the other layouts are rebuilt here by renaming
//! (the script's own name map for diffusers'), so every layout loads the same values.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kiln_compute::Backend as _;
use kiln_compute::DType;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::family::{VaeDetected, VaeFamily, VaeNet};
use kiln_models::flux_vae::{self, Config, Layout};
use kiln_models::latent::LatentFormat;
use kiln_models::synth::{self, SynthDtype, SynthFamily, ZImageTurboSet};
use kiln_models::{Error, Header};

use crate::common::{assert_close, cpu, fixture, read_tensors, write_header_only};

/// One tensor of a file: name, dtype, shape, raw bytes.
type Raw = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

/// A fresh directory for this test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-flux2-vae-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// Writes a safetensors file of `tensors`.
fn write(path: &Path, tensors: &[Raw]) {
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

/// The fixture's tensors, in the released layout.
fn released() -> Vec<Raw> {
    let bytes = std::fs::read(fixture("flux2_vae/weights.safetensors")).expect("the fixture");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors fixture");
    file.tensors()
        .into_iter()
        .map(|(name, v)| (name, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect()
}

/// The fixture with each tensor's name passed through `rename`, and those it maps to `None` dropped, written
/// to `dir/file`.
fn renamed(dir: &Path, file: &str, rename: impl Fn(&str) -> Option<String>) -> PathBuf {
    let tensors: Vec<Raw> =
        released().into_iter().filter_map(|(n, d, s, b)| Some((rename(&n)?, d, s, b))).collect();
    let path = dir.join(file);
    write(&path, &tensors);
    path
}

/// The fixture in diffusers' layout (attention projections as `[C, C]` Linear weights), from the script's map
/// `{diffusers name: [file name, diffusers shape]}`.
fn in_diffusers_layout(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(fixture("flux2_vae/diffusers_names.json")).expect("the map");
    let map: BTreeMap<String, (String, Vec<usize>)> =
        serde_json::from_str(&text).expect("a JSON name map");
    let by_name: BTreeMap<String, Raw> = released().into_iter().map(|t| (t.0.clone(), t)).collect();
    let tensors: Vec<Raw> = map
        .into_iter()
        .map(|(diffusers, (name, shape))| {
            let (_, dtype, _, bytes) =
                by_name.get(&name).unwrap_or_else(|| panic!("no {name}")).clone();
            (diffusers, dtype, shape, bytes)
        })
        .collect();
    let path = dir.join("diffusers.safetensors");
    write(&path, &tensors);
    path
}

/// The tiny config: encoder widths 64, decoder widths 32 at each of 4 levels, one resnet per encoder level,
/// z 32, both quant convs, the latent BatchNorm.
fn tiny_config() -> Config {
    Config {
        ch: 64,
        decoder_ch: 32,
        ch_mult: vec![1, 1, 1, 1],
        num_res_blocks: 1,
        z_channels: 32,
        in_channels: 3,
        out_channels: 3,
        groups: 32,
        has_encoder: true,
        has_decoder: true,
        quant_conv: true,
        post_quant_conv: true,
        latent_bn: true,
    }
}

/// Detects `path` as a VAE of any family, loads it on a CPU with 64 MiB of simulated VRAM, and builds it.
fn load(path: &Path) -> (std::sync::Arc<Cpu>, VaeNet, VaeDetected) {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(path).expect("open");
    let header = Header::new(&file, "");
    let found = VaeDetected::detect(&header).expect("detect").expect("a VAE");
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).expect("load");
    (b, found.clone().build(weights), found)
}

/// The detected config of a Flux-network VAE.
fn config(found: &VaeDetected) -> (&Config, Layout) {
    match found {
        VaeDetected::Flux(config, layout) => (config, *layout),
        other => panic!("not the Flux network: {other:?}"),
    }
}

/// Runs `input` of the fixture's io through `vae` (encode or decode) and compares with `want`.
fn check(vae: &VaeNet, b: &Cpu, input: &str, want: &str, what: &str) {
    let io = read_tensors("flux2_vae/io.safetensors");
    let (shape, values) = &io[input];
    let x = b.from_f32(shape, values, DType::F32).expect("input");
    let y = if input.starts_with('x') { vae.encode(b, &x) } else { vae.decode(b, &x) }
        .expect("forward");
    let (want_shape, want_values) = &io[want];
    assert_eq!(y.shape(), want_shape.as_slice(), "{what} {want}");
    assert_eq!(y.dtype(), DType::F32);
    assert_close(&format!("{what} {want}"), &b.to_f32(&y).expect("read"), want_values, 1e-4);
}

/// Encodes x1 and x2 (35×38, centre-cropped to 32×32) and decodes z1 and z2, compared with diffusers.
fn check_outputs(vae: &VaeNet, b: &Cpu, what: &str) {
    check(vae, b, "x1", "encode_x1", what);
    check(vae, b, "x2", "encode_x2", what);
    check(vae, b, "z1", "decode_z1", what);
    check(vae, b, "z2", "decode_z2", what);
}

/// The released layout (BFL's `encoder.quant_conv`, `decoder.post_quant_conv`, an int64
/// `bn.num_batches_tracked` beside the statistics) is the FLUX.2 VAE, its decoder's widths its own.
#[test]
fn released_layout_matches_diffusers() {
    let (b, vae, found) = load(&fixture("flux2_vae/weights.safetensors"));
    assert_eq!(found.family(), VaeFamily::Flux2);
    assert_eq!(config(&found), (&tiny_config(), Layout::Ldm));
    assert_eq!(vae.family().latent(), LatentFormat::FLUX2);
    assert_eq!(vae.downscale(), 16);
    check_outputs(&vae, &b, "released");
}

/// The quant convs under ComfyUI's names (what its `VAE` renames BFL's to) load the same.
#[test]
fn comfyui_names_match_diffusers() {
    let dir = scratch("comfyui");
    let path = renamed(&dir, "comfyui.safetensors", |n| {
        let n = n.strip_prefix("encoder.").filter(|r| r.starts_with("quant_conv.")).unwrap_or(n);
        let n =
            n.strip_prefix("decoder.").filter(|r| r.starts_with("post_quant_conv.")).unwrap_or(n);
        Some(n.to_string())
    });
    let (b, vae, found) = load(&path);
    assert_eq!(config(&found), (&tiny_config(), Layout::Ldm));
    check_outputs(&vae, &b, "comfyui");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn diffusers_layout_matches_diffusers() {
    let dir = scratch("diffusers");
    let (b, vae, found) = load(&in_diffusers_layout(&dir));
    assert_eq!(config(&found), (&tiny_config(), Layout::Diffusers));
    check_outputs(&vae, &b, "diffusers");
    let _ = std::fs::remove_dir_all(dir);
}

/// A decoder-only and an encoder-only file (each with the statistics) load with their own side's widths.
#[test]
fn one_half_only() {
    let dir = scratch("halves");
    let decoder = renamed(&dir, "decoder.safetensors", |n| {
        (!n.starts_with("encoder.")).then(|| n.to_string())
    });
    let (b, vae, found) = load(&decoder);
    let (cfg, _) = config(&found);
    assert_eq!((cfg.ch, cfg.decoder_ch, cfg.has_encoder), (32, 32, false));
    assert_eq!(found.family(), VaeFamily::Flux2);
    check(&vae, &b, "z1", "decode_z1", "decoder only");
    let io = read_tensors("flux2_vae/io.safetensors");
    let (shape, values) = &io["x1"];
    let x = b.from_f32(shape, values, DType::F32).expect("x");
    assert!(matches!(vae.encode(&*b, &x), Err(Error::Invalid(m)) if m.contains("no encoder")));

    let encoder = renamed(&dir, "encoder.safetensors", |n| {
        (!n.starts_with("decoder.")).then(|| n.to_string())
    });
    let (b, vae, found) = load(&encoder);
    let (cfg, _) = config(&found);
    assert_eq!((cfg.ch, cfg.decoder_ch, cfg.has_decoder), (64, 64, false));
    check(&vae, &b, "x1", "encode_x1", "encoder only");
    let _ = std::fs::remove_dir_all(dir);
}

/// Latents of FLUX.1's 16 channels and images under 16×16 are input errors.
#[test]
fn bad_inputs() {
    let (b, vae, _) = load(&fixture("flux2_vae/weights.safetensors"));
    let z = b.full(&[1, 16, 2, 2], 0.0, DType::F32).expect("z");
    assert!(matches!(vae.decode(&*b, &z), Err(Error::Invalid(m)) if m.contains("16 channels")));
    let x = b.full(&[1, 3, 15, 32], 0.0, DType::F32).expect("x");
    assert!(matches!(vae.encode(&*b, &x), Err(Error::Invalid(m)) if m.contains("16×16")));
}

/// The FLUX.1 VAE keeps its family and latent format; the FLUX.2 VAE has its own.
#[test]
fn each_flux_vae_has_its_latent_format() {
    let (_, flux1, found) = load(&fixture("flux_vae/weights.safetensors"));
    assert_eq!((found.family(), flux1.family()), (VaeFamily::Flux, VaeFamily::Flux));
    assert_eq!(flux1.family().latent(), LatentFormat::FLUX);
    assert_eq!(flux1.downscale(), 8);
    assert!(!config(&found).0.latent_bn);
    let (_, flux2, found) = load(&fixture("flux2_vae/weights.safetensors"));
    assert_eq!((found.family(), flux2.family()), (VaeFamily::Flux2, VaeFamily::Flux2));
    assert_eq!(flux2.family().latent(), LatentFormat::FLUX2);
    assert_eq!(
        (VaeFamily::Flux2.name(), VaeFamily::Flux2.synth_name()),
        ("the FLUX.2 VAE", "flux2-vae")
    );
    let format = LatentFormat::FLUX2;
    assert_eq!((format.channels, format.spatial_downscale), (128, 16));
}

/// The real FLUX.1 VAE's names and shapes (from the flux_vae fixture's map) turned into FLUX.2's: z 32, BFL's
/// quant convs, the statistics; `decoder_ch` narrows the decoder.
fn real_flux2(decoder_ch: usize) -> Vec<(String, Vec<usize>)> {
    let text = std::fs::read_to_string(fixture("flux_vae/flux_names.json")).expect("the map");
    let map: BTreeMap<String, (String, Vec<usize>)> =
        serde_json::from_str(&text).expect("a JSON name map");
    let narrow = |d: usize| if d >= 128 { d * decoder_ch / 128 } else { d };
    let mut shapes: Vec<(String, Vec<usize>)> = map
        .into_values()
        .map(|(name, mut shape)| {
            if name.contains(".mid.attn_1.") && !name.contains(".norm.") && shape.len() == 2 {
                shape.extend([1, 1]);
            }
            match name.as_str() {
                "decoder.conv_in.weight" => shape[1] = 32,
                "encoder.conv_out.weight" | "encoder.conv_out.bias" => shape[0] = 64,
                _ => {}
            }
            if name.starts_with("decoder.") {
                // Every width of the decoder scales; its image and latent channels do not.
                let keep_in = name == "decoder.conv_in.weight";
                let keep_out = name.starts_with("decoder.conv_out.");
                for (i, d) in shape.iter_mut().enumerate().take(2) {
                    if !(keep_in && i == 1 || keep_out && i == 0) {
                        *d = narrow(*d);
                    }
                }
            }
            (name, shape)
        })
        .collect();
    shapes.extend([
        ("encoder.quant_conv.weight".to_string(), vec![64, 64, 1, 1]),
        ("encoder.quant_conv.bias".to_string(), vec![64]),
        ("decoder.post_quant_conv.weight".to_string(), vec![32, 32, 1, 1]),
        ("decoder.post_quant_conv.bias".to_string(), vec![32]),
        ("bn.running_mean".to_string(), vec![128]),
        ("bn.running_var".to_string(), vec![128]),
    ]);
    shapes
}

/// Header-only files of the real FLUX.2 VAE's shapes, and of a decoder half as wide, detect with each side's
/// widths; a file under a checkpoint's prefix reads its keys there.
#[test]
fn detects_the_real_flux2_vae_and_a_small_decoder() {
    let dir = scratch("real");
    for decoder_ch in [128, 64] {
        let path = dir.join(format!("real-{decoder_ch}.safetensors"));
        write_header_only(&path, &real_flux2(decoder_ch));
        let sf = SafetensorsFile::open(&path).expect("open");
        let header = Header::new(&sf, "");
        let (cfg, layout) = flux_vae::detect(&header).expect("detect").expect("a VAE");
        let want = Config {
            ch: 128,
            decoder_ch,
            ch_mult: vec![1, 2, 4, 4],
            num_res_blocks: 2,
            z_channels: 32,
            in_channels: 3,
            out_channels: 3,
            groups: 32,
            has_encoder: true,
            has_decoder: true,
            quant_conv: true,
            post_quant_conv: true,
            latent_bn: true,
        };
        assert_eq!((cfg.clone(), layout), (want, Layout::Ldm));
        assert_eq!((cfg.downscale(), cfg.latent_channels()), (16, 128));
        let plan = flux_vae::load_plan(&header, &cfg, layout);
        assert_eq!(plan.slots.len(), 250);
        let slot = plan.slots.iter().find(|s| s.name == "quant_conv.weight").expect("quant_conv");
        assert_eq!(slot.parts, [(0, "encoder.quant_conv.weight".to_string())]);
    }
    let prefixed: Vec<(String, Vec<usize>)> =
        real_flux2(128).into_iter().map(|(n, s)| (format!("vae.{n}"), s)).collect();
    let path = dir.join("checkpoint.safetensors");
    write_header_only(&path, &prefixed);
    let sf = SafetensorsFile::open(&path).expect("open");
    let header = Header::new(&sf, "vae.");
    let found = VaeDetected::detect(&header).expect("detect").expect("a VAE");
    assert_eq!(found.family(), VaeFamily::Flux2);
    let plan = found.load_plan(&header);
    let slot = plan.slots.iter().find(|s| s.name == "bn.running_var").expect("bn");
    assert_eq!(slot.parts, [(0, "vae.bn.running_var".to_string())]);
    let _ = std::fs::remove_dir_all(dir);
}

/// Asserts `path` is refused as `Error::Unsupported` whose message contains every one of `words`.
#[track_caller]
fn assert_unsupported(path: &Path, words: &[&str]) {
    let sf = SafetensorsFile::open(path).expect("open");
    match VaeDetected::detect(&Header::new(&sf, "")) {
        Err(Error::Unsupported { path: p, msg }) => {
            assert_eq!(p, path);
            for w in words {
                assert!(msg.contains(w), "{msg:?} lacks {w:?}");
            }
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

/// Statistics of the wrong length, and a decoder whose levels are not its encoder's multiples, are refused by
/// name.
#[test]
fn refuses_mismatched_files_clearly() {
    let dir = scratch("refusals");
    let mut shapes = real_flux2(128);
    shapes.iter_mut().find(|(n, _)| n == "bn.running_var").expect("bn").1 = vec![64];
    let path = dir.join("bn.safetensors");
    write_header_only(&path, &shapes);
    assert_unsupported(&path, &["bn.running_var", "[64]", "[128]"]);

    // Decoder level 0 at 64 wide (a narrow decoder must narrow every level alike).
    let mut shapes = real_flux2(128);
    for (name, shape) in &mut shapes {
        if name.starts_with("decoder.up.0.") && shape.len() == 4 {
            shape[0] = 64;
        }
    }
    let path = dir.join("levels.safetensors");
    write_header_only(&path, &shapes);
    assert_unsupported(&path, &["disagree", "[128, 256, 512, 512]", "[64, 256, 512, 512]"]);
    let _ = std::fs::remove_dir_all(dir);
}

/// `kiln model synth --family flux2-vae` writes the released layout; the tiny file decodes random latents and
/// encodes an image to finite values of the right shapes.
#[test]
fn the_synthetic_file_is_the_flux2_vae() {
    let dir = scratch("synth");
    let path = dir.join("flux2-vae.safetensors");
    let family: SynthFamily = "flux2-vae".parse().expect("a synth family");
    assert_eq!(family, SynthFamily::Vae(VaeFamily::Flux2));
    let set = ZImageTurboSet::tiny();
    synth::write_family(&path, family, &set, SynthDtype::F32, 3, &mut |_, _| {}).expect("write");
    let sf = SafetensorsFile::open(&path).expect("open");
    for name in ["encoder.quant_conv.weight", "decoder.post_quant_conv.bias", "bn.running_mean"] {
        assert!(sf.tensors().any(|(n, _)| n == name), "no {name}");
    }
    let (b, vae, found) = load(&path);
    let (cfg, _) = config(&found);
    assert_eq!((cfg.ch, cfg.decoder_ch, &cfg.ch_mult), (set.vae.ch, set.vae.ch, &set.vae.ch_mult));
    assert_eq!((cfg.z_channels, cfg.latent_bn), (32, true));
    let values: Vec<f32> = (0..128 * 6).map(|i| ((i * 7919) % 17) as f32 / 4.0 - 2.0).collect();
    let z = b.from_f32(&[1, 128, 2, 3], &values, DType::F32).expect("z");
    let image = vae.decode(&*b, &z).expect("decode");
    assert_eq!(image.shape(), [1, 3, 32, 48]);
    assert!(b.to_f32(&image).expect("read").iter().all(|v| v.is_finite()));
    let pixels: Vec<f32> = (0..3 * 40 * 40).map(|i| ((i * 31) % 13) as f32 / 6.0 - 1.0).collect();
    let x = b.from_f32(&[1, 3, 40, 40], &pixels, DType::F32).expect("x");
    let latent = vae.encode(&*b, &x).expect("encode");
    assert_eq!(latent.shape(), [1, 128, 2, 2]);
    assert!(b.to_f32(&latent).expect("read").iter().all(|v| v.is_finite()));
    let _ = std::fs::remove_dir_all(dir);
}
