//! The Wan VAEs on video against diffusers' `AutoencoderKLWan` (fixtures from `scripts/reference/wan_vae_video.py`,
//! which checks them against ComfyUI's `WanVAE`s): a tiny Wan 2.1 VAE and a tiny Wan 2.2 VAE decode 3 latent
//! frames to 9 and one to one, and encode 9 frames to 3, 6 to 2 (the sixth dropped) and one to one, within
//! 1e-4; any chunking gives the whole clip's result; a one-frame clip is the image path bit for bit; and the
//! Wan 2.2 VAE is detected (both layouts, released and tiny shapes) and told apart from the 2.1 VAE.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_compute::Backend as _;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{DType, Tensor};
use kiln_models::family::{VaeDetected, VaeFamily};
use kiln_models::wan_vae::{self, ClipVae, Layout, Wan22Vae, WanVae, wan22};
use kiln_models::{Error, Header};

use crate::common::{assert_close, check, cpu, fixture, gather, input, read_tensors};

/// A fresh directory for this test's files.
fn scratch(test: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("kiln-wan-vae-video-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// `{diffusers name: (ComfyUI name, shape)}` from one of the script's JSON maps.
fn names(relative: &str) -> BTreeMap<String, (String, Vec<usize>)> {
    let text = std::fs::read_to_string(fixture(relative)).expect("the name map");
    serde_json::from_str(&text).expect("a JSON name map")
}

type Tensors = Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>;

/// The tensors of a fixture file.
fn tensors(relative: &str) -> Tensors {
    let bytes = std::fs::read(fixture(relative)).expect("the fixture");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors fixture");
    file.tensors()
        .into_iter()
        .map(|(name, v)| (name, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect()
}

/// Writes `tensors` to `path`.
fn write(path: &Path, tensors: &Tensors) {
    let views = tensors.iter().map(|(name, dtype, shape, bytes)| {
        let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes)
            .expect("a consistent tensor");
        (name.clone(), view)
    });
    safetensors::serialize_to_file(views, None, path).expect("writing a safetensors file");
}

/// The tiny 2.2 fixture, edited, in diffusers' names when asked (the script's map, not Kiln's conversion).
fn wan22_file(dir: &Path, file: &str, diffusers: bool, edit: impl FnOnce(&mut Tensors)) -> PathBuf {
    let mut all = tensors("wan_vae_video/wan22.safetensors");
    if diffusers {
        let map: BTreeMap<String, String> = names("wan_vae_video/wan22_diffusers_names.json")
            .into_iter()
            .map(|(d, (comfy, _))| (comfy, d))
            .collect();
        for t in &mut all {
            t.0 = map.get(&t.0).unwrap_or_else(|| panic!("no diffusers name for {}", t.0)).clone();
        }
    }
    edit(&mut all);
    let path = dir.join(file);
    write(&path, &all);
    path
}

/// Detection of `path` through the family list.
fn detect(path: &Path) -> kiln_models::Result<Option<VaeDetected>> {
    let file = SafetensorsFile::open(path).expect("open");
    VaeDetected::detect(&Header::new(&file, ""))
}

/// The tiny Wan 2.1 VAE.
fn load21() -> (Arc<Cpu>, WanVae) {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture("wan_vae_video/wan21.safetensors")).expect("open");
    let header = Header::new(&file, "");
    let (config, layout) = wan_vae::detect(&header).expect("detect").expect("a Wan 2.1 VAE");
    let weights = manager.load(&wan_vae::load_plan(&header, &config, layout), &mut |_, _| {});
    (b, WanVae::new(config, weights.expect("load")))
}

/// A tiny Wan 2.2 VAE from `path`, with its layout.
fn load22(path: &Path) -> (Arc<Cpu>, Wan22Vae, Layout) {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(path).expect("open");
    let header = Header::new(&file, "");
    let (config, layout) = wan22::detect(&header).expect("detect").expect("a Wan 2.2 VAE");
    let weights = manager.load(&wan22::load_plan(&header, &config, layout), &mut |_, _| {});
    (b, Wan22Vae::new(config, weights.expect("load")), layout)
}

/// The tiny 2.2 VAE's config.
fn tiny22() -> wan22::Config {
    wan22::Config { dim: 4, dec_dim: 8, ..wan22::Config::released() }
}

/// A VAE's clip API, for the tests both versions share.
trait Clips {
    fn decode_with(&self, b: &Cpu, z: &Tensor<Cpu>, per: usize) -> Tensor<Cpu>;
    fn encode_with(&self, b: &Cpu, x: &Tensor<Cpu>, per: usize) -> Tensor<Cpu>;
    fn image_decode(&self, b: &Cpu, z: &Tensor<Cpu>) -> Tensor<Cpu>;
    fn image_encode(&self, b: &Cpu, x: &Tensor<Cpu>) -> Tensor<Cpu>;
    fn set_frames_together_bytes(&mut self, bytes: usize);
}

macro_rules! clips {
    ($t:ty) => {
        impl Clips for $t {
            fn decode_with(&self, b: &Cpu, z: &Tensor<Cpu>, per: usize) -> Tensor<Cpu> {
                gather(b, |out| self.decode_video_with(b, z, per, out))
            }
            fn encode_with(&self, b: &Cpu, x: &Tensor<Cpu>, per: usize) -> Tensor<Cpu> {
                gather(b, |out| self.encode_video_with(b, x, per, out))
            }
            fn image_decode(&self, b: &Cpu, z: &Tensor<Cpu>) -> Tensor<Cpu> {
                self.decode(b, z).expect("decode an image")
            }
            fn image_encode(&self, b: &Cpu, x: &Tensor<Cpu>) -> Tensor<Cpu> {
                self.encode(b, x).expect("encode an image")
            }
            fn set_frames_together_bytes(&mut self, bytes: usize) {
                self.frames_together_bytes = bytes;
            }
        }
    };
}
clips!(WanVae);
clips!(Wan22Vae);

/// The fixture cases of `tag` (`wan21`, `wan22`) through `vae`'s clip API.
fn check_clips(b: &Cpu, vae: &impl Clips, tag: &str, what: &str) {
    let io = read_tensors("wan_vae_video/io.safetensors");
    for z in ["z3", "z1"] {
        let got = vae.decode_with(b, &input(b, &io, &format!("{tag}_{z}")), 1);
        check(b, what, &got, &io, &format!("{tag}_decode_{z}"));
    }
    for x in ["x9", "x6", "x1"] {
        let got = vae.encode_with(b, &input(b, &io, &format!("{tag}_{x}")), 4);
        check(b, what, &got, &io, &format!("{tag}_encode_{x}"));
    }
}

#[test]
fn wan21_decodes_and_encodes_clips_as_diffusers() {
    let (b, vae) = load21();
    check_clips(&b, &vae, "wan21", "2.1");
    // The whole-clip conveniences are the same calls.
    let io = read_tensors("wan_vae_video/io.safetensors");
    let got = vae.decode_video(&*b, &input(&b, &io, "wan21_z3")).expect("decode_video");
    check(&b, "2.1 decode_video", &got, &io, "wan21_decode_z3");
    let got = vae.encode_video(&*b, &input(&b, &io, "wan21_x9")).expect("encode_video");
    check(&b, "2.1 encode_video", &got, &io, "wan21_encode_x9");
}

#[test]
fn wan22_decodes_and_encodes_clips_as_diffusers_in_both_layouts() {
    let dir = scratch("wan22-layouts");
    for (diffusers, layout) in [(false, Layout::Comfy), (true, Layout::Diffusers)] {
        let path = wan22_file(&dir, &format!("{layout:?}.safetensors"), diffusers, |_| {});
        let (b, vae, found) = load22(&path);
        assert_eq!((found, &vae.config), (layout, &tiny22()));
        check_clips(&b, &vae, "wan22", &format!("2.2 {layout:?}"));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Whole-clip chunks (every latent frame after the first at once; 8 frames at a time) give what one latent
/// frame (4 frames) at a time gives; and a chunk's frames going on one at a time after each temporal upsample
/// (as a large clip's do) give exactly what they give together (as a small clip's do).
#[test]
fn any_chunking_gives_the_whole_clips_result() {
    let io = read_tensors("wan_vae_video/io.safetensors");
    let dir = scratch("chunks");
    let (b21, mut v21) = load21();
    let (b22, mut v22, _) = load22(&wan22_file(&dir, "w.safetensors", false, |_| {}));
    let cases: [(&Cpu, &mut dyn Clips, &str); 2] =
        [(&b21, &mut v21, "wan21"), (&b22, &mut v22, "wan22")];
    for (b, vae, tag) in cases {
        let z = input(b, &io, &format!("{tag}_z3"));
        let one = b.to_f32(&vae.decode_with(b, &z, 1)).expect("read");
        let whole = b.to_f32(&vae.decode_with(b, &z, 2)).expect("read");
        assert_close(&format!("{tag} decode"), &whole, &one, 1e-6);
        vae.set_frames_together_bytes(0);
        let frame_by_frame = b.to_f32(&vae.decode_with(b, &z, 1)).expect("read");
        assert_eq!(frame_by_frame, one, "{tag}: frames one at a time or together");
        vae.set_frames_together_bytes(wan_vae::FRAMES_TOGETHER_BYTES);
        let x = input(b, &io, &format!("{tag}_x9"));
        let four = b.to_f32(&vae.encode_with(b, &x, 4)).expect("read");
        let eight = b.to_f32(&vae.encode_with(b, &x, 8)).expect("read");
        assert_close(&format!("{tag} encode"), &eight, &four, 1e-6);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A one-frame clip takes exactly the image path's operations (Qwen-Image's images depend on them).
#[test]
fn a_one_frame_clip_is_the_image_path_bit_for_bit() {
    let io = read_tensors("wan_vae_video/io.safetensors");
    let dir = scratch("one-frame");
    let (b21, v21) = load21();
    let (b22, v22, _) = load22(&wan22_file(&dir, "w.safetensors", false, |_| {}));
    let cases: [(&Cpu, &dyn Clips, &str); 2] = [(&b21, &v21, "wan21"), (&b22, &v22, "wan22")];
    for (b, vae, tag) in cases {
        let frame = |name: &str| {
            let (shape, values) = &io[&format!("{tag}_{name}")];
            let image = [shape[0], shape[1], shape[3], shape[4]];
            (input(b, &io, &format!("{tag}_{name}")), b.from_f32(&image, values, DType::F32))
        };
        let (clip, image) = frame("z1");
        let video = b.to_f32(&vae.decode_with(b, &clip, 1)).expect("read");
        let picture = b.to_f32(&vae.image_decode(b, &image.expect("z"))).expect("read");
        assert_eq!(video, picture, "{tag} decode");
        assert_close(
            &format!("{tag} image decode"),
            &picture,
            &io[&format!("{tag}_decode_z1")].1,
            1e-4,
        );
        let (clip, image) = frame("x1");
        let video = b.to_f32(&vae.encode_with(b, &clip, 4)).expect("read");
        let picture = b.to_f32(&vae.image_encode(b, &image.expect("x"))).expect("read");
        assert_eq!(video, picture, "{tag} encode");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The released Wan 2.2 VAE's names and shapes (header-only files, both layouts) give its widths and 196
/// weights; each Wan VAE is detected as its own family; a 2.2 file with a missing weight or a latent of other
/// than 48 channels is refused by name; an encoder-only 2.2 file is an encoder.
#[test]
fn detects_the_wan22_vae_and_tells_it_from_the_wan21_vae() {
    let dir = scratch("detect");
    let map = names("wan_vae_video/wan22_names.json");
    for layout in [Layout::Comfy, Layout::Diffusers] {
        let shapes: Vec<(String, Vec<usize>)> = map
            .iter()
            .map(|(d, (comfy, shape))| {
                (if layout == Layout::Comfy { comfy.clone() } else { d.clone() }, shape.clone())
            })
            .collect();
        let path = dir.join(format!("real-{layout:?}.safetensors"));
        crate::common::write_header_only(&path, &shapes);
        let sf = SafetensorsFile::open(&path).expect("open");
        let header = Header::new(&sf, "");
        assert_eq!(
            wan22::detect(&header).expect("detect"),
            Some((wan22::Config::released(), layout))
        );
        assert_eq!(wan_vae::detect(&header).expect("2.1 detection"), None, "{layout:?}");
        let plan = wan22::load_plan(&header, &wan22::Config::released(), layout);
        assert_eq!(plan.slots.len(), 196);
        let found = detect(&path).expect("detect").expect("a VAE");
        assert_eq!(found.family(), VaeFamily::Wan22);
    }
    let tiny = wan22_file(&dir, "tiny.safetensors", false, |_| {});
    assert_eq!(detect(&tiny).expect("detect").expect("a VAE").family(), VaeFamily::Wan22);
    let wan21 = fixture("wan_vae_video/wan21.safetensors");
    assert_eq!(detect(&wan21).expect("detect").expect("a VAE").family(), VaeFamily::Wan21);
    assert_eq!(
        wan22::detect(&Header::new(&SafetensorsFile::open(&wan21).expect("open"), ""))
            .expect("detect"),
        None
    );
    let missing = wan22_file(&dir, "missing.safetensors", false, |t| {
        t.retain(|x| x.0 != "decoder.upsamples.1.upsamples.3.time_conv.weight")
    });
    let err = detect(&missing).expect_err("a weight is missing");
    assert!(err.to_string().contains("decoder.upsamples.1.upsamples.3.time_conv.weight"), "{err}");
    let narrow = wan22_file(&dir, "narrow.safetensors", false, |t| {
        for x in t.iter_mut().filter(|x| x.0 == "decoder.conv1.weight") {
            x.2[1] = 16;
            x.3 = vec![0; x.2.iter().product::<usize>() * 2];
        }
    });
    let err = detect(&narrow).expect_err("16 channels");
    assert!(err.to_string().contains("16-channel latent"), "{err}");
    let encoder = wan22_file(&dir, "encoder.safetensors", false, |t| {
        t.retain(|x| x.0.starts_with("encoder.") || x.0.starts_with("conv1."))
    });
    match detect(&encoder).expect("detect") {
        Some(VaeDetected::Wan22(config, _)) => {
            assert!(config.has_encoder && !config.has_decoder && config.dim == 4);
        }
        other => panic!("an encoder-only Wan 2.2 VAE, got {other:?}"),
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Clips of the wrong rank or channels, and encode chunks that are not multiples of 4, are input errors.
#[test]
fn bad_clips_are_errors() {
    let (b, vae) = load21();
    let image = b.full(&[1, 16, 2, 2], 0.0, DType::F32).expect("z");
    let err = vae.decode_video(&*b, &image).expect_err("an image latent is not a clip");
    assert!(matches!(err, Error::Invalid(ref m) if m.contains("[1, C, T, H, W]")), "{err}");
    let wide = b.full(&[1, 48, 2, 2, 2], 0.0, DType::F32).expect("z");
    assert!(
        matches!(vae.decode_video(&*b, &wide), Err(Error::Invalid(m)) if m.contains("16 channels"))
    );
    let x = b.full(&[1, 3, 5, 16, 16], 0.0, DType::F32).expect("x");
    let err = vae.encode_video_with(&*b, &x, 3, &mut |_| Ok(())).expect_err("3 frames a chunk");
    assert!(err.to_string().contains("multiple of 4"), "{err}");
    let small = b.full(&[1, 3, 5, 4, 16], 0.0, DType::F32).expect("x");
    assert!(matches!(vae.encode_video(&*b, &small), Err(Error::Invalid(_))));
}

/// `kiln model synth --family wan22-vae` writes a file detected as the tiny Wan 2.2 VAE it describes, which
/// decodes 2 latent frames to 5.
#[test]
fn the_synthetic_wan22_vae_is_detected_and_decodes_a_clip() {
    use kiln_models::synth::{self, SynthDtype, SynthFamily, ZImageTurboSet};
    let dir = scratch("synth");
    let path = dir.join("wan2.2_vae.safetensors");
    let set = ZImageTurboSet::tiny();
    let family = SynthFamily::Vae(VaeFamily::Wan22);
    assert_eq!(family.name(), "wan22-vae");
    synth::write_family(&path, family, &set, SynthDtype::F32, 3, &mut |_, _| {}).expect("synth");
    assert_eq!(ZImageTurboSet::real().wan22_vae, wan22::Config::released());
    let (b, vae, layout) = load22(&path);
    assert_eq!((layout, &vae.config), (Layout::Comfy, &set.wan22_vae));
    let z = b.full(&[1, 48, 2, 2, 3], 0.5, DType::F32).expect("z");
    let frames = vae.decode_video(&*b, &z).expect("decode");
    assert_eq!(frames.shape(), [1, 3, 5, 32, 48]);
    assert!(b.to_f32(&frames).expect("read").iter().all(|v| v.is_finite()));
    let _ = std::fs::remove_dir_all(dir);
}
