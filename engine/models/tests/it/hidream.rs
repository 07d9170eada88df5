//! HiDream against `scripts/reference/hidream.py`'s fixtures, ComfyUI 0f1fa67a's own code: the DiT (double and
//! single blocks with mixture-of-experts feed-forwards, T5-XXL's and one Llama state per block) on a tiny random
//! model, text-to-image and E1's image latent joined along the width; and Llama's per-layer states (ComfyUI's
//! `layer="all"` output) under HiDream's padding mask.

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType};
use kiln_models::family::{
    DiffusionDetected, DiffusionFamily, PromptTokens, TextEncoderDetected, TextEncoderFamily,
    TextEncoderNet,
};
use kiln_models::hidream::{self, HiDream, HiDreamInput};
use kiln_models::qwen3::Qwen3;
use kiln_models::synth::{self, SynthDtype, SynthFamily, ZImageTurboSet};
use kiln_models::{Header, llama3};
use serde_json::Value;

use crate::common::{assert_close, cpu, fixture, read_tensors};

/// The tiny reference model's config (the script's constructor arguments).
fn tiny() -> hidream::Config {
    hidream::Config {
        dim: 128,
        heads: 1,
        double_blocks: 1,
        single_blocks: 1,
        experts: 3,
        t5_width: 32,
        llama_width: 24,
        pooled_width: 20,
        expert_hidden: 512,
        shared_hidden: 256,
        text_hidden: 512,
    }
}

#[test]
fn the_dit_matches_comfyuis_hidream() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture("hidream/weights.safetensors")).unwrap();
    let header = Header::new(&file, "");
    let detected = DiffusionDetected::detect(&header).unwrap().unwrap();
    assert_eq!(detected, DiffusionDetected::HiDream(tiny()));
    assert_eq!(detected.family(), DiffusionFamily::HiDream);
    // ComfyUI's HiDream sampling settings are empty: ModelSamplingDiscreteFlow's shift 1, multiplier 1000.
    let sampling = detected.sampling();
    let flow = sampling.flow().expect("flow sampling");
    assert_eq!((flow.shift(), flow.multiplier()), (1.0, 1000.0));
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).unwrap();
    let model = HiDream::new(tiny(), weights);

    let io = read_tensors("hidream/io.safetensors");
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).unwrap();
    for case in ["even", "batch", "ragged", "edit"] {
        let at = |what: &str| format!("{what}.{case}");
        let (x, context, llama, pooled) =
            (tensor(&at("x")), tensor(&at("context")), tensor(&at("llama")), tensor(&at("pooled")));
        let image = io.contains_key(&at("image_cond")).then(|| tensor(&at("image_cond")));
        // The model sampling hands the DiT σ·1000.
        let timesteps: Vec<f32> = io[&at("sigma")].1.iter().map(|&s| flow.timestep(s)).collect();
        assert_eq!(timesteps, io[&at("timestep")].1, "{case}: the timesteps");
        let input = HiDreamInput {
            x: &x,
            timesteps: &timesteps,
            context: &context,
            llama: &llama,
            pooled: Some(&pooled),
            image_cond: image.as_ref(),
        };
        let out = model.forward(&*b, &input).unwrap();
        assert_close(case, &b.to_f32(&out).unwrap(), &io[&at("out")].1, 1e-4);
    }

    // One sample's Llama states serve a batch (ComfyUI repeats a conditioning to the batch).
    let (x, context) = (tensor("x.batch"), tensor("context.batch"));
    let one = b.slice(&tensor("llama.batch"), 0, 0, 1).unwrap();
    let pooled = tensor("pooled.batch");
    let input = HiDreamInput {
        x: &x,
        timesteps: &[900.0, 300.0],
        context: &context,
        llama: &one,
        pooled: Some(&pooled),
        image_cond: None,
    };
    assert_eq!(model.forward(&*b, &input).unwrap().shape(), &[2, 16, 6, 10]);
    // Llama states of the wrong width are an error naming what the model reads.
    let wrong = b.full(&[1, 2, 3, 8], 0.0, DType::F32).unwrap();
    let err = model.forward(&*b, &HiDreamInput { llama: &wrong, ..input }).err().unwrap();
    assert!(err.to_string().contains("Llama states"), "{err}");
}

#[test]
fn llama_states_match_comfyuis_all_layers_output() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture("hidream/llama.safetensors")).unwrap();
    let header = Header::new(&file, "");
    let Some(TextEncoderDetected::Llama3(config)) = TextEncoderDetected::detect(&header).unwrap()
    else {
        panic!("the tiny Llama is not detected as Llama 3");
    };
    assert_eq!((config.layers, config.hidden, config.heads, config.kv_heads), (3, 64, 2, 1));
    assert_eq!(config.head_dim, llama3::HEAD_DIM);
    let detected = TextEncoderDetected::Llama3(config);
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).unwrap();
    let model = Qwen3::new(config, weights);

    let io = read_tensors("hidream/llama_io.safetensors");
    for case in ["padded", "full"] {
        let ids: Vec<u32> = io[&format!("ids.{case}")].1.iter().map(|&v| v as u32).collect();
        let attended = io[&format!("mask.{case}")].1.iter().filter(|&&m| m == 1.0).count();
        let taps: Vec<usize> = (1..=config.layers).collect();
        let states = model.tapped_hidden_states(&*b, &ids, attended, &taps).unwrap();
        // [1, N, layers·D] token-major against ComfyUI's [1, layers + 1, N, D] without the embeddings.
        let got = b.to_f32(&states).unwrap();
        let (all, n, d) = (&io[&format!("all.{case}")].1, ids.len(), config.hidden);
        let mut want = Vec::with_capacity(got.len());
        for token in 0..n {
            for layer in 1..=config.layers {
                want.extend_from_slice(&all[(layer * n + token) * d..][..d]);
            }
        }
        assert_close(case, &got, &want, 1e-4);
    }
}

/// HiDream's four encoders as `QuadrupleCLIPLoader` combines them (tiny synthetic files, in any order): the
/// tokens of each against ComfyUI's `HiDreamTokenizer` (`scripts/reference/llama3_tokenizer.py`), and what the
/// encoding gives the DiT.
#[test]
fn the_four_encoders_tokenize_as_comfyui_and_condition_the_dit() {
    let dir = std::env::temp_dir().join(format!("kiln-hidream-te-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let set = ZImageTurboSet::tiny();
    let families = [
        SynthFamily::TextEncoder(TextEncoderFamily::Llama3),
        SynthFamily::ClipG,
        SynthFamily::TextEncoder(TextEncoderFamily::T5Xxl),
        SynthFamily::TextEncoder(TextEncoderFamily::ClipL),
    ];
    let (b, manager) = cpu(256 << 20);
    let load = |family: SynthFamily| {
        let path = dir.join(format!("{family}.safetensors"));
        if !path.exists() {
            synth::write_family(&path, family, &set, SynthDtype::Bf16, 3, &mut |_, _| {}).unwrap();
        }
        let file = SafetensorsFile::open(&path).unwrap();
        let header = Header::new(&file, "");
        let found = TextEncoderDetected::detect(&header).unwrap().unwrap();
        let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).unwrap();
        (found, weights)
    };
    let parts: Vec<_> = families.into_iter().map(load).collect();
    let detected: Vec<TextEncoderDetected> = parts.iter().map(|(d, _)| d.clone()).collect();
    // A CLIP-L twice, or FLUX.1's type, are errors naming what the files are.
    let twice: Vec<&TextEncoderDetected> = [&detected[3], &detected[3]].into();
    let err = TextEncoderNet::check_combination(&twice, "hidream").unwrap_err().to_string();
    assert!(err.contains("CLIP-L + CLIP-L") && err.contains("at most one"), "{err}");
    let all: Vec<&TextEncoderDetected> = detected.iter().collect();
    assert!(TextEncoderNet::check_combination(&all, "flux").is_err());
    let net = TextEncoderNet::combine(parts, "hidream").unwrap();
    assert_eq!(net.family(), TextEncoderFamily::HiDream);

    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("llama3/tokens.json")).unwrap())
            .unwrap();
    let pairs = |v: &Value| -> Vec<Vec<(u32, f32)>> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|section| {
                let section = section.as_array().unwrap();
                section
                    .iter()
                    .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32))
                    .collect()
            })
            .collect()
    };
    let mut checked = 0;
    for case in fixture["cases"].as_array().unwrap().iter().filter(|c| c.get("t5xxl").is_some()) {
        let prompt = case["prompt"].as_str().unwrap();
        let PromptTokens::HiDream(tokens) = net.tokenize(prompt).unwrap() else {
            panic!("not HiDream's tokens");
        };
        assert_eq!(tokens.clip_l, pairs(&case["clip_l"]), "{prompt}: CLIP-L");
        assert_eq!(tokens.clip_g, pairs(&case["clip_g"]), "{prompt}: CLIP-G");
        assert_eq!(vec![tokens.t5.clone()], pairs(&case["t5xxl"]), "{prompt}: T5-XXL");
        assert_eq!(vec![tokens.llama.clone()], pairs(&case["llama"]), "{prompt}: Llama");
        checked += 1;
    }
    assert!(checked >= 2);

    let tokens =
        net.tokenize_hidream(["a cat", "a dog", "a (bird:1.2)", "a fish"], Default::default());
    let encoded = net.encode(&*b, &tokens.unwrap()).unwrap();
    let (cfg, llama) = (&set.hidream, &set.llama3);
    assert_eq!(encoded.cond.shape(), &[1, 128, cfg.t5_width]);
    assert_eq!(encoded.pooled.as_ref().unwrap().shape(), &[1, cfg.pooled_width]);
    assert_eq!(encoded.llama.as_ref().unwrap().shape(), &[1, llama.layers, 128, cfg.llama_width]);

    // DualCLIPLoader's recipe (T5-XXL and Llama): CLIP-L's and CLIP-G's pooled vectors are ComfyUI's zeros
    // (768 + 1280 wide); a Llama file alone (any CLIPLoader type) leaves T5-XXL's states zeros.
    let t5_llama = vec![
        load(SynthFamily::TextEncoder(TextEncoderFamily::T5Xxl)),
        load(SynthFamily::TextEncoder(TextEncoderFamily::Llama3)),
    ];
    let net = TextEncoderNet::combine(t5_llama, "hidream").unwrap();
    let encoded = net.encode(&*b, &net.tokenize("a cat").unwrap()).unwrap();
    let pooled = encoded.pooled.unwrap();
    assert_eq!(pooled.shape(), &[1, 768 + 1280]);
    assert!(b.to_f32(&pooled).unwrap().iter().all(|&v| v == 0.0));
    assert_eq!(encoded.cond.shape(), &[1, 128, cfg.t5_width]);
    // CLIPLoader with type `hidream`: CLIP-G alone is HiDream's encoder, T5-XXL's and Llama's states zeros.
    let (found, weights) = load(SynthFamily::ClipG);
    let net =
        found.for_clip_type("hidream").unwrap().build_for_clip_type(weights, "hidream").unwrap();
    assert_eq!(net.family(), TextEncoderFamily::HiDream);
    let encoded = net.encode(&*b, &net.tokenize("a cat").unwrap()).unwrap();
    let pooled = b.to_f32(encoded.pooled.as_ref().unwrap()).unwrap();
    assert_eq!(pooled.len(), 768 + set.clip_g.hidden);
    assert!(pooled[..768].iter().all(|&v| v == 0.0) && pooled[768..].iter().any(|&v| v != 0.0));
    assert_eq!(encoded.llama.unwrap().shape(), &[1, 32, 1, 4096]);
    // With another type, CLIP-G alone is what ComfyUI's `load_clip` makes it: SD3's encoder with `sd3`, SDXL's
    // refiner's with `stable_diffusion`, nothing Kiln runs with `stable_cascade`.
    for (kind, family) in
        [("sd3", TextEncoderFamily::Sd3), ("stable_diffusion", TextEncoderFamily::Sdxl)]
    {
        let (found, weights) = load(SynthFamily::ClipG);
        assert_eq!(found.build_for_clip_type(weights, kind).unwrap().family(), family, "{kind}");
    }
    let (found, weights) = load(SynthFamily::ClipG);
    assert!(found.build_for_clip_type(weights, "stable_cascade").is_err());
    let (found, weights) = load(SynthFamily::TextEncoder(TextEncoderFamily::Llama3));
    let net = found.for_clip_type("stable_diffusion").unwrap().build(weights).unwrap();
    assert_eq!(net.family(), TextEncoderFamily::HiDream);
    let encoded = net.encode(&*b, &net.tokenize("a cat").unwrap()).unwrap();
    assert_eq!(encoded.cond.shape(), &[1, 128, 4096]);
    assert!(b.to_f32(&encoded.cond).unwrap().iter().all(|&v| v == 0.0));
    assert_eq!(encoded.llama.unwrap().shape(), &[1, llama.layers, 128, cfg.llama_width]);
    std::fs::remove_dir_all(&dir).ok();
}
