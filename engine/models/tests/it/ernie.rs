//! ERNIE-Image's DiT against ComfyUI 0f1fa67a (`scripts/reference/ernie.py`, fixtures in `fixtures/ernie/`): two
//! tiny `ErnieImageModel`s (2 heads of 64 with a text projection; 1 head of 128, the released head width and
//! RoPE axes, without one) on latents of several sides, one- and two-sample batches, text of 1, 3 and 7 tokens and
//! `rope_options`; a one-sample conditioning repeated to the batch and a file under `model.diffusion_model.`;
//! detection of the released model's shapes, and refusals.

use std::path::Path;
use std::sync::Arc;

use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::{MemoryManager, SafetensorsFile};
use kiln_compute::{Backend, Tensor};
use kiln_models::ernie::{self, Config, ErnieImage};
use kiln_models::{Header, RopeOptions};

use crate::common::{
    Io, TempTensors, assert_close, cpu, detect_header_only, fixture, input, json, read_tensors,
    relative_error, rope_options, scratch_dir,
};

/// The fixture models' configs (scripts/reference/ernie.py's `MODELS`, as Kiln derives them).
fn config(model: &str) -> Config {
    match model {
        "tiny" => Config {
            hidden: 128,
            channels: 128,
            layers: 2,
            heads: 2,
            head_dim: 64,
            ffn_dim: 64,
            text_dim: 48,
            text_proj: true,
            axes: [16, 24, 24],
        },
        "wide" => Config {
            hidden: 128,
            channels: 128,
            layers: 1,
            heads: 1,
            head_dim: 128,
            ffn_dim: 64,
            text_dim: 128,
            text_proj: false,
            axes: [32, 48, 48],
        },
        other => panic!("no fixture model {other}"),
    }
}

/// The model of `path`, its keys under `prefix`: detected, its config checked against `model`'s, loaded.
fn load(manager: &Arc<MemoryManager>, path: &Path, prefix: &str, model: &str) -> ErnieImage {
    let file = SafetensorsFile::open(path).expect("open");
    let header = Header::new(&file, prefix);
    let found = ernie::detect(&header).expect("detect").expect("ERNIE-Image");
    assert_eq!(found, config(model));
    let weights = manager.load(&ernie::load_plan(&header, &found), &mut |_, _| {}).expect("load");
    ErnieImage::new(found, weights)
}

/// Case `case`'s output against `{case}.out` (within 1e-4 relative); its max relative error.
fn check_case(b: &Cpu, model: &ErnieImage, io: &Io, case: &str, rope: &RopeOptions) -> f32 {
    let t = |name: &str| input(b, io, &format!("{case}.{name}"));
    let timesteps = &io[&format!("{case}.t")].1;
    let out = model.forward_with_rope(b, &t("x"), timesteps, &t("context"), rope).expect("forward");
    let want = &io[&format!("{case}.out")];
    assert_eq!(out.shape(), want.0.as_slice(), "{case}");
    let got = b.to_f32(&out).expect("read");
    assert_close(&format!("ERNIE-Image {case}"), &got, &want.1, 1e-4);
    relative_error(&got, &want.1)
}

#[test]
fn dit_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let models = ["tiny", "wide"]
        .map(|m| (m, load(&manager, &fixture(&format!("ernie/{m}.safetensors")), "", m)));
    let io = read_tensors("ernie/io.safetensors");
    let cases = json("ernie/cases.json");
    let cases = cases["cases"].as_object().expect("cases");
    assert_eq!(cases.len(), 6);
    for (case, spec) in cases {
        let which = spec["model"].as_str().expect("model");
        let model = &models.iter().find(|(m, _)| *m == which).expect("a fixture model").1;
        let err = check_case(&b, model, &io, case, &rope_options(&spec["rope_options"]));
        eprintln!("ERNIE-Image {case} ({which}): max relative error {err:.2e}");
    }
    // `forward` is the identity RoPE's.
    let t = |name: &str| input(&b, &io, &format!("one.{name}"));
    let out =
        models[0].1.forward(b.as_ref(), &t("x"), &io["one.t"].1, &t("context")).expect("forward");
    assert_close("ERNIE-Image forward", &b.to_f32(&out).expect("read"), &io["one.out"].1, 1e-4);
}

#[test]
fn one_sample_text_serves_the_batch() {
    let (b, manager) = cpu(64 << 20);
    let model = load(&manager, &fixture("ernie/wide.safetensors"), "", "wide");
    let io = read_tensors("ernie/io.safetensors");
    let t = |name: &str| input(&b, &io, &format!("wide.{name}"));
    let (x, timesteps) = (t("x"), &io["wide.t"].1);
    let one = b.slice(&t("context"), 0, 0, 1).expect("first");
    let two = b.concat(&[&one, &one], 0).expect("repeated");
    let a = model.forward(b.as_ref(), &x, timesteps, &one).expect("forward");
    let c = model.forward(b.as_ref(), &x, timesteps, &two).expect("forward");
    assert_eq!(b.to_f32(&a).expect("read"), b.to_f32(&c).expect("read"));
}

#[test]
fn loads_under_comfyuis_checkpoint_prefix() {
    let (b, manager) = cpu(64 << 20);
    let prefixed: Io = read_tensors("ernie/tiny.safetensors")
        .into_iter()
        .map(|(name, t)| (format!("model.diffusion_model.{name}"), t))
        .collect();
    let file = TempTensors::new("ernie-prefixed", prefixed);
    let names: Vec<String> = {
        let sf = SafetensorsFile::open(&file.0).expect("open");
        sf.tensors().map(|(name, _)| name.to_owned()).collect()
    };
    let prefix = kiln_models::header::diffusion_prefix(names.iter().map(String::as_str));
    assert_eq!(prefix, "model.diffusion_model.");
    let model = load(&manager, &file.0, &prefix, "tiny");
    let io = read_tensors("ernie/io.safetensors");
    check_case(&b, &model, &io, "odd", &RopeOptions::default());
}

/// The released model: `ErnieImageModel()` with the class defaults (what ComfyUI's detection always builds), its
/// weight list recorded by the reference script.
#[test]
fn detects_the_released_model() {
    let cases = json("ernie/cases.json");
    let released = &cases["released"];
    let shapes: Vec<(String, Vec<usize>)> = released["shapes"]
        .as_object()
        .expect("shapes")
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::from_value(v.clone()).expect("a shape")))
        .collect();
    let dir = scratch_dir("ernie", "released");
    let found = detect_header_only(&dir, "ernie.safetensors", &shapes, ernie::detect);
    std::fs::remove_dir_all(&dir).ok();
    let want = Config {
        hidden: 4096,
        channels: 128,
        layers: 36,
        heads: 32,
        head_dim: 128,
        ffn_dim: 12288,
        text_dim: 3072,
        text_proj: true,
        axes: [32, 48, 48],
    };
    assert_eq!(found.expect("detect"), Some(want.clone()));
    assert_eq!(released["detect_unet_config"]["image_model"], "ernie");
    // Kiln's weight list is ComfyUI's, and each tiny file's.
    let mut ours = ernie::expected(&want);
    let mut theirs = shapes;
    ours.sort();
    theirs.sort();
    assert_eq!(ours, theirs);
    for model in ["tiny", "wide"] {
        let names: Vec<String> =
            read_tensors(&format!("ernie/{model}.safetensors")).into_keys().collect();
        let mut ours: Vec<String> =
            ernie::expected(&config(model)).into_iter().map(|(n, _)| n).collect();
        ours.sort();
        assert_eq!(ours, names, "{model}");
    }
}

#[test]
fn refuses_other_files_and_misshapen_ones() {
    let dir = scratch_dir("ernie", "refuses");
    let detect = |file: &str, shapes: &[(String, Vec<usize>)]| {
        detect_header_only(&dir, file, shapes, ernie::detect)
    };
    let tiny = || ernie::expected(&config("tiny"));
    // Z-Image's NextDiT (layers.0.feed_forward.w2, no linear_fc2): not ERNIE-Image.
    let other = vec![
        ("layers.0.feed_forward.w2.weight".to_owned(), vec![128, 256]),
        ("x_embedder.weight".to_owned(), vec![128, 64]),
    ];
    let found = detect("other.safetensors", &other);
    assert!(matches!(found, Ok(None)), "{found:?}");
    // A 2×2 patch embedding (ComfyUI builds 1×1 only).
    let shapes: Vec<_> = tiny()
        .into_iter()
        .map(|(n, s)| if n == "x_embedder.proj.weight" { (n, vec![128, 32, 2, 2]) } else { (n, s) })
        .collect();
    let err = detect("patch.safetensors", &shapes).expect_err("a 2×2 patch");
    assert!(err.to_string().contains("2×2"), "{err}");
    // Heads whose width does not split into the RoPE's axes.
    let shapes: Vec<_> = tiny()
        .into_iter()
        .map(|(n, s)| if n.contains(".norm_") { (n, vec![8]) } else { (n, s) })
        .collect();
    let err = detect("heads.safetensors", &shapes).expect_err("8-wide heads");
    assert!(err.to_string().contains("8-wide heads"), "{err}");
    // A truncated file: a layer weight missing.
    let shapes: Vec<_> =
        tiny().into_iter().filter(|(n, _)| n != "layers.1.self_attention.to_v.weight").collect();
    let err = detect("missing.safetensors", &shapes).expect_err("a missing weight");
    assert!(err.to_string().contains("layers.1.self_attention.to_v.weight"), "{err}");
    // A gap in the layers.
    let shapes: Vec<_> =
        tiny().into_iter().map(|(n, s)| (n.replace("layers.1.", "layers.2."), s)).collect();
    let err = detect("gap.safetensors", &shapes).expect_err("a gap");
    assert!(err.to_string().contains("layers.2."), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn refuses_misshapen_inputs() {
    let (b, manager) = cpu(64 << 20);
    let model = load(&manager, &fixture("ernie/tiny.safetensors"), "", "tiny");
    let io = read_tensors("ernie/io.safetensors");
    let t = |name: &str| input(&b, &io, &format!("one.{name}"));
    let (x, context, timesteps) = (t("x"), t("context"), &io["one.t"].1);
    let run = |x: &Tensor<Cpu>, timesteps: &[f32], context: &Tensor<Cpu>| {
        model.forward(b.as_ref(), x, timesteps, context).map(|_| ()).map_err(|e| e.to_string())
    };
    let narrow = b.slice(&context, 2, 0, 32).expect("narrow");
    let msg = run(&x, timesteps, &narrow).expect_err("32-wide text");
    assert!(msg.contains("48") && msg.contains("32"), "{msg}");
    let empty = b.slice(&context, 1, 0, 0).expect("no tokens");
    let msg = run(&x, timesteps, &empty).expect_err("no text");
    assert!(msg.contains("N > 0"), "{msg}");
    let msg = run(&b.slice(&x, 1, 0, 16).expect("16"), timesteps, &context).expect_err("channels");
    assert!(msg.contains("128 channels"), "{msg}");
    let msg = run(&x, &[500.0, 500.0], &context).expect_err("2 timesteps");
    assert!(msg.contains("2 timesteps"), "{msg}");
    let five = x.reshape(&[1, 128, 1, 4, 6]).expect("5-D");
    assert!(run(&five, timesteps, &context).is_err(), "a 5-D latent");
}
