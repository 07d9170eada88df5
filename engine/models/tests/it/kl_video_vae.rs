//! HunyuanVideo 1.0's VAE against ComfyUI (fixtures from `scripts/reference/kl_video_vae.py`: ComfyUI's
//! `AutoencoderKL` with 3-D convolutions at widths `[32, 32, 32, 64]`, a 4-channel latent): a one-frame clip, 9, 5
//! and 13 frames encode and one, three and five latent frames decode within 1e-4, bit for bit whatever chunk size is
//! asked for (ComfyUI's chunks are kept); an image is a one-frame clip bit for bit, and each image of a batch a clip
//! of its own; frames past the last 4k + 1 are dropped and sizes centre-cropped; the released file's names and
//! shapes are detected, a misshapen or missing weight is refused by name, and no other VAE's file is claimed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_compute::Backend as _;
use kiln_compute::backend::PadMode;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::kl_video_vae::{self, Config, KlVideoVae};
use kiln_models::wan_vae::ClipVae;
use kiln_models::{Error, Header};

use crate::common::{
    assert_close, check_cases, check_images_are_one_frame_clips, check_refusals, decode_clip,
    detect_header_only, encode_clip, fixture, input, json, load_weights, read_tensors, scratch_dir,
};

/// The fixture's weights.
const WEIGHTS: &str = "kl_video_vae/vae.safetensors";

/// The tiny VAE's shape, read from the fixture's config.
fn tiny() -> Config {
    let cases = json("kl_video_vae/vae_cases.json");
    let config = &cases["config"];
    let widths: Vec<usize> = config["widths"]
        .as_array()
        .expect("widths")
        .iter()
        .map(|w| w.as_u64().expect("a width") as usize)
        .collect();
    assert_eq!(config["embed_dim"], config["z_channels"], "a square quant_conv");
    Config {
        widths: widths.try_into().expect("four widths"),
        z_channels: config["z_channels"].as_u64().expect("z_channels") as usize,
        has_encoder: true,
    }
}

/// The tiny VAE on the CPU.
fn load() -> (Arc<Cpu>, KlVideoVae) {
    let config = tiny();
    let (b, weights) = load_weights(WEIGHTS, |h| kl_video_vae::load_plan(h, &config));
    (b, KlVideoVae::new(config, weights))
}

/// Every case of the fixture, with the chunk sizes ComfyUI uses (8 frames, 2 latent frames) and Kiln's nodes ask
/// for (4, 1), and through the whole-clip conveniences.
#[test]
fn encodes_and_decodes_clips_as_comfyui() {
    let (b, vae) = load();
    let io = read_tensors("kl_video_vae/vae_io.safetensors");
    check_cases(&b, &vae, &io, "kl_video_vae/vae_cases.json", 7);
}

/// However many frames a caller asks for a chunk, the chunks are ComfyUI's (their GroupNorms are part of its
/// numbers), so the results are the same bit for bit; a decode hands out each chunk of 2 latent frames as it is
/// finished.
#[test]
fn chunk_sizes_give_the_same_results() {
    let (b, vae) = load();
    let io = read_tensors("kl_video_vae/vae_io.safetensors");
    let z = input(&b, &io, "decode_5f.x");
    let one = b.to_f32(&decode_clip(&b, &vae, &z, 1)).expect("read");
    for per in [2, 3, 5] {
        let got = b.to_f32(&decode_clip(&b, &vae, &z, per)).expect("read");
        assert_eq!(got, one, "decode per {per}");
    }
    let mut sizes = Vec::new();
    vae.decode_video_with(&*b, &z, 1, &mut |frames| {
        assert_eq!(frames.shape()[1..], [3, 24, 24]);
        sizes.push(frames.shape()[0]);
        Ok(())
    })
    .expect("decode");
    // Latent frames [0, 1], [2, 3], [4]: the first frame gives one frame, each later one four.
    assert_eq!(sizes, [5, 8, 4]);
    let x = input(&b, &io, "encode_13f.x");
    let four = b.to_f32(&encode_clip(&b, &vae, &x, 4)).expect("read");
    for per in [8, 12] {
        assert_eq!(
            b.to_f32(&encode_clip(&b, &vae, &x, per)).expect("read"),
            four,
            "encode per {per}"
        );
    }
}

/// An image takes the one-frame clip's operations exactly, and each image of a batch is a clip of its own.
#[test]
fn an_image_is_a_one_frame_clip() {
    let (b, vae) = load();
    let io = read_tensors("kl_video_vae/vae_io.safetensors");
    check_images_are_one_frame_clips(&b, &vae, &io, [1, 4, 4, 6], 1e-5);
}

/// Frames past the last 4k + 1 are dropped (7 frames encode as their first 5), and a clip is centre-cropped to
/// multiples of 8 (offset `(H mod 8) / 2`), as ComfyUI's `VAE.encode` does.
#[test]
fn drops_late_frames_and_crops_as_comfyui() {
    let (b, vae) = load();
    let io = read_tensors("kl_video_vae/vae_io.safetensors");
    let x = input(&b, &io, "encode_5f.x");
    let five = b.to_f32(&encode_clip(&b, &vae, &x, 4)).expect("read");
    let late = b.affine(&b.slice(&x, 2, 0, 2).expect("frames"), -1.0, 0.0).expect("late frames");
    let seven = b.concat(&[&x, &late], 2).expect("7 frames");
    assert_eq!(b.to_f32(&encode_clip(&b, &vae, &seven, 4)).expect("read"), five, "7 frames");
    // 32×24 → 35×26: one row above and two below, one column each side; the centre crop takes the clip back.
    let padded = b.pad(&x, 3, 1, 2, PadMode::Constant(0.5)).expect("rows");
    let padded = b.pad(&padded, 4, 1, 1, PadMode::Constant(-0.5)).expect("columns");
    assert_eq!(padded.shape(), [1, 3, 5, 35, 26]);
    assert_eq!(b.to_f32(&encode_clip(&b, &vae, &padded, 4)).expect("read"), five, "cropped");
    assert_close("5 frames", &five, &io["encode_5f.out"].1, 1e-4);
}

/// A fresh directory for this test's files.
fn scratch(test: &str) -> PathBuf {
    scratch_dir("kl-video-vae", test)
}

/// The released file's names and shapes, as ComfyUI's `AutoencoderKL` has them with `comfy/sd.py`'s config
/// (the reference script builds it on the meta device).
fn released_shapes() -> Vec<(String, Vec<usize>)> {
    let list = json("kl_video_vae/released_shapes.json");
    list.as_array()
        .expect("a list")
        .iter()
        .map(|entry| {
            let name = entry[0].as_str().expect("a name").to_owned();
            let shape = entry[1].as_array().expect("a shape");
            (name, shape.iter().map(|d| d.as_u64().expect("a dim") as usize).collect())
        })
        .collect()
}

/// Detection of a header-only file of `shapes`, written under `dir`.
fn detect_shapes(
    dir: &Path,
    file: &str,
    shapes: &[(String, Vec<usize>)],
) -> kiln_models::Result<Option<Config>> {
    detect_header_only(dir, file, shapes, kl_video_vae::detect)
}

/// `shapes` with the shape of `name` changed by `change`.
fn reshaped(
    shapes: &[(String, Vec<usize>)],
    name: &str,
    change: impl Fn(&mut Vec<usize>),
) -> Vec<(String, Vec<usize>)> {
    let mut out = shapes.to_vec();
    let entry = out.iter_mut().find(|s| s.0 == name).unwrap_or_else(|| panic!("no {name}"));
    change(&mut entry.1);
    out
}

/// An [`Error::Unsupported`] whose message names every one of `words`.
#[track_caller]
fn refused(result: kiln_models::Result<Option<Config>>, words: &[&str]) {
    let err = result.expect_err("a refusal");
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    let msg = err.to_string();
    assert!(words.iter().all(|w| msg.contains(w)), "{msg} should name {words:?}");
}

/// The released names and shapes are the released config, every weight in its load plan; a misshapen or missing
/// weight, or a width GroupNorm cannot split, is refused by name; the 1.5 VAE's latent width, CogVideoX's and
/// LTX-Video's files are not claimed; diffusers' layout is refused; a decoder-only file is a decoder.
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
    let plan = kl_video_vae::load_plan(&Header::new(&sf, ""), &Config::released());
    let mut planned: Vec<&str> = plan.slots.iter().map(|s| s.name.as_str()).collect();
    let mut names: Vec<&str> = shapes.iter().map(|s| s.0.as_str()).collect();
    planned.sort_unstable();
    names.sort_unstable();
    assert_eq!(planned, names, "the plan reads every tensor of the released file");

    let misshapen = "decoder.up.2.upsample.conv.conv.weight";
    let bad = reshaped(&shapes, misshapen, |s| s[1] = 256);
    refused(detect_shapes(&dir, "misshapen.safetensors", &bad), &[misshapen, "256"]);

    let missing = "encoder.mid.attn_1.proj_out.bias";
    let bad: Vec<_> = shapes.iter().filter(|s| s.0 != missing).cloned().collect();
    refused(detect_shapes(&dir, "missing.safetensors", &bad), &[missing]);
    let bad: Vec<_> = shapes.iter().filter(|s| s.0 != "post_quant_conv.weight").cloned().collect();
    refused(detect_shapes(&dir, "no_post_quant.safetensors", &bad), &["post_quant_conv.weight"]);

    // A level 48 wide: GroupNorm's 32 groups do not divide it.
    let bad = reshaped(&shapes, "decoder.up.0.block.0.conv2.conv.weight", |s| s[0] = 48);
    refused(detect_shapes(&dir, "groups.safetensors", &bad), &["[48, 256, 512, 512]", "32"]);

    // The HunyuanVideo 1.5 VAE's latent width is that VAE's, as in ComfyUI.
    let wide = reshaped(&shapes, "decoder.conv_in.conv.weight", |s| s[1] = 32);
    assert_eq!(detect_shapes(&dir, "z32.safetensors", &wide).expect("detect"), None);
    // Files ComfyUI gives to CogVideoX's and LTX-Video's VAEs first.
    for (file, marker) in [
        ("cog.safetensors", "decoder.mid_block.resnets.0.norm1.norm_layer.weight"),
        ("ltxv.safetensors", "decoder.up_blocks.0.res_blocks.0.conv1.conv.weight"),
    ] {
        let mut other = shapes.clone();
        other.push((marker.to_owned(), vec![512]));
        assert_eq!(detect_shapes(&dir, file, &other).expect("detect"), None, "{file}");
    }
    let mut diffusers = shapes.clone();
    diffusers.push(("decoder.up_blocks.0.resnets.0.norm1.weight".to_owned(), vec![512]));
    refused(detect_shapes(&dir, "diffusers.safetensors", &diffusers), &["diffusers' layout"]);

    let decoder: Vec<_> = shapes
        .iter()
        .filter(|s| {
            !s.0.starts_with("encoder.") && s.0 != "quant_conv.weight" && s.0 != "quant_conv.bias"
        })
        .cloned()
        .collect();
    assert_eq!(
        detect_shapes(&dir, "decoder.safetensors", &decoder).expect("detect"),
        Some(Config { has_encoder: false, ..Config::released() })
    );
    let _ = std::fs::remove_dir_all(dir);

    // The fixture is the tiny config.
    let sf = SafetensorsFile::open(fixture(WEIGHTS)).expect("open");
    assert_eq!(kl_video_vae::detect(&Header::new(&sf, "")).expect("detect"), Some(tiny()));
}

/// No other VAE's file is claimed (the Wan VAEs', the HunyuanVideo 1.5 VAE's at its tiny latent width too, the
/// 2-D KL autoencoders'), and the other video VAEs' detections leave this one's file alone.
#[test]
fn claims_no_other_vae() {
    for file in [
        "wan_vae/weights.safetensors",
        "wan_vae_video/wan21.safetensors",
        "wan_vae_video/wan22.safetensors",
        "hunyuan_video15/vae.safetensors",
        "flux_vae/weights.safetensors",
        "flux2_vae/weights.safetensors",
    ] {
        let sf = SafetensorsFile::open(fixture(file)).expect("open");
        assert_eq!(kl_video_vae::detect(&Header::new(&sf, "")).expect(file), None, "{file}");
    }
    let sf = SafetensorsFile::open(fixture(WEIGHTS)).expect("open");
    let h = Header::new(&sf, "");
    assert!(kiln_models::wan_vae::detect(&h).expect("Wan 2.1").is_none());
    assert!(kiln_models::wan_vae::wan22::detect(&h).expect("Wan 2.2").is_none());
    assert!(kiln_models::hunyuan_vae::detect(&h).expect("HunyuanVideo 1.5").is_none());
}

/// Clips of the wrong shape, chunk sizes that cannot be asked for, and frames smaller than 8×8 are input errors.
#[test]
fn refuses_what_it_cannot_take() {
    let (b, vae) = load();
    check_refusals(&b, &vae, 8, 4, 16);
}
