//! ERNIE-Image's text encoder and prompt enhancer against ComfyUI 0f1fa67a (`scripts/reference/ernie_te.py`,
//! fixtures in `fixtures/ernie_te/`): a tiny Ministral 3 3B (4 layers, too shallow for FLUX.2 dev's taps, so
//! Ministral's) through the whole `CLIPLoader` path (detection, the tokenizer read from the file's
//! `tekken_model`): the prompt ids (no template, `<s>` first, written special tokens as their ids), the
//! conditioning (the second-to-last layer's output, un-normed, ComfyUI's mask after a written `<unk>`) within
//! 1e-4, and `TextGenerate` greedy and sampled: the ids, the decoded text and each step's logits.

use std::sync::Arc;

use kiln_compute::Backend as _;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::Header;
use kiln_models::family::{PromptTokens, TextEncoderDetected, TextEncoderFamily, TextEncoderNet};
use kiln_models::mistral3;
use kiln_models::textgen::{ChatOptions, Decoding, SamplingSettings, TokenPicker};

use crate::common::{assert_close, cpu, fixture, ids, json, read_tensors, relative_error};

/// The fixture file as `CLIPLoader` (type `flux2`, as the templates load it) makes it.
fn encoder() -> (Arc<Cpu>, TextEncoderNet) {
    let (b, manager) = cpu(256 << 20);
    let file = SafetensorsFile::open(fixture("ernie_te/weights.safetensors")).expect("open");
    let header = Header::new(&file, "");
    let found = TextEncoderDetected::detect(&header).expect("detect").expect("a text encoder");
    let TextEncoderDetected::Mistral3(detected) = &found else { panic!("detected as {found:?}") };
    assert_eq!(detected.size, mistral3::Size::Ministral3B);
    assert_eq!(detected.config.rope_theta, mistral3::MINISTRAL_ROPE_THETA);
    assert_eq!(found.family(), TextEncoderFamily::Ernie);
    let found = found.for_clip_type("flux2").expect("flux2");
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).expect("load");
    let net = found.build_for_clip_type(weights, "flux2").expect("build");
    assert_eq!(net.family(), TextEncoderFamily::Ernie);
    (b, net)
}

#[test]
fn ernie_conditioning_matches_comfyui() {
    let (b, net) = encoder();
    let cases = json("ernie_te/cases.json");
    let io = read_tensors("ernie_te/io.safetensors");
    let cases = cases["cases"].as_object().expect("cases");
    assert_eq!(cases.len(), 5);
    let mut worst = 0f32;
    for (name, case) in cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let PromptTokens::Ids(got) = net.tokenize(prompt).expect("tokenize") else {
            panic!("ids for {prompt:?}")
        };
        assert_eq!(got, ids(&case["ids"]), "{name} ids");
        let encoded = net.encode(b.as_ref(), &PromptTokens::Ids(got)).expect("encode");
        let (shape, want) = &io[&format!("cond.{name}")];
        assert_eq!(encoded.cond.shape(), shape.as_slice(), "{name}");
        assert!(encoded.pooled.is_none(), "{name}");
        let cond = b.to_f32(&encoded.cond).expect("read");
        worst = worst.max(relative_error(&cond, want));
        assert_close(&format!("{name} cond"), &cond, want, 1e-4);
    }
    eprintln!("ernie conditioning: max relative error {worst:e}");
}

/// The node's decoding for a case's recorded widgets.
fn decoding(sampling: &serde_json::Value) -> Decoding {
    if sampling["sampling_mode"] == "off" {
        return Decoding::Greedy;
    }
    let number = |key: &str| sampling[key].as_f64().expect(key) as f32;
    Decoding::Sample(SamplingSettings {
        temperature: number("temperature"),
        top_k: sampling["top_k"].as_u64().expect("top_k") as usize,
        top_p: number("top_p"),
        min_p: number("min_p"),
        repetition_penalty: number("repetition_penalty"),
        presence_penalty: 0.0,
        seed: sampling["seed"].as_u64().expect("seed"),
    })
}

#[test]
fn ernie_prompt_enhancer_generates_as_comfyui() {
    let (b, net) = encoder();
    let TextEncoderNet::Mistral3 { model, tokenizer, .. } = &net else { panic!("not a Mistral") };
    let cases = json("ernie_te/cases.json");
    let io = read_tensors("ernie_te/io.safetensors");
    let cases = cases["generate"].as_object().expect("generate cases");
    assert_eq!(cases.len(), 3);
    let mut worst = 0f32;
    for (name, case) in cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let max_new = case["max_length"].as_u64().expect("max_length") as usize;
        let decoding = decoding(&case["sampling"]);
        assert_eq!(tokenizer.plain_prompt(prompt).expect("ids"), ids(&case["ids"]), "{name} ids");

        let generated = net
            .generate(
                b.as_ref(),
                prompt,
                &[],
                ChatOptions::default(),
                max_new,
                decoding,
                &mut |_| Ok(()),
            )
            .expect("generate");
        assert_eq!(generated, ids(&case["generated"]), "{name} generated");
        assert_eq!(
            net.decode(&generated).expect("decode"),
            case["text"].as_str().expect("text"),
            "{name}"
        );

        // Each step's logits, picked as the node picks.
        let mut picker = TokenPicker::new(decoding);
        let mut steps: Vec<Vec<f32>> = Vec::new();
        let mut pick = |logits: Vec<f32>| {
            steps.push(logits.clone());
            picker.pick(logits)
        };
        let prompt_ids = tokenizer.plain_prompt(prompt).expect("ids");
        let again = model
            .generate(
                b.as_ref(),
                &prompt_ids,
                max_new,
                &mistral3::STOP_TOKENS,
                &mut pick,
                &mut |_| Ok(()),
            )
            .expect("generate");
        assert_eq!(again, generated, "{name}: the model's own loop");
        let (shape, logits) = &io[&format!("logits.{name}")];
        assert_eq!(shape[0], steps.len(), "{name}");
        for (s, (got, want)) in steps.iter().zip(logits.chunks_exact(shape[1])).enumerate() {
            worst = worst.max(relative_error(got, want));
            assert_close(&format!("{name} step {s} logits"), got, want, 1e-4);
        }
    }
    eprintln!("ernie generate: max relative logits error {worst:e}");
}
