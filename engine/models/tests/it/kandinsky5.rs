//! Kandinsky 5 against ComfyUI 0f1fa67a (`scripts/reference/kandinsky5.py`, fixtures in `fixtures/kandinsky5/`;
//! diffusers' `Kandinsky5Transformer3DModel` and transformers' Qwen2.5-VL and CLIP agree with it there): the Lite
//! image model's DiT on a square and a batched non-square latent, its RoPE in the video models' settings (fractional
//! positions), and the text encoders (Qwen2.5-VL's last layer without the final norm over Kandinsky 5's template,
//! CLIP-L's pooled vector) as `DualCLIPLoader` type `kandinsky5_image` combines them.

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend, DType};
use kiln_models::Header;
use kiln_models::family::{
    DiffusionDetected, DiffusionFamily, KANDINSKY5_IMAGE_CLIP_TYPE, PromptTokens, Qwen25Role,
    TextEncoderDetected, TextEncoderFamily, TextEncoderNet,
};
use kiln_models::kandinsky5::{Kandinsky5, Kandinsky5Input};
use kiln_models::{clip_text, qwen3};

use kiln_models::synth::ZImageTurboSet;

use crate::common::{
    TempTensors, assert_close, cpu, fixture, ids, json, read_tensors, tiled_table,
    write_header_only,
};

#[test]
fn dit_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture("kandinsky5/dit.safetensors")).expect("open");
    let header = Header::new(&file, "");
    let detected = DiffusionDetected::detect(&header).expect("detect").expect("a DiT");
    assert_eq!(detected.family(), DiffusionFamily::Kandinsky5);
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).expect("load");
    let DiffusionDetected::Kandinsky5(config) = detected else { panic!("not Kandinsky 5") };
    assert_eq!((config.dim, config.head_dim, config.axes), (128, 128, [32, 48, 48]));
    assert_eq!((config.text_blocks, config.visual_blocks), (1, 2));
    let image = Kandinsky5::new(config, weights);
    let video = video_rope_model(&manager);
    let io = read_tensors("kandinsky5/dit_io.safetensors");
    for (case, model) in [("a", &image), ("b", &image), ("video_rope", &video)] {
        let t = |name: &str| &io[&format!("{case}.{name}")];
        let tensor = |name: &str| b.from_f32(&t(name).0, &t(name).1, DType::F32).expect(name);
        let (x, context, pooled) = (tensor("x"), tensor("context"), tensor("y"));
        let input =
            Kandinsky5Input { x: &x, timesteps: &t("t").1, context: &context, pooled: &pooled };
        let out = model.forward(b.as_ref(), &input).expect("forward");
        assert_eq!(out.shape(), t("out").0.as_slice(), "{case}");
        assert_close(
            &format!("Kandinsky 5 {case}"),
            &b.to_f32(&out).expect("read"),
            &t("out").1,
            1e-4,
        );
    }
}

/// The same weights with the q/k norm gains 64 wide (`dit_video_norms.safetensors`): detected with the video
/// models' RoPE axes (16, 24, 24), and given their scale (1, 2, 2), which Kiln's detection keeps for the video
/// models it refuses.
fn video_rope_model(manager: &std::sync::Arc<kiln_compute::memory::MemoryManager>) -> Kandinsky5 {
    let mut tensors = read_tensors("kandinsky5/dit.safetensors");
    tensors.extend(read_tensors("kandinsky5/dit_video_norms.safetensors"));
    let file = TempTensors::new("kandinsky5-video-rope", tensors);
    let safetensors = SafetensorsFile::open(&file.0).expect("open");
    let header = Header::new(&safetensors, "");
    let Some(DiffusionDetected::Kandinsky5(config)) =
        DiffusionDetected::detect(&header).expect("detect")
    else {
        panic!("not Kandinsky 5")
    };
    assert_eq!((config.head_dim, config.axes), (64, [16, 24, 24]));
    let plan = DiffusionDetected::Kandinsky5(config.clone()).load_plan(&header);
    let weights = manager.load(&plan, &mut |_, _| {}).expect("load");
    Kandinsky5::new(
        kiln_models::kandinsky5::Config { rope_scale: [1.0, 2.0, 2.0], ..config },
        weights,
    )
}

/// The reference's tiny Qwen2.5-VL language model (ComfyUI's `Qwen25_7BVLI_Config` narrowed; eps and θ as
/// released).
const TINY_QWEN: qwen3::Config = qwen3::Config {
    vocab: 152_064,
    hidden: 64,
    layers: 2,
    heads: 2,
    kv_heads: 1,
    head_dim: 32,
    intermediate: 128,
    rms_eps: 1e-6,
    rope_theta: 1e6,
    variant: qwen3::Variant::Qwen25Vl,
};

#[test]
fn text_encoders_match_comfyui() {
    let (b, manager) = cpu(256 << 20);
    let qwen = tiled_table("kandinsky5/te_qwen.safetensors", "model.embed_tokens.weight", 152_064);
    let clip = tiled_table(
        "kandinsky5/te_clip_l.safetensors",
        "text_model.embeddings.token_embedding.weight",
        49_408,
    );
    let files = [
        SafetensorsFile::open(&qwen.0).expect("qwen"),
        SafetensorsFile::open(&clip.0).expect("clip"),
    ];
    // Kiln's detection takes Qwen2.5-VL's heads to be 128 wide, as released; the tiny one's are 32 wide.
    let tiny_qwen = TextEncoderDetected::Qwen25Vl(TINY_QWEN, None, Qwen25Role::QwenImage);
    let clip_header = Header::new(&files[1], "");
    // Kiln's detection takes CLIP's heads to be 64 wide, as released; the tiny one has two of 32.
    let Some(TextEncoderDetected::ClipL(clip_config)) =
        TextEncoderDetected::detect(&clip_header).expect("detect")
    else {
        panic!("not CLIP-L")
    };
    let clip_l =
        TextEncoderDetected::ClipL(clip_text::Config { heads: 2, head_dim: 32, ..clip_config });
    let mut parts = Vec::new();
    for (found, header) in [(tiny_qwen, Header::new(&files[0], "")), (clip_l, clip_header)] {
        let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).expect("load");
        parts.push((found, weights));
    }
    let families: Vec<TextEncoderFamily> = parts.iter().map(|(d, _)| d.family()).collect();
    assert_eq!(families, [TextEncoderFamily::Qwen25Vl, TextEncoderFamily::ClipL]);
    let net = TextEncoderNet::combine(parts, KANDINSKY5_IMAGE_CLIP_TYPE).expect("combine");
    assert_eq!(net.family(), TextEncoderFamily::Kandinsky5);

    let cases = json("kandinsky5/te_cases.json");
    let io = read_tensors("kandinsky5/te_io.safetensors");
    for case in ["cat", "empty", "long", "weighted"] {
        let want = &cases["cases"][case];
        let prompt = want["prompt"].as_str().expect("prompt");
        // The bundled tokenizers lay the prompt out as ComfyUI's Kandinsky5TokenizerImage does.
        let tokens = net.tokenize(prompt).expect("tokenize");
        let PromptTokens::Kandinsky5(got) = &tokens else { panic!("Kandinsky 5 tokens") };
        assert_eq!(got.qwen, ids(&want["qwen25_7b"]), "{case}");
        let sections: Vec<Vec<u32>> =
            got.clip_l.iter().map(|s| s.iter().map(|&(id, _)| id).collect()).collect();
        let weights: Vec<Vec<f64>> =
            got.clip_l.iter().map(|s| s.iter().map(|&(_, w)| f64::from(w)).collect()).collect();
        let want_sections: Vec<Vec<u32>> =
            want["l"]["ids"].as_array().expect("sections").iter().map(ids).collect();
        assert_eq!(sections, want_sections, "{case}");
        let want_weights: Vec<Vec<f64>> =
            serde_json::from_value(want["l"]["weights"].clone()).expect("weights");
        for (got, want) in weights.iter().flatten().zip(want_weights.iter().flatten()) {
            assert!((got - want).abs() < 1e-6, "{case}: weight {got} for {want}");
        }

        let encoded = net.encode(b.as_ref(), &tokens).expect("encode");
        let (cond, pooled) = (&io[&format!("{case}.cond")], &io[&format!("{case}.pooled")]);
        assert_eq!(encoded.cond.shape(), cond.0.as_slice(), "{case}");
        assert_close(
            &format!("{case} cond"),
            &b.to_f32(&encoded.cond).expect("read"),
            &cond.1,
            1e-4,
        );
        let got_pooled = encoded.pooled.expect("a pooled vector");
        assert_eq!(got_pooled.shape(), pooled.0.as_slice(), "{case}");
        assert_close(
            &format!("{case} pooled"),
            &b.to_f32(&got_pooled).expect("read"),
            &pooled.1,
            1e-4,
        );
    }
    // The video models' template (DualCLIPLoader type `kandinsky5`).
    let tokenizer = qwen3::Tokenizer::bundled().expect("tokenizer");
    let video = tokenizer.kandinsky5_prompt("a photo of a cat", true).expect("video ids");
    assert_eq!(video, ids(&cases["cases"]["cat"]["video_qwen_ids"]));
}

#[test]
fn refuses_what_is_not_kandinsky5s_pair() {
    let clip = tiled_table(
        "kandinsky5/te_clip_l.safetensors",
        "text_model.embeddings.token_embedding.weight",
        49_408,
    );
    let file = SafetensorsFile::open(&clip.0).expect("clip");
    let found =
        TextEncoderDetected::detect(&Header::new(&file, "")).expect("detect").expect("CLIP-L");
    let err = TextEncoderNet::check_combination(&[&found, &found], KANDINSKY5_IMAGE_CLIP_TYPE)
        .expect_err("two CLIP-Ls");
    let msg = err.to_string();
    assert!(msg.contains("Qwen2.5-VL 7B and a CLIP-L") && msg.contains("CLIP-L + CLIP-L"), "{msg}");
}

#[test]
fn refuses_the_video_models_by_name() {
    let dir = std::env::temp_dir().join(format!("kiln-kandinsky5-video-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("kandinsky5lite_t2v.safetensors");
    let config = ZImageTurboSet::tiny().kandinsky5;
    // The video models join an image latent and a mask to the latent: 33 channels a frame, 132 features a patch.
    let shapes: Vec<(String, Vec<usize>)> = kiln_models::kandinsky5::expected(&config)
        .into_iter()
        .map(|(name, shape)| match name.as_str() {
            "visual_embeddings.in_layer.weight" => (name, vec![config.dim, 132]),
            _ => (name, shape),
        })
        .collect();
    write_header_only(&path, &shapes);
    let file = SafetensorsFile::open(&path).expect("open");
    let err = DiffusionDetected::detect(&Header::new(&file, "")).expect_err("a video model");
    let msg = err.to_string();
    assert!(msg.contains("the video and editing models") && msg.contains("text-to-image"), "{msg}");
    std::fs::remove_dir_all(&dir).ok();
}
