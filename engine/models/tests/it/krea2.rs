//! Krea 2 against ComfyUI 0f1fa67a (`scripts/reference/krea2.py`, fixtures in `fixtures/krea2/`; a plain-torch
//! restatement agrees with it there): the tiny `SingleStreamDiT`'s output on an even latent, an odd one (padding),
//! a batch of two timesteps, references under `index_timestep_zero` and `offset`, references without a method
//! (ignored), a one-frame 5-D latent and a file under `model.diffusion_model.`; detection of the tiny file and of
//! the released K2's shapes, and refusals.

use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::{MemoryManager, SafetensorsFile};
use kiln_compute::{Backend, Tensor};
use kiln_models::Header;
use kiln_models::krea2::{self, Config, Krea2};

use crate::common::{
    Io, TempTensors, assert_close, cpu, detect_header_only, fixture, input, json, read_tensors,
    scratch_dir,
};

/// The tiny fixture's config (scripts/reference/krea2.py's `DIT`, as Kiln derives it).
fn tiny() -> Config {
    Config {
        features: 256,
        channels: 16,
        layers: 2,
        heads: 2,
        kv_heads: 1,
        mlp_dim: 256,
        time_dim: 64,
        text_layers: 3,
        text_dim: 128,
        text_heads: 1,
        text_kv_heads: 1,
        text_mlp_dim: 128,
        axes: [32, 48, 48],
    }
}

/// The model of `path`, its keys under `prefix`: detected, its config checked, loaded.
fn load(manager: &std::sync::Arc<MemoryManager>, path: &std::path::Path, prefix: &str) -> Krea2 {
    let file = SafetensorsFile::open(path).expect("open");
    let header = Header::new(&file, prefix);
    let config = krea2::detect(&header).expect("detect").expect("Krea 2");
    assert_eq!(config, tiny());
    let weights = manager.load(&krea2::load_plan(&header, &config), &mut |_, _| {}).expect("load");
    Krea2::new(config, weights)
}

/// Case `case`'s output with the references `refs` of case `inputs` and `method`, against `{case}.out`.
fn check_case(b: &Cpu, model: &Krea2, io: &Io, case: &str, inputs: &str, method: Option<&str>) {
    let t = |name: &str| input(b, io, &format!("{inputs}.{name}"));
    let refs: Vec<Tensor<Cpu>> = (0..)
        .map(|i| format!("{inputs}.ref{i}"))
        .take_while(|name| io.contains_key(name))
        .map(|name| input(b, io, &name))
        .collect();
    let sigmas = &io[&format!("{inputs}.t")].1;
    let out = model
        .forward_with_references(b, &t("x"), sigmas, &t("context"), &refs, method)
        .expect("forward");
    let want = &io[&format!("{case}.out")];
    assert_eq!(out.shape(), want.0.as_slice(), "{case}");
    assert_close(&format!("Krea 2 {case}"), &b.to_f32(&out).expect("read"), &want.1, 1e-4);
}

#[test]
fn dit_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let model = load(&manager, &fixture("krea2/dit.safetensors"), "");
    let io = read_tensors("krea2/dit_io.safetensors");
    let cases = json("krea2/dit_cases.json");
    for case in ["t2i", "odd", "batch", "ref_tz", "ref_offset"] {
        let method = cases["cases"][case]["method"].as_str();
        check_case(&b, &model, &io, case, case, method);
    }
    assert_eq!(cases["cases"]["ref_tz"]["method"], krea2::INDEX_TIMESTEP_ZERO);
    // References without a method are ignored (ComfyUI's default_ref_method is None); "index" places them as
    // "offset" does.
    check_case(&b, &model, &io, "ref_ignored", "ref_offset", None);
    check_case(&b, &model, &io, "ref_offset", "ref_offset", Some("index"));
    // `forward` is the plain case.
    let t = |name: &str| input(&b, &io, &format!("t2i.{name}"));
    let out = model.forward(b.as_ref(), &t("x"), &io["t2i.t"].1, &t("context")).expect("forward");
    assert_close("Krea 2 forward", &b.to_f32(&out).expect("read"), &io["t2i.out"].1, 1e-4);
    // A latent with a frame axis of 1 comes out with it.
    let x5 = t("x").reshape(&[1, 16, 1, 8, 8]).expect("5-D");
    let out = model.forward(b.as_ref(), &x5, &io["t2i.t"].1, &t("context")).expect("forward 5-D");
    assert_eq!(out.shape(), [1, 16, 1, 8, 8]);
    assert_close("Krea 2 5-D", &b.to_f32(&out).expect("read"), &io["t2i.out"].1, 1e-4);
    // A one-sample conditioning serves the batch.
    let t = |name: &str| input(&b, &io, &format!("batch.{name}"));
    let context = b.slice(&t("context"), 0, 0, 1).expect("first");
    let both = b.concat(&[&context, &context], 0).expect("repeated");
    let one = model.forward(b.as_ref(), &t("x"), &io["batch.t"].1, &context).expect("forward");
    let two = model.forward(b.as_ref(), &t("x"), &io["batch.t"].1, &both).expect("forward");
    assert_eq!(b.to_f32(&one).expect("read"), b.to_f32(&two).expect("read"));
}

#[test]
fn loads_under_comfyuis_checkpoint_prefix() {
    let (b, manager) = cpu(64 << 20);
    let prefixed: Io = read_tensors("krea2/dit.safetensors")
        .into_iter()
        .map(|(name, t)| (format!("model.diffusion_model.{name}"), t))
        .collect();
    let file = TempTensors::new("krea2-prefixed", prefixed);
    let names: Vec<String> = {
        let sf = SafetensorsFile::open(&file.0).expect("open");
        sf.tensors().map(|(name, _)| name.to_owned()).collect()
    };
    let prefix = kiln_models::header::diffusion_prefix(names.iter().map(String::as_str));
    assert_eq!(prefix, "model.diffusion_model.");
    let model = load(&manager, &file.0, &prefix);
    let io = read_tensors("krea2/dit_io.safetensors");
    check_case(&b, &model, &io, "odd", "odd", None);
}

#[test]
fn detects_the_released_model() {
    let cases = json("krea2/dit_cases.json");
    let released = &cases["released"];
    let shapes: Vec<(String, Vec<usize>)> = released["shapes"]
        .as_object()
        .expect("shapes")
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::from_value(v.clone()).expect("a shape")))
        .collect();
    let dir = scratch_dir("krea2", "released");
    let found = detect_header_only(&dir, "k2.safetensors", &shapes, krea2::detect);
    std::fs::remove_dir_all(&dir).ok();
    let want = Config {
        features: 6144,
        channels: 16,
        layers: 28,
        heads: 48,
        kv_heads: 12,
        mlp_dim: 16384,
        time_dim: 256,
        text_layers: 12,
        text_dim: 2560,
        text_heads: 20,
        text_kv_heads: 20,
        text_mlp_dim: 6912,
        axes: [32, 48, 48],
    };
    assert_eq!(found.expect("detect"), Some(want.clone()));
    assert_eq!(want.context_dim(), 30720);
    // ComfyUI's detection reads the same sizes (its text heads are the class default, 20).
    let comfy = &released["detect_unet_config"];
    let n = |k: &str| comfy[k].as_u64().expect(k) as usize;
    assert_eq!(
        (n("features"), n("channels"), n("layers"), n("heads"), n("kvheads")),
        (want.features, want.channels, want.layers, want.heads, want.kv_heads)
    );
    assert_eq!((n("txtlayers"), n("txtdim")), (want.text_layers, want.text_dim));
    // Kiln's weight list is ComfyUI's.
    let mut ours = krea2::expected(&want);
    let mut theirs = shapes;
    ours.sort();
    theirs.sort();
    assert_eq!(ours, theirs);
    // And the tiny file's.
    let tiny_names: Vec<String> =
        read_tensors("krea2/dit.safetensors").into_keys().collect::<Vec<_>>();
    let mut ours: Vec<String> = krea2::expected(&tiny()).into_iter().map(|(n, _)| n).collect();
    ours.sort();
    assert_eq!(ours, tiny_names);
}

#[test]
fn refuses_other_files_and_misshapen_ones() {
    let dir = scratch_dir("krea2", "refuses");
    // Another family's DiT: not Krea 2.
    let other =
        vec![("txt_norm.weight".to_owned(), vec![64]), ("img_in.weight".to_owned(), vec![128, 64])];
    let found = detect_header_only(&dir, "other.safetensors", &other, krea2::detect);
    assert!(matches!(found, Ok(None)), "{found:?}");
    // Krea 2's marker with a query projection that is not whole 128-wide heads.
    let mut shapes = krea2::expected(&tiny());
    for (name, shape) in &mut shapes {
        if name == "blocks.0.attn.wq.weight" {
            *shape = vec![200, 256];
        }
    }
    let err = detect_header_only(&dir, "heads.safetensors", &shapes, krea2::detect)
        .expect_err("200-row queries");
    assert!(err.to_string().contains("128-wide heads"), "{err}");
    // A missing weight.
    let shapes: Vec<_> = krea2::expected(&tiny())
        .into_iter()
        .filter(|(n, _)| n != "blocks.1.mlp.up.weight")
        .collect();
    let err = detect_header_only(&dir, "missing.safetensors", &shapes, krea2::detect)
        .expect_err("a missing weight");
    assert!(err.to_string().contains("blocks.1.mlp.up.weight"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn refuses_misshapen_inputs() {
    let (b, manager) = cpu(64 << 20);
    let model = load(&manager, &fixture("krea2/dit.safetensors"), "");
    let io = read_tensors("krea2/dit_io.safetensors");
    let t = |name: &str| input(&b, &io, &format!("t2i.{name}"));
    let (x, context, sigmas) = (t("x"), t("context"), &io["t2i.t"].1);
    let run = |x: &Tensor<Cpu>, sigmas: &[f32], context: &Tensor<Cpu>, refs: &[Tensor<Cpu>]| {
        model
            .forward_with_references(b.as_ref(), x, sigmas, context, refs, Some("offset"))
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let narrow = b.slice(&context, 2, 0, 256).expect("narrow");
    let msg = run(&x, sigmas, &narrow, &[]).expect_err("256-wide text");
    assert!(msg.contains("384") && msg.contains("krea2"), "{msg}");
    let msg = run(&b.slice(&x, 1, 0, 4).expect("4"), sigmas, &context, &[]).expect_err("channels");
    assert!(msg.contains("16 channels"), "{msg}");
    let msg = run(&x, &[0.5, 0.5], &context, &[]).expect_err("2 timesteps");
    assert!(msg.contains("2 timesteps"), "{msg}");
    let frames = b.concat(&[&x, &x], 0).expect("two").reshape(&[1, 16, 2, 8, 8]).expect("5-D");
    assert!(run(&frames, sigmas, &context, &[]).is_err(), "two frames");
    let reference = b.slice(&x, 1, 0, 8).expect("8 channels");
    let msg = run(&x, sigmas, &context, &[reference]).expect_err("reference channels");
    assert!(msg.contains("reference latent"), "{msg}");
}

/// A LoRA under ComfyUI's diffusers names for Krea 2 (`krea2_to_diffusers`: bare, under `diffusion_model.`, with
/// `to_out` without its `.0`) adapts the weights they map to.
#[test]
fn loras_under_diffusers_names_adapt_their_weights() {
    let cfg = tiny();
    let slots = krea2::expected(&cfg);
    let view: Vec<(&str, &[usize])> =
        slots.iter().map(|(n, s)| (n.as_str(), s.as_slice())).collect();
    let pair = |stem: &str, out: usize, inp: usize| {
        [
            (format!("{stem}.lora_A.weight"), (vec![4, inp], vec![0.01; 4 * inp])),
            (format!("{stem}.lora_B.weight"), (vec![out, 4], vec![0.02; out * 4])),
        ]
    };
    let d = cfg.features;
    let tensors: Io = [
        pair("transformer_blocks.0.attn.to_q", d, d),
        pair("diffusion_model.transformer_blocks.1.attn.to_out", d, d),
        pair("transformer.transformer_blocks.0.ff.down", d, cfg.mlp_dim),
        pair("text_fusion.refiner_blocks.1.attn.to_gate", cfg.text_dim, cfg.text_dim),
        pair("time_mod_proj", 6 * d, d),
    ]
    .into_iter()
    .flatten()
    .collect();
    let file = crate::common::TempTensors::new("krea2-diffusers-lora", tensors);
    let lora = krea2::lora::patches(&SafetensorsFile::open(&file.0).unwrap(), &view, 1.0).unwrap();
    assert!(lora.unmatched.is_empty(), "{:?}", lora.unmatched);
    let mut adapted: Vec<&str> = lora.patches.iter().map(|(name, _)| name.as_str()).collect();
    adapted.sort_unstable();
    assert_eq!(
        adapted,
        [
            "blocks.0.attn.wq.weight",
            "blocks.0.mlp.down.weight",
            "blocks.1.attn.wo.weight",
            "tproj.1.weight",
            "txtfusion.refiner_blocks.1.attn.gate.weight",
        ]
    );
}
