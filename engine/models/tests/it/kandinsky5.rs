//! Kandinsky 5 against ComfyUI 0f1fa67a (`scripts/reference/kandinsky5.py` and `kandinsky5_video.py`, fixtures in
//! `fixtures/kandinsky5/` and `fixtures/kandinsky5_video/`; diffusers' `Kandinsky5Transformer3DModel` and
//! transformers' Qwen2.5-VL and CLIP agree with it there): the Lite image model's DiT on a square and a batched
//! non-square latent, its RoPE in the video models' settings (fractional positions), the video models' DiT through
//! ComfyUI's model_base (text to video, image to video with `time_dim_replace` and the mask, a batch, odd sides),
//! detection of the released image and video files' shapes, and the text encoders (Qwen2.5-VL's last layer without
//! the final norm over Kandinsky 5's template, CLIP-L's pooled vector) as `DualCLIPLoader` type `kandinsky5_image`
//! combines them.

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend, DType};
use kiln_models::Header;
use kiln_models::family::{
    DiffusionDetected, DiffusionFamily, KANDINSKY5_IMAGE_CLIP_TYPE, PromptTokens, Qwen25Role,
    TextEncoderDetected, TextEncoderFamily, TextEncoderNet,
};
use kiln_models::kandinsky5::{self, Kandinsky5, Kandinsky5Input};
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
    assert_eq!(
        (config.is_video(), config.concat_channels(), config.rope_scale),
        (false, 0, [1.0; 3])
    );
    let image = Kandinsky5::new(config, weights);
    let video = video_rope_model(&manager);
    let io = read_tensors("kandinsky5/dit_io.safetensors");
    for (case, model) in [("a", &image), ("b", &image), ("video_rope", &video)] {
        let t = |name: &str| &io[&format!("{case}.{name}")];
        let tensor = |name: &str| b.from_f32(&t(name).0, &t(name).1, DType::F32).expect(name);
        let (x, context, pooled) = (tensor("x"), tensor("context"), tensor("y"));
        let input = Kandinsky5Input {
            x: &x,
            timesteps: &t("t").1,
            context: &context,
            pooled: &pooled,
            time_dim_replace: None,
        };
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
/// models' RoPE axes (16, 24, 24), and given their scale (1, 2, 2), which Kiln's detection gives only a file whose
/// patch embedding reads the video models' joined channels.
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

/// The video fixture's DiT, detected and loaded (`kandinsky5_video/dit.safetensors`).
fn video_model(manager: &std::sync::Arc<kiln_compute::memory::MemoryManager>) -> Kandinsky5 {
    let file = SafetensorsFile::open(fixture("kandinsky5_video/dit.safetensors")).expect("open");
    let header = Header::new(&file, "");
    let config = kandinsky5::detect(&header).expect("detect").expect("Kandinsky 5");
    let weights =
        manager.load(&kandinsky5::load_plan(&header, &config), &mut |_, _| {}).expect("load");
    Kandinsky5::new(config, weights)
}

#[test]
fn video_dit_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let model = video_model(&manager);
    let config = &model.config;
    assert!(config.is_video());
    assert_eq!(
        (config.dim, config.head_dim, config.heads(), config.axes),
        (128, 64, 2, [16, 24, 24])
    );
    assert_eq!((config.channels, config.concat_channels(), config.in_channels()), (16, 17, 33));
    assert_eq!(
        (config.rope_scale, config.text_blocks, config.visual_blocks),
        ([1.0, 2.0, 2.0], 1, 2)
    );
    let cases = json("kandinsky5_video/dit_cases.json");
    let io = read_tensors("kandinsky5_video/dit_io.safetensors");
    for case in ["t2v", "i2v", "batch", "odd"] {
        let t = |name: &str| &io[&format!("{case}.{name}")];
        let tensor = |name: &str| b.from_f32(&t(name).0, &t(name).1, DType::F32).expect(name);
        let (x, context, pooled) = (tensor("x"), tensor("context"), tensor("y"));
        let replace = io
            .contains_key(&format!("{case}.time_dim_replace"))
            .then(|| tensor("time_dim_replace"));
        assert_eq!(
            replace.is_some(),
            cases["cases"][case]["start_images"].as_u64() != Some(0),
            "{case}"
        );
        // ComfyUI returns odd sides padded (its apply_model then fails); Kiln crops them off.
        let want = io.get(&format!("{case}.out_cropped")).unwrap_or_else(|| t("out"));
        let run = |replace: Option<&kiln_compute::Tensor<kiln_compute::backend::cpu::Cpu>>| {
            let input = Kandinsky5Input {
                x: &x,
                timesteps: &t("t").1,
                context: &context,
                pooled: &pooled,
                time_dim_replace: replace,
            };
            model.forward(b.as_ref(), &input).expect("forward")
        };
        let out = run(replace.as_ref());
        assert_eq!(out.shape(), want.0.as_slice(), "{case}");
        let what = format!("Kandinsky 5 video {case}");
        assert_close(&what, &b.to_f32(&out).expect("read"), &want.1, 1e-4);
        if let Some(replace) = &replace
            && replace.dim(0).expect("batch") > 1
        {
            // One start latent serves the whole batch (ComfyUI's conds repeat it; its model broadcasts it).
            let first = b.slice(replace, 0, 0, 1).expect("first");
            let out = run(Some(&first));
            assert_close(
                &format!("{what}, batch-1 replacement"),
                &b.to_f32(&out).expect("read"),
                &want.1,
                1e-4,
            );
        }
    }
}

#[test]
fn video_dit_refuses_misshapen_inputs() {
    let (b, manager) = cpu(64 << 20);
    let model = video_model(&manager);
    let io = read_tensors("kandinsky5_video/dit_io.safetensors");
    let t = |name: &str| &io[&format!("i2v.{name}")];
    let tensor = |name: &str| b.from_f32(&t(name).0, &t(name).1, DType::F32).expect(name);
    let (x, context, pooled) = (tensor("x"), tensor("context"), tensor("y"));
    let forward =
        |x: &kiln_compute::Tensor<kiln_compute::backend::cpu::Cpu>,
         replace: Option<&kiln_compute::Tensor<kiln_compute::backend::cpu::Cpu>>| {
            let input = Kandinsky5Input {
                x,
                timesteps: &t("t").1,
                context: &context,
                pooled: &pooled,
                time_dim_replace: replace,
            };
            model.forward(b.as_ref(), &input).map(|_| ()).map_err(|e| e.to_string())
        };
    // The latent alone, without the joined channels.
    let latent = b.slice(&x, 1, 0, 16).expect("latent");
    let msg = forward(&latent, None).expect_err("16 channels");
    assert!(msg.contains("33 channels") && msg.contains("concat_cond"), "{msg}");
    // More clean frames than the input has, and a replacement of other sides.
    let replace = tensor("time_dim_replace");
    let too_long = b.concat(&[&replace, &replace, &replace, &replace], 2).expect("4 frames");
    let msg = forward(&x, Some(&too_long)).expect_err("4 of 3 frames");
    assert!(msg.contains("time_dim_replace"), "{msg}");
    let narrow = b.slice(&replace, 4, 0, 4).expect("narrower");
    assert!(forward(&x, Some(&narrow)).expect_err("narrower").contains("time_dim_replace"));
}

/// The config `shapes` (a released file's tensor shapes, from the fixture's `released`) detect as.
fn detect_shapes(
    name: &str,
    shapes: &[(String, Vec<usize>)],
) -> kiln_models::Result<Option<kandinsky5::Config>> {
    let dir = std::env::temp_dir().join(format!("kiln-kandinsky5-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join(format!("{name}.safetensors"));
    write_header_only(&path, shapes);
    let file = SafetensorsFile::open(&path).expect("open");
    let found = kandinsky5::detect(&Header::new(&file, ""));
    std::fs::remove_dir_all(&dir).ok();
    found
}

/// The `released` entry `name` of the video fixture's cases: ComfyUI's Kandinsky5 built with the released kwargs.
fn released_shapes(cases: &serde_json::Value, name: &str) -> Vec<(String, Vec<usize>)> {
    let shapes = cases["released"][name]["shapes"].as_object().expect("shapes");
    shapes
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::from_value(v.clone()).expect("a shape")))
        .collect()
}

#[test]
fn detects_the_released_image_and_video_models() {
    let cases = json("kandinsky5_video/dit_cases.json");
    let lite = |dim, ff_dim, visual_blocks, head_dim, axes, rope_scale, video| kandinsky5::Config {
        dim,
        time_dim: 512,
        ff_dim,
        text_dim: 3584,
        pooled_dim: 768,
        channels: 16,
        text_blocks: 2,
        visual_blocks,
        head_dim,
        axes,
        rope_scale,
        video,
    };
    // kandinsky5lite_t2v_sft_5s and kandinsky5lite_i2v_5s (the same shapes): ComfyUI's Kandinsky5 (video).
    let video =
        detect_shapes("lite-video", &released_shapes(&cases, "lite_video")).expect("detect");
    let want = lite(1792, 7168, 32, 64, [16, 24, 24], [1.0, 2.0, 2.0], true);
    assert_eq!(video.as_ref(), Some(&want));
    assert_eq!(cases["released"]["lite_video"]["model_config"], "Kandinsky5");
    assert_eq!(
        cases["released"]["lite_video"]["rope_scale_factor"],
        serde_json::json!([1.0, 2.0, 2.0])
    );
    assert_eq!((want.heads(), want.concat_channels(), want.in_channels()), (28, 17, 33));
    // kandinsky5lite_t2i: ComfyUI's Kandinsky5Image, detected as before.
    let image =
        detect_shapes("lite-image", &released_shapes(&cases, "lite_image")).expect("detect");
    let want = lite(2560, 10240, 50, 128, [32, 48, 48], [1.0; 3], false);
    assert_eq!(image.as_ref(), Some(&want));
    assert_eq!(cases["released"]["lite_image"]["model_config"], "Kandinsky5Image");
    assert_eq!((want.heads(), want.concat_channels(), want.in_channels()), (20, 0, 16));
    // Kiln's own weight list is ComfyUI's for both.
    for (name, config) in [("lite_video", video), ("lite_image", image)] {
        let mut ours = kandinsky5::expected(&config.expect("a config"));
        let mut comfy = released_shapes(&cases, name);
        ours.sort();
        comfy.sort();
        assert_eq!(ours, comfy, "{name}");
    }
    // The tiny synthetic image model still detects as the image model.
    let tiny = ZImageTurboSet::tiny().kandinsky5;
    let found = detect_shapes("tiny-image", &kandinsky5::expected(&tiny)).expect("detect");
    assert_eq!(found, Some(tiny));
    // ComfyUI's RoPE scale at model_dim 4096 (Pro) on both sides of h·w = 14080, and at 1792.
    for at in cases["pro_rope"].as_array().expect("pro_rope") {
        let n = |k: &str| at[k].as_u64().expect(k) as usize;
        let config = kandinsky5::Config { dim: n("model_dim"), ..want.clone() };
        let config = kandinsky5::Config { rope_scale: [1.0, 2.0, 2.0], video: true, ..config };
        let scale: [f64; 3] = serde_json::from_value(at["scale"].clone()).expect("scale");
        assert_eq!(config.rope_scale_at(n("h"), n("w")), scale, "{at}");
    }
}

#[test]
fn refuses_the_editing_model_and_other_patch_widths() {
    let cases = json("kandinsky5_video/dit_cases.json");
    let with_patch_width = |features: usize| -> Vec<(String, Vec<usize>)> {
        released_shapes(&cases, "lite_image")
            .into_iter()
            .map(|(name, shape)| match name.as_str() {
                "visual_embeddings.in_layer.weight" => (name, vec![2560, features]),
                _ => (name, shape),
            })
            .collect()
    };
    // The image editing model: 2560 wide like the image model, with an image latent and a mask joined.
    let err = detect_shapes("edit", &with_patch_width(132)).expect_err("the editing model");
    let msg = err.to_string();
    assert!(msg.contains("image editing model") && msg.contains("132 features"), "{msg}");
    let err = detect_shapes("odd-patch", &with_patch_width(100)).expect_err("100 features");
    let msg = err.to_string();
    assert!(msg.contains("100 features") && msg.contains("64") && msg.contains("132"), "{msg}");
}
