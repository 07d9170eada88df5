//! Llama 3's tokenizer against `scripts/reference/llama3_tokenizer.py`'s fixture: ComfyUI 0f1fa67a's own
//! `HiDreamTokenizer` (its llama sections, weights included), its tokenizer's word ids next to tiktoken's, and every
//! vocabulary entry's text: its own id, but for the 588 that ComfyUI's merging cannot reach.

use std::collections::HashMap;
use std::io::Read as _;

use kiln_models::llama3::{BOS, EOT, Tokenizer};
use serde_json::Value;

use crate::common::fixture;

fn read_fixture() -> Value {
    serde_json::from_slice(&std::fs::read(fixture("llama3/tokens.json")).unwrap()).unwrap()
}

fn ids(value: &Value) -> Vec<u32> {
    value.as_array().unwrap().iter().map(|id| id.as_u64().unwrap() as u32).collect()
}

#[test]
fn hidream_prompts_match_comfyuis() {
    let fixture = read_fixture();
    let tokenizer = Tokenizer::bundled().unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let want: Vec<Vec<(u32, f32)>> = case["llama"]
            .as_array()
            .unwrap()
            .iter()
            .map(|section| {
                section
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|pair| {
                        (pair[0].as_u64().unwrap() as u32, pair[1].as_f64().unwrap() as f32)
                    })
                    .collect()
            })
            .collect();
        let got = tokenizer.hidream_prompt(case["prompt"].as_str().unwrap()).unwrap();
        assert_eq!(got, want, "{name}");
        assert_eq!(got.len(), 1, "{name}");
        assert_eq!(got[0][0], (BOS, 1.0), "{name}");
        assert!(got[0].len() >= 128, "{name}");
    }
    // An empty prompt is the start token and 127 pads; a long one is never padded or cut.
    let empty = tokenizer.hidream_prompt("").unwrap();
    assert!(empty[0][1..].iter().all(|&t| t == (EOT, 1.0)));
    let long = cases.iter().find(|c| c["name"] == "long").unwrap();
    assert!(long["llama"][0].as_array().unwrap().len() > 128);
}

#[test]
fn word_ids_are_comfyuis_and_tiktokens_but_where_merging_cannot_reach_a_token() {
    let fixture = read_fixture();
    let tokenizer = Tokenizer::bundled().unwrap();
    for word in fixture["word_ids"].as_array().unwrap() {
        let text = word["text"].as_str().unwrap();
        let got = tokenizer.word_ids(text).unwrap();
        assert_eq!(got, ids(&word["comfyui"]), "{text:?}");
        // ComfyUI merges a piece pair by pair; tiktoken looks a whole piece up first.
        assert_eq!(got == ids(&word["tiktoken"]), text != " việc", "{text:?}");
    }
    assert_eq!(tokenizer.word_ids(" việc").unwrap(), [3355, 26298, 66]);
}

/// Standard base64 with padding, as the rank file writes it.
fn base64(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let sextets: Vec<u32> = text
        .bytes()
        .filter(|&c| c != b'=')
        .map(|c| ALPHABET.iter().position(|&a| a == c).expect("base64") as u32)
        .collect();
    let mut out = Vec::new();
    for chunk in sextets.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &s)| n | s << (18 - 6 * i));
        out.extend(n.to_be_bytes()[1..chunk.len()].iter());
    }
    out
}

#[test]
fn every_vocabulary_text_is_its_own_id_but_those_merging_cannot_reach() {
    let fixture = read_fixture();
    let unreachable: HashMap<&str, Vec<u32>> = fixture["unreachable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| (entry[0].as_str().unwrap(), ids(&entry[1])))
        .collect();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/llama3-tokenizer/tokenizer.model.gz");
    let mut ranks = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_string(&mut ranks)
        .unwrap();
    let tokenizer = Tokenizer::bundled().unwrap();
    let (mut texts, mut split) = (0, 0);
    for (line, rank) in ranks.lines().zip(0u32..) {
        let (token, written) = line.split_once(' ').unwrap();
        assert_eq!(written.parse::<u32>().unwrap(), rank);
        let Ok(text) = String::from_utf8(base64(token)) else { continue };
        texts += 1;
        let got = tokenizer.word_ids(&text).unwrap();
        match unreachable.get(text.as_str()) {
            Some(want) => {
                split += 1;
                assert!(want.len() > 1, "{text:?}");
                assert_eq!(&got, want, "{text:?}");
            }
            None => assert_eq!(got, [rank], "{text:?}"),
        }
    }
    assert_eq!((texts, split, unreachable.len()), (126_648, 588, 588));
}

#[test]
fn the_bundled_tokenizer_is_parsed_once_and_knows_comfyuis_special_tokens() {
    let a = Tokenizer::bundled().unwrap();
    let b = Tokenizer::bundled().unwrap();
    assert_eq!(format!("{a:?}"), "Tokenizer(llama3, 128259 tokens)");
    assert_eq!(format!("{b:?}"), format!("{a:?}"));
    assert_eq!(a.word_ids("<|begin_of_text|><|eot_id|>").unwrap(), [BOS, EOT]);
    // Llama 3.0's names, as ComfyUI's tokenizer has them: Meta's 3.1 `<|eom_id|>` is text.
    assert_eq!(a.word_ids("<|reserved_special_token_4|>").unwrap(), [128_008]);
    assert!(a.word_ids("<|eom_id|>").unwrap().len() > 1);
    assert_eq!(a.word_ids("<pad>").unwrap(), [128_258]);
    assert_eq!(a.word_ids("").unwrap(), Vec::<u32>::new());
}
