//! Mage-VAE against ComfyUI's own `MageVAE` (fixtures from `scripts/reference/mage_vae.py`: a tiny one built by
//! ComfyUI's classes, its file in the released layout and checked there to load through ComfyUI's `VAE`):
//! detection and the load plan (the anchor encoder ComfyUI drops left out), encodes of images (one centre-cropped)
//! and decodes of latents (one over two attention windows) within 1e-4, the per-pixel head in chunks, detection of
//! the released shapes under a checkpoint's prefix, and the refusals.

use std::path::{Path, PathBuf};

use kiln_compute::Backend as _;
use kiln_compute::DType;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::latent::LatentFormat;
use kiln_models::mage_vae::{
    self, CodBlock, Config, DecoderConfig, EncoderConfig, MageVae, family,
};
use kiln_models::{Error, Header};

use crate::common::{Io, check, cpu, fixture, input, read_tensors, write_header_only};

/// Tensor names and shapes, as a header-only file holds them.
type Shapes = Vec<(String, Vec<usize>)>;

/// A fresh directory for this test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-mage-vae-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// The script's tiny config.
fn tiny() -> Config {
    use CodBlock::{Attention, Resnet};
    Config {
        image_channels: 3,
        encoder: EncoderConfig {
            head: 48,
            head_blocks: 2,
            head_ffn: 96,
            hidden: 32,
            blocks: 2,
            ffn: 64,
            frequencies: 256,
            out_channels: 256,
        },
        decoder: DecoderConfig {
            hidden: 64,
            cod: vec![Resnet, Attention, Resnet, Attention, Resnet],
            blocks: 1,
            ffn: 256,
            frequencies: 256,
            pixel: 8,
            pixel_blocks: 2,
            dct_frequencies: 8,
        },
    }
}

/// Detects and loads the fixture's weights on a CPU with 64 MiB of simulated VRAM.
fn load() -> (std::sync::Arc<Cpu>, MageVae) {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture("mage_vae/weights.safetensors")).expect("open");
    let header = Header::new(&file, "");
    let config = mage_vae::detect(&header).expect("detect").expect("a Mage-VAE");
    let plan = mage_vae::load_plan(&header, &config);
    let weights = manager.load(&plan, &mut |_, _| {}).expect("load");
    (b, MageVae::new(config, weights))
}

fn io() -> Io {
    read_tensors("mage_vae/io.safetensors")
}

/// The file's layout detects as the tiny config; the plan reads every slot under ComfyUI's name from the file's,
/// and neither the anchor encoder ComfyUI drops nor the zero noise's `proj1`.
#[test]
fn detects_the_tiny_file() {
    let file = SafetensorsFile::open(fixture("mage_vae/weights.safetensors")).expect("open");
    let header = Header::new(&file, "");
    let config = mage_vae::detect(&header).expect("detect").expect("a Mage-VAE");
    assert_eq!(config, tiny());
    assert_eq!((config.downscale(), config.latent_channels()), (16, 128));
    let plan = mage_vae::load_plan(&header, &config);
    let in_file = file.tensors().count();
    // Three anchor-encoder tensors and proj1 are in the file but not the plan.
    assert_eq!(plan.slots.len(), in_file - 4);
    for slot in &plan.slots {
        let [(0, key)] = slot.parts.as_slice() else { panic!("{slot:?}") };
        let want = match slot.name.strip_prefix("dconv_encoder.") {
            Some(rest) => format!("student.dconv_encoder.{rest}"),
            None => {
                format!("pipeline.{}", slot.name.strip_prefix("decoder_model.").expect("a name"))
            }
        };
        assert_eq!(key, &want);
        assert!(!key.contains("y_embedder.encoder.") && !key.contains("y_embedder.bottleneck."));
        assert!(!key.contains("proj1"));
    }
}

/// Encodes of 32×32, 48×32 (batch 2) and 37×50 (centre-cropped to 32×48) images.
#[test]
fn encode_matches_comfyui() {
    let (b, vae) = load();
    let io = io();
    for x in ["x1", "x2", "x3"] {
        let latent = vae.encode(&*b, &input(&b, &io, x)).expect("encode");
        check(&b, "encode", &latent, &io, &format!("encode_{x}"));
    }
}

/// Decodes of 2×2, 3×2 (batch 2) and 34×3 latents (the last over two attention windows, the second padded),
/// the per-pixel head at once and in chunks.
#[test]
fn decode_matches_comfyui() {
    let (b, vae) = load();
    let io = io();
    for z in ["z1", "z2", "z3"] {
        let image = vae.decode(&*b, &input(&b, &io, z)).expect("decode");
        check(&b, "decode", &image, &io, &format!("decode_{z}"));
    }
    let z2 = input(&b, &io, "z2");
    for patches in [1, 5] {
        let image = vae.decode_with(&*b, &z2, patches).expect("decode");
        check(&b, &format!("decode by {patches}"), &image, &io, "decode_z2");
    }
    let image = vae.decode_with(&*b, &input(&b, &io, "z3"), 40).expect("decode");
    check(&b, "decode by 40", &image, &io, "decode_z3");
}

/// Latents of other than 128 channels, images under 16×16 and a decode of 0 patches at a time are input errors.
#[test]
fn bad_inputs() {
    let (b, vae) = load();
    let z = b.full(&[1, 32, 2, 2], 0.0, DType::F32).expect("z");
    assert!(matches!(vae.decode(&*b, &z), Err(Error::Invalid(m)) if m.contains("32 channels")));
    let x = b.full(&[1, 3, 15, 32], 0.0, DType::F32).expect("x");
    assert!(matches!(vae.encode(&*b, &x), Err(Error::Invalid(m)) if m.contains("16×16")));
    let z = b.full(&[1, 128, 1, 1], 0.0, DType::F32).expect("z");
    assert!(matches!(vae.decode_with(&*b, &z, 0), Err(Error::Invalid(_))));
}

/// The released names and shapes (`MageVAE()`'s state under the file's names, from the script), as a header-only
/// file.
fn released() -> Shapes {
    let text =
        std::fs::read_to_string(fixture("mage_vae/released_shapes.json")).expect("the shapes");
    serde_json::from_str(&text).expect("a JSON list of [name, shape]")
}

/// Detects the header-only file of `shapes` (under `prefix`).
fn detect(
    path: &Path,
    shapes: &[(String, Vec<usize>)],
    prefix: &str,
) -> kiln_models::Result<Option<Config>> {
    let named: Shapes = shapes.iter().map(|(n, s)| (format!("{prefix}{n}"), s.clone())).collect();
    write_header_only(path, &named);
    let file = SafetensorsFile::open(path).expect("open");
    mage_vae::detect(&Header::new(&file, prefix))
}

/// The released file's shapes give ComfyUI's defaults, bare and under a checkpoint's `vae.` prefix.
#[test]
fn detects_the_released_shapes() {
    use CodBlock::{Attention, Resnet};
    let dir = scratch("released");
    let want = Config {
        image_channels: 3,
        encoder: EncoderConfig {
            head: 768,
            head_blocks: 2,
            head_ffn: 3072,
            hidden: 384,
            blocks: 21,
            ffn: 1536,
            frequencies: 256,
            out_channels: 256,
        },
        decoder: DecoderConfig {
            hidden: 384,
            cod: vec![Resnet, Attention, Resnet, Attention, Resnet],
            blocks: 21,
            ffn: 1536,
            frequencies: 256,
            pixel: 32,
            pixel_blocks: 3,
            dct_frequencies: 8,
        },
    };
    let shapes = released();
    let path = dir.join("released.safetensors");
    assert_eq!(detect(&path, &shapes, "").expect("detect"), Some(want.clone()));
    let path = dir.join("checkpoint.safetensors");
    assert_eq!(detect(&path, &shapes, "vae.").expect("detect"), Some(want.clone()));
    let file = SafetensorsFile::open(&path).expect("open");
    let header = Header::new(&file, "vae.");
    let plan = mage_vae::load_plan(&header, &want);
    // Everything but the 3 dropped tensors and proj1.
    assert_eq!(plan.slots.len(), shapes.len() - 4);
    let slot =
        plan.slots.iter().find(|s| s.name == "decoder_model.y_embedder_x.weight").expect("slot");
    assert_eq!(slot.parts, [(0, "vae.pipeline.y_embedder_x.weight".to_string())]);
    let _ = std::fs::remove_dir_all(dir);
}

/// Asserts `result` is `Error::Unsupported` for `path` whose message contains every one of `words`.
#[track_caller]
fn assert_unsupported(result: kiln_models::Result<Option<Config>>, path: &Path, words: &[&str]) {
    match result {
        Err(Error::Unsupported { path: p, msg }) => {
            assert_eq!(p, path);
            for w in words {
                assert!(msg.contains(w), "{msg:?} lacks {w:?}");
            }
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

/// Other VAEs are not Mage-VAEs; a Mage-VAE of another latent width, with a weight of the wrong shape, or with
/// a block missing, is refused by name.
#[test]
fn refuses_other_files() {
    for other in ["flux_vae/weights.safetensors", "flux2_vae/weights.safetensors"] {
        let file = SafetensorsFile::open(fixture(other)).expect("open");
        assert!(mage_vae::detect(&Header::new(&file, "")).expect("detect").is_none(), "{other}");
    }
    let dir = scratch("refusals");
    let edit = |name: &str, f: &dyn Fn(&mut Shapes)| {
        let mut shapes = released();
        f(&mut shapes);
        let path = dir.join(format!("{name}.safetensors"));
        let result = detect(&path, &shapes, "");
        (path, result)
    };
    let set = |shapes: &mut Shapes, name: &str, shape: Vec<usize>| {
        shapes.iter_mut().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no {name}")).1 = shape;
    };

    let (path, result) =
        edit("z64", &|s| set(s, "student.dconv_encoder.z_proj.weight", vec![384, 64, 1, 1]));
    assert_unsupported(result, &path, &["64 channels", "128"]);

    let (path, result) = edit("conv5", &|s| {
        set(s, "pipeline.blocks.3.conv5.weight", vec![384, 1024, 1, 1]);
    });
    assert_unsupported(
        result,
        &path,
        &["pipeline.blocks.3.conv5.weight", "[384, 1024, 1, 1]", "[384, 1536, 1, 1]"],
    );

    let (path, result) =
        edit("gap", &|s| s.retain(|(n, _)| !n.starts_with("student.dconv_encoder.blocks.4.")));
    assert_unsupported(result, &path, &["student.dconv_encoder.blocks.5."]);

    let (path, result) = edit("width", &|s| {
        set(s, "pipeline.t_embedder.mlp.0.weight", vec![400, 256]);
    });
    assert_unsupported(result, &path, &["400", "32 groups"]);
    let _ = std::fs::remove_dir_all(dir);
}

/// Its name, synth name and latent space (FLUX.2's, as ComfyUI's Mage-Flow model reads it).
#[test]
fn family_facts() {
    assert_eq!((family::NAME, family::SYNTH_NAME), ("the Mage-Flow VAE", "mage-flow-vae"));
    assert_eq!(family::LATENT, LatentFormat::FLUX2);
    assert_eq!((family::LATENT.channels, family::LATENT.spatial_downscale), (128, 16));
}
