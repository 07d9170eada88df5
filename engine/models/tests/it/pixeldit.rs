//! PixelDiT's text-to-image DiT against ComfyUI 0f1fa67a (`scripts/reference/pixeldit.py`, fixtures in
//! `fixtures/pixeldit/`): a tiny `PixDiT_T2I` (2 patch and 2 pixel blocks, patch 4) in the released layout, run by
//! ComfyUI after its own `process_unet_state_dict`, on images whose sides are and are not multiples of the patch
//! (one patch alone included), one- and two-sample batches, text of 1 to 7 tokens and of 11 (cut to 8), and
//! `rope_options`; the same file in ComfyUI's processed layout and under `model.diffusion_model.`, the pixel
//! blocks in tiles, a one-sample conditioning repeated to the batch; detection of the released model's weights,
//! and refusals.

use std::path::Path;
use std::sync::Arc;

use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::{MemoryManager, SafetensorsFile};
use kiln_compute::{Backend, Tensor};
use kiln_models::pixeldit::{self, Config, Layout, PixelDit};
use kiln_models::{Header, RopeOptions};

use crate::common::{
    Io, TempTensors, assert_close, cpu, detect_header_only, fixture, input, json, read_tensors,
    relative_error, rope_options, scratch_dir,
};

/// The fixture model's config (scripts/reference/pixeldit.py's `KWARGS`, as Kiln derives them).
fn tiny(layout: Layout) -> Config {
    Config {
        layout,
        hidden: 64,
        heads: 4,
        head_dim: 16,
        ffn_dim: 170,
        patch_depth: 2,
        pixel_depth: 2,
        patch: 4,
        pixel_dim: 8,
        pixel_mlp: 32,
        attn_dim: 32,
        attn_heads: 2,
        attn_head_dim: 16,
        text_dim: 48,
        text_max: 8,
    }
}

/// The model of `path`, its keys under `prefix`: detected, its config checked against `want`, loaded.
fn load(manager: &Arc<MemoryManager>, path: &Path, prefix: &str, want: &Config) -> PixelDit {
    let file = SafetensorsFile::open(path).expect("open");
    let header = Header::new(&file, prefix);
    let found = pixeldit::detect(&header).expect("detect").expect("PixelDiT");
    assert_eq!(&found, want);
    let weights =
        manager.load(&pixeldit::load_plan(&header, &found), &mut |_, _| {}).expect("load");
    PixelDit::new(found, weights)
}

/// The fixture model, as released.
fn load_tiny(manager: &Arc<MemoryManager>) -> PixelDit {
    load(manager, &fixture("pixeldit/tiny.safetensors"), "", &tiny(Layout::Released))
}

/// Case `case`'s output against `{case}.out` (within 1e-4 relative); its max relative error.
fn check_case(b: &Cpu, model: &PixelDit, io: &Io, case: &str, rope: &RopeOptions) -> f32 {
    let t = |name: &str| input(b, io, &format!("{case}.{name}"));
    let timesteps = &io[&format!("{case}.t")].1;
    let out = model.forward_with_rope(b, &t("x"), timesteps, &t("context"), rope).expect("forward");
    let want = &io[&format!("{case}.out")];
    assert_eq!(out.shape(), want.0.as_slice(), "{case}");
    let got = b.to_f32(&out).expect("read");
    assert_close(&format!("PixelDiT {case}"), &got, &want.1, 1e-4);
    relative_error(&got, &want.1)
}

#[test]
fn dit_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let model = load_tiny(&manager);
    let io = read_tensors("pixeldit/io.safetensors");
    let cases = json("pixeldit/cases.json");
    let cases = cases["cases"].as_object().expect("cases");
    assert_eq!(cases.len(), 7);
    for (case, spec) in cases {
        let err = check_case(&b, &model, &io, case, &rope_options(&spec["rope_options"]));
        eprintln!("PixelDiT {case}: max relative error {err:.2e}");
    }
    // `forward` is the identity RoPE's.
    let t = |name: &str| input(&b, &io, &format!("one.{name}"));
    let out = model.forward(b.as_ref(), &t("x"), &io["one.t"].1, &t("context")).expect("forward");
    assert_close("PixelDiT forward", &b.to_f32(&out).expect("read"), &io["one.out"].1, 1e-4);
}

#[test]
fn pixel_tiles_change_no_value() {
    let (b, manager) = cpu(64 << 20);
    let io = read_tensors("pixeldit/io.safetensors");
    // "batch": 2 × 2 × 3 patches, in tiles of 5 (the last short) and of 1.
    for tile in [5, 1] {
        let model = load_tiny(&manager).with_pixel_tile(tile);
        let err = check_case(&b, &model, &io, "batch", &RopeOptions::default());
        eprintln!("PixelDiT batch in tiles of {tile}: max relative error {err:.2e}");
    }
}

#[test]
fn one_sample_text_serves_the_batch() {
    let (b, manager) = cpu(64 << 20);
    let model = load_tiny(&manager);
    let io = read_tensors("pixeldit/io.safetensors");
    let t = |name: &str| input(&b, &io, &format!("batch.{name}"));
    let (x, timesteps) = (t("x"), &io["batch.t"].1);
    let one = b.slice(&t("context"), 0, 0, 1).expect("first");
    let two = b.concat(&[&one, &one], 0).expect("repeated");
    let a = model.forward(b.as_ref(), &x, timesteps, &one).expect("forward");
    let c = model.forward(b.as_ref(), &x, timesteps, &two).expect("forward");
    assert_eq!(b.to_f32(&a).expect("read"), b.to_f32(&c).expect("read"));
}

#[test]
fn loads_under_comfyuis_checkpoint_prefix() {
    let (b, manager) = cpu(64 << 20);
    let prefixed: Io = read_tensors("pixeldit/tiny.safetensors")
        .into_iter()
        .map(|(name, t)| (format!("model.diffusion_model.{name}"), t))
        .collect();
    let file = TempTensors::new("pixeldit-prefixed", prefixed);
    let names: Vec<String> = {
        let sf = SafetensorsFile::open(&file.0).expect("open");
        sf.tensors().map(|(name, _)| name.to_owned()).collect()
    };
    let prefix = kiln_models::header::diffusion_prefix(names.iter().map(String::as_str));
    assert_eq!(prefix, "model.diffusion_model.");
    let model = load(&manager, &file.0, &prefix, &tiny(Layout::Released));
    let io = read_tensors("pixeldit/io.safetensors");
    check_case(&b, &model, &io, "odd", &RopeOptions::default());
}

/// The fixture in ComfyUI's processed layout (what `process_unet_state_dict` makes of it): `core.` dropped, each
/// pixel block's modulation split per pixel into its attention's chunks and its MLP's.
fn processed(pixel_dim: usize) -> Io {
    let mut out = Io::new();
    for (name, (shape, values)) in read_tensors("pixeldit/tiny.safetensors") {
        let name = name.strip_prefix("core.").expect("the released layout").to_owned();
        let Some((base, suffix)) = name.split_once(".adaLN_modulation.0.") else {
            out.insert(name, (shape, values));
            continue;
        };
        if !base.starts_with("pixel_blocks.") {
            out.insert(name, (shape, values));
            continue;
        }
        // Rows (pixel, 6, pixel_dim), each `row` values long.
        let row = values.len() / shape[0];
        let run = 3 * pixel_dim * row;
        let (mut msa, mut mlp) = (Vec::new(), Vec::new());
        for pixel in values.chunks_exact(2 * run) {
            msa.extend_from_slice(&pixel[..run]);
            mlp.extend_from_slice(&pixel[run..]);
        }
        let mut half = shape.clone();
        half[0] /= 2;
        out.insert(format!("{base}.adaLN_modulation_msa.{suffix}"), (half.clone(), msa));
        out.insert(format!("{base}.adaLN_modulation_mlp.{suffix}"), (half, mlp));
    }
    out
}

#[test]
fn loads_comfyuis_processed_layout() {
    let (b, manager) = cpu(64 << 20);
    let file = TempTensors::new("pixeldit-processed", processed(8));
    let io = read_tensors("pixeldit/io.safetensors");
    for (case, tile) in [("batch_odd", 0), ("long", 0), ("batch", 5)] {
        let model = load(&manager, &file.0, "", &tiny(Layout::Comfy)).with_pixel_tile(tile);
        let err = check_case(&b, &model, &io, case, &RopeOptions::default());
        eprintln!("PixelDiT processed layout, {case} (tile {tile}): max relative error {err:.2e}");
    }
}

/// The released model: `PixDiT_T2I()` with the class defaults (what ComfyUI's detection always builds), its
/// weight list in the released layout recorded by the reference script.
#[test]
fn detects_the_released_model() {
    let cases = json("pixeldit/cases.json");
    let released = &cases["released"];
    let shapes: Vec<(String, Vec<usize>)> = released["shapes"]
        .as_object()
        .expect("shapes")
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::from_value(v.clone()).expect("a shape")))
        .collect();
    let dir = scratch_dir("pixeldit", "released");
    let found = detect_header_only(&dir, "pixeldit.safetensors", &shapes, pixeldit::detect);
    std::fs::remove_dir_all(&dir).ok();
    let want = Config {
        layout: Layout::Released,
        hidden: 1536,
        heads: 24,
        head_dim: 64,
        ffn_dim: 4096,
        patch_depth: 14,
        pixel_depth: 2,
        patch: 16,
        pixel_dim: 16,
        pixel_mlp: 64,
        attn_dim: 1152,
        attn_heads: 16,
        attn_head_dim: 72,
        text_dim: 2304,
        text_max: 300,
    };
    assert_eq!(found.expect("detect"), Some(want.clone()));
    assert_eq!(released["detect_unet_config"]["image_model"], "pixeldit_t2i");
    // Kiln's weight list is ComfyUI's, and the tiny file's.
    let mut ours = pixeldit::expected(&want);
    let mut theirs = shapes;
    ours.sort();
    theirs.sort();
    assert_eq!(ours, theirs);
    let names: Vec<String> = read_tensors("pixeldit/tiny.safetensors").into_keys().collect();
    let mut ours: Vec<String> =
        pixeldit::expected(&tiny(Layout::Released)).into_iter().map(|(n, _)| n).collect();
    ours.sort();
    assert_eq!(ours, names);
}

#[test]
fn refuses_other_files_and_misshapen_ones() {
    let dir = scratch_dir("pixeldit", "refuses");
    let detect = |file: &str, shapes: &[(String, Vec<usize>)]| {
        detect_header_only(&dir, file, shapes, pixeldit::detect)
    };
    let released = || pixeldit::expected(&tiny(Layout::Released));
    // PiD (its LQ branch beside the same body): ComfyUI's detection takes it first, so it is not PixelDiT.
    let mut pid = released();
    pid.push(("lq_proj.latent_proj.0.weight".to_owned(), vec![512, 16, 3, 3]));
    let found = detect("pid.safetensors", &pid);
    assert!(matches!(found, Ok(None)), "{found:?}");
    // Another DiT.
    let other = vec![
        ("layers.0.feed_forward.w2.weight".to_owned(), vec![128, 256]),
        ("x_embedder.weight".to_owned(), vec![128, 64]),
    ];
    let found = detect("other.safetensors", &other);
    assert!(matches!(found, Ok(None)), "{found:?}");
    // A patch embedding that is not 3 · p² wide.
    let shapes: Vec<_> = released()
        .into_iter()
        .map(|(n, s)| if n == "core.s_embedder.proj.weight" { (n, vec![64, 50]) } else { (n, s) })
        .collect();
    let err = detect("patch.safetensors", &shapes).expect_err("a 50-feature patch");
    assert!(err.to_string().contains("50 features"), "{err}");
    // Heads whose width is not a multiple of 4 (the 2-D RoPE).
    let shapes: Vec<_> = released()
        .into_iter()
        .map(|(n, s)| if n.contains("q_norm_x") { (n, vec![6]) } else { (n, s) })
        .collect();
    let err = detect("heads.safetensors", &shapes).expect_err("6-wide heads");
    assert!(err.to_string().contains("6-wide heads"), "{err}");
    // A truncated file: a pixel block's modulation missing.
    let missing = "core.pixel_blocks.1.adaLN_modulation.0.weight";
    let shapes: Vec<_> = released().into_iter().filter(|(n, _)| n != missing).collect();
    let err = detect("missing.safetensors", &shapes).expect_err("a missing weight");
    assert!(err.to_string().contains(missing), "{err}");
    // A gap in the patch blocks.
    let shapes: Vec<_> = released()
        .into_iter()
        .map(|(n, s)| (n.replace("patch_blocks.1.", "patch_blocks.2."), s))
        .collect();
    let err = detect("gap.safetensors", &shapes).expect_err("a gap");
    assert!(err.to_string().contains("patch_blocks.2."), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn refuses_misshapen_inputs() {
    let (b, manager) = cpu(64 << 20);
    let model = load_tiny(&manager);
    let io = read_tensors("pixeldit/io.safetensors");
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
    let msg = run(&b.slice(&x, 1, 0, 1).expect("1"), timesteps, &context).expect_err("channels");
    assert!(msg.contains("3 channels"), "{msg}");
    let msg = run(&x, &[500.0, 500.0], &context).expect_err("2 timesteps");
    assert!(msg.contains("2 timesteps"), "{msg}");
    let two = b.concat(&[&context, &context, &context], 0).expect("3 texts");
    let msg = run(&x, timesteps, &two).expect_err("3 texts for 1 sample");
    assert!(msg.contains("[1 or 1"), "{msg}");
    let five = x.reshape(&[1, 3, 1, 8, 8]).expect("5-D");
    assert!(run(&five, timesteps, &context).is_err(), "a 5-D image");
}
