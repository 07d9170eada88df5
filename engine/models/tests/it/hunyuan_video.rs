//! HunyuanVideo 1.5's DiT against ComfyUI 0f1fa67a (`scripts/reference/hunyuan_video15.py`, fixtures in
//! `fixtures/hunyuan_video15/`): the tiny network on four latents (text alone; byT5 glyph tokens; byT5 and
//! vision tokens on an image-to-video latent; a batch of two with vision tokens and a timestep each); detection
//! on headers built from [`hunyuan_video::expected`] (the released 1.5 and a 1.0-shaped config read back from
//! shapes, a missing or misshapen tensor named, other families left alone); and the forward pass's batch,
//! side-token, meanflow, pooled-vector and guidance handling on random weights.

use std::collections::BTreeMap;

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend, DType};
use kiln_models::Header;
use kiln_models::hunyuan_video::{self, ByT5Widths, HunyuanVideo, HunyuanVideoInput};

use crate::common::{
    TempTensors, assert_close, cpu, fixture, json, read_tensors, write_header_only,
};

/// The reference's tiny HunyuanVideo 1.5: hidden 64 in two heads of 32, RoPE axes (8, 12, 12), 2 double and 2
/// single blocks, a byT5 mapper 16 → 32 → 32, vision states 24 wide (detection assumes 128-wide heads and
/// axes (16, 56, 56), so the test builds this).
fn reference_config() -> hunyuan_video::Config {
    hunyuan_video::Config {
        hidden: 64,
        heads: 2,
        double_blocks: 2,
        single_blocks: 2,
        refiner_blocks: 2,
        in_channels: 65,
        out_channels: 32,
        patch: 1,
        context_dim: 32,
        axes_dims: [8, 12, 12],
        rope_theta: 256.0,
        vec_dim: None,
        guidance: false,
        meanflow: false,
        byt5: Some(ByT5Widths { in_dim: 16, hidden: 32, out: 32 }),
        vision_dim: Some(24),
        cond_type_embedding: true,
    }
}

#[test]
fn dit_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture("hunyuan_video15/dit.safetensors")).expect("open");
    let header = Header::new(&file, "");
    let err = hunyuan_video::detect(&header).expect_err("64 is no whole 128-wide head");
    assert!(err.to_string().contains("128-wide heads"), "{err}");
    let config = reference_config();
    let weights =
        manager.load(&hunyuan_video::load_plan(&header, &config), &mut |_, _| {}).expect("load");
    let model = HunyuanVideo::new(config, weights);
    let io = read_tensors("hunyuan_video15/dit_io.safetensors");
    let b = b.as_ref();
    for case in ["a", "b", "c", "d"] {
        let t = |name: &str| &io[&format!("{case}.{name}")];
        let tensor = |name: &str| b.from_f32(&t(name).0, &t(name).1, DType::F32).expect(name);
        let optional =
            |name: &str| io.contains_key(&format!("{case}.{name}")).then(|| tensor(name));
        let (x, context, byt5, clip) =
            (tensor("x"), tensor("context"), optional("byt5"), optional("clip_fea"));
        let timesteps = &t("timesteps").1;
        let mut input = HunyuanVideoInput::new(&x, timesteps, &context);
        input.byt5 = byt5.as_ref();
        input.clip_fea = clip.as_ref();
        let out = model.forward(b, &input).expect("forward");
        assert_eq!(out.shape(), t("out").0.as_slice(), "{case}");
        let got = b.to_f32(&out).expect("read");
        assert_close(&format!("HunyuanVideo 1.5 {case}"), &got, &t("out").1, 1e-4);
    }
}

#[test]
fn comfyuis_detection_of_the_fixture_agrees() {
    let cases = json("hunyuan_video15/dit_cases.json");
    let detected = &cases["comfy_detection"]["detect_unet_config"];
    let config = reference_config();
    assert_eq!(detected["image_model"].as_str(), Some("hunyuan_video"));
    assert_eq!(detected["hidden_size"].as_u64(), Some(config.hidden as u64));
    assert_eq!(detected["in_channels"].as_u64(), Some(config.in_channels as u64));
    assert_eq!(detected["out_channels"].as_u64(), Some(config.out_channels as u64));
    assert_eq!(detected["context_in_dim"].as_u64(), Some(config.context_dim as u64));
    assert_eq!(detected["depth"].as_u64(), Some(config.double_blocks as u64));
    assert_eq!(detected["depth_single_blocks"].as_u64(), Some(config.single_blocks as u64));
    assert_eq!(detected["vision_in_dim"].as_u64(), Some(24));
    assert_eq!(detected["axes_dim"], serde_json::json!(hunyuan_video::AXES_DIMS));
    assert_eq!(detected["theta"].as_f64(), Some(hunyuan_video::ROPE_THETA));
    assert_eq!(detected["meanflow_sum"].as_bool(), Some(config.meanflow_sum()));
    for (key, want) in [
        ("byt5", true),
        ("use_cond_type_embedding", true),
        ("guidance_embed", false),
        ("meanflow", false),
    ] {
        assert_eq!(detected[key].as_bool(), Some(want), "{key}");
    }
    assert_eq!(cases["token_refiner_blocks"].as_u64(), Some(config.refiner_blocks as u64));
    assert_eq!(cases["mlp_hidden"].as_u64(), Some(config.mlp_hidden() as u64));
}

/// HunyuanVideo 1.5 720p as released: hidden 2048 in 16 heads, 54 double blocks and no single ones, 65 input
/// channels (noise, image latent, mask), Qwen2.5-VL 7B's text, SigLIP's vision states, the byT5 mapper.
fn released() -> hunyuan_video::Config {
    hunyuan_video::Config {
        hidden: 2048,
        heads: 16,
        double_blocks: 54,
        single_blocks: 0,
        context_dim: 3584,
        axes_dims: hunyuan_video::AXES_DIMS,
        byt5: Some(ByT5Widths { in_dim: 1472, hidden: 2048, out: 2048 }),
        vision_dim: Some(1152),
        ..reference_config()
    }
}

/// A HunyuanVideo 1.0-shaped model, shrunk: 128-wide heads, 2×2 patches, CLIP-L's pooled vector, guidance;
/// none of 1.5's parts.
fn tiny_v1() -> hunyuan_video::Config {
    hunyuan_video::Config {
        hidden: 256,
        heads: 2,
        double_blocks: 1,
        single_blocks: 1,
        in_channels: 16,
        out_channels: 16,
        patch: 2,
        context_dim: 48,
        axes_dims: hunyuan_video::AXES_DIMS,
        vec_dim: Some(768),
        guidance: true,
        byt5: None,
        vision_dim: None,
        cond_type_embedding: false,
        ..reference_config()
    }
}

/// Detection on a header-only file of `shapes` (bf16 zeros): its config, or the error's text.
fn detect(
    name: &str,
    shapes: &[(String, Vec<usize>)],
) -> Result<Option<hunyuan_video::Config>, String> {
    let path = std::env::temp_dir().join(format!("kiln-{name}-{}.safetensors", std::process::id()));
    write_header_only(&path, shapes);
    let file = SafetensorsFile::open(&path).expect("open");
    let found = hunyuan_video::detect(&Header::new(&file, "")).map_err(|e| e.to_string());
    drop(file);
    let _ = std::fs::remove_file(&path);
    found
}

#[test]
fn detection_reads_the_released_models_from_shapes() {
    let config = released();
    let shapes = hunyuan_video::expected(&config);
    assert_eq!(
        shapes.iter().find(|(n, _)| n == "img_in.proj.weight").map(|s| &s.1[..]),
        Some(&[2048, 65, 1, 1, 1][..])
    );
    assert_eq!(detect("hyv15-released", &shapes), Ok(Some(config.clone())));
    // The step-distilled model: a time_r_in beside the rest.
    let meanflow = hunyuan_video::Config { meanflow: true, ..config };
    assert_eq!(detect("hyv15-meanflow", &hunyuan_video::expected(&meanflow)), Ok(Some(meanflow)));
    let v1 = tiny_v1();
    assert_eq!(detect("hyv1", &hunyuan_video::expected(&v1)), Ok(Some(v1)));
}

#[test]
fn a_missing_or_misshapen_tensor_is_refused_by_name() {
    let shapes = hunyuan_video::expected(&released());
    let missing = "double_blocks.53.txt_attn.norm.key_norm.weight";
    let without: Vec<_> = shapes.iter().filter(|(name, _)| name != missing).cloned().collect();
    let err = detect("hyv15-missing", &without).expect_err("a tensor is missing");
    assert!(err.contains(missing), "{err}");

    let misshapen = "byt5_in.fc3.weight";
    let wrong: Vec<_> = shapes
        .iter()
        .map(|(name, shape)| {
            (name.clone(), if name == misshapen { vec![2048, 1024] } else { shape.clone() })
        })
        .collect();
    let err = detect("hyv15-misshapen", &wrong).expect_err("a tensor is misshapen");
    assert!(err.contains(misshapen) && err.contains("[2048, 1024]"), "{err}");

    // A hidden width of no whole 128-wide heads.
    let odd = hunyuan_video::Config { hidden: 64 * 3, heads: 1, ..tiny_v1() };
    let err = detect("hyv-heads", &hunyuan_video::expected(&odd)).expect_err("192 wide");
    assert!(err.contains("128-wide heads"), "{err}");
}

#[test]
fn other_families_are_left_alone() {
    let shapes = hunyuan_video::expected(&tiny_v1());
    let marker = "txt_in.individual_token_refiner.blocks.0.norm1.weight";
    let unmarked: Vec<_> = shapes.iter().filter(|(name, _)| name != marker).cloned().collect();
    assert_eq!(detect("hyv-unmarked", &unmarked), Ok(None));
    // HunyuanImage 2.1: the same marker over a 2-D patch embedding.
    let image: Vec<_> = shapes
        .iter()
        .map(|(name, shape)| match name.as_str() {
            "img_in.proj.weight" => (name.clone(), vec![256, 16, 2, 2]),
            _ => (name.clone(), shape.clone()),
        })
        .collect();
    assert_eq!(detect("hyv-image21", &image), Ok(None));
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

/// A model of `config` with random weights, `edit` applied to them, written to a file `name` and loaded back
/// (detection checks the config, so its heads must be 128 wide). The file is removed with the returned guard.
fn random_model(
    name: &str,
    config: &hunyuan_video::Config,
    edit: impl Fn(&mut BTreeMap<String, (Vec<usize>, Vec<f32>)>),
) -> (HunyuanVideo, std::sync::Arc<kiln_compute::backend::cpu::Cpu>) {
    let mut tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)> = hunyuan_video::expected(config)
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let n = shape.iter().product();
            let fan_in = shape[1..].iter().product::<usize>().max(1) as f32;
            let v = if shape.len() == 1 && name.ends_with("weight") {
                values(n, i as u64, 0.2).iter().map(|v| 1.0 + v).collect()
            } else {
                values(n, i as u64, 1.0 / fan_in.sqrt())
            };
            (name, (shape, v))
        })
        .collect();
    edit(&mut tensors);
    let file = TempTensors::new(name, tensors);
    let (b, manager) = cpu(256 << 20);
    let safetensors = SafetensorsFile::open(&file.0).expect("open");
    let model =
        HunyuanVideo::load(&manager, &Header::new(&safetensors, ""), &mut |_, _| {}).expect("load");
    assert_eq!(&model.config, config);
    (model, b)
}

/// A small 1.5-shaped model with 128-wide heads (detection's) and both kinds of block.
fn tiny_v15() -> hunyuan_video::Config {
    hunyuan_video::Config {
        hidden: 256,
        heads: 2,
        double_blocks: 1,
        single_blocks: 1,
        context_dim: 24,
        axes_dims: hunyuan_video::AXES_DIMS,
        byt5: Some(ByT5Widths { in_dim: 8, hidden: 16, out: 16 }),
        vision_dim: Some(12),
        ..reference_config()
    }
}

#[test]
fn each_sample_is_its_own_and_side_tokens_repeat_over_the_batch() {
    let config = tiny_v15();
    let (model, b) = random_model("hyv-batch", &config, |_| {});
    let b = b.as_ref();
    let tensor = |shape: &[usize], seed| {
        let n = shape.iter().product();
        b.from_f32(shape, &values(n, seed, 1.0), DType::F32).expect("tensor")
    };
    let x = tensor(&[2, 65, 2, 3, 2], 100);
    let context = tensor(&[2, 5, 24], 101);
    let byt5 = tensor(&[1, 3, 8], 102);
    let clip = tensor(&[1, 2, 12], 103);
    let timesteps = [300.0, 800.0];
    let mut input = HunyuanVideoInput::new(&x, &timesteps, &context);
    input.byt5 = Some(&byt5);
    input.clip_fea = Some(&clip);
    let out = model.forward(b, &input).expect("forward");
    assert_eq!(out.shape(), [2, 32, 2, 3, 2]);
    let both = b.to_f32(&out).expect("read");
    let half = both.len() / 2;
    for (i, sample) in both.chunks(half).enumerate() {
        let one = |t: &kiln_compute::Tensor<_>| b.slice(t, 0, i, 1).expect("slice");
        let (x1, context1) = (one(&x), one(&context));
        let mut alone = HunyuanVideoInput::new(&x1, &timesteps[i..=i], &context1);
        alone.byt5 = Some(&byt5);
        alone.clip_fea = Some(&clip);
        let alone = model.forward(b, &alone).expect("forward");
        assert_close(&format!("sample {i}"), sample, &b.to_f32(&alone).expect("read"), 1e-5);
    }
    // The side tokens take part: without them the output differs.
    let plain =
        model.forward(b, &HunyuanVideoInput::new(&x, &timesteps, &context)).expect("forward");
    let plain = b.to_f32(&plain).expect("read");
    assert!(plain.iter().zip(&both).any(|(a, b)| (a - b).abs() > 1e-3));
    // More rows than samples (a clip's frames through CLIPVisionEncode): the first ones, as ComfyUI fits a
    // `CONDRegular` to the batch.
    let extra = tensor(&[3, 2, 12], 105);
    let first_two = b.slice(&extra, 0, 0, 2).expect("slice");
    input.clip_fea = Some(&extra);
    let from_extra = b.to_f32(&model.forward(b, &input).expect("forward")).expect("read");
    input.clip_fea = Some(&first_two);
    let from_two = b.to_f32(&model.forward(b, &input).expect("forward")).expect("read");
    assert_eq!(from_extra, from_two);
    // Malformed side tokens are refused.
    let wide = tensor(&[1, 3, 9], 104);
    input.byt5 = Some(&wide);
    let err = model.forward(b, &input).expect_err("9-wide byT5 features");
    assert!(err.to_string().contains("byT5"), "{err}");
}

/// The forward's output on `config`'s random model for one fixed input, with `r` as the meanflow σ.
fn meanflow_output(
    name: &str,
    config: &hunyuan_video::Config,
    zero_r: bool,
    r: Option<f32>,
) -> Vec<f32> {
    // time_r_in as time_in: then 1000·r = t embeds the same vector.
    let (model, b) = random_model(name, config, |tensors| {
        for part in ["in_layer.weight", "in_layer.bias", "out_layer.weight", "out_layer.bias"] {
            let mut copy = tensors[&format!("time_in.{part}")].clone();
            if zero_r && part.starts_with("out_layer") {
                copy.1.iter_mut().for_each(|v| *v = 0.0);
            }
            tensors.insert(format!("time_r_in.{part}"), copy);
        }
    });
    let b = b.as_ref();
    let x = b.from_f32(&[1, 65, 1, 2, 2], &values(260, 7, 1.0), DType::F32).expect("x");
    let context = b.from_f32(&[1, 3, 24], &values(72, 8, 1.0), DType::F32).expect("context");
    let mut input = HunyuanVideoInput::new(&x, &[500.0], &context);
    input.timestep_r = r;
    b.to_f32(&model.forward(b, &input).expect("forward")).expect("read")
}

#[test]
fn a_meanflow_model_embeds_the_next_sigma() {
    // Without vision_in the two embeddings are averaged: time_r_in = time_in at r = t/1000 leaves vec as it is.
    let averaged = hunyuan_video::Config { meanflow: true, vision_dim: None, ..tiny_v15() };
    assert!(!averaged.meanflow_sum());
    let without = meanflow_output("hyv-mf-avg", &averaged, false, None);
    let same = meanflow_output("hyv-mf-avg", &averaged, false, Some(0.5));
    assert_close("averaged with itself", &same, &without, 1e-5);
    let other = meanflow_output("hyv-mf-avg", &averaged, false, Some(0.1));
    assert!(other.iter().zip(&without).any(|(a, b)| (a - b).abs() > 1e-3));
    // With vision_in (1.5's) they are summed: a time_r_in of zero output changes nothing, a real one does.
    let summed = hunyuan_video::Config { meanflow: true, ..tiny_v15() };
    assert!(summed.meanflow_sum());
    let without = meanflow_output("hyv-mf-sum", &summed, true, None);
    let zero = meanflow_output("hyv-mf-sum", &summed, true, Some(0.1));
    assert_close("summed with zero", &zero, &without, 1e-6);
    let doubled = meanflow_output("hyv-mf-sum", &summed, false, Some(0.5));
    assert!(doubled.iter().zip(&without).any(|(a, b)| (a - b).abs() > 1e-3));
}

#[test]
fn version_one_takes_a_pooled_vector_and_guidance_on_odd_sides() {
    let (model, b) = random_model("hyv1-forward", &tiny_v1(), |_| {});
    let b = b.as_ref();
    let x = b.from_f32(&[1, 16, 2, 3, 5], &values(480, 1, 1.0), DType::F32).expect("x");
    let context = b.from_f32(&[1, 4, 48], &values(192, 2, 1.0), DType::F32).expect("context");
    let zeros = b.full(&[1, 768], 0.0, DType::F32).expect("zeros");
    let pooled = b.from_f32(&[1, 768], &values(768, 3, 1.0), DType::F32).expect("pooled");
    let run = |pooled: Option<&kiln_compute::Tensor<_>>, guidance: Option<&[f32]>| {
        let mut input = HunyuanVideoInput::new(&x, &[700.0], &context);
        input.pooled = pooled;
        input.guidance = guidance;
        let out = model.forward(b, &input).expect("forward");
        assert_eq!(out.shape(), [1, 16, 2, 3, 5]);
        b.to_f32(&out).expect("read")
    };
    let plain = run(None, None);
    assert_close("no pooled vector is zeros", &run(Some(&zeros), None), &plain, 1e-6);
    let differs = |a: &[f32]| a.iter().zip(&plain).any(|(a, b)| (a - b).abs() > 1e-3);
    assert!(differs(&run(Some(&pooled), None)), "the pooled vector takes part");
    assert!(differs(&run(None, Some(&[6.0]))), "guidance takes part");
}
