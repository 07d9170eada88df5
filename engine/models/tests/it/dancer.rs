//! WanDancer against `scripts/reference/wan_dancer.py`'s fixture, recorded from ComfyUI's own
//! `model_wandancer.py` on the tiny Wan's I2V weights with tiny WanDancer parts: no music, music at 30 frames a
//! second (the plain patch embedding and head), at 15 and 10 (the global ones, the time positions stretched,
//! the last one ComfyUI's rounded end), the injection scale, the reference image's CLIP states, no CLIP states at
//! all, and a batch.

use kiln_compute::Backend as _;
use kiln_models::family::{DiffusionInput, DiffusionNet};
use kiln_models::wan::dancer::DancerInput;

use crate::common::{TempTensors, assert_close, cpu, read_tensors};
use crate::wan::{Tensors, Variant, io_tensor, load_on};

/// The fixture's inputs and outputs, and the tiny I2V body with its WanDancer parts as one file.
fn fixture() -> (Tensors, TempTensors) {
    let f = read_tensors("wan/dancer.safetensors");
    let mut weights = Variant::I2v.tensors();
    weights.extend(
        f.iter().filter_map(|(k, v)| k.strip_prefix("w.").map(|name| (name.to_owned(), v.clone()))),
    );
    (f, TempTensors::new("dancer", weights))
}

#[test]
fn music_drives_the_blocks_as_comfyuis_dancer_does() {
    let (f, file) = fixture();
    let (b, manager) = cpu(256 << 20);
    let (_, net) = load_on(&manager, &file.0);
    let DiffusionNet::Wan(wan) = &net else { panic!("not a Wan model") };
    assert_eq!(wan.config.variant(), "WanDancer");
    assert_eq!(
        wan.config.dancer.map(|d| (d.width, d.ffn, d.layers, d.injectors)),
        Some((32, 1024, 2, 1))
    );
    let io = |name: &str| io_tensor(&b, &f, name);
    let (x, context, clip, clip_ref, music) =
        (io("x"), io("context"), io("clip"), io("clip_ref"), io("music"));
    let t = &f["t"].1;
    let run = |x, t: &[f32], context, dancer: Option<DancerInput<'_, _>>| {
        let input = DiffusionInput {
            clip_vision: Some(&clip),
            dancer,
            ..DiffusionInput::new(x, t, context)
        };
        b.to_f32(&net.forward(&*b, input).unwrap()).unwrap()
    };
    let with = |fps: f64, scale: f32, reference: bool| DancerInput {
        music: Some(&music),
        fps,
        scale,
        clip_reference: reference.then_some(&clip_ref),
    };
    assert_close("plain", &run(&x, t, &context, None), &f["out.plain"].1, 1e-4);
    assert_close(
        "music",
        &run(&x, t, &context, Some(with(30.0, 1.0, false))),
        &f["out.music"].1,
        1e-4,
    );
    assert_close(
        "global",
        &run(&x, t, &context, Some(with(15.0, 0.7, true))),
        &f["out.global"].1,
        1e-4,
    );
    assert_close(
        "fps10",
        &run(&x, t, &context, Some(with(10.0, 1.0, true))),
        &f["out.fps10"].1,
        1e-4,
    );
    // Without CLIP states the image attention reads nothing (ComfyUI's dancer passes context_img_len 0).
    let input = DiffusionInput {
        dancer: Some(with(30.0, 1.0, false)),
        ..DiffusionInput::new(&x, t, &context)
    };
    let got = b.to_f32(&net.forward(&*b, input).unwrap()).unwrap();
    assert_close("noclip", &got, &f["out.noclip"].1, 1e-4);
    let (x2, context2) = (io("x2"), io("context2"));
    let got = run(&x2, &f["t2"].1, &context2, Some(with(15.0, 1.0, true)));
    assert_close("batch2", &got, &f["out.batch2"].1, 1e-4);
}

#[test]
fn a_frame_the_music_rows_cannot_split_is_refused() {
    let (f, file) = fixture();
    let (b, manager) = cpu(256 << 20);
    let (_, net) = load_on(&manager, &file.0);
    // 6 × 6 latents: 3 × 3 patches a frame, not a multiple of the 8 rows each latent frame's music becomes.
    let x =
        b.from_f32(&[1, 36, 3, 6, 6], &vec![0.1; 36 * 3 * 36], kiln_compute::DType::F32).unwrap();
    let (context, music) = (io_tensor(&b, &f, "context"), io_tensor(&b, &f, "music"));
    let dancer = DancerInput { music: Some(&music), ..DancerInput::default() };
    let input =
        DiffusionInput { dancer: Some(dancer), ..DiffusionInput::new(&x, &f["t"].1, &context) };
    let err = net.forward(&*b, input).unwrap_err().to_string();
    assert!(err.contains("multiple of 8 patches"), "{err}");
}

#[test]
fn a_file_with_the_music_projections_apart_runs_the_same() {
    // ComfyUI saves a WanDancer with each music layer's in_proj split into q, k and v (its
    // process_unet_state_dict splits a released file's on load): Kiln joins them back.
    let (f, _) = fixture();
    let mut weights = Variant::I2v.tensors();
    for (name, (shape, values)) in f.iter().filter_map(|(k, v)| Some((k.strip_prefix("w.")?, v))) {
        let Some((stem, suffix)) = name.split_once(".self_attn.in_proj_") else {
            weights.insert(name.to_owned(), (shape.clone(), values.clone()));
            continue;
        };
        let rows = shape[0] / 3;
        let per = values.len() / 3;
        for (k, p) in ["q", "k", "v"].iter().enumerate() {
            let mut part = shape.clone();
            part[0] = rows;
            let name = format!("{stem}.self_attn.{p}_proj.{suffix}");
            weights.insert(name, (part, values[k * per..(k + 1) * per].to_vec()));
        }
    }
    let file = TempTensors::new("dancer-split", weights);
    let (b, manager) = cpu(256 << 20);
    let (_, net) = load_on(&manager, &file.0);
    let io = |name: &str| io_tensor(&b, &f, name);
    let (x, context, clip, music) = (io("x"), io("context"), io("clip"), io("music"));
    let dancer = DancerInput { music: Some(&music), ..DancerInput::default() };
    let input = DiffusionInput {
        clip_vision: Some(&clip),
        dancer: Some(dancer),
        ..DiffusionInput::new(&x, &f["t"].1, &context)
    };
    let got = b.to_f32(&net.forward(&*b, input).unwrap()).unwrap();
    assert_close("split", &got, &f["out.music"].1, 1e-4);
}
