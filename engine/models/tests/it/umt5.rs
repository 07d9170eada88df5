//! umT5-XXL, Wan's text encoder, against `scripts/reference/umt5.py`'s fixtures: the SentencePiece tokenizer
//! read from a model's bytes against the `sentencepiece` package (umT5's vocabulary under both whitespace
//! settings, small models of every normaliser setting), ComfyUI's weighted sections, the masked hidden state
//! against transformers' `UMT5EncoderModel`, ComfyUI's whole Wan encode (`WanT5Tokenizer` + `WanT5Model`) on a
//! tiny file, and detection (umT5 against T5-XXL, `CLIPLoader`'s type).

use std::io::Read as _;

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType};
use kiln_models::family::{PromptTokens, TextEncoderDetected, TextEncoderFamily};
use kiln_models::t5::{self, Config, SentencePiece, T5, Umt5File};
use kiln_models::{Error, Header};
use serde_json::Value;

use crate::common::{assert_close, cpu, fixture, ids, json, read_tensors, write_header_only};

const WEIGHTS: &str = "umt5/weights.safetensors";

/// The tiny reference model's config.
const TINY: Config = Config {
    vocab: 384,
    d_model: 64,
    blocks: 2,
    heads: 4,
    d_kv: 16,
    d_ff: 128,
    buckets: 32,
    max_distance: 128,
    rms_eps: 1e-6,
};

/// A gzipped fixture's bytes.
fn gunzip(relative: &str) -> Vec<u8> {
    let path = fixture(relative);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(&bytes[..]).read_to_end(&mut out).expect("a gzip file");
    out
}

/// The reduced umT5 SentencePiece model, with extra whitespace removed when `remove` (a second
/// `normalizer_spec` appended, which protobuf merges into the first: field 3, `remove_extra_whitespaces` = 1).
fn umt5_tokenizer(remove: bool) -> SentencePiece {
    let mut proto = gunzip("umt5/umt5_vocab.model.gz");
    if remove {
        proto.extend_from_slice(&[0x1A, 0x02, 0x20, 0x01]);
    }
    SentencePiece::from_proto(&proto).unwrap()
}

#[test]
fn tokenizer_matches_sentencepiece_on_umt5s_vocabulary() {
    let cases = json("umt5/umt5_ids.json");
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 50);
    assert!(cases.iter().any(|c| c["text"].as_str().unwrap().starts_with("色调艳丽，过曝")));
    for (remove, key) in [(false, "keep_whitespace"), (true, "remove_extra_whitespaces")] {
        let tokenizer = umt5_tokenizer(remove);
        assert_eq!(tokenizer.vocab_size(), 256_000);
        for case in cases {
            let text = case["text"].as_str().unwrap();
            assert_eq!(tokenizer.word_ids(text).unwrap(), ids(&case[key]), "{key}: {text:?}");
        }
    }
}

#[test]
fn weighted_sections_are_comfyuis() {
    let tokenizer = umt5_tokenizer(false);
    let cases = json("umt5/umt5_weighted.json");
    for case in cases.as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let got = t5::umt5_tokens(prompt, |w| tokenizer.word_ids(w)).unwrap();
        assert_eq!(got, sections(&case["sections"]), "{prompt:?}");
    }
}

/// Weighted sections as the fixtures hold them (`[[[id, weight], …]]`).
fn sections(v: &Value) -> Vec<Vec<(u32, f32)>> {
    let pair = |p: &Value| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32);
    v.as_array().unwrap().iter().map(|s| s.as_array().unwrap().iter().map(pair).collect()).collect()
}

#[test]
fn normaliser_settings_match_sentencepiece() {
    let settings = json("umt5/settings.json");
    let settings = settings.as_array().unwrap();
    assert_eq!(settings.len(), 7);
    for setting in settings {
        let name = setting["name"].as_str().unwrap();
        let tokenizer =
            SentencePiece::from_proto(&gunzip(&format!("umt5/settings/{name}.model.gz"))).unwrap();
        for case in setting["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            assert_eq!(tokenizer.word_ids(text).unwrap(), ids(&case["ids"]), "{name}: {text:?}");
        }
    }
}

#[test]
fn malformed_models_are_errors() {
    let proto = gunzip("umt5/umt5_vocab.model.gz");
    for bad in [&proto[..proto.len() - 3], &[0x0A, 0x7F][..], &[0xFF][..]] {
        assert!(matches!(SentencePiece::from_proto(bad), Err(Error::Tokenizer(_))));
    }
}

// --- The encoder ----------------------------------------------------------------------------------------------

/// The tiny file's encoder, loaded.
fn tiny_encoder() -> (std::sync::Arc<kiln_compute::backend::cpu::Cpu>, T5) {
    let (b, manager) = cpu(1 << 30);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let config = t5::detect_umt5(&header).unwrap().unwrap();
    let weights = manager.load(&t5::umt5_load_plan(&header, &config), &mut |_, _| {}).unwrap();
    (b, T5::umt5(config, weights))
}

#[test]
fn masked_hidden_state_matches_transformers() {
    let (b, model) = tiny_encoder();
    let expected = read_tensors("umt5/hidden.safetensors");
    let cases = json("umt5/cases.json");
    let cases = cases.as_object().unwrap();
    assert_eq!(cases.len(), 5);
    for (name, case) in cases {
        let ids = ids(case);
        let mask = t5::attention_mask(&ids);
        let (shape, want) = &expected[&format!("hidden.{name}")];
        let out = model.masked_hidden_state(&*b, &ids, &mask).unwrap();
        assert_eq!((out.shape(), out.dtype()), (shape.as_slice(), DType::F32), "{name}");
        let got = b.to_f32(&out).unwrap();
        assert_close(&format!("hidden state {name}"), &got, want, 1e-4);
        // The rows after the first EOS are exactly zero.
        for (row, _) in mask.iter().enumerate().filter(|(_, keep)| !**keep) {
            assert!(got[row * 64..(row + 1) * 64].iter().all(|&v| v == 0.0), "{name} row {row}");
        }
    }
}

#[test]
fn conditioning_is_comfyuis_wan_encoder() {
    let (b, manager) = cpu(1 << 30);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let found = TextEncoderDetected::detect(&header).unwrap().unwrap();
    assert_eq!(found.family(), TextEncoderFamily::Umt5Xxl);
    let found = found.for_clip_type("wan").unwrap();
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).unwrap();
    let net = found.build(weights).unwrap();
    assert_eq!(net.family(), TextEncoderFamily::Umt5Xxl);
    let expected = read_tensors("umt5/comfy.safetensors");
    let cases = json("umt5/comfy.json");
    let cases = cases.as_array().unwrap();
    assert!(cases.iter().any(|c| c["prompt"].as_str().unwrap().contains(":1.5)")));
    for (i, case) in cases.iter().enumerate() {
        let prompt = case["prompt"].as_str().unwrap();
        let tokens = net.tokenize(prompt).unwrap();
        assert_eq!(tokens, PromptTokens::Weighted(sections(&case["sections"])), "{prompt:?}");
        let encoded = net.encode(&*b, &tokens).unwrap();
        assert!(encoded.pooled.is_none());
        let (shape, want) = &expected[&format!("cond.{i}")];
        assert_eq!(encoded.cond.shape(), shape.as_slice(), "{prompt:?}");
        let got = b.to_f32(&encoded.cond).unwrap();
        assert_close(&format!("conditioning of {prompt:?}"), &got, want, 1e-4);
    }
}

// --- Detection ------------------------------------------------------------------------------------------------

#[test]
fn the_tiny_file_is_umt5_with_its_tokenizer() {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let found = Umt5File::detect(&header).unwrap().unwrap();
    assert_eq!(found.config, TINY);
    assert_eq!(found.spiece_key.as_deref(), Some(t5::SPIECE_MODEL));
    assert_eq!(found.tokenizer().unwrap().vocab_size(), 365);
    // T5-XXL's detection refuses it, naming umT5.
    let err = t5::detect(&header).unwrap_err();
    assert!(err.to_string().contains("umT5"), "{err}");
    // The plan loads the embedding, every block with its own bias table, the final norm; not the tokenizer.
    let plan = t5::umt5_load_plan(&header, &TINY);
    assert_eq!(plan.slots.len(), 1 + 10 * 2 + 1);
    let weights = file.tensors().filter(|(name, _)| *name != t5::SPIECE_MODEL).count();
    assert_eq!(plan.slots.len(), weights);
}

#[test]
fn t5_xxl_is_not_umt5() {
    let file = SafetensorsFile::open(fixture("t5/weights.safetensors")).unwrap();
    let header = Header::new(&file, "");
    assert!(Umt5File::detect(&header).unwrap().is_none());
    let found = TextEncoderDetected::detect(&header).unwrap().unwrap();
    assert_eq!(found.family(), TextEncoderFamily::T5Xxl);
    let err = found.for_clip_type("wan").unwrap_err();
    assert!(err.to_string().contains("umT5-XXL"), "{err}");
}

#[test]
fn clip_types_other_than_wan_refuse_umt5() {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let found = TextEncoderDetected::detect(&Header::new(&file, "")).unwrap().unwrap();
    for kind in ["stable_diffusion", "sd3", "flux", "flux2", "ltxv"] {
        let err = found.clone().for_clip_type(kind).unwrap_err();
        assert!(err.to_string().contains("type `wan`"), "{kind}: {err}");
    }
}

/// Detection of a header-only file of `tensors`.
fn detect_shapes(
    test: &str,
    tensors: &[(String, Vec<usize>)],
) -> (std::path::PathBuf, kiln_models::Result<Option<Umt5File>>) {
    let dir = std::env::temp_dir().join(format!("kiln-umt5-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("umt5.safetensors");
    write_header_only(&path, tensors);
    let file = SafetensorsFile::open(&path).unwrap();
    let found = Umt5File::detect(&Header::new(&file, ""));
    drop(file);
    std::fs::remove_dir_all(&dir).unwrap();
    (path, found)
}

/// The tiny file's tensor shapes, as `edit` changes them.
fn tiny_shapes(edit: impl FnOnce(&mut Vec<(String, Vec<usize>)>)) -> Vec<(String, Vec<usize>)> {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let mut tensors: Vec<(String, Vec<usize>)> = file
        .tensors()
        .filter(|(name, _)| *name != t5::SPIECE_MODEL)
        .map(|(name, info)| (name.to_owned(), info.shape.clone()))
        .collect();
    edit(&mut tensors);
    tensors
}

#[test]
fn a_one_block_file_is_umt5_by_its_vocabulary() {
    let one_block = |vocab: usize| {
        tiny_shapes(|t| {
            t.retain(|(name, _)| !name.starts_with("encoder.block.1."));
            for (name, shape) in t.iter_mut() {
                if name == "shared.weight" {
                    shape[0] = vocab;
                }
            }
        })
    };
    let (_, found) = detect_shapes("vocab", &one_block(t5::UMT5_VOCAB));
    let found = found.unwrap().unwrap();
    assert_eq!(found.config, Config { vocab: t5::UMT5_VOCAB, blocks: 1, ..TINY });
    assert_eq!(found.spiece_key, None);
    let err = found.tokenizer().unwrap_err();
    assert!(err.to_string().contains("spiece_model"), "{err}");
    let (_, found) = detect_shapes("t5vocab", &one_block(384));
    assert!(found.unwrap().is_none());
}

#[test]
fn a_block_without_its_bias_is_unsupported() {
    let key = "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight";
    let tensors = tiny_shapes(|t| {
        t.retain(|(name, _)| name != key);
        for (name, shape) in t.iter_mut() {
            if name == "shared.weight" {
                shape[0] = t5::UMT5_VOCAB;
            }
        }
    });
    let (path, found) = detect_shapes("bias", &tensors);
    match found {
        Err(Error::Unsupported { path: p, msg }) => {
            assert_eq!(p, path);
            assert!(msg.contains("umT5") && msg.contains(key), "{msg}");
        }
        other => panic!("expected Unsupported naming {key}, got {other:?}"),
    }
}
