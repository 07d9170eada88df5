//! SentencePiece BPE models (Gemma's tokenizer type) against `scripts/reference/spiece_bpe.py`'s fixtures: tiny
//! models trained by the `sentencepiece` package with Gemma's settings, with the default `nmt_nfkc` normaliser
//! (no byte fallback) and with unused pieces, each with the package's ids for a set of texts.

use std::io::Read as _;

use kiln_models::t5::{SYNTH_BPE_PIECES, SentencePiece, synth_bpe_model};

use crate::common::{fixture, ids, json};

/// A gzipped fixture's bytes.
fn gunzip(relative: &str) -> Vec<u8> {
    let path = fixture(relative);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(&bytes[..]).read_to_end(&mut out).expect("a gzip file");
    out
}

#[test]
fn bpe_models_match_sentencepiece() {
    let fixtures = json("spiece_bpe/cases.json");
    let models = fixtures["models"].as_array().unwrap();
    let names: Vec<&str> = models.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["gemma_like", "nmt_nfkc", "unused"]);
    for model in models {
        let name = model["name"].as_str().unwrap();
        let tokenizer =
            SentencePiece::from_proto(&gunzip(&format!("spiece_bpe/{name}.model.gz"))).unwrap();
        assert_eq!(tokenizer.vocab_size() as u64, model["pieces"].as_u64().unwrap(), "{name}");
        let cases = model["cases"].as_array().unwrap();
        assert!(cases.len() >= 20, "{name}");
        for case in cases {
            let text = case["text"].as_str().unwrap();
            assert_eq!(tokenizer.word_ids(text).unwrap(), ids(&case["ids"]), "{name}: {text:?}");
        }
    }
}

#[test]
fn a_gemma_sized_vocabulary_loads_and_encodes_quickly() {
    // The gemma_like model grown to Gemma's 256 000 pieces with unmatchable filler merges (their text holds a
    // character no test text has), so only their number changes; one protobuf field 1 (a piece) per filler.
    let mut proto = gunzip("spiece_bpe/gemma_like.model.gz");
    let base = SentencePiece::from_proto(&proto).unwrap();
    for i in base.vocab_size()..256_000 {
        let text = format!("\u{E000}{i}");
        let mut piece = vec![0x0A, text.len() as u8];
        piece.extend_from_slice(text.as_bytes());
        piece.extend_from_slice(&[0x15]);
        piece.extend_from_slice(&(-(i as f32)).to_le_bytes());
        proto.extend_from_slice(&[0x0A, piece.len() as u8]);
        proto.extend_from_slice(&piece);
    }
    let started = std::time::Instant::now();
    let big = SentencePiece::from_proto(&proto).unwrap();
    let built = started.elapsed();
    assert_eq!(big.vocab_size(), 256_000);
    let prompt =
        "A cinematic wide shot of an old lighthouse on a rocky cliff at dusk, 东京的夜晚 🌃. "
            .repeat(60);
    let started = std::time::Instant::now();
    let got = big.word_ids(&prompt).unwrap();
    let encoded = started.elapsed();
    assert_eq!(got, base.word_ids(&prompt).unwrap());
    // Loose bounds for loaded machines: kiln-models builds at opt-level 3 even for tests, and takes about 35 ms
    // to build and 1 ms to encode here on two cores.
    assert!(built.as_secs_f64() < 5.0, "building took {built:?}");
    assert!(encoded.as_secs_f64() < 1.0, "encoding {} bytes took {encoded:?}", prompt.len());
}

#[test]
fn the_synthetic_bpe_model_loads() {
    let tokenizer = SentencePiece::from_proto(synth_bpe_model()).unwrap();
    assert_eq!(tokenizer.vocab_size(), SYNTH_BPE_PIECES);
    let ids =
        tokenizer.word_ids("<start_of_turn>user\nA photo of the sea, 海.<end_of_turn>").unwrap();
    assert!(ids.iter().all(|&id| (id as usize) < SYNTH_BPE_PIECES));
}
