//! HunyuanVideo 1.5's VAE against ComfyUI (fixtures from `scripts/reference/hunyuan_video15.py`: ComfyUI's
//! `vae_refiner` Encoder and Decoder at widths `[2, 4, 8, 16, 16]`, a 2-channel latent): a one-frame clip, 9 and
//! 5 frames encode and one and three latent frames decode within 1e-4, bit for bit whatever the chunking; an
//! image is a one-frame clip bit for bit, and each image of a batch a clip of its own; the released file's
//! names and shapes are detected, and a misshapen or missing weight is refused by name.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_compute::Backend as _;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::hunyuan_vae::{self, Config, HunyuanVae};
use kiln_models::wan_vae::ClipVae;
use kiln_models::{Error, Header};

use crate::common::{
    check_cases, check_images_are_one_frame_clips, check_refusals, decode_clip, detect_header_only,
    encode_clip, fixture, input, json, load_weights, read_tensors, scratch_dir,
};

/// The fixture's weights.
const WEIGHTS: &str = "hunyuan_video15/vae.safetensors";

/// The tiny VAE's shape, read from the fixture's config.
fn tiny() -> Config {
    let cases = json("hunyuan_video15/vae_cases.json");
    let config = &cases["config"];
    let widths: Vec<usize> = config["block_out_channels"]
        .as_array()
        .expect("block_out_channels")
        .iter()
        .map(|w| w.as_u64().expect("a width") as usize)
        .collect();
    Config {
        widths: widths.try_into().expect("five widths"),
        z_channels: config["z_channels"].as_u64().expect("z_channels") as usize,
        has_encoder: true,
        has_decoder: true,
    }
}

/// The tiny VAE on the CPU.
fn load() -> (Arc<Cpu>, HunyuanVae) {
    let config = tiny();
    let (b, weights) = load_weights(WEIGHTS, |h| hunyuan_vae::load_plan(h, &config));
    (b, HunyuanVae::new(config, weights))
}

/// Every case of the fixture, chunked as ComfyUI does (8 frames, 2 latent frames) and as Kiln's nodes do (4, 1),
/// and through the whole-clip conveniences.
#[test]
fn encodes_and_decodes_clips_as_comfyui() {
    let (b, vae) = load();
    let io = read_tensors("hunyuan_video15/vae_io.safetensors");
    check_cases(&b, &vae, &io, "hunyuan_video15/vae_cases.json", 5);
}

/// A decode hands out the same frames however many latent frames go in a chunk, and an encode the same latent
/// however many frames, bit for bit: the carried history makes every chunking the whole clip's computation.
#[test]
fn any_chunking_gives_the_same_frames() {
    let (b, vae) = load();
    let io = read_tensors("hunyuan_video15/vae_io.safetensors");
    let z = input(&b, &io, "decode_3f.x");
    let one = b.to_f32(&decode_clip(&b, &vae, &z, 1)).expect("read");
    for per in [2, 3, 5] {
        let got = b.to_f32(&decode_clip(&b, &vae, &z, per)).expect("read");
        assert_eq!(got, one, "decode per {per}");
    }
    let mut chunks = 0;
    vae.decode_video_with(&*b, &z, 1, &mut |frames| {
        // The first latent frame gives one frame, each later one four.
        assert_eq!(frames.shape(), [if chunks == 0 { 1 } else { 4 }, 3, 32, 32]);
        chunks += 1;
        Ok(())
    })
    .expect("decode");
    assert_eq!(chunks, 3);
    let x = input(&b, &io, "encode_9f.x");
    let four = b.to_f32(&encode_clip(&b, &vae, &x, 4)).expect("read");
    let eight = b.to_f32(&encode_clip(&b, &vae, &x, 8)).expect("read");
    assert_eq!(eight, four, "encode per 8");
}

/// An image takes the one-frame clip's operations exactly, and each image of a batch is a clip of its own.
#[test]
fn an_image_is_a_one_frame_clip() {
    let (b, vae) = load();
    let io = read_tensors("hunyuan_video15/vae_io.safetensors");
    // The CPU's kernels block a batch of two otherwise than one image, and the tiny VAE's 2-channel norms amplify
    // that rounding (to about 1e-5): within the fixtures' tolerance, far from any mixing of images.
    check_images_are_one_frame_clips(&b, &vae, &io, [1, 2, 2, 3], 1e-4);
}

/// A fresh directory for this test's files.
fn scratch(test: &str) -> PathBuf {
    scratch_dir("hunyuan-vae", test)
}

/// The released file's names and shapes: the fixture's names (ComfyUI's state dict) with every width 64 times
/// as wide and the latent 16 times (the fixture keeps every released ratio).
fn released_shapes() -> Vec<(String, Vec<usize>)> {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).expect("open");
    let header = Header::new(&file, "");
    header
        .names()
        .map(|name| {
            let shape = header.shape(name).expect("a shape");
            let scaled = shape.iter().enumerate().map(|(d, &n)| match (name, d) {
                // Kernel taps, and a norm's broadcast dimensions.
                (_, 2..) => n,
                (_, 1) if name.ends_with(".gamma") => n,
                ("encoder.conv_in.conv.weight", 1) | ("decoder.conv_out.conv.weight", 0) => n,
                ("decoder.conv_out.conv.bias", 0) => n,
                ("decoder.conv_in.conv.weight", 1) | ("encoder.conv_out.conv.weight", 0) => n * 16,
                ("encoder.conv_out.conv.bias", 0) => n * 16,
                _ => n * 64,
            });
            (name.to_owned(), scaled.collect())
        })
        .collect()
}

/// Detection of a header-only file of `shapes`, written under `dir`.
fn detect_shapes(
    dir: &Path,
    file: &str,
    shapes: &[(String, Vec<usize>)],
) -> kiln_models::Result<Option<Config>> {
    detect_header_only(dir, file, shapes, hunyuan_vae::detect)
}

/// The released names and shapes are the released config, every weight in its load plan; a misshapen or
/// missing weight is refused by name; another latent width is not claimed; a decoder-only file is a decoder.
#[test]
fn detects_the_released_vae() {
    let dir = scratch("detect");
    let shapes = released_shapes();
    assert_eq!(
        detect_shapes(&dir, "released.safetensors", &shapes).expect("detect"),
        Some(Config::released())
    );
    let path = dir.join("released.safetensors");
    let sf = SafetensorsFile::open(&path).expect("open");
    let plan = hunyuan_vae::load_plan(&Header::new(&sf, ""), &Config::released());
    assert_eq!(plan.slots.len(), shapes.len());
    assert_eq!(
        shapes.iter().find(|s| s.0 == "decoder.up.0.upsample.conv.conv.weight").map(|s| &s.1),
        Some(&vec![8192, 1024, 3, 3, 3])
    );

    let misshapen = "decoder.up.1.upsample.conv.conv.weight";
    let mut bad = shapes.clone();
    bad.iter_mut().filter(|s| s.0 == misshapen).for_each(|s| s.1[0] = 2048);
    let err = detect_shapes(&dir, "misshapen.safetensors", &bad).expect_err("a misshapen weight");
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains(misshapen) && err.to_string().contains("2048"), "{err}");

    let missing = "encoder.mid.attn_1.proj_out.bias";
    let bad: Vec<_> = shapes.iter().filter(|s| s.0 != missing).cloned().collect();
    let err = detect_shapes(&dir, "missing.safetensors", &bad).expect_err("a missing weight");
    assert!(err.to_string().contains(missing), "{err}");

    let mut narrow = shapes.clone();
    narrow.iter_mut().filter(|s| s.0 == "decoder.conv_in.conv.weight").for_each(|s| s.1[1] = 16);
    assert_eq!(detect_shapes(&dir, "z16.safetensors", &narrow).expect("detect"), None);

    let decoder: Vec<_> = shapes.iter().filter(|s| s.0.starts_with("decoder.")).cloned().collect();
    assert_eq!(
        detect_shapes(&dir, "decoder.safetensors", &decoder).expect("detect"),
        Some(Config { has_encoder: false, ..Config::released() })
    );
    let _ = std::fs::remove_dir_all(dir);

    // The tiny fixture's 2-channel latent is not the released VAE's.
    let sf = SafetensorsFile::open(fixture(WEIGHTS)).expect("open");
    assert_eq!(hunyuan_vae::detect(&Header::new(&sf, "")).expect("detect"), None);
}

/// Clips of the wrong shape, chunk sizes that cannot work, and frames smaller than 16×16 are input errors.
#[test]
fn refuses_what_it_cannot_take() {
    let (b, vae) = load();
    check_refusals(&b, &vae, 16, 2, 4);
}
