//! The T5 v1.1 encoder and its tokenizer against `scripts/reference/t5.py`'s fixtures: token ids of ComfyUI's T5
//! `tokenizer.json` run by the python `tokenizers` library (cross-checked there with transformers'
//! `T5TokenizerFast`), hidden states from transformers' `T5EncoderModel` (tiny config, bf16 weights; checked
//! there against ComfyUI's own T5), the relative position buckets of transformers, and detection of good and
//! broken files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType};
use kiln_models::t5::{self, Config, T5, Tokenizer};
use kiln_models::{Error, Header};

use crate::common::{assert_close, cpu, fixture, ids, json, read_tensors, write_header_only};

const WEIGHTS: &str = "t5/weights.safetensors";

/// The tiny reference model's config.
const TINY: Config = Config {
    vocab: 512,
    d_model: 64,
    blocks: 3,
    heads: 4,
    d_kv: 16,
    d_ff: 96,
    buckets: 32,
    max_distance: 128,
    rms_eps: 1e-6,
};

#[test]
fn tokenizer_matches_comfyuis() {
    let tokenizer = Tokenizer::bundled().unwrap();
    let cases = json("t5/tokenizer_ids.json");
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 30);
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        assert_eq!(tokenizer.word_ids(prompt).unwrap(), ids(&case["ids"]), "word_ids({prompt:?})");
    }
}

#[test]
fn tokenizer_basics() {
    let tokenizer = Tokenizer::bundled().unwrap();
    assert_eq!(tokenizer.word_ids("").unwrap(), Vec::<u32>::new());
    assert_eq!(tokenizer.word_ids("a photo of a cat").unwrap(), [3, 9, 1202, 13, 3, 9, 1712]);
    assert_eq!(tokenizer.word_ids("</s><pad>").unwrap(), [t5::EOS, t5::PAD]);
}

#[test]
fn buckets_match_transformers() {
    let fixture = json("t5/buckets.json");
    let positions = fixture["relative_positions"].as_array().unwrap();
    let buckets = fixture["buckets"].as_array().unwrap();
    assert_eq!(positions.len(), 601);
    for (position, bucket) in positions.iter().zip(buckets) {
        let position = position.as_i64().unwrap();
        assert_eq!(
            t5::relative_position_bucket(position, 32, 128),
            bucket.as_u64().unwrap() as usize,
            "relative position {position}"
        );
    }
}

#[test]
fn detects_the_tiny_model() {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let config = t5::detect(&Header::new(&file, "")).unwrap();
    assert_eq!(config, Some(TINY));
}

#[test]
fn the_plan_loads_the_tables_every_block_and_the_final_norm() {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let plan = t5::load_plan(&Header::new(&file, ""), &TINY);
    assert_eq!(plan.files, [fixture(WEIGHTS)]);
    assert_eq!(plan.slots.len(), 2 + 9 * 3 + 1);
    for slot in &plan.slots {
        assert_eq!(slot.parts, [(0, slot.name.clone())]);
        assert!(file.tensors().any(|(name, _)| name == slot.name), "{}", slot.name);
    }
    // Every tensor of the file is loaded (the fixture holds nothing else).
    assert_eq!(plan.slots.len(), file.tensors().count());
}

#[test]
fn the_plan_keeps_the_names_under_a_prefix() {
    let dir = scratch("prefixed");
    let path = dir.join("checkpoint.safetensors");
    let prefix = "text_encoders.t5xxl.transformer.";
    let tensors: Vec<(String, Vec<usize>)> = header_of(&fixture(WEIGHTS))
        .into_iter()
        .map(|(name, shape)| (format!("{prefix}{name}"), shape))
        .collect();
    write_header_only(&path, &tensors);
    let file = SafetensorsFile::open(&path).unwrap();
    let header = Header::new(&file, prefix);
    let config = t5::detect(&header).unwrap().unwrap();
    assert_eq!(config, TINY);
    let plan = t5::load_plan(&header, &config);
    assert_eq!(plan.slots[0].name, "shared.weight");
    assert_eq!(plan.slots[0].parts, [(0, format!("{prefix}shared.weight"))]);
    drop(file);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn hidden_state_matches_transformers() {
    let (b, manager) = cpu(1 << 30);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let config = t5::detect(&header).unwrap().unwrap();
    let weights = manager.load(&t5::load_plan(&header, &config), &mut |_, _| {}).unwrap();
    let model = T5::new(config, weights);
    let expected = read_tensors("t5/hidden.safetensors");
    let cases = json("t5/cases.json");
    let cases = cases.as_object().unwrap();
    assert!(cases.values().any(|ids| ids.as_array().unwrap().len() > 128));
    for (name, case) in cases {
        let ids = ids(case);
        let (shape, want) = &expected[&format!("hidden.{name}")];
        let out = model.hidden_state(&*b, &ids).unwrap();
        assert_eq!(out.shape(), shape.as_slice(), "{name}");
        assert_eq!(out.dtype(), DType::F32);
        let got = b.to_f32(&out).unwrap();
        assert_close(&format!("hidden state {name}"), &got, want, 1e-4);
    }
}

#[test]
fn hidden_state_rejects_bad_ids() {
    let (b, manager) = cpu(1 << 30);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let weights = manager.load(&t5::load_plan(&header, &TINY), &mut |_, _| {}).unwrap();
    let model = T5::new(TINY, weights);
    assert!(matches!(model.hidden_state(&*b, &[]), Err(Error::Invalid(_))));
    assert!(
        matches!(model.hidden_state(&*b, &[3, 512]), Err(Error::Invalid(m)) if m.contains("512"))
    );
}

// --- Detection of other and broken files ---------------------------------------------------------------------

/// A fresh directory for one test's files (the test removes it).
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-t5-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The names and shapes of a safetensors file's tensors.
fn header_of(path: &Path) -> BTreeMap<String, Vec<usize>> {
    let file = SafetensorsFile::open(path).unwrap();
    file.tensors().map(|(name, info)| (name.to_owned(), info.shape.clone())).collect()
}

/// Detection of the fixture's tensors changed by `edit`, in a file of its own.
fn detect_edited(
    test: &str,
    edit: impl FnOnce(&mut BTreeMap<String, Vec<usize>>),
) -> (PathBuf, kiln_models::Result<Option<Config>>) {
    let path = scratch(test).join("t5.safetensors");
    let mut tensors = header_of(&fixture(WEIGHTS));
    edit(&mut tensors);
    write_header_only(&path, &tensors.into_iter().collect::<Vec<_>>());
    let file = SafetensorsFile::open(&path).unwrap();
    let detected = t5::detect(&Header::new(&file, ""));
    drop(file);
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    (path, detected)
}

/// Asserts an `Error::Unsupported` about `path` whose message names `what`.
#[track_caller]
fn assert_unsupported(result: kiln_models::Result<Option<Config>>, path: &Path, what: &str) {
    match result {
        Err(Error::Unsupported { path: p, msg }) => {
            assert_eq!(p, path);
            assert!(msg.contains(what), "{msg:?} does not name {what}");
        }
        other => panic!("expected Unsupported naming {what}, got {other:?}"),
    }
}

#[test]
fn other_files_are_not_t5() {
    let (_, detected) = detect_edited("vae", |t| {
        t.clear();
        t.insert("decoder.conv_in.weight".into(), vec![512, 16, 3, 3]);
        t.insert("encoder.conv_in.weight".into(), vec![128, 3, 3, 3]);
    });
    assert!(matches!(detected, Ok(None)), "{detected:?}");
    let (_, detected) = detect_edited("clip", |t| {
        t.clear();
        t.insert("text_model.encoder.layers.0.mlp.fc1.weight".into(), vec![3072, 768]);
        t.insert("text_model.embeddings.token_embedding.weight".into(), vec![49408, 768]);
    });
    assert!(matches!(detected, Ok(None)), "{detected:?}");
    let file = SafetensorsFile::open(fixture("qwen3/weights.safetensors")).unwrap();
    assert!(matches!(t5::detect(&Header::new(&file, "")), Ok(None)));
}

#[test]
fn a_whole_t5_file_is_its_encoder() {
    // The decoder of a T5ForConditionalGeneration file is not read.
    let (_, detected) = detect_edited("whole", |t| {
        t.insert("decoder.block.0.layer.0.SelfAttention.q.weight".into(), vec![64, 64]);
        t.insert("decoder.final_layer_norm.weight".into(), vec![64]);
        t.insert("lm_head.weight".into(), vec![512, 64]);
    });
    assert_eq!(detected.unwrap(), Some(TINY));
}

#[test]
fn widths_come_from_the_shapes() {
    // 6 heads of width 8 (inner 48 ≠ d_model 64), FFN 80, 2 blocks, 16 buckets.
    let (_, detected) = detect_edited("widths", |t| {
        t.retain(|name, _| !name.starts_with("encoder.block.2."));
        for (name, shape) in t.iter_mut() {
            if name.ends_with("relative_attention_bias.weight") {
                *shape = vec![16, 6];
            } else if [".q.weight", ".k.weight", ".v.weight"].iter().any(|s| name.ends_with(s)) {
                *shape = vec![48, 64];
            } else if name.ends_with(".o.weight") {
                *shape = vec![64, 48];
            } else if name.ends_with("wi_0.weight") || name.ends_with("wi_1.weight") {
                *shape = vec![80, 64];
            } else if name.ends_with("wo.weight") {
                *shape = vec![64, 80];
            }
        }
    });
    let want = Config { blocks: 2, heads: 6, d_kv: 8, d_ff: 80, buckets: 16, ..TINY };
    assert_eq!(detected.unwrap(), Some(want));
}

#[test]
fn umt5_and_ungated_t5_are_unsupported() {
    let (path, detected) = detect_edited("umt5", |t| {
        t.insert(
            "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight".into(),
            vec![32, 4],
        );
    });
    assert_unsupported(detected, &path, "umT5");
    let (path, detected) = detect_edited("ungated", |t| {
        for i in 0..3 {
            let gate = t.remove(&format!("encoder.block.{i}.layer.1.DenseReluDense.wi_0.weight"));
            t.remove(&format!("encoder.block.{i}.layer.1.DenseReluDense.wi_1.weight"));
            t.insert(format!("encoder.block.{i}.layer.1.DenseReluDense.wi.weight"), gate.unwrap());
        }
    });
    assert_unsupported(detected, &path, "DenseReluDense.wi");
}

#[test]
fn a_missing_tensor_is_unsupported() {
    for key in [
        "encoder.block.1.layer.0.SelfAttention.k.weight",
        "encoder.block.2.layer.1.layer_norm.weight",
        "shared.weight",
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        "encoder.final_layer_norm.weight",
    ] {
        let (path, detected) = detect_edited("missing", |t| {
            t.remove(key);
        });
        assert_unsupported(detected, &path, key);
    }
}

#[test]
fn a_wrong_shape_is_unsupported() {
    let key = "encoder.block.2.layer.1.DenseReluDense.wo.weight";
    let (path, detected) = detect_edited("shape", |t| {
        t.insert(key.into(), vec![64, 64]);
    });
    assert_unsupported(detected, &path, key);
    let (path, detected) = detect_edited("heads", |t| {
        t.insert(
            "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight".into(),
            vec![32, 5],
        );
    });
    assert_unsupported(detected, &path, "whole heads");
}

#[test]
fn blocks_must_be_consecutive() {
    let (path, detected) = detect_edited("gap", |t| {
        t.retain(|name, _| !name.starts_with("encoder.block.1."));
    });
    assert_unsupported(detected, &path, "encoder.block.2.");
    let (_, detected) = detect_edited("two", |t| {
        t.retain(|name, _| !name.starts_with("encoder.block.2."));
    });
    assert_eq!(detected.unwrap(), Some(Config { blocks: 2, ..TINY }));
}
