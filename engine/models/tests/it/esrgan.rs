//! The ESRGAN upscale model against ComfyUI's `ImageUpscaleWithModel` on spandrel's RRDBNet
//! (`scripts/reference/esrgan.py`; the fixtures are the engine's, `engine/tests/fixtures/esrgan/`), in each of the
//! three key layouts spandrel reads.

use std::collections::BTreeMap;

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType};
use kiln_models::Header;
use kiln_models::esrgan::{self, Config, Esrgan, Layout};

use crate::common::{TempTensors, assert_close, cpu, read_tensors};

/// The engine's fixture `name`.
fn engine_fixture(name: &str) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    read_tensors(&format!("../../../tests/fixtures/esrgan/{name}"))
}

/// The fixture's weights renamed into `layout` (Real-ESRGAN's are the file's own).
fn renamed(layout: Layout) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let cfg = Config { in_channels: 3, out_channels: 3, filters: 8, blocks: 2, upsamplings: 2 };
    let weights = engine_fixture("weights.safetensors");
    let name = |n: &str| -> String {
        match layout {
            Layout::RealEsrgan => n.to_owned(),
            Layout::Bsrgan => n
                .replace("conv_body", "trunk_conv")
                .replace("body.", "RRDB_trunk.")
                .replace(".rdb", ".RDB")
                .replace("conv_up", "upconv")
                .replace("conv_hr", "HRconv"),
            Layout::Esrgan => {
                let (layer, part) = n.rsplit_once('.').unwrap();
                let old = match layer {
                    "conv_first" => "model.0".to_owned(),
                    "conv_body" => format!("model.1.sub.{}", cfg.blocks),
                    "conv_up1" => "model.3".to_owned(),
                    "conv_up2" => "model.6".to_owned(),
                    "conv_hr" => "model.8".to_owned(),
                    "conv_last" => "model.10".to_owned(),
                    block => {
                        let block = block.replace("body.", "model.1.sub.").replace(".rdb", ".RDB");
                        format!("{block}.0")
                    }
                };
                format!("{old}.{part}")
            }
        }
    };
    weights.into_iter().map(|(n, t)| (name(&n), t)).collect()
}

#[test]
fn esrgan_upscales_as_comfyui_in_every_key_layout() {
    let io = engine_fixture("io.safetensors");
    let (image_shape, image) = &io["image"];
    let &[batch, h, w, c] = image_shape.as_slice() else { panic!("an image") };
    // The node's input is NHWC; the model reads NCHW.
    let mut nchw = vec![0f32; image.len()];
    for (i, v) in image.iter().enumerate() {
        let (n, rest) = (i / (h * w * c), i % (h * w * c));
        let (y, x, ch) = (rest / (w * c), (rest / c) % w, rest % c);
        nchw[((n * c + ch) * h + y) * w + x] = *v;
    }
    let (want_shape, want) = &io["out"];
    for (layout, tag) in
        [(Layout::RealEsrgan, "real"), (Layout::Bsrgan, "bsrgan"), (Layout::Esrgan, "esrgan")]
    {
        let file = TempTensors::new(&format!("esrgan-{tag}"), renamed(layout));
        let sf = SafetensorsFile::open(&file.0).unwrap();
        let header = Header::new(&sf, "");
        let (config, found) = esrgan::detect(&header).unwrap().expect("an ESRGAN model");
        assert_eq!(found, layout);
        assert_eq!((config.filters, config.blocks, config.scale()), (8, 2, 4), "{tag}");
        let (b, manager) = cpu(64 << 20);
        let weights =
            manager.load(&esrgan::load_plan(&header, &config, layout), &mut |_, _| {}).unwrap();
        let model = Esrgan::new(config, weights);
        let x = b.from_f32(&[batch, c, h, w], &nchw, DType::F32).unwrap();
        let out = b.to_f32(&model.forward(&*b, &x).unwrap()).unwrap();
        // The image fits one tile: the node's output is the model's, clamped, as NHWC.
        let (oh, ow) = (4 * h, 4 * w);
        assert_eq!(want_shape, &vec![batch, oh, ow, c]);
        let got: Vec<f32> = (0..want.len())
            .map(|i| {
                let (n, rest) = (i / (oh * ow * c), i % (oh * ow * c));
                let (y, x, ch) = (rest / (ow * c), (rest / c) % ow, rest % c);
                out[((n * c + ch) * oh + y) * ow + x].clamp(0.0, 1.0)
            })
            .collect();
        assert_close(tag, &got, want, 1e-4);
    }
}

#[test]
fn other_upscale_models_are_refused_by_name() {
    // Real-ESRGAN ×2 reads pixel-unshuffled images: 12 channels in, 3 out.
    let mut x2 = renamed(Layout::RealEsrgan);
    x2.insert("conv_first.weight".into(), (vec![8, 12, 3, 3], vec![0.0; 8 * 12 * 9]));
    let file = TempTensors::new("esrgan-x2", x2);
    let sf = SafetensorsFile::open(&file.0).unwrap();
    let err = esrgan::detect(&Header::new(&sf, "")).unwrap_err().to_string();
    assert!(err.contains("reads 12 channels and writes 3"), "{err}");
    // A file of another kind is not an ESRGAN model.
    let other = TempTensors::new("esrgan-other", read_tensors("wan/ti2v.safetensors"));
    let sf = SafetensorsFile::open(&other.0).unwrap();
    assert!(esrgan::detect(&Header::new(&sf, "")).unwrap().is_none());
}
