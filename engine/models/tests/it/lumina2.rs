//! Lumina Image 2.0 against ComfyUI 0f1fa67a (`scripts/reference/lumina2.py`, fixtures in `fixtures/lumina2/`;
//! diffusers' `Lumina2Transformer2DModel` and transformers' `Gemma2Model` agree with it there): the NextDiT in
//! its Lumina 2 configuration (grouped-query attention, SiLU before the adaLN, time scale 1) on three latents,
//! the model sampling, and Gemma 2 2B's conditioning with ComfyUI's tokenizer on six prompts.

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend, DType};
use kiln_models::Header;
use kiln_models::family::{
    DiffusionDetected, DiffusionFamily, PromptTokens, TextEncoderDetected, TextEncoderFamily,
};
use kiln_models::gemma2::{self, Gemma2File};
use kiln_models::qwen3;
use kiln_models::sampling::FlowSampling;
use kiln_models::zimage::{self, Layout, Variant, ZImage};

use crate::common::{
    TempTensors, assert_close, cpu, fixture, ids, json, read_tensors, write_header_only,
};

#[test]
fn dit_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture("lumina2/dit.safetensors")).expect("open");
    let header = Header::new(&file, "");
    // Head width 16 splits into no three equal even axes (Kiln's detection splits Lumina 2's heads in thirds, as
    // released: 96 → 32 each): detection names the problem, and the test builds the reference's config, four heads
    // of 16 over two key/value heads, RoPE axes (4, 6, 6).
    let err = DiffusionDetected::detect(&header).expect_err("16-wide heads");
    assert!(err.to_string().contains("RoPE axes"), "{err}");
    let config = zimage::Config {
        variant: Variant::Lumina2,
        dim: 64,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        layers: 2,
        noise_refiners: 2,
        context_refiners: 2,
        ffn_hidden: 256,
        cap_feat_dim: 32,
        t_freq_dim: 256,
        t_hidden: 64,
        adaln_dim: 64,
        axes_dims: [4, 6, 6],
        rope_theta: 10_000.0,
        pad_multiple: 1,
        norm_eps: 1e-5,
        qk_norm_eps: f32::EPSILON,
        patch_size: 2,
        in_channels: 16,
        time_scale: 1.0,
        allow_fp16: false,
    };
    let detected = DiffusionDetected::ZImage(config.clone(), Layout::Comfy);
    assert_eq!(detected.family(), DiffusionFamily::Lumina2);
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).expect("load");
    let model = ZImage::new(config, weights);
    let io = read_tensors("lumina2/dit_io.safetensors");
    for case in ["a", "b", "c"] {
        let t = |name: &str| &io[&format!("{case}.{name}")];
        let tensor = |name: &str| b.from_f32(&t(name).0, &t(name).1, DType::F32).expect(name);
        let (x, context) = (tensor("x"), tensor("context"));
        let out = model.forward(b.as_ref(), &x, &t("timestep").1, &context).expect("forward");
        assert_eq!(out.shape(), t("out").0.as_slice(), "{case}");
        let got = b.to_f32(&out).expect("read");
        assert_close(&format!("Lumina 2 {case}"), &got, &t("out").1, 1e-4);
        // ComfyUI's CONST flow: denoised = x − out·σ, one σ per sample.
        let per_sample = got.len() / t("sigma").1.len();
        let denoised: Vec<f32> = got
            .iter()
            .zip(&t("x").1)
            .enumerate()
            .map(|(i, (o, x))| x - o * t("sigma").1[i / per_sample])
            .collect();
        assert_close(&format!("Lumina 2 {case} denoised"), &denoised, &t("denoised").1, 1e-4);
    }
}

#[test]
fn sampling_is_comfyuis_lumina2() {
    let cases = json("lumina2/dit_cases.json");
    let sampling = &cases["sampling"];
    assert_eq!(sampling["shift"].as_f64(), Some(6.0));
    let family = DiffusionFamily::Lumina2.sampling();
    let want = FlowSampling::new(6.0, 1.0).into();
    assert_eq!(family, want);
    assert_eq!(DiffusionFamily::Lumina2.latent(), DiffusionFamily::ZImage.latent());
}

/// The reference's tiny Gemma 2: four heads of 16 over two key/value heads (Kiln's detection takes Gemma 2's
/// heads to be 256 wide, as released).
pub(crate) const TINY_GEMMA: qwen3::Config = qwen3::Config {
    vocab: 600,
    hidden: 32,
    layers: 3,
    heads: 4,
    kv_heads: 2,
    head_dim: 16,
    intermediate: 64,
    rms_eps: 1e-6,
    rope_theta: 10_000.0,
    variant: qwen3::Variant::Gemma2,
};

#[test]
fn text_encoder_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture("lumina2/te.safetensors")).expect("open");
    let header = Header::new(&file, "");
    // 64 q_proj rows are no whole 256-wide head: detection names the layout.
    let err = TextEncoderDetected::detect(&header).expect_err("16-wide heads");
    assert!(err.to_string().contains("Gemma 2"), "{err}");
    let found = TextEncoderDetected::Gemma2(Gemma2File::of(&header, TINY_GEMMA));
    assert_eq!(found.family(), TextEncoderFamily::Gemma2);
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).expect("load");
    let found = found.for_clip_type("lumina2").expect("lumina2");
    let net = found.build(weights).expect("build");

    let cases = json("lumina2/te_cases.json");
    let io = read_tensors("lumina2/te_io.safetensors");
    for case in ["netayume", "empty", "weighted", "end_of_turn", "newlines", "node_superior"] {
        let want = &cases["cases"][case];
        let prompt = want["prompt"].as_str().expect("prompt");
        let tokens = net.tokenize(prompt).expect("tokenize");
        let PromptTokens::Weighted(sections) = &tokens else { panic!("weighted sections") };
        let [section] = sections.as_slice() else { panic!("{case}: one section") };
        let got_ids: Vec<u32> = section.iter().map(|&(id, _)| id).collect();
        assert_eq!(got_ids, ids(&want["ids"]), "{case}");
        let want_weights: Vec<f64> =
            serde_json::from_value(want["weights"].clone()).expect("weights");
        for (&(_, got), want) in section.iter().zip(&want_weights) {
            assert!((f64::from(got) - want).abs() < 1e-6, "{case}: weight {got} for {want}");
        }
        let encoded = net.encode(b.as_ref(), &tokens).expect("encode");
        assert!(encoded.pooled.is_none());
        let cond = &io[&format!("{case}.cond")];
        assert_eq!(encoded.cond.shape(), cond.0.as_slice(), "{case}");
        let got = b.to_f32(&encoded.cond).expect("read");
        assert_close(&format!("Gemma 2 {case}"), &got, &cond.1, 1e-4);
    }
}

#[test]
fn end_of_turn_costs_the_prompt_its_first_token_as_in_comfyui() {
    let file = SafetensorsFile::open(fixture("lumina2/te.safetensors")).expect("open");
    let header = Header::new(&file, "");
    let tokenizer = Gemma2File::of(&header, TINY_GEMMA).tokenizer().expect("tokenizer");
    let plain = tokenizer.word_ids("a cat").expect("ids");
    let marked = tokenizer.word_ids("a cat<end_of_turn>").expect("ids");
    assert_eq!(marked[..marked.len() - 1], plain[1..]);
    assert_eq!(marked.last(), Some(&gemma2::END_OF_TURN));
    assert_eq!(gemma2::attended_keys(&[gemma2::START, 0, 0]), 1);
    assert_eq!(gemma2::attended_keys(&[gemma2::START, 5]), 2);
}

#[test]
fn a_file_without_its_tokenizer_is_refused_by_name() {
    let file = SafetensorsFile::open(fixture("lumina2/te.safetensors")).expect("open");
    let header = Header::new(&file, "");
    let gemma = Gemma2File {
        spiece_keys: vec!["nothing".to_owned()],
        ..Gemma2File::of(&header, TINY_GEMMA)
    };
    let err = gemma.tokenizer().expect_err("no SentencePiece model");
    assert!(err.to_string().contains("spiece_model"), "{err}");
}

#[test]
fn released_shapes_detect_as_comfyuis_lumina2() {
    // ComfyUI's `model_detection.py` for dim 2304: 24 heads over 8 key/value heads, axes (32, 32, 32), θ 10000,
    // FFN multiplier 4, no pad tokens; Lumina2's sampling: time scale 1 (the class default).
    let config = kiln_models::synth::ZImageTurboSet::real().lumina2;
    let shapes = zimage::expected(&config);
    let file = header_only("lumina2-released", &shapes);
    let safetensors = SafetensorsFile::open(&file.0).expect("open");
    let Some(DiffusionDetected::ZImage(found, Layout::Comfy)) =
        DiffusionDetected::detect(&Header::new(&safetensors, "")).expect("detect")
    else {
        panic!("not a NextDiT")
    };
    assert_eq!(found.variant, Variant::Lumina2);
    assert_eq!((found.dim, found.heads, found.kv_heads, found.head_dim), (2304, 24, 8, 96));
    assert_eq!((found.layers, found.noise_refiners, found.context_refiners), (26, 2, 2));
    assert_eq!((found.axes_dims, found.rope_theta, found.time_scale), ([32; 3], 10_000.0, 1.0));
    assert_eq!((found.ffn_hidden, found.cap_feat_dim, found.pad_multiple), (9216, 2304, 1));
    assert_eq!((found.t_hidden, found.adaln_dim), (1024, 1024));
    assert!(!found.allow_fp16);
}

#[test]
fn gemma3_is_refused_by_name_not_taken_for_qwen3() {
    // Gemma 3 4B's layer 0: Gemma 2's sandwich norms and q/k norms, 2560 wide like Qwen3-4B.
    let mut shapes = vec![("model.embed_tokens.weight".to_owned(), vec![262_208, 2560])];
    for (name, shape) in [
        ("input_layernorm", vec![2560]),
        ("post_attention_layernorm", vec![2560]),
        ("pre_feedforward_layernorm", vec![2560]),
        ("post_feedforward_layernorm", vec![2560]),
        ("self_attn.q_proj", vec![2048, 2560]),
        ("self_attn.k_proj", vec![1024, 2560]),
        ("self_attn.v_proj", vec![1024, 2560]),
        ("self_attn.o_proj", vec![2560, 2048]),
        ("self_attn.q_norm", vec![256]),
        ("self_attn.k_norm", vec![256]),
    ] {
        shapes.push((format!("model.layers.0.{name}.weight"), shape));
    }
    let file = header_only("gemma3", &shapes);
    let safetensors = SafetensorsFile::open(&file.0).expect("open");
    let err = TextEncoderDetected::detect(&Header::new(&safetensors, "")).expect_err("Gemma 3");
    assert!(err.to_string().contains("Gemma 3"), "{err}");
}

/// A scratch file of `shapes` whose tensors are sparse zeros (only the header is read).
fn header_only(name: &str, shapes: &[(String, Vec<usize>)]) -> TempTensors {
    let path = std::env::temp_dir().join(format!("kiln-{name}-{}.safetensors", std::process::id()));
    write_header_only(&path, shapes);
    TempTensors(path)
}
