//! Chroma against `scripts/reference/chroma.py`'s fixtures, ComfyUI 0f1fa67a's own code: the DiT (FLUX.1's blocks
//! modulated from one guidance MLP over the timestep, the guidance and each modulation's index) on a tiny random
//! model, and the T5-XXL tokens of CLIPLoader type `chroma` with T5TokenizerOptions' settings.

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType};
use kiln_models::family::{
    DiffusionDetected, DiffusionFamily, PromptTokens, T5Options, TextEncoderDetected,
};
use kiln_models::flux::{self, Approximator, Config, Flux, FluxInput, Layout};
use kiln_models::{Header, prompt_weights, t5};
use serde_json::Value;

use crate::common::{assert_close, cpu, fixture, read_tensors};

const WEIGHTS: &str = "chroma/weights.safetensors";

/// The tiny reference model's config: the FLUX.1 fixture's widths, no pooled vector or guidance embedding, the
/// guidance MLP 48 wide and 2 layers deep.
fn tiny() -> Config {
    Config {
        vec_dim: None,
        guidance: false,
        approximator: Some(Approximator { hidden: 48, layers: 2 }),
        ..crate::flux::tiny()
    }
}

#[test]
fn the_dit_matches_comfyuis_chroma() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let detected = DiffusionDetected::detect(&header).unwrap().unwrap();
    assert_eq!(detected, DiffusionDetected::Flux(tiny(), Layout::Comfy));
    assert_eq!(detected.family(), DiffusionFamily::Chroma);
    assert_eq!(
        detected.sampling().flow().expect("flow sampling").shift(),
        flux::family::FLUX_SHIFT
    );
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).unwrap();
    let model = Flux::new(tiny(), Layout::Comfy, weights);
    assert_eq!(model.config.variant(), "Chroma");

    let io = read_tensors("chroma/io.safetensors");
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).unwrap();
    for case in ["even", "odd", "ragged"] {
        let (x, context) = (tensor(&format!("x.{case}")), tensor(&format!("context.{case}")));
        let out = model
            .forward(
                &*b,
                &FluxInput {
                    x: &x,
                    timesteps: &io[&format!("sigma.{case}")].1,
                    context: &context,
                    pooled: None,
                    guidance: Some(&io[&format!("guidance.{case}")].1),
                    references: &[],
                    method: None,
                    kv_cache: None,
                    text_prefix: None,
                },
            )
            .unwrap();
        assert_close(case, &b.to_f32(&out).unwrap(), &io[&format!("out.{case}")].1, 1e-4);
    }
    // A conditioning without guidance gives Chroma 0 (`model_base.Chroma`), the even case's.
    let (x, context) = (tensor("x.even"), tensor("context.even"));
    let input = FluxInput {
        x: &x,
        timesteps: &io["sigma.even"].1,
        context: &context,
        pooled: None,
        guidance: None,
        references: &[],
        method: None,
        kv_cache: None,
        text_prefix: None,
    };
    let out = model.forward(&*b, &input).unwrap();
    assert_close("no guidance", &b.to_f32(&out).unwrap(), &io["out.even"].1, 1e-4);
    // ComfyUI's Chroma takes no reference latents (ReferenceLatent's are left out).
    let reference = b.full(&[1, 16, 4, 4], 0.5, DType::F32).unwrap();
    let with_reference = FluxInput { references: std::slice::from_ref(&reference), ..input };
    let out = model.forward(&*b, &with_reference).unwrap();
    assert_close("a reference", &b.to_f32(&out).unwrap(), &io["out.even"].1, 1e-4);
}

#[test]
fn t5_tokenizer_options_pad_umt5_tokens_too() {
    let ids = |_: &str| -> kiln_models::Result<Vec<u32>> { Ok(vec![7]) };
    let options = T5Options { min_padding: Some(2), min_length: Some(0) };
    let sections = t5::umt5_tokens_in("a", &options.apply(&t5::UMT5_PROMPT_LAYOUT), ids).unwrap();
    // The word, EOS, two pads: no padding to 512 with `min_length` 0.
    assert_eq!(sections, vec![vec![(7, 1.0), (t5::EOS, 1.0), (t5::PAD, 1.0), (t5::PAD, 1.0)]]);
    assert_eq!(t5::umt5_tokens("a", ids).unwrap()[0].len(), 512);
}

#[test]
fn chroma_prompts_tokenize_as_comfyuis_pixart_tokenizer() {
    let tokenizer = t5::Tokenizer::bundled().unwrap();
    let fixture: Value =
        serde_json::from_slice(&std::fs::read(fixture("chroma/tokens.json")).unwrap()).unwrap();
    for (name, case) in fixture.as_object().unwrap() {
        let options = &case["options"];
        let read = |key: &str| options.get(key).and_then(Value::as_u64).map(|v| v as usize);
        let options = T5Options {
            min_padding: read("t5xxl_min_padding"),
            min_length: read("t5xxl_min_length"),
        };
        let layout = options.apply(&t5::CHROMA_PROMPT_LAYOUT);
        let prompt = case["prompt"].as_str().unwrap();
        let sections =
            prompt_weights::tokenize(prompt, &layout, |w| tokenizer.word_ids(w)).unwrap();
        let want: Vec<(u32, f32)> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32))
            .collect();
        assert_eq!(sections, vec![want.clone()], "{name}");
        // Weighting moves from PixArt's empty prompt: pads alone, no end token.
        let empty = prompt_weights::Layout { end: None, ..t5::CHROMA_PROMPT_LAYOUT };
        let empty_ids: Vec<u32> =
            case["empty"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(prompt_weights::empty_tokens(&empty, want.len()), empty_ids, "{name}");
    }
}

#[test]
fn clip_loader_type_chroma_makes_t5_xxl_the_whole_encoder() {
    let file = SafetensorsFile::open(fixture("t5/weights.safetensors")).unwrap();
    let found = TextEncoderDetected::detect(&Header::new(&file, "")).unwrap().unwrap();
    assert!(matches!(found, TextEncoderDetected::T5(_)), "{found:?}");
    let chroma = found.clone().for_clip_type("chroma").unwrap();
    assert!(matches!(chroma, TextEncoderDetected::T5Alone(_)), "{chroma:?}");
    // Another type leaves it FLUX.1's half, which conditions nothing alone.
    let (_, manager) = cpu(64 << 20);
    let weights = manager.load(&found.load_plan(&Header::new(&file, "")), &mut |_, _| {}).unwrap();
    let err = found.build(weights).err().expect("a refusal");
    assert!(err.to_string().contains("type `chroma`"), "{err}");

    let weights = manager.load(&chroma.load_plan(&Header::new(&file, "")), &mut |_, _| {}).unwrap();
    let net = chroma.build(weights).unwrap();
    let tokens = net.tokenize("a (tiger:1.2)").unwrap();
    let PromptTokens::Weighted(sections) = &tokens else { panic!("{tokens:?}") };
    assert_eq!(sections.len(), 1);
    assert_eq!(sections[0].last(), Some(&(t5::EOS, 1.0)), "no padding after the end token");
    let padded = net.tokenize_with("a tiger", T5Options { min_padding: None, min_length: Some(9) });
    let PromptTokens::Weighted(padded) = padded.unwrap() else { panic!() };
    assert_eq!(padded[0].len(), 9);
    // CLIPTextEncodeFlux with T5-XXL alone: its `t5xxl` prompt is the whole of it.
    assert_eq!(net.tokenize_flux("ignored", "a (tiger:1.2)").unwrap(), tokens);
}
