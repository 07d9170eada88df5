//! The Qwen3 text encoder and its tokenizer against `scripts/reference/qwen3.py`'s fixtures: token ids from the
//! python `tokenizers` library (cross-checked there with transformers' `Qwen2Tokenizer`), hidden states from
//! transformers' `Qwen3Model` (tiny config, bf16 weights), and detection of good and broken files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::{MemoryManager, SafetensorsFile};
use kiln_compute::{Backend as _, DType};
use kiln_models::qwen3::{self, Config, Qwen3, Tokenizer};
use kiln_models::textgen::{Decoding, SamplingSettings, TokenPicker};
use kiln_models::{Error, Header};
use serde_json::Value;

use crate::common::{assert_close, cpu, fixture, ids, json, read_tensors};

const WEIGHTS: &str = "qwen3/weights.safetensors";

/// The tiny reference model's config.
const TINY: Config = Config {
    vocab: 1024,
    hidden: 64,
    layers: 3,
    heads: 4,
    kv_heads: 2,
    head_dim: 16,
    intermediate: 128,
    rms_eps: 1e-6,
    rope_theta: 1e6,
    variant: qwen3::Variant::Qwen3,
};

#[test]
fn tokenizer_matches_the_python_library() {
    let tokenizer = Tokenizer::bundled().unwrap();
    let cases = json("qwen3/tokenizer_ids.json");
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        assert_eq!(tokenizer.encode(prompt).unwrap(), ids(&case["encode"]), "encode({prompt:?})");
        assert_eq!(
            tokenizer.zimage_prompt(prompt).unwrap(),
            ids(&case["zimage"]),
            "zimage_prompt({prompt:?})"
        );
    }
}

#[test]
fn the_empty_prompt_is_the_template() {
    let tokenizer = Tokenizer::bundled().unwrap();
    assert_eq!(
        tokenizer.zimage_prompt("").unwrap(),
        [151644, 872, 198, 151645, 198, 151644, 77091, 198]
    );
    assert_eq!(tokenizer.encode("").unwrap(), Vec::<u32>::new());
    // Weighting syntax stays text; escaped parentheses lose their backslash.
    assert_eq!(
        tokenizer.zimage_prompt(r"\(cat\)").unwrap(),
        tokenizer.zimage_prompt("(cat)").unwrap()
    );
}

#[test]
fn detects_the_tiny_model() {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let config = qwen3::detect(&Header::new(&file, "")).unwrap();
    assert_eq!(config, Some(TINY));
}

#[test]
fn the_plan_loads_every_layer_and_the_final_norm_for_generation() {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let plan = qwen3::load_plan(&Header::new(&file, ""), &TINY);
    assert_eq!(plan.files, [fixture(WEIGHTS)]);
    assert_eq!(plan.slots.len(), 1 + 11 * 3 + 1);
    for slot in &plan.slots {
        assert_eq!(slot.parts, [(0, slot.name.clone())]);
        assert!(!slot.name.starts_with("lm_head"));
    }
    assert!(plan.slots.iter().any(|s| s.name == "model.norm.weight"));
    assert!(plan.slots.iter().any(|s| s.name.starts_with("model.layers.2.")));
}

#[test]
fn the_plan_keeps_the_names_under_a_prefix() {
    let dir = scratch("prefixed");
    let path = dir.join("checkpoint.safetensors");
    let prefix = "text_encoders.qwen3_4b.transformer.";
    let tensors = header_of(&fixture(WEIGHTS))
        .into_iter()
        .map(|(name, shape)| (format!("{prefix}{name}"), shape))
        .collect();
    write_header(&path, &tensors);
    let file = SafetensorsFile::open(&path).unwrap();
    let header = Header::new(&file, prefix);
    let config = qwen3::detect(&header).unwrap().unwrap();
    assert_eq!(config, TINY);
    let plan = qwen3::load_plan(&header, &config);
    assert_eq!(plan.slots[0].name, "model.embed_tokens.weight");
    assert_eq!(plan.slots[0].parts, [(0, format!("{prefix}model.embed_tokens.weight"))]);
    drop(file);
    std::fs::remove_dir_all(dir).unwrap();
}

/// The hidden states of the fixture's id sequences under `manager` on `b`.
fn check_hidden_states(b: &Cpu, manager: &Arc<MemoryManager>) {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let config = qwen3::detect(&header).unwrap().unwrap();
    let weights = manager.load(&qwen3::load_plan(&header, &config), &mut |_, _| {}).unwrap();
    let model = Qwen3::new(config, weights);
    let expected = read_tensors("qwen3/hidden.safetensors");
    let cases = json("qwen3/cases.json");
    for (name, case) in cases.as_object().unwrap() {
        let ids = ids(case);
        let (shape, want) = &expected[&format!("hidden.{name}")];
        let out = model.hidden_state(b, &ids).unwrap();
        assert_eq!(out.shape(), shape.as_slice(), "{name}");
        assert_eq!(out.dtype(), DType::F32);
        let got = b.to_f32(&out).unwrap();
        assert_close(&format!("hidden state {name}"), &got, want, 1e-4);
    }
}

#[test]
fn hidden_state_matches_transformers() {
    let (b, manager) = cpu(1 << 30);
    check_hidden_states(&b, &manager);
    // ComfyUI computes text encoders in f32 on every device: on a backend whose activations are bf16 (CUDA's
    // default) the hidden states are still the f32 ones.
    check_hidden_states(&b.with_compute_dtype(DType::BF16).unwrap(), &manager);
}

#[test]
fn hidden_state_rejects_bad_ids() {
    let (b, manager) = cpu(1 << 30);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let weights = manager.load(&qwen3::load_plan(&header, &TINY), &mut |_, _| {}).unwrap();
    let model = Qwen3::new(TINY, weights);
    assert!(matches!(model.hidden_state(&*b, &[]), Err(Error::Invalid(_))));
    assert!(
        matches!(model.hidden_state(&*b, &[3, 1024]), Err(Error::Invalid(m)) if m.contains("1024"))
    );
}

// --- Detection of other and broken files ---------------------------------------------------------------------

/// A fresh directory for one test's files (the test removes it).
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-qwen3-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The names and shapes of a safetensors file's tensors.
fn header_of(path: &Path) -> BTreeMap<String, Vec<usize>> {
    let file = SafetensorsFile::open(path).unwrap();
    file.tensors().map(|(name, info)| (name.to_owned(), info.shape.clone())).collect()
}

/// Writes a safetensors file of zero-filled bf16 tensors.
fn write_header(path: &Path, tensors: &BTreeMap<String, Vec<usize>>) {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape) in tensors {
        let len = shape.iter().product::<usize>() * 2;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut json = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    bytes.resize(bytes.len() + offset, 0);
    std::fs::write(path, bytes).unwrap();
}

/// Detection of the fixture's tensors changed by `edit`, in a file of its own.
fn detect_edited(
    test: &str,
    edit: impl FnOnce(&mut BTreeMap<String, Vec<usize>>),
) -> (PathBuf, kiln_models::Result<Option<Config>>) {
    let path = scratch(test).join("qwen.safetensors");
    let mut tensors = header_of(&fixture(WEIGHTS));
    edit(&mut tensors);
    write_header(&path, &tensors);
    let file = SafetensorsFile::open(&path).unwrap();
    let detected = qwen3::detect(&Header::new(&file, ""));
    drop(file);
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    (path, detected)
}

/// Asserts an `Error::Unsupported` about `path` whose message names `key`.
#[track_caller]
fn assert_unsupported(result: kiln_models::Result<Option<Config>>, path: &Path, key: &str) {
    match result {
        Err(Error::Unsupported { path: p, msg }) => {
            assert_eq!(p, path);
            assert!(msg.contains(key), "{msg:?} does not name {key}");
        }
        other => panic!("expected Unsupported naming {key}, got {other:?}"),
    }
}

#[test]
fn other_families_are_not_qwen3() {
    let (_, detected) = detect_edited("vae", |t| {
        t.clear();
        t.insert("decoder.conv_in.weight".into(), vec![512, 16, 3, 3]);
        t.insert("encoder.conv_in.weight".into(), vec![128, 3, 3, 3]);
    });
    assert!(matches!(detected, Ok(None)), "{detected:?}");
    // Qwen2.5-style keys without q_norm are another text encoder.
    let (_, detected) = detect_edited("qwen25", |t| {
        t.retain(|name, _| !name.contains("q_norm"));
    });
    assert!(matches!(detected, Ok(None)), "{detected:?}");
}

#[test]
fn a_missing_tensor_is_unsupported() {
    let key = "model.layers.1.self_attn.k_proj.weight";
    let (path, detected) = detect_edited("missing", |t| {
        t.remove(key);
    });
    assert_unsupported(detected, &path, key);
    let (path, detected) = detect_edited("no-embed", |t| {
        t.remove("model.embed_tokens.weight");
    });
    assert_unsupported(detected, &path, "model.embed_tokens.weight");
}

#[test]
fn a_wrong_shape_is_unsupported() {
    let key = "model.layers.2.mlp.down_proj.weight";
    let (path, detected) = detect_edited("shape", |t| {
        t.insert(key.into(), vec![64, 96]);
    });
    assert_unsupported(detected, &path, key);
    let (path, detected) = detect_edited("heads", |t| {
        t.insert("model.layers.0.self_attn.q_norm.weight".into(), vec![24]);
    });
    assert_unsupported(detected, &path, "q_norm");
}

#[test]
fn layers_must_be_consecutive() {
    let (path, detected) = detect_edited("gap", |t| {
        t.retain(|name, _| !name.starts_with("model.layers.1."));
    });
    assert_unsupported(detected, &path, "model.layers.2.");
    // A file with fewer layers is a smaller model: its hidden state is layer 0's.
    let (_, detected) = detect_edited("two", |t| {
        t.retain(|name, _| !name.starts_with("model.layers.2."));
    });
    assert_eq!(detected.unwrap(), Some(Config { layers: 2, ..TINY }));
}

// --- Text generation against ComfyUI's own (scripts/reference/qwen3_generate.py) ------------------------------

/// The fixture's settings as Kiln's decoding.
fn decoding(sampling: &Value) -> Decoding {
    if sampling.is_null() {
        return Decoding::Greedy;
    }
    let f = |name: &str| sampling[name].as_f64().unwrap() as f32;
    Decoding::Sample(SamplingSettings {
        temperature: f("temperature"),
        top_k: sampling["top_k"].as_u64().unwrap() as usize,
        top_p: f("top_p"),
        min_p: f("min_p"),
        repetition_penalty: f("repetition_penalty"),
        presence_penalty: f("presence_penalty"),
        seed: sampling["seed"].as_u64().unwrap(),
    })
}

#[test]
fn generation_picks_comfyuis_tokens() {
    let (b, manager) = cpu(1 << 30);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let weights =
        manager.load(&qwen3::load_plan(&Header::new(&file, ""), &TINY), &mut |_, _| {}).unwrap();
    let model = Qwen3::new(TINY, weights);
    let fixture = json("qwen3/generate.json");
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let prompt = ids(&case["prompt"]);
        let max_new = case["max_length"].as_u64().unwrap() as usize;
        let mut picker = TokenPicker::new(decoding(&case["sampling"]));
        let mut first: Option<Vec<f32>> = None;
        let mut pick = |logits: Vec<f32>| {
            first.get_or_insert_with(|| logits.clone());
            picker.pick(logits)
        };
        let mut steps = 0;
        let generated = model
            .generate(&*b, &prompt, max_new, &qwen3::STOP_TOKENS, &mut pick, &mut |n| {
                steps = n;
                Ok(())
            })
            .unwrap();
        let want: Vec<f32> = case["first_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_close(&format!("{name}: first logits"), &first.unwrap(), &want, 1e-4);
        assert_eq!(generated, ids(&case["generated"]), "{name}: the generated tokens");
        assert_eq!(steps, generated.len(), "{name}: one report per token");
    }
}

#[test]
fn generation_stops_at_a_stop_token_and_keeps_it() {
    let (b, manager) = cpu(1 << 30);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let weights =
        manager.load(&qwen3::load_plan(&Header::new(&file, ""), &TINY), &mut |_, _| {}).unwrap();
    let model = Qwen3::new(TINY, weights);
    // Whatever the logits, the picker answers 7, then 9; 9 stops.
    let mut answers = [7u32, 9, 11].into_iter();
    let mut pick = |_: Vec<f32>| answers.next().unwrap();
    let out = model.generate(&*b, &[1, 2], 10, &[9], &mut pick, &mut |_| Ok(())).unwrap();
    assert_eq!(out, [7, 9]);
    // An error from the progress callback (an interrupt) ends the run with it.
    let mut pick = |_: Vec<f32>| 5u32;
    let stopped = model.generate(&*b, &[1], 10, &[], &mut pick, &mut |n| {
        if n == 3 { Err(Error::Invalid("interrupted".into())) } else { Ok(()) }
    });
    assert!(matches!(stopped, Err(Error::Invalid(m)) if m == "interrupted"));
}

#[test]
fn decode_skips_special_tokens_as_comfyui() {
    let tokenizer = Tokenizer::bundled().unwrap();
    let fixture = json("qwen3/generate.json");
    for case in fixture["decode"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(tokenizer.decode(&ids(&case["ids"])).unwrap(), text);
    }
}
