//! JoyAI Image Edit's DiT against ComfyUI 0f1fa67a (`scripts/reference/joyimage.py`, fixtures in
//! `fixtures/joyimage/`; a plain-torch restatement agrees with it there): the tiny `JoyImageTransformer3DModel`'s
//! output on an even latent, an odd one (padding), a batch of two timesteps, one reference, two references of
//! different sizes, two frames with a reference, a 4-D latent, a one-sample reference and conditioning repeated to
//! the batch, and a file under `model.diffusion_model.`; detection of the tiny file and of the released model's
//! shapes, and refusals.

use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::{MemoryManager, SafetensorsFile};
use kiln_compute::{Backend, Tensor};
use kiln_models::Header;
use kiln_models::joyimage::{self, Config, JoyImage};

use crate::common::{
    Io, TempTensors, assert_close, cpu, detect_header_only, fixture, input, json, read_tensors,
    relative_error, scratch_dir,
};

/// The cases of `scripts/reference/joyimage.py`.
const CASES: [&str; 6] = ["even", "odd", "batch", "ref1", "ref2", "frames"];

/// The tiny fixture's config (scripts/reference/joyimage.py's `DIT`, as Kiln derives it).
fn tiny() -> Config {
    Config {
        hidden: 128,
        channels: 16,
        layers: 2,
        heads: 2,
        head_dim: 64,
        mlp_dim: 512,
        text_dim: 64,
        patch: [1, 2, 2],
        axes: [16, 24, 24],
    }
}

/// The model of `path`, its keys under `prefix`: detected, its config checked, loaded.
fn load(manager: &std::sync::Arc<MemoryManager>, path: &std::path::Path, prefix: &str) -> JoyImage {
    let file = SafetensorsFile::open(path).expect("open");
    let header = Header::new(&file, prefix);
    let config = joyimage::detect(&header).expect("detect").expect("JoyAI Image Edit");
    assert_eq!(config, tiny());
    let weights =
        manager.load(&joyimage::load_plan(&header, &config), &mut |_, _| {}).expect("load");
    JoyImage::new(config, weights)
}

/// Case `case`'s references, `{case}.ref0`, `{case}.ref1`, …
fn refs(b: &Cpu, io: &Io, case: &str) -> Vec<Tensor<Cpu>> {
    (0..)
        .map(|i| format!("{case}.ref{i}"))
        .take_while(|name| io.contains_key(name))
        .map(|name| input(b, io, &name))
        .collect()
}

/// Case `case`'s output against `{case}.out`; its max relative error.
fn check_case(b: &Cpu, model: &JoyImage, io: &Io, case: &str) -> f32 {
    let t = |name: &str| input(b, io, &format!("{case}.{name}"));
    let timesteps = &io[&format!("{case}.t")].1;
    let out =
        model.forward(b, &t("x"), timesteps, &t("context"), &refs(b, io, case)).expect("forward");
    let want = &io[&format!("{case}.out")];
    assert_eq!(out.shape(), want.0.as_slice(), "{case}");
    let got = b.to_f32(&out).expect("read");
    assert_close(&format!("JoyAI Image Edit {case}"), &got, &want.1, 1e-4);
    relative_error(&got, &want.1)
}

#[test]
fn dit_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let model = load(&manager, &fixture("joyimage/weights.safetensors"), "");
    let io = read_tensors("joyimage/io.safetensors");
    for case in CASES {
        let err = check_case(&b, &model, &io, case);
        eprintln!("JoyAI Image Edit {case}: max relative error {err:.2e}");
    }
    // A 4-D latent is one frame, and comes out 4-D.
    let t = |name: &str| input(&b, &io, &format!("even.{name}"));
    let x4 = t("x").reshape(&[1, 16, 8, 8]).expect("4-D");
    let out = model.forward(b.as_ref(), &x4, &io["even.t"].1, &t("context"), &[]).expect("4-D");
    assert_eq!(out.shape(), [1, 16, 8, 8]);
    assert_close("JoyAI Image Edit 4-D", &b.to_f32(&out).expect("read"), &io["even.out"].1, 1e-4);
}

#[test]
fn one_sample_references_and_text_serve_the_batch() {
    let (b, manager) = cpu(64 << 20);
    let model = load(&manager, &fixture("joyimage/weights.safetensors"), "");
    let io = read_tensors("joyimage/io.safetensors");
    let t = |name: &str| input(&b, &io, &format!("ref2.{name}"));
    let (x, timesteps) = (t("x"), &io["ref2.t"].1);
    let first = |x: &Tensor<Cpu>| b.slice(x, 0, 0, 1).expect("first");
    let twice = |x: &Tensor<Cpu>| b.concat(&[x, x], 0).expect("repeated");
    let one_refs: Vec<Tensor<Cpu>> = refs(&b, &io, "ref2").iter().map(first).collect();
    let two_refs: Vec<Tensor<Cpu>> = one_refs.iter().map(twice).collect();
    let context = first(&t("context"));
    let one = model.forward(b.as_ref(), &x, timesteps, &context, &one_refs).expect("forward");
    let two =
        model.forward(b.as_ref(), &x, timesteps, &twice(&context), &two_refs).expect("forward");
    assert_eq!(b.to_f32(&one).expect("read"), b.to_f32(&two).expect("read"));
    // 4-D references are one frame each.
    let four: Vec<Tensor<Cpu>> = two_refs
        .iter()
        .map(|r| {
            let s = r.shape();
            r.reshape(&[s[0], s[1], s[3], s[4]]).expect("4-D")
        })
        .collect();
    let out = model.forward(b.as_ref(), &x, timesteps, &twice(&context), &four).expect("4-D refs");
    assert_eq!(b.to_f32(&out).expect("read"), b.to_f32(&two).expect("read"));
}

#[test]
fn loads_under_comfyuis_checkpoint_prefix() {
    let (b, manager) = cpu(64 << 20);
    let prefixed: Io = read_tensors("joyimage/weights.safetensors")
        .into_iter()
        .map(|(name, t)| (format!("model.diffusion_model.{name}"), t))
        .collect();
    let file = TempTensors::new("joyimage-prefixed", prefixed);
    let names: Vec<String> = {
        let sf = SafetensorsFile::open(&file.0).expect("open");
        sf.tensors().map(|(name, _)| name.to_owned()).collect()
    };
    let prefix = kiln_models::header::diffusion_prefix(names.iter().map(String::as_str));
    assert_eq!(prefix, "model.diffusion_model.");
    let model = load(&manager, &file.0, &prefix);
    let io = read_tensors("joyimage/io.safetensors");
    check_case(&b, &model, &io, "odd");
}

/// The released model (jd-opensource/JoyAI-Image, `joyai_image_comfyui/configs/transformer/config.json`:
/// hidden 4096, 32 heads, 40 layers, text 4096), its weight list as ComfyUI's class builds it.
#[test]
fn detects_the_released_model() {
    let cases = json("joyimage/cases.json");
    let released = &cases["released"];
    let shapes: Vec<(String, Vec<usize>)> = released["shapes"]
        .as_object()
        .expect("shapes")
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::from_value(v.clone()).expect("a shape")))
        .collect();
    let dir = scratch_dir("joyimage", "released");
    let found = detect_header_only(&dir, "joyimage.safetensors", &shapes, joyimage::detect);
    std::fs::remove_dir_all(&dir).ok();
    let want = Config {
        hidden: 4096,
        channels: 16,
        layers: 40,
        heads: 32,
        head_dim: 128,
        mlp_dim: 16384,
        text_dim: 4096,
        patch: [1, 2, 2],
        axes: [16, 56, 56],
    };
    assert_eq!(found.expect("detect"), Some(want.clone()));
    // ComfyUI's detection reads the same sizes (its text width is fixed at 4096, its RoPE axes at 16, 56, 56).
    let comfy = &released["detect_unet_config"];
    let n = |k: &str| comfy[k].as_u64().expect(k) as usize;
    assert_eq!(
        (
            n("in_channels"),
            n("hidden_size"),
            n("num_layers"),
            n("num_attention_heads"),
            n("text_dim")
        ),
        (want.channels, want.hidden, want.layers, want.heads, want.text_dim)
    );
    let patch: Vec<usize> = serde_json::from_value(comfy["patch_size"].clone()).expect("patch");
    assert_eq!(patch, want.patch);
    let axes: Vec<usize> =
        serde_json::from_value(released["kwargs"]["rope_dim_list"].clone()).expect("axes");
    assert_eq!(axes, want.axes);
    // Kiln's weight list is ComfyUI's, and the tiny file's.
    let mut ours = joyimage::expected(&want);
    let mut theirs = shapes;
    ours.sort();
    theirs.sort();
    assert_eq!(ours, theirs);
    let tiny_names: Vec<String> =
        read_tensors("joyimage/weights.safetensors").into_keys().collect();
    let mut ours: Vec<String> = joyimage::expected(&tiny()).into_iter().map(|(n, _)| n).collect();
    ours.sort();
    assert_eq!(ours, tiny_names);
}

#[test]
fn refuses_other_files_and_misshapen_ones() {
    let dir = scratch_dir("joyimage", "refuses");
    // HunyuanVideo's double blocks: not JoyAI Image Edit.
    let other = vec![
        ("double_blocks.0.img_attn.qkv.weight".to_owned(), vec![384, 128]),
        ("img_in.proj.weight".to_owned(), vec![128, 16, 1, 2, 2]),
    ];
    let found = detect_header_only(&dir, "other.safetensors", &other, joyimage::detect);
    assert!(matches!(found, Ok(None)), "{found:?}");
    // The markers with a 2-D img_in (ComfyUI's test fails too): not JoyAI Image Edit.
    let mut shapes = joyimage::expected(&tiny());
    for (name, shape) in &mut shapes {
        if name == joyimage::IMG_IN {
            *shape = vec![128, 64];
        }
    }
    let found = detect_header_only(&dir, "flat.safetensors", &shapes, joyimage::detect);
    assert!(matches!(found, Ok(None)), "{found:?}");
    // Heads whose width does not split into the RoPE's axes.
    let mut shapes = joyimage::expected(&tiny());
    for (name, shape) in &mut shapes {
        if name.ends_with("_norm.weight") {
            *shape = vec![16];
        }
    }
    let err = detect_header_only(&dir, "heads.safetensors", &shapes, joyimage::detect)
        .expect_err("16-wide heads");
    assert!(err.to_string().contains("16-wide heads"), "{err}");
    // A truncated file: a block weight missing.
    let shapes: Vec<_> = joyimage::expected(&tiny())
        .into_iter()
        .filter(|(n, _)| n != "double_blocks.1.txt_mlp.net.2.weight")
        .collect();
    let err = detect_header_only(&dir, "missing.safetensors", &shapes, joyimage::detect)
        .expect_err("a missing weight");
    assert!(err.to_string().contains("double_blocks.1.txt_mlp.net.2.weight"), "{err}");
    // A gap in the blocks.
    let shapes: Vec<_> = joyimage::expected(&tiny())
        .into_iter()
        .map(|(n, s)| (n.replace("double_blocks.1.", "double_blocks.2."), s))
        .collect();
    let err =
        detect_header_only(&dir, "gap.safetensors", &shapes, joyimage::detect).expect_err("a gap");
    assert!(err.to_string().contains("double_blocks.2."), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn refuses_misshapen_inputs() {
    let (b, manager) = cpu(64 << 20);
    let model = load(&manager, &fixture("joyimage/weights.safetensors"), "");
    let io = read_tensors("joyimage/io.safetensors");
    let t = |name: &str| input(&b, &io, &format!("even.{name}"));
    let (x, context, timesteps) = (t("x"), t("context"), &io["even.t"].1);
    let run = |x: &Tensor<Cpu>, timesteps: &[f32], context: &Tensor<Cpu>, refs: &[Tensor<Cpu>]| {
        model
            .forward(b.as_ref(), x, timesteps, context, refs)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let narrow = b.slice(&context, 2, 0, 32).expect("narrow");
    let msg = run(&x, timesteps, &narrow, &[]).expect_err("32-wide text");
    assert!(msg.contains("64") && msg.contains("joyimage"), "{msg}");
    let msg =
        run(&b.slice(&x, 1, 0, 4).expect("4"), timesteps, &context, &[]).expect_err("channels");
    assert!(msg.contains("16 channels"), "{msg}");
    let msg = run(&x, &[500.0, 500.0], &context, &[]).expect_err("2 timesteps");
    assert!(msg.contains("2 timesteps"), "{msg}");
    let flat = x.reshape(&[16, 64]).expect("2-D");
    assert!(run(&flat, timesteps, &context, &[]).is_err(), "a 2-D latent");
    let reference = b.slice(&x, 1, 0, 8).expect("8 channels");
    let msg = run(&x, timesteps, &context, &[reference]).expect_err("reference channels");
    assert!(msg.contains("reference latent"), "{msg}");
}
