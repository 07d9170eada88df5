//! FLUX.2 dev's text encoder against `scripts/reference/mistral3.py`'s fixtures: the Tekken tokenizer rebuilt from
//! the real vocabulary gives ComfyUI's ids for the FLUX.2 template, and hidden states 10, 20 and 30 of
//! transformers' `MistralModel` (tiny, 31 layers) under ComfyUI's mask, through the whole `CLIPLoader` path
//! (detection, the tokenizer read from the file's `tekken_model`, a pruned 30-layer file).

use std::io::Read as _;
use std::path::PathBuf;

use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType, Tensor};
use kiln_models::family::{PromptTokens, TextEncoderDetected, TextEncoderFamily, TextEncoderNet};
use kiln_models::mistral3::{self, TAPS, Tokenizer};
use kiln_models::qwen3::{Config, Variant};
use kiln_models::synth::{self, SynthDtype, SynthFamily, ZImageTurboSet};
use kiln_models::{Error, Header};

use crate::common::{assert_close, cpu, fixture, ids, json, read_tensors};

const WEIGHTS: &str = "mistral3/weights.safetensors";

/// The tiny reference model's config: 31 layers, so every tap is inside the stack; ComfyUI's head width.
const TINY: Config = Config {
    vocab: 1512,
    hidden: 16,
    layers: 31,
    heads: 2,
    kv_heads: 1,
    head_dim: 128,
    intermediate: 32,
    rms_eps: 1e-5,
    rope_theta: 1e9,
    variant: Variant::Mistral3,
};

fn values(b: &Cpu, t: &Tensor<Cpu>) -> Vec<f32> {
    assert_eq!(t.dtype(), DType::F32);
    b.to_f32(t).unwrap()
}

/// A fresh directory for one test's files (the test removes it).
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-mistral3-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The real Tekken vocabulary (Mistral Small 3.1's, as FLUX.2 dev's file embeds it), rebuilt.
fn real_tokenizer() -> Tokenizer {
    let path = fixture("mistral3/tekken.json.gz");
    let gz = std::fs::read(&path).unwrap();
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut json).expect("a gzip file");
    Tokenizer::from_tekken_json(&json).unwrap()
}

#[test]
fn flux2_ids_match_comfyuis_tokenizer_on_the_real_vocabulary() {
    let tokenizer = real_tokenizer();
    assert_eq!(tokenizer.vocab_size(), 131072);
    let cases = json("mistral3/tokenizer_ids.json");
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 15);
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let got = tokenizer.flux2_prompt(prompt).unwrap();
        assert_eq!(got, ids(&case["ids"]), "flux2_prompt({prompt:?})");
    }
    // The template's specials: <s> 1, [SYSTEM_PROMPT] 17, [/SYSTEM_PROMPT] 18, [INST] 3, [/INST] 4.
    let empty = tokenizer.flux2_prompt("").unwrap();
    assert_eq!(empty[..2], [1, 17]);
    assert_eq!(empty[empty.len() - 3..], [18, 3, 4]);
    // ComfyUI's system prompt has a newline between "object" and "attribution" (BFL's has a space).
    let newline = tokenizer.encode("\n").unwrap();
    assert_eq!(newline, [1010]);
    assert!(empty.windows(3).any(|w| w[1] == 1010), "the template's newline is tokenised");
    // Written specials are matched whole; `<unk>` (0) is where ComfyUI's mask starts.
    let written = tokenizer.encode("a<unk>b[INST]").unwrap();
    assert!(written.contains(&0) && written.ends_with(&[3]), "{written:?}");
    assert_eq!(mistral3::attended_keys(&[1, 5, 0, 7]), 2);
}

#[test]
fn malformed_tekken_json_is_refused_naming_the_problem() {
    for (json, says) in [
        (&b"not json"[..], "not JSON"),
        (br#"{"vocab": []}"#, "config"),
        (br#"{"config": {"default_num_special_tokens": 2, "default_vocab_size": 1}}"#, "default_vocab_size"),
        (
            br#"{"config": {"default_num_special_tokens": 1, "default_vocab_size": 3}, "vocab": [{"rank": 0, "token_bytes": "$$"}], "special_tokens": []}"#,
            "base64",
        ),
    ] {
        match Tokenizer::from_tekken_json(json) {
            Err(Error::Invalid(msg)) => assert!(msg.contains(says), "{msg}"),
            other => panic!("expected a refusal for {says}, got {other:?}"),
        }
    }
}

#[test]
fn the_fixture_file_is_detected_loaded_and_encodes_like_transformers() {
    let (b, manager) = cpu(1 << 30);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let found = TextEncoderDetected::detect(&header).unwrap().expect("a text encoder");
    let TextEncoderDetected::Mistral3(detected) = &found else { panic!("Mistral, got {found:?}") };
    assert_eq!(detected.config, TINY);
    assert_eq!(found.name(), "Mistral Small 3 (FLUX.2 dev)");
    // Any CLIPLoader type keeps it FLUX.2 dev's (ComfyUI decides by the file alone).
    for kind in ["flux2", "flux", "stable_diffusion"] {
        assert_eq!(
            found.clone().for_clip_type(kind).unwrap().family(),
            TextEncoderFamily::Mistral3
        );
    }
    // Only the embedding and layers 0-29 are loaded: not layer 30, not the final norm, not `tekken_model`.
    let plan = found.load_plan(&header);
    assert_eq!(plan.slots.len(), 1 + 30 * 9);
    assert!(!plan.slots.iter().any(|s| s.name.starts_with("model.layers.30.")));
    let weights = manager.load(&plan, &mut |_, _| {}).unwrap();
    let net = found.build(weights).unwrap();
    assert_eq!(net.family(), TextEncoderFamily::Mistral3);

    let expected = read_tensors("mistral3/hidden.safetensors");
    let cases = json("mistral3/cases.json");
    let cases = cases.as_object().unwrap();
    assert_eq!(cases.len(), 3);
    let TextEncoderNet::Mistral3 { tokenizer, .. } = &net else { unreachable!() };
    // The small tekken JSON the file carries gives ComfyUI's ids for the template.
    assert_eq!(tokenizer.flux2_prompt("a photo of a cat").unwrap(), ids(&cases["template"]["ids"]));
    assert_eq!(tokenizer.vocab_size(), TINY.vocab);
    for (name, case) in cases {
        let ids = ids(&case["ids"]);
        assert_eq!(mistral3::attended_keys(&ids), case["attended"].as_u64().unwrap() as usize);
        let (shape, want) = &expected[&format!("hidden.{name}")];
        let encoded = net.encode(&*b, &PromptTokens::Ids(ids)).unwrap();
        assert!(encoded.pooled.is_none());
        assert_eq!(encoded.cond.shape(), shape.as_slice(), "{name}");
        assert_eq!(shape[2], TAPS.len() * TINY.hidden);
        assert_close(
            &format!("Mistral hidden states {name}"),
            &values(&b, &encoded.cond),
            want,
            1e-4,
        );
    }
    // `tokenize` is the template through the file's tokenizer.
    let tokens = net.tokenize("a photo of a cat").unwrap();
    assert_eq!(tokens, PromptTokens::Ids(ids(&cases["template"]["ids"])));
}

#[test]
fn a_pruned_30_layer_file_gives_the_same_states() {
    let dir = scratch("pruned");
    let path = dir.join("mistral_pruned.safetensors");
    let bytes = std::fs::read(fixture(WEIGHTS)).unwrap();
    let full = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView<'_>)> = full
        .tensors()
        .into_iter()
        .filter(|(name, _)| !name.starts_with("model.layers.30.") && name != "model.norm.weight")
        .collect();
    safetensors::serialize_to_file(kept, None, &path).unwrap();
    let (b, manager) = cpu(1 << 30);
    let file = SafetensorsFile::open(&path).unwrap();
    let header = Header::new(&file, "");
    let found = TextEncoderDetected::detect(&header).unwrap().unwrap();
    let TextEncoderDetected::Mistral3(detected) = &found else { panic!("Mistral, got {found:?}") };
    assert_eq!(detected.config.layers, 30);
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).unwrap();
    let net = found.build(weights).unwrap();
    let cases = json("mistral3/cases.json");
    let ids = ids(&cases["random"]["ids"]);
    let encoded = net.encode(&*b, &PromptTokens::Ids(ids)).unwrap();
    let (_, want) = &read_tensors("mistral3/hidden.safetensors")["hidden.random"];
    // Tap 30 is the last layer's output, not final-normed (ComfyUI's pruned config has no final norm).
    assert_close("pruned Mistral hidden states", &values(&b, &encoded.cond), want, 1e-4);
    drop(file);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn shallow_files_are_ministral_and_tokenizerless_ones_llama() {
    let dir = scratch("refusals");
    let bytes = std::fs::read(fixture(WEIGHTS)).unwrap();
    let full = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let write = |name: &str, keep: &dyn Fn(&str) -> bool| {
        let path = dir.join(name);
        let kept: Vec<(String, safetensors::tensor::TensorView<'_>)> =
            full.tensors().into_iter().filter(|(n, _)| keep(n)).collect();
        safetensors::serialize_to_file(kept, None, &path).unwrap();
        path
    };
    // 29 layers: hidden state 30 does not exist, so a file of neither released width is Ministral 3 3B's
    // (ERNIE-Image's encoder), as a 3072-wide one is.
    let shallow = write("shallow.safetensors", &|n| {
        !(29..31).any(|i| n.starts_with(&format!("model.layers.{i}.")))
    });
    let file = SafetensorsFile::open(&shallow).unwrap();
    match TextEncoderDetected::detect(&Header::new(&file, "")) {
        Ok(Some(found @ TextEncoderDetected::Mistral3(_))) => {
            assert_eq!(found.family(), TextEncoderFamily::Ernie)
        }
        other => panic!("expected Ministral 3 3B, got {other:?}"),
    }
    // Without `tekken_model` a tiny Llama-shaped file is not Mistral: it reads as Llama 3 (HiDream's encoder).
    let bare = write("bare.safetensors", &|n| n != "tekken_model");
    let file = SafetensorsFile::open(&bare).unwrap();
    let found = TextEncoderDetected::detect(&Header::new(&file, "")).unwrap();
    assert!(matches!(found, Some(TextEncoderDetected::Llama3(_))), "{found:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn synths_tiny_file_loads_and_conditions_the_tiny_flux2_dev() {
    let set = ZImageTurboSet::tiny();
    let dir = scratch("synth");
    let path = dir.join("mistral_3_small_flux2_bf16.safetensors");
    let family = SynthFamily::TextEncoder(TextEncoderFamily::Mistral3);
    assert_eq!(family.name(), "mistral3");
    synth::write_family(&path, family, &set, SynthDtype::Bf16, 7, &mut |_, _| {}).unwrap();
    let (b, manager) = cpu(1 << 30);
    let file = SafetensorsFile::open(&path).unwrap();
    let header = Header::new(&file, "");
    let found =
        TextEncoderDetected::detect(&header).unwrap().unwrap().for_clip_type("flux2").unwrap();
    let TextEncoderDetected::Mistral3(detected) = &found else { panic!("Mistral, got {found:?}") };
    assert_eq!(detected.config, set.mistral3);
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).unwrap();
    let net = found.build(weights).unwrap();
    let tokens = net.tokenize("a photo of a cat, 2 dogs and ✨").unwrap();
    let PromptTokens::Ids(ids) = &tokens else { panic!("one id sequence, got {tokens:?}") };
    assert_eq!(ids[..2], [1, 17]);
    assert!(ids.iter().all(|&id| (id as usize) < set.mistral3.vocab));
    let encoded = net.encode(&*b, &tokens).unwrap();
    assert_eq!(encoded.cond.shape(), [1, ids.len(), set.flux2.text_dim]);
    drop(file);
    std::fs::remove_dir_all(dir).unwrap();
}
