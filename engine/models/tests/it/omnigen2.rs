//! OmniGen2's DiT against ComfyUI 0f1fa67a (`scripts/reference/omnigen2.py`, fixtures in `fixtures/omnigen2/`):
//! the tiny network on five latents with and without reference images (odd sides, a batch of two, references
//! repeated over the batch or one per sample), its family facts; Boogu-Image's DiT, the OmniGen2 variant with
//! double-stream blocks (`scripts/reference/boogu.py`, `fixtures/boogu/`), the same way on four latents, and its
//! family facts; detection on headers built from [`omnigen2::expected`] (widths from shapes for both variants,
//! the released ones included, a missing or misshapen tensor named, Boogu-Image told from OmniGen2); the forward
//! pass's batch and reference handling, for both.

use std::collections::BTreeMap;

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend, DType};
use kiln_models::Header;
use kiln_models::latent::LatentFormat;
use kiln_models::omnigen2::{self, OmniGen2, Variant, family};

use crate::common::{
    TempTensors, assert_close, cpu, fixture, json, read_tensors, write_header_only,
};

/// The reference's tiny OmniGen2: four heads of 16 over two key/value heads, RoPE axes (4, 6, 6) (Kiln's
/// detection splits a head in thirds, as released: 120 → 40 each, so 16 is refused and the test builds this).
fn reference_config() -> omnigen2::Config {
    omnigen2::Config {
        variant: Variant::OmniGen2,
        double_stream_layers: 0,
        hidden: 64,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        layers: 2,
        refiners: 2,
        ffn_hidden: 256,
        text_feat_dim: 32,
        t_freq_dim: 256,
        t_dim: 64,
        axes_dims: [4, 6, 6],
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        patch_size: 2,
        in_channels: 16,
        timestep_scale: 1000.0,
        max_references: 5,
    }
}

#[test]
fn dit_matches_comfyui() {
    matches_comfyui("omnigen2", reference_config(), &["a", "b", "c", "d", "e"]);
}

/// The reference's tiny Boogu-Image: [`reference_config`]'s widths (instruction width 32), 2 double-stream blocks
/// and 2 single-stream ones.
fn boogu_reference_config() -> omnigen2::Config {
    omnigen2::Config { variant: Variant::Boogu, double_stream_layers: 2, ..reference_config() }
}

#[test]
fn boogu_dit_matches_comfyui() {
    // b: odd sides, a batch of two; c: the text encoder's caption and one reference (odd width after the patch);
    // d: two references repeated over a batch of two.
    matches_comfyui("boogu", boogu_reference_config(), &["a", "b", "c", "d"]);
}

/// The tiny model of `config` in `fixtures/{dir}/dit.safetensors` (whose 16-wide heads detection refuses) on the
/// reference's `cases`: output and denoised within 1e-4. Case `d`'s references were repeated over the batch by
/// ComfyUI: Kiln gets them of batch 1.
fn matches_comfyui(dir: &str, config: omnigen2::Config, cases: &[&str]) {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture(&format!("{dir}/dit.safetensors"))).expect("open");
    let header = Header::new(&file, "");
    let err = omnigen2::detect(&header).expect_err("16-wide heads");
    assert!(err.to_string().contains("RoPE axes"), "{err}");
    let what = if config.is_boogu() { "Boogu-Image" } else { "OmniGen2" };
    let weights =
        manager.load(&omnigen2::load_plan(&header, &config), &mut |_, _| {}).expect("load");
    let model = OmniGen2::new(config, weights);
    let io = read_tensors(&format!("{dir}/dit_io.safetensors"));
    let b = b.as_ref();
    for &case in cases {
        let t = |name: &str| &io[&format!("{case}.{name}")];
        let tensor = |name: &str| b.from_f32(&t(name).0, &t(name).1, DType::F32).expect(name);
        let (x, context) = (tensor("x"), tensor("context"));
        let mut references: Vec<_> = (0..)
            .map_while(|j| {
                io.contains_key(&format!("{case}.ref.{j}")).then(|| tensor(&format!("ref.{j}")))
            })
            .collect();
        if case == "d" {
            // ComfyUI repeated one reference over the batch: Kiln repeats a batch of 1 itself.
            references = references.iter().map(|r| b.slice(r, 0, 0, 1).expect("slice")).collect();
        }
        let out = model.forward(b, &x, &t("timestep").1, &context, &references).expect("forward");
        assert_eq!(out.shape(), t("out").0.as_slice(), "{case}");
        let got = b.to_f32(&out).expect("read");
        assert_close(&format!("{what} {case}"), &got, &t("out").1, 1e-4);
        // ComfyUI's CONST flow: denoised = x − out·σ, one σ per sample.
        let per_sample = got.len() / t("sigma").1.len();
        let denoised: Vec<f32> = got
            .iter()
            .zip(&t("x").1)
            .enumerate()
            .map(|(i, (o, x))| x - o * t("sigma").1[i / per_sample])
            .collect();
        assert_close(&format!("{what} {case} denoised"), &denoised, &t("denoised").1, 1e-4);
    }
}

#[test]
fn family_facts_are_comfyuis() {
    let cases = json("omnigen2/dit_cases.json");
    assert_eq!(cases["sampling"]["shift"].as_f64(), Some(family::SHIFT));
    assert_eq!(cases["sampling"]["multiplier"].as_f64(), Some(family::MULTIPLIER));
    assert_eq!(cases["latent_format"]["class"].as_str(), Some("Flux"));
    assert_eq!(family::LATENT, LatentFormat::FLUX);
    assert_eq!(cases["dit_kwargs"]["timestep_scale"].as_f64(), Some(1000.0));
    assert_eq!(
        cases["comfy_detection"]["detect_unet_config"]["axes_dim_rope"],
        serde_json::json!([40, 40, 40])
    );
    assert_eq!(omnigen2::axes_dims(2520 / 21), Some([40, 40, 40]));
}

#[test]
fn boogu_family_facts_are_comfyuis() {
    let cases = json("boogu/dit_cases.json");
    assert_eq!(cases["sampling"]["shift"].as_f64(), Some(family::BOOGU_SHIFT));
    assert_eq!(cases["sampling"]["multiplier"].as_f64(), Some(family::MULTIPLIER));
    assert_eq!(cases["latent_format"]["class"].as_str(), Some("Flux"));
    assert_eq!(cases["dit_kwargs"]["timestep_scale"].as_f64(), Some(1000.0));
    // ComfyUI's boogu branch reads these from shapes: the tiny file's agree with the config the test builds.
    let detected = &cases["comfy_detection"]["detect_unet_config"];
    let config = boogu_reference_config();
    assert_eq!(detected["image_model"].as_str(), Some("boogu"));
    assert_eq!(detected["hidden_size"].as_u64(), Some(config.hidden as u64));
    assert_eq!(detected["num_layers"].as_u64(), Some(config.layers as u64));
    assert_eq!(
        detected["num_double_stream_layers"].as_u64(),
        Some(config.double_stream_layers as u64)
    );
    assert_eq!(detected["num_refiner_layers"].as_u64(), Some(config.refiners as u64));
    assert_eq!(detected["instruction_feat_dim"].as_u64(), Some(config.text_feat_dim as u64));
    assert_eq!(family::BOOGU_NAME, "Boogu-Image");
    assert_eq!(
        family::BOOGU_CHECKPOINT_TEXT_ENCODER_PREFIX,
        "text_encoders.qwen3vl_8b.transformer."
    );
}

/// A shrunken OmniGen2: two heads of 24 over one key/value head, RoPE axes (8, 8, 8).
fn tiny() -> omnigen2::Config {
    omnigen2::Config {
        variant: Variant::OmniGen2,
        double_stream_layers: 0,
        hidden: 48,
        heads: 2,
        kv_heads: 1,
        head_dim: 24,
        layers: 2,
        refiners: 1,
        ffn_hidden: 256,
        text_feat_dim: 32,
        t_freq_dim: 256,
        t_dim: 48,
        axes_dims: [8, 8, 8],
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        patch_size: 2,
        in_channels: 16,
        timestep_scale: 1000.0,
        max_references: 5,
    }
}

/// A shrunken Boogu-Image: [`tiny`]'s widths, 2 double-stream blocks before 1 single-stream block.
fn tiny_boogu() -> omnigen2::Config {
    omnigen2::Config { variant: Variant::Boogu, double_stream_layers: 2, layers: 1, ..tiny() }
}

/// Detection on a header-only file of `shapes` (bf16 zeros): its config, or the error's text.
fn detect(name: &str, shapes: &[(String, Vec<usize>)]) -> Result<Option<omnigen2::Config>, String> {
    let path = std::env::temp_dir().join(format!("kiln-{name}-{}.safetensors", std::process::id()));
    write_header_only(&path, shapes);
    let file = SafetensorsFile::open(&path).expect("open");
    let found = omnigen2::detect(&Header::new(&file, "")).map_err(|e| e.to_string());
    drop(file);
    let _ = std::fs::remove_file(&path);
    found
}

#[test]
fn detection_reads_every_width_from_shapes() {
    let config = tiny();
    let found = detect("omnigen2-whole", &omnigen2::expected(&config)).expect("detects");
    assert_eq!(found, Some(config));
    // The released model's shapes give ComfyUI's hard-coded config (model_detection.py's omnigen2 branch).
    let released = omnigen2::Config {
        hidden: 2520,
        heads: 21,
        kv_heads: 7,
        head_dim: 120,
        layers: 32,
        refiners: 2,
        ffn_hidden: 10240,
        text_feat_dim: 2048,
        t_dim: 1024,
        axes_dims: [40, 40, 40],
        ..tiny()
    };
    let found = detect("omnigen2-released", &omnigen2::expected(&released)).expect("detects");
    assert_eq!(found, Some(released));
}

#[test]
fn boogu_detection_reads_every_width_from_shapes() {
    let config = tiny_boogu();
    let shapes = omnigen2::expected(&config);
    assert!(shapes.iter().any(|(name, _)| name.starts_with("single_stream_layers.0.")));
    assert!(!shapes.iter().any(|(name, _)| name.starts_with("layers.")));
    let found = detect("boogu-whole", &shapes).expect("detects");
    assert!(found.as_ref().is_some_and(omnigen2::Config::is_boogu));
    assert_eq!(found, Some(config));
    // The released model's shapes give ComfyUI's config: the boogu branch reads the hidden width, the block
    // counts and the instruction width; 28 heads, 7 key/value heads and axes (40, 40, 40) are the class defaults.
    let released = omnigen2::Config {
        hidden: 3360,
        heads: 28,
        kv_heads: 7,
        head_dim: 120,
        layers: 32,
        double_stream_layers: 8,
        refiners: 2,
        ffn_hidden: 13568,
        text_feat_dim: 4096,
        t_dim: 1024,
        axes_dims: [40, 40, 40],
        ..tiny_boogu()
    };
    let found = detect("boogu-released", &omnigen2::expected(&released)).expect("detects");
    assert_eq!(found, Some(released));
    // A double-stream block's tensor missing or misshapen is named.
    let missing = "double_stream_layers.1.img_norm3.linear.bias";
    let without: Vec<_> = shapes.iter().filter(|(name, _)| name != missing).cloned().collect();
    let err = detect("boogu-missing", &without).expect_err("a tensor is missing");
    assert!(err.contains(missing), "{err}");
    let misshapen = "double_stream_layers.0.img_instruct_attn.processor.img_out.weight";
    let wrong: Vec<_> = shapes
        .iter()
        .map(|(name, shape)| {
            (name.clone(), if name == misshapen { vec![48, 24] } else { shape.clone() })
        })
        .collect();
    let err = detect("boogu-misshapen", &wrong).expect_err("a tensor is misshapen");
    assert!(err.contains(misshapen) && err.contains("Boogu-Image"), "{err}");
}

#[test]
fn a_missing_or_misshapen_tensor_is_refused_by_name() {
    let shapes = omnigen2::expected(&tiny());
    let missing = "ref_image_refiner.0.attn.norm_k.weight";
    let without: Vec<_> = shapes.iter().filter(|(name, _)| name != missing).cloned().collect();
    let err = detect("omnigen2-missing", &without).expect_err("a tensor is missing");
    assert!(err.contains(missing), "{err}");

    let misshapen = "layers.1.feed_forward.linear_2.weight";
    let wrong: Vec<_> = shapes
        .iter()
        .map(|(name, shape)| {
            (name.clone(), if name == misshapen { vec![48, 128] } else { shape.clone() })
        })
        .collect();
    let err = detect("omnigen2-misshapen", &wrong).expect_err("a tensor is misshapen");
    assert!(err.contains(misshapen) && err.contains("[48, 128]"), "{err}");
}

#[test]
fn other_families_and_relatives_are_told_apart() {
    let shapes = omnigen2::expected(&tiny());
    // Without OmniGen2's reference-image tensors the marker alone is another family's (diffusers' Lumina 2).
    let lumina: Vec<_> = shapes
        .iter()
        .filter(|(name, _)| !name.starts_with("ref_image_") && name != "image_index_embedding")
        .cloned()
        .collect();
    assert_eq!(detect("omnigen2-lumina", &lumina), Ok(None));
    // ComfyUI's Boogu-Image marker makes a file Boogu-Image: OmniGen2's `layers.*` do not make one.
    let mut boogu = shapes.clone();
    boogu.push((
        "double_stream_layers.0.img_instruct_attn.processor.img_to_q.weight".into(),
        vec![48, 48],
    ));
    let err = detect("omnigen2-boogu", &boogu).expect_err("Boogu-Image");
    assert!(err.contains("Boogu-Image") && err.contains("single_stream_layers.0."), "{err}");
    // A Boogu-Image file short of that marker is still Boogu-Image, refused naming it.
    let marker = "double_stream_layers.0.img_instruct_attn.processor.img_to_q.weight";
    let boogu: Vec<_> =
        omnigen2::expected(&tiny_boogu()).into_iter().filter(|(name, _)| name != marker).collect();
    let err = detect("boogu-unmarked", &boogu).expect_err("Boogu-Image");
    assert!(err.contains(marker), "{err}");
    // A head width with no three equal even RoPE axes.
    let odd = omnigen2::Config { head_dim: 16, heads: 3, axes_dims: [4, 6, 6], ..tiny() };
    let err = detect("omnigen2-heads", &omnigen2::expected(&odd)).expect_err("16-wide heads");
    assert!(err.contains("RoPE axes"), "{err}");
}

/// Deterministic values in [−scale, scale) (a small LCG).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

#[test]
fn each_sample_is_its_own_and_references_repeat_over_the_batch() {
    samples_are_their_own("omnigen2-batch", tiny());
}

#[test]
fn boogu_each_sample_is_its_own_and_references_repeat_over_the_batch() {
    samples_are_their_own("boogu-batch", tiny_boogu());
}

/// A model of `config` with random weights, loaded from a file `name`: a batch of two with references of batch 1
/// gives each sample what it gives alone, and the references change the output.
fn samples_are_their_own(name: &str, config: omnigen2::Config) {
    let tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)> = omnigen2::expected(&config)
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let n = shape.iter().product();
            let fan_in = *shape.last().unwrap_or(&1) as f32;
            let v = if shape.len() == 1 && name.ends_with("weight") {
                values(n, i as u64, 0.2).iter().map(|v| 1.0 + v).collect()
            } else {
                values(n, i as u64, 1.0 / fan_in.sqrt())
            };
            (name, (shape, v))
        })
        .collect();
    let file = TempTensors::new(name, tensors);
    let (b, manager) = cpu(64 << 20);
    let safetensors = SafetensorsFile::open(&file.0).expect("open");
    let header = Header::new(&safetensors, "");
    let model = OmniGen2::load(&manager, &header, &mut |_, _| {}).expect("load");
    assert_eq!(model.config, config);

    let b = b.as_ref();
    let tensor = |shape: &[usize], seed| {
        let n = shape.iter().product();
        b.from_f32(shape, &values(n, seed, 1.0), DType::F32).expect("tensor")
    };
    // An odd-sided image and references (one odd) of batch 1.
    let x = tensor(&[2, 16, 3, 4], 100);
    let context = tensor(&[2, 5, 32], 101);
    let refs = [tensor(&[1, 16, 2, 5], 102), tensor(&[1, 16, 4, 2], 103)];
    let timesteps = [0.3, 0.8];
    let out = model.forward(b, &x, &timesteps, &context, &refs).expect("forward");
    assert_eq!(out.shape(), [2, 16, 3, 4]);
    let both = b.to_f32(&out).expect("read");
    let half = both.len() / 2;
    for (i, sample) in both.chunks(half).enumerate() {
        let one = |t: &kiln_compute::Tensor<_>| b.slice(t, 0, i, 1).expect("slice");
        let alone =
            model.forward(b, &one(&x), &timesteps[i..=i], &one(&context), &refs).expect("forward");
        assert_close(&format!("sample {i}"), sample, &b.to_f32(&alone).expect("read"), 1e-5);
    }
    // The references take part: without them the output differs.
    let plain = model.forward(b, &x, &timesteps, &context, &[]).expect("forward");
    let plain = b.to_f32(&plain).expect("read");
    assert!(plain.iter().zip(&both).any(|(a, b)| (a - b).abs() > 1e-3));
}

#[test]
fn text_encoder_matches_comfyui() {
    use kiln_models::family::{
        OMNIGEN2_CLIP_TYPE, PromptTokens, Qwen25Role, TextEncoderDetected, TextEncoderNet,
    };
    let (b, manager) = cpu(256 << 20);
    // The reference stores the first 1000 rows of the token table; row `id % 1000` answers every id.
    let te =
        crate::common::tiled_table("omnigen2/te.safetensors", "model.embed_tokens.weight", 151_936);
    let file = SafetensorsFile::open(&te.0).expect("open");
    let header = Header::new(&file, "");
    // Qwen2.5-VL 3B's heads are 128 wide, as detection takes them.
    let found = TextEncoderDetected::detect(&header).expect("detect").expect("Qwen2.5-VL");
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).expect("load");
    // Its two key/value heads of 128 make it the 3B, OmniGen2's encoder, whatever CLIPLoader's type.
    for kind in [OMNIGEN2_CLIP_TYPE, "qwen_image", "stable_diffusion"] {
        let role = found.clone().for_clip_type(kind).expect("a type");
        assert!(
            matches!(role, TextEncoderDetected::Qwen25Vl(_, _, Qwen25Role::OmniGen2)),
            "{kind}"
        );
    }
    let found = found.for_clip_type(OMNIGEN2_CLIP_TYPE).expect("omnigen2");
    let net: TextEncoderNet = found.build(weights).expect("build");

    let cases = json("omnigen2/te_cases.json");
    let io = read_tensors("omnigen2/te_io.safetensors");
    for case in ["caption", "empty", "weighted", "newlines"] {
        let want = &cases["cases"][case];
        let prompt = want["prompt"].as_str().expect("prompt");
        let tokens = net.tokenize(prompt).expect("tokenize");
        let PromptTokens::Weighted(sections) = &tokens else { panic!("weighted sections") };
        let [section] = sections.as_slice() else { panic!("{case}: one section") };
        let ids: Vec<u32> = section.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, crate::common::ids(&want["ids"]), "{case}");
        let weights: Vec<f64> = serde_json::from_value(want["weights"].clone()).expect("weights");
        for (&(_, got), want) in section.iter().zip(&weights) {
            assert!((f64::from(got) - want).abs() < 1e-6, "{case}: weight {got} for {want}");
        }
        let encoded = net.encode(b.as_ref(), &tokens).expect("encode");
        let cond = &io[&format!("{case}.cond")];
        assert_eq!(encoded.cond.shape(), cond.0.as_slice(), "{case}");
        let got = b.to_f32(&encoded.cond).expect("read");
        assert_close(&format!("OmniGen2 text {case}"), &got, &cond.1, 1e-4);
    }
}
