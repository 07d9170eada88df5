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
use kiln_models::{Error, Header};
use serde_json::Value;

use crate::common::{assert_close, cpu, fixture, read_tensors};

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
};

fn json(relative: &str) -> Value {
    let path = fixture(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("an id list").iter().map(|id| id.as_u64().expect("an id") as u32).collect()
}

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
fn the_plan_skips_the_last_layer_and_the_norm() {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let plan = qwen3::load_plan(&Header::new(&file, ""), &TINY);
    assert_eq!(plan.files, [fixture(WEIGHTS)]);
    assert_eq!(plan.slots.len(), 1 + 11 * 2);
    for slot in &plan.slots {
        assert_eq!(slot.parts, [(0, slot.name.clone())]);
        assert!(!slot.name.starts_with("model.layers.2.") && !slot.name.starts_with("model.norm"));
    }
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
