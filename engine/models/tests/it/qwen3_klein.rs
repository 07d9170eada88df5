//! FLUX.2 Klein's text encoder against `scripts/reference/qwen3_klein.py`'s fixtures: the Klein template's ids
//! (the python `tokenizers` library, cross-checked there with transformers' Qwen3 chat template with thinking
//! disabled) padded to 512, hidden states 9, 18 and 27 of transformers' `Qwen3Model` (tiny, 28 layers) under
//! ComfyUI's padding mask, and `CLIPLoader`'s choice between Klein's and Z-Image's encoder.

use std::path::PathBuf;

use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::{MemoryManager, SafetensorsFile};
use kiln_compute::{Backend as _, DType, Tensor};
use kiln_models::family::{PromptTokens, TextEncoderDetected, TextEncoderFamily, TextEncoderNet};
use kiln_models::qwen3::{self, Config, KLEIN_MIN_LENGTH, KLEIN_TAPS, Qwen3, Tokenizer};
use kiln_models::synth::{self, Qwen3Shape, SynthDtype, SynthFamily, ZImageTurboSet};
use kiln_models::{Error, Header};
use serde_json::Value;

use crate::common::{assert_close, cpu, fixture, ids, json, read_tensors, write_header_only};

const WEIGHTS: &str = "qwen3_klein/weights.safetensors";

/// The tiny reference model's config: 28 layers, so every tap is inside the stack.
const TINY: Config = Config {
    vocab: 1024,
    hidden: 32,
    layers: 28,
    heads: 2,
    kv_heads: 1,
    head_dim: 16,
    intermediate: 64,
    rms_eps: 1e-6,
    rope_theta: 1e6,
    variant: qwen3::Variant::Qwen3,
};

/// Qwen3-8B's widths (FLUX.2 Klein 9B's encoder).
const QWEN3_8B: Qwen3Shape = Qwen3Shape {
    vocab: 151936,
    hidden: 4096,
    layers: 36,
    heads: 32,
    kv_heads: 8,
    head_dim: 128,
    intermediate: 12288,
};

fn count(v: &Value) -> usize {
    v.as_u64().expect("a count") as usize
}

/// A fresh directory for one test's files (the test removes it).
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-klein-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The tiny reference model, loaded.
fn tiny_model(manager: &std::sync::Arc<MemoryManager>) -> Qwen3 {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let config = qwen3::detect(&header).unwrap().unwrap();
    assert_eq!(config, TINY);
    let weights = manager.load(&qwen3::load_plan(&header, &config), &mut |_, _| {}).unwrap();
    Qwen3::new(config, weights)
}

fn values(b: &Cpu, t: &Tensor<Cpu>) -> Vec<f32> {
    assert_eq!(t.dtype(), DType::F32);
    b.to_f32(t).unwrap()
}

#[test]
fn klein_ids_match_the_qwen3_chat_template_without_thinking() {
    let tokenizer = Tokenizer::bundled().unwrap();
    let cases = json("qwen3_klein/tokenizer_ids.json");
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let want = ids(&case["klein"]);
        let got = tokenizer.klein_prompt(prompt).unwrap();
        assert_eq!(got, want, "klein_prompt({prompt:?})");
        assert_eq!(qwen3::attended_keys(&got), count(&case["attended"]), "{prompt:?}");
        let unpadded = tokenizer.klein_unpadded(prompt).unwrap();
        assert_eq!(unpadded, want[..unpadded.len()], "klein_unpadded({prompt:?})");
    }
}

#[test]
fn the_empty_prompt_is_the_template_and_pads() {
    let tokenizer = Tokenizer::bundled().unwrap();
    let template: [u32; 12] =
        [151644, 872, 198, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271];
    assert_eq!(tokenizer.klein_unpadded("").unwrap(), template);
    let ids = tokenizer.klein_prompt("").unwrap();
    assert_eq!(ids.len(), KLEIN_MIN_LENGTH);
    assert_eq!(ids[..12], template);
    assert!(ids[12..].iter().all(|&id| id == qwen3::ENDOFTEXT));
    assert_eq!(qwen3::attended_keys(&ids), 12);
    // A prompt longer than 512 tokens is kept whole (ComfyUI never truncates) and has no pads.
    let long = tokenizer.klein_prompt(&"cat ".repeat(600)).unwrap();
    assert!(long.len() > KLEIN_MIN_LENGTH);
    assert_eq!(qwen3::attended_keys(&long), long.len());
}

#[test]
fn tapped_hidden_states_match_transformers_under_comfyuis_mask() {
    let (b, manager) = cpu(1 << 30);
    let model = tiny_model(&manager);
    let expected = read_tensors("qwen3_klein/hidden.safetensors");
    let cases = json("qwen3_klein/cases.json");
    let cases = cases.as_object().unwrap();
    assert_eq!(cases.len(), 3);
    for (name, case) in cases {
        let attended = count(&case["attended"]);
        // The fixture's mask is the one Kiln derives from the real ids.
        assert_eq!(qwen3::attended_keys(&ids(&case["ids"])), attended, "{name}");
        let (shape, want) = &expected[&format!("hidden.{name}")];
        let out = model
            .tapped_hidden_states(&*b, &ids(&case["model_ids"]), attended, &KLEIN_TAPS)
            .unwrap();
        assert_eq!(out.shape(), shape.as_slice(), "{name}");
        assert_eq!(shape[2], 3 * TINY.hidden);
        let got = values(&b, &out);
        assert_close(&format!("Klein hidden states {name}"), &got, want, 1e-4);
    }
    // A tap at the layer count is the last layer's output through the final norm, as in transformers and
    // ComfyUI.
    let unpadded = ids(&cases["unpadded"]["model_ids"]);
    let last = model.tapped_hidden_states(&*b, &unpadded, unpadded.len(), &[TINY.layers]).unwrap();
    let (shape, want) = &expected["last.unpadded"];
    assert_eq!(last.shape(), shape.as_slice());
    assert_close("the last hidden state", &values(&b, &last), want, 1e-4);
    assert_eq!(expected["hidden.klein"].0, [1, KLEIN_MIN_LENGTH, 96]);
}

#[test]
fn tapped_hidden_states_refuse_bad_arguments() {
    let (b, manager) = cpu(1 << 30);
    let model = tiny_model(&manager);
    let invalid = |r: kiln_models::Result<Tensor<Cpu>>| matches!(r, Err(Error::Invalid(_)));
    assert!(invalid(model.tapped_hidden_states(&*b, &[1, 2, 3], 0, &KLEIN_TAPS)));
    assert!(invalid(model.tapped_hidden_states(&*b, &[1, 2, 3], 4, &KLEIN_TAPS)));
    assert!(invalid(model.tapped_hidden_states(&*b, &[1, 2, 3], 3, &[])));
    assert!(invalid(model.tapped_hidden_states(&*b, &[1, 2, 3], 3, &[29])));
    assert!(invalid(model.tapped_hidden_states(&*b, &[1, 2024], 2, &KLEIN_TAPS)));
    // Tap 0 is the embeddings, tap 28 the last layer's output; one tap is not concatenated.
    let out = model.tapped_hidden_states(&*b, &[1, 2, 3], 3, &[0, 28]).unwrap();
    assert_eq!(out.shape(), [1, 3, 64]);
    let one = model.tapped_hidden_states(&*b, &[1, 2, 3], 3, &[28]).unwrap();
    assert_eq!(values(&b, &one), values(&b, &b.slice(&out, 2, 32, 32).unwrap()));
}

/// A Qwen3 encoder's detection at `hidden` wide (the other widths Qwen3-4B's).
fn detected(hidden: usize) -> TextEncoderDetected {
    TextEncoderDetected::Qwen3(Config { hidden, ..TINY })
}

#[test]
fn clip_loader_types_choose_klein_or_zimage_as_comfyui_does() {
    let family = |d: kiln_models::Result<TextEncoderDetected>| d.unwrap().family();
    // Qwen3-4B (and any width but 8B's): Klein with `flux2`/`flux`, Z-Image's otherwise.
    for hidden in [2560, 32] {
        assert_eq!(family(detected(hidden).for_clip_type("flux2")), TextEncoderFamily::Flux2Klein);
        assert_eq!(family(detected(hidden).for_clip_type("flux")), TextEncoderFamily::Flux2Klein);
        for kind in ["lumina2", "stable_diffusion", "qwen_image", "ideogram4"] {
            assert_eq!(family(detected(hidden).for_clip_type(kind)), TextEncoderFamily::Qwen3);
        }
    }
    // Qwen3-8B: Klein whatever the type, but `ideogram4` (Ideogram 4's encoder, which Kiln lacks).
    for kind in ["flux2", "flux", "lumina2", "stable_diffusion"] {
        assert_eq!(family(detected(4096).for_clip_type(kind)), TextEncoderFamily::Flux2Klein);
    }
    match detected(4096).for_clip_type("ideogram4") {
        Err(Error::Invalid(msg)) => assert!(msg.contains("Ideogram 4"), "{msg}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A Qwen3 too shallow for the taps is refused as Klein's, and stays Z-Image's otherwise.
    let shallow = || TextEncoderDetected::Qwen3(Config { layers: 3, ..TINY });
    match shallow().for_clip_type("flux2") {
        Err(Error::Invalid(msg)) => assert!(msg.contains("only 3 layers"), "{msg}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(family(shallow().for_clip_type("lumina2")), TextEncoderFamily::Qwen3);
    // Another family with type `flux2` is named; with `flux` it is what it is.
    let qwen25 = TextEncoderDetected::Qwen25Vl(
        Config { variant: qwen3::Variant::Qwen25Vl, head_dim: 128, heads: 1, kv_heads: 1, ..TINY },
        None,
        kiln_models::family::Qwen25Role::QwenImage,
    );
    match qwen25.clone().for_clip_type("flux2") {
        Err(Error::Invalid(msg)) => assert!(msg.contains("Qwen2.5-VL"), "{msg}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(family(qwen25.for_clip_type("flux")), TextEncoderFamily::Qwen25Vl);
}

#[test]
fn qwen3_8b_shapes_are_detected_and_become_klein() {
    let dir = scratch("8b");
    let path = dir.join("qwen_3_8b.safetensors");
    let mut tensors = synth::qwen3_tensors(&QWEN3_8B).unwrap();
    tensors.push(("lm_head.weight".to_owned(), vec![151936, 4096]));
    write_header_only(&path, &tensors);
    let file = SafetensorsFile::open(&path).unwrap();
    let found = TextEncoderDetected::detect(&Header::new(&file, "")).unwrap().unwrap();
    let want = Config {
        vocab: 151936,
        hidden: 4096,
        layers: 36,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 12288,
        ..TINY
    };
    assert_eq!(found, TextEncoderDetected::Qwen3(want));
    assert_eq!(found.for_clip_type("lumina2").unwrap(), TextEncoderDetected::Flux2Klein(want));
    // Qwen3-8B's untied output head is loaded for TextGenerate, as ComfyUI's `Qwen3_8BConfig` has one.
    let plan = qwen3::load_plan(&Header::new(&file, ""), &want);
    let head = plan.slots.iter().find(|s| s.name == "lm_head.weight").expect("an lm_head slot");
    assert_eq!(head.parts, [(0, "lm_head.weight".to_owned())]);
    drop(file);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn only_qwen3_8b_loads_an_lm_head_under_either_name() {
    let dir = scratch("heads");
    let path = dir.join("qwen.safetensors");
    let plan_of = |shape: &Qwen3Shape, head: &str| {
        let mut tensors = synth::qwen3_tensors(shape).unwrap();
        tensors.push((head.to_owned(), vec![shape.vocab, shape.hidden]));
        write_header_only(&path, &tensors);
        let file = SafetensorsFile::open(&path).unwrap();
        let header = Header::new(&file, "");
        let config = qwen3::detect(&header).unwrap().unwrap();
        let plan = qwen3::load_plan(&header, &config);
        plan.slots.iter().find(|s| s.name == "lm_head.weight").map(|s| s.parts.clone())
    };
    let narrow_8b = Qwen3Shape { layers: 1, heads: 1, kv_heads: 1, intermediate: 8, ..QWEN3_8B };
    assert_eq!(
        plan_of(&narrow_8b, "model.lm_head.weight"),
        Some(vec![(0, "model.lm_head.weight".to_owned())])
    );
    // Qwen3-4B ties its head to the embedding; ComfyUI ignores a file's `lm_head` there.
    let narrow_4b = Qwen3Shape { hidden: 2560, ..narrow_8b };
    assert_eq!(plan_of(&narrow_4b, "lm_head.weight"), None);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn generation_reads_logits_from_a_loaded_lm_head() {
    let (b, manager) = cpu(1 << 30);
    let mut tensors: Vec<(String, DType, Vec<usize>, Vec<u8>)> = read_tensors(WEIGHTS)
        .into_iter()
        .map(|(name, (shape, v))| {
            (name, DType::F32, shape, kiln_compute::dtype::narrow(DType::F32, &v))
        })
        .collect();
    // A head whose only non-zero row is token 77's: the logits are zero everywhere else.
    let mut head = vec![0f32; TINY.vocab * TINY.hidden];
    head[77 * TINY.hidden..78 * TINY.hidden].fill(1.0);
    let shape = vec![TINY.vocab, TINY.hidden];
    tensors.push((
        "lm_head.weight".to_owned(),
        DType::F32,
        shape,
        kiln_compute::dtype::narrow(DType::F32, &head),
    ));
    let model = Qwen3::new(TINY, manager.load_tensors(tensors).unwrap());
    let mut seen = Vec::new();
    let pick = &mut |logits: Vec<f32>| {
        seen = logits;
        77
    };
    let tokens = model.generate(&*b, &[1, 2, 3], 1, &[], pick, &mut |_| Ok(())).unwrap();
    assert_eq!(tokens, [77]);
    assert_eq!(seen.len(), TINY.vocab);
    assert!(seen[77] != 0.0 && seen.iter().enumerate().all(|(i, &v)| i == 77 || v == 0.0));
}

#[test]
fn clip_text_encode_with_klein_gives_512_rows_of_three_taps() {
    // Synth's tiny Klein encoder: the real vocabulary (so the real tokenizer's ids are valid), tiny widths over
    // 28 layers; its three taps side by side are as wide as the tiny FLUX.2 DiT's context.
    let set = ZImageTurboSet::tiny();
    let dir = scratch("net");
    let path = dir.join("qwen.safetensors");
    let family = SynthFamily::TextEncoder(TextEncoderFamily::Flux2Klein);
    synth::write_family(&path, family, &set, SynthDtype::F32, 7, &mut |_, _| {}).unwrap();
    let (b, manager) = cpu(1 << 30);
    let file = SafetensorsFile::open(&path).unwrap();
    let header = Header::new(&file, "");
    let found =
        TextEncoderDetected::detect(&header).unwrap().unwrap().for_clip_type("flux2").unwrap();
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).unwrap();
    let net = found.build(weights).unwrap();
    assert!(matches!(net, TextEncoderNet::Flux2Klein { .. }));
    assert_eq!(net.family().name(), "FLUX.2 Klein's Qwen3");

    let tokens = net.tokenize("a photo of a cat").unwrap();
    let PromptTokens::Ids(ids) = &tokens else { panic!("one id sequence, got {tokens:?}") };
    assert_eq!(ids.len(), KLEIN_MIN_LENGTH);
    let encoded = net.encode(&*b, &tokens).unwrap();
    assert!(encoded.pooled.is_none());
    let width = 3 * set.qwen3.hidden;
    assert_eq!(width, set.flux2.text_dim);
    assert_eq!(encoded.cond.shape(), [1, KLEIN_MIN_LENGTH, width]);
    let cond = values(&b, &encoded.cond);

    // The prompt's rows are what the prompt alone gives: the pads change none of them.
    let TextEncoderNet::Flux2Klein { model, .. } = &net else { unreachable!() };
    let attended = qwen3::attended_keys(ids);
    let alone = model.tapped_hidden_states(&*b, &ids[..attended], attended, &KLEIN_TAPS).unwrap();
    assert_close("the prompt's rows", &cond[..attended * width], &values(&b, &alone), 1e-5);
    // The pad rows are computed (not zero) and differ by position (RoPE).
    let pad_row = |i: usize| &cond[i * width..(i + 1) * width];
    assert!(pad_row(attended).iter().any(|&v| v != 0.0));
    assert_ne!(pad_row(attended), pad_row(KLEIN_MIN_LENGTH - 1));
    drop(file);
    std::fs::remove_dir_all(dir).unwrap();
}
