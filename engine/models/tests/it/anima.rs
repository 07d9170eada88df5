//! Anima against ComfyUI 0f1fa67a (`scripts/reference/anima.py`, fixtures in `fixtures/anima/`; diffusers'
//! `CosmosTransformer3DModel`, an independent adapter and transformers' `Qwen3Model` agree with it there): the LLM
//! adapter on two prompts' T5 tokens, the Cosmos Predict2 DiT on an even, a batched non-square and an odd-sided
//! latent (the first on the adapter's output), the released head's RoPE table, and the text encoder (Qwen3's last
//! state of the prompt as it is, the T5 tokens beside it).

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend, DType};
use kiln_models::Header;
use kiln_models::anima::{Anima, AnimaInput, LlliteCall, LlliteTarget, rope_angles};
use kiln_models::family::{
    DiffusionDetected, DiffusionFamily, ModelPatchDetected, ModelPatchNet, PromptTokens,
    TextEncoderDetected, TextEncoderFamily,
};

use crate::common::{assert_close, cpu, fixture, ids, json, read_tensors, tiled_table};

/// The tiny DiT, detected and loaded.
fn dit(manager: &std::sync::Arc<kiln_compute::memory::MemoryManager>) -> Anima {
    let file = tiled_table("anima/dit.safetensors", "llm_adapter.embed.weight", 32_128);
    let safetensors = SafetensorsFile::open(&file.0).expect("open");
    let header = Header::new(&safetensors, "");
    let detected = DiffusionDetected::detect(&header).expect("detect").expect("a DiT");
    assert_eq!(detected.family(), DiffusionFamily::Anima);
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).expect("load");
    let DiffusionDetected::Anima(config) = detected else { panic!("not Anima") };
    assert_eq!((config.dim, config.head_dim, config.blocks), (128, 64, 2));
    assert_eq!((config.context_dim, config.adaln_lora_dim, config.mlp_dim), (64, 32, 512));
    let adapter = &config.adapter;
    assert_eq!(
        (adapter.vocab, adapter.model_dim, adapter.head_dim, adapter.layers),
        (32_128, 64, 32, 2)
    );
    Anima::new(config, weights)
}

#[test]
fn adapter_and_dit_match_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let model = dit(&manager);
    let io = read_tensors("anima/dit_io.safetensors");
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).expect(name);
    for case in ["adapter_a", "adapter_b"] {
        let t = |name: &str| &io[&format!("{case}.{name}")];
        let source = tensor(&format!("{case}.source"));
        let ids: Vec<u32> = t("ids").1.iter().map(|&id| id as u32).collect();
        let out = model.adapt(b.as_ref(), &source, &ids, &t("weights").1).expect("adapt");
        assert_eq!(out.shape(), t("out").0.as_slice(), "{case}");
        assert_close(case, &b.to_f32(&out).expect("read"), &t("out").1, 1e-4);
    }
    for case in ["a", "b", "c"] {
        let t = |name: &str| &io[&format!("{case}.{name}")];
        let (x, context) = (tensor(&format!("{case}.x")), tensor(&format!("{case}.context")));
        let input = AnimaInput { x: &x, timesteps: &t("t").1, context: &context, lllite: &[] };
        let out = model.forward(b.as_ref(), &input).expect("forward");
        assert_eq!(out.shape(), t("out").0.as_slice(), "{case}");
        assert_close(&format!("Anima {case}"), &b.to_f32(&out).expect("read"), &t("out").1, 1e-4);
    }
    // A 4-D image latent is the same as one frame.
    let x = &io["a.x"];
    let flat = b.from_f32(&[1, 16, 8, 8], &x.1, DType::F32).expect("x");
    let context = tensor("a.context");
    let out = model.forward(
        b.as_ref(),
        &AnimaInput { x: &flat, timesteps: &io["a.t"].1, context: &context, lllite: &[] },
    );
    let out = out.expect("forward");
    assert_eq!(out.shape(), [1, 16, 8, 8]);
    assert_close("Anima 4-D", &b.to_f32(&out).expect("read"), &io["a.out"].1, 1e-4);
}

#[test]
fn the_released_heads_rope_is_comfyuis() {
    // ComfyUI's `VideoRopePosition3DEmb` at head width 128, ratios (t 1, h 4, w 4), on 2 × 3 × 5 tokens:
    // [tokens, 64, 2, 2] rotation matrices [[cos, −sin], [sin, cos]].
    let (shape, table) = &read_tensors("anima/dit_io.safetensors")["rope128.table"];
    assert_eq!(shape, &[30, 64, 2, 2]);
    let angles = rope_angles(128, [1.0, 4.0, 4.0], (2, 3, 5));
    let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
    let want_cos: Vec<f32> = table.chunks(4).map(|m| m[0]).collect();
    let want_sin: Vec<f32> = table.chunks(4).map(|m| m[2]).collect();
    assert_close("RoPE cos", &cos, &want_cos, 1e-5);
    assert_close("RoPE sin", &sin, &want_sin, 1e-5);
}

#[test]
fn text_encoder_matches_comfyui() {
    let file = tiled_table("anima/te.safetensors", "model.embed_tokens.weight", 151_936);
    let (b, manager) = cpu(256 << 20);
    let safetensors = SafetensorsFile::open(&file.0).expect("open");
    let header = Header::new(&safetensors, "");
    let Some(TextEncoderDetected::Qwen3(config)) =
        TextEncoderDetected::detect(&header).expect("detect")
    else {
        panic!("not a Qwen3")
    };
    // ComfyUI tells Anima's encoder by Qwen3 0.6B's width (1024); the tiny one is 64 wide.
    let found = TextEncoderDetected::Anima(config);
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).expect("load");
    let net = found.build(weights).expect("build");
    assert_eq!(net.family(), TextEncoderFamily::Anima);

    let cases = json("anima/te_cases.json");
    let io = read_tensors("anima/te_io.safetensors");
    for case in ["cat", "weighted", "empty"] {
        let want = &cases["cases"][case];
        let tokens = net.tokenize(want["prompt"].as_str().expect("prompt")).expect("tokenize");
        let PromptTokens::Anima(got) = &tokens else { panic!("Anima tokens") };
        assert_eq!(got.qwen, ids(&want["qwen3_06b"]), "{case}");
        let t5_ids: Vec<u32> = got.t5.iter().map(|&(id, _)| id).collect();
        assert_eq!(t5_ids, ids(&want["t5xxl"]["ids"]), "{case}");
        let t5_weights: Vec<f32> = got.t5.iter().map(|&(_, w)| w).collect();
        assert_close(
            &format!("{case} weights"),
            &t5_weights,
            &io[&format!("{case}.t5xxl_weights")].1,
            1e-6,
        );

        let encoded = net.encode(b.as_ref(), &tokens).expect("encode");
        let cond = &io[&format!("{case}.cond")];
        assert_eq!(encoded.cond.shape(), cond.0.as_slice(), "{case}");
        assert_close(
            &format!("{case} cond"),
            &b.to_f32(&encoded.cond).expect("read"),
            &cond.1,
            1e-4,
        );
        assert!(encoded.pooled.is_none());
        assert_eq!(encoded.t5_tokens.as_ref(), Some(&got.t5), "{case}");
    }
}

#[test]
fn a_qwen3_of_06bs_width_is_animas_encoder_whatever_the_type() {
    let mut config = kiln_models::qwen3::Config {
        vocab: 151_936,
        hidden: 1024,
        layers: 28,
        heads: 16,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 3072,
        rms_eps: 1e-6,
        rope_theta: 1e6,
        variant: kiln_models::qwen3::Variant::Qwen3,
    };
    for kind in ["stable_diffusion", "flux2", "ovis", "anima"] {
        let found = TextEncoderDetected::Qwen3(config).for_clip_type(kind).expect(kind);
        assert_eq!(found.family(), TextEncoderFamily::Anima, "{kind}");
    }
    config.hidden = 2560;
    let found = TextEncoderDetected::Qwen3(config).for_clip_type("stable_diffusion").expect("4B");
    assert_eq!(found.family(), TextEncoderFamily::Qwen3);
}

#[test]
fn a_turbo_style_lora_adapts_every_blocks_attention() {
    use kiln_models::synth::{self, SynthDtype, SynthFamily, ZImageTurboSet};
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("anima-lora");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let set = ZImageTurboSet::tiny();
    let (model_path, lora_path) = (dir.join("anima.safetensors"), dir.join("lora.safetensors"));
    for (path, family) in [
        (&model_path, SynthFamily::Diffusion(DiffusionFamily::Anima)),
        (&lora_path, SynthFamily::Lora(DiffusionFamily::Anima)),
    ] {
        synth::write_family(path, family, &set, SynthDtype::F32, 5, &mut |_, _| {}).expect("synth");
    }
    let (b, manager) = cpu(256 << 20);
    let (_, net) = crate::wan::load_on(&manager, &model_path);
    let slots: Vec<(&str, &[usize])> =
        net.weights().names().map(|n| (n, net.weights().info(n).expect("a slot").1)).collect();
    let lora = SafetensorsFile::open(&lora_path).expect("lora");
    let patches = net.lora(&lora, &slots, 1.0).expect("patches");
    assert!(patches.unmatched.is_empty(), "{:?}", patches.unmatched);
    assert_eq!(patches.patches.len(), set.anima.blocks * 4);

    let x = b.from_f32(&[1, 16, 1, 4, 4], &vec![0.5; 256], DType::F32).expect("x");
    let context = b.from_f32(&[1, 512, 64], &vec![0.25; 512 * 64], DType::F32).expect("context");
    let forward = || {
        let kiln_models::family::DiffusionNet::Anima(model) = &net else { panic!("Anima") };
        let input = AnimaInput { x: &x, timesteps: &[0.5], context: &context, lllite: &[] };
        b.to_f32(&model.forward(b.as_ref(), &input).expect("forward")).expect("read")
    };
    let plain = forward();
    net.weights().set_patches(patches.patches).expect("patches set");
    let patched = forward();
    assert!(
        plain.iter().zip(&patched).any(|(p, q)| (p - q).abs() > 1e-3),
        "the LoRA changed nothing"
    );
}

/// The LLLite file `name` of `fixtures/anima_lllite/`, detected and loaded.
fn lllite(
    manager: &std::sync::Arc<kiln_compute::memory::MemoryManager>,
    name: &str,
) -> ModelPatchNet {
    let file =
        SafetensorsFile::open(fixture(&format!("anima_lllite/{name}.safetensors"))).expect("open");
    let header = Header::new(&file, "");
    let detected = ModelPatchDetected::detect(&header).expect("detect").expect("a model patch");
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).expect("load");
    let net = detected.build(weights);
    assert_eq!(net.family(), DiffusionFamily::Anima);
    net
}

#[test]
fn lllite_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let model = dit(&manager);
    let (ModelPatchNet::AnimaLllite(control), ModelPatchNet::AnimaLllite(inpaint)) =
        (lllite(&manager, "control"), lllite(&manager, "inpaint"))
    else {
        panic!("not Anima LLLites")
    };
    assert_eq!(
        (control.config.cond_in_channels, &control.config.aspp_dilations[..]),
        (3, &[1, 2, 4, 8][..])
    );
    assert_eq!(control.config.modules.len(), 8, "two modules left out");
    assert!(!control.has(1, LlliteTarget::SelfV) && control.has(1, LlliteTarget::SelfK));
    assert_eq!((inpaint.config.cond_in_channels, inpaint.config.inpaint_masked_input), (4, true));
    assert!(inpaint.config.aspp_dilations.is_empty() && inpaint.config.resblocks == 0);

    let io = read_tensors("anima_lllite/io.safetensors");
    let cases = json("anima_lllite/cases.json");
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).expect(name);
    // The conditioning CNN alone.
    let cond = control.embed(b.as_ref(), &tensor("cond_control.image")).expect("embed");
    assert_close("LLLite CNN", &b.to_f32(&cond).expect("read"), &io["cond_control.out"].1, 1e-4);

    // The inpainting kind without a mask reads its image unmasked and a mask channel of −1 (zeros as ±1).
    let nomask = {
        let (shape, pixels) = &io["inpaint_a.cond_image"];
        let plane = shape[2] * shape[3];
        let mut values =
            io["inpaint_a.image"].1.chunks(3).fold(vec![Vec::new(); 3], |mut planes, p| {
                (0..3).for_each(|c| planes[c].push(p[c] * 2.0 - 1.0));
                planes
            });
        values.push(vec![-1.0; plane]);
        assert_eq!(pixels.len(), 4 * plane);
        b.from_f32(shape, &values.concat(), DType::F32).expect("pixels")
    };
    for (case, net, pixels, inputs) in [
        ("control_a", &control, Some(tensor("control_a.cond_image")), "control_a"),
        ("control_off", &control, None, "control_a"),
        ("control_b2", &control, Some(tensor("control_a.cond_image")), "control_b2"),
        ("inpaint_a", &inpaint, Some(tensor("inpaint_a.cond_image")), "inpaint_a"),
        ("inpaint_nomask", &inpaint, Some(nomask.clone()), "inpaint_a"),
        ("inpaint_resize", &inpaint, Some(tensor("inpaint_resize.cond_image")), "inpaint_a"),
    ] {
        let strength = cases["cases"][case]["strength"].as_f64().expect("strength") as f32;
        let calls: Vec<LlliteCall<'_, _>> = pixels
            .iter()
            .map(|p| LlliteCall { net, cond: net.embed(b.as_ref(), p).expect("embed"), strength })
            .collect();
        if let Some(call) = calls.first()
            && let Some(want) = io.get(&format!("{case}.cond_emb"))
        {
            assert_close(
                &format!("{case} embedding"),
                &b.to_f32(&call.cond).expect("read"),
                &want.1,
                1e-4,
            );
        }
        let (x, context) = (tensor(&format!("{inputs}.x")), tensor(&format!("{inputs}.context")));
        let input = AnimaInput {
            x: &x,
            timesteps: &io[&format!("{inputs}.t")].1,
            context: &context,
            lllite: &calls,
        };
        let out = model.forward(b.as_ref(), &input).expect("forward");
        let want = &io[&format!("{case}.out")];
        assert_eq!(out.shape(), want.0.as_slice(), "{case}");
        assert_close(&format!("LLLite {case}"), &b.to_f32(&out).expect("read"), &want.1, 1e-4);
    }
}
