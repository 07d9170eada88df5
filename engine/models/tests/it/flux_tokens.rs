//! FLUX.1's prompt weighting and token layout end to end against `scripts/reference/flux_tokens.py`'s fixture:
//! ComfyUI's own `FluxTokenizer.tokenize_with_weights` (an empty embeddings folder, so `embedding:name` is not
//! found) for a set of prompts, CLIP-L's sections and T5-XXL's. Kiln's [`prompt_weights::tokenize`] with each
//! encoder's layout and bundled tokenizer must give the same sections: the same ids, weights within 1e-6.

use kiln_models::{clip_text, prompt_weights, t5};
use serde_json::Value;

use crate::common::fixture;

const CASES: &str = "flux_tokens/cases.json";

/// A tokenizer's ids for a piece of text, without start or end tokens.
type WordIds<'a> = &'a dyn Fn(&str) -> kiln_models::Result<Vec<u32>>;

/// One section's (id, weight) pairs as the fixture holds them; a non-finite weight is a string (`"-inf"`).
fn section(v: &Value) -> Vec<(u32, f64)> {
    v.as_array()
        .expect("a section")
        .iter()
        .map(|pair| {
            let id = pair[0].as_u64().expect("an id") as u32;
            let weight = match &pair[1] {
                Value::String(s) => match s.as_str() {
                    "inf" => f64::INFINITY,
                    "-inf" => f64::NEG_INFINITY,
                    "nan" => f64::NAN,
                    other => panic!("weight {other:?}"),
                },
                w => w.as_f64().expect("a weight"),
            };
            (id, weight)
        })
        .collect()
}

fn weights_equal(got: f32, want: f64) -> bool {
    let got = f64::from(got);
    if want.is_finite() {
        (got - want).abs() <= 1e-6
    } else {
        got == want || (got.is_nan() && want.is_nan())
    }
}

/// Where Kiln's sections differ from ComfyUI's, described at the first differing position; `None` when equal.
fn difference(got: &[Vec<prompt_weights::Weighted>], want: &[Vec<(u32, f64)>]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} sections, ComfyUI {}", got.len(), want.len()));
    }
    for (s, (got, want)) in got.iter().zip(want).enumerate() {
        for (i, (&(gid, gw), &(wid, ww))) in got.iter().zip(want).enumerate() {
            if gid != wid || !weights_equal(gw, ww) {
                let near = |r: &[(u32, f64)]| r[i.saturating_sub(3)..(i + 4).min(r.len())].to_vec();
                let got_f64: Vec<(u32, f64)> =
                    got.iter().map(|&(t, w)| (t, f64::from(w))).collect();
                return Some(format!(
                    "section {s} position {i}: Kiln ({gid}, {gw}), ComfyUI ({wid}, {ww}); \
                     Kiln near it {:?}, ComfyUI {:?}",
                    near(&got_f64),
                    near(want)
                ));
            }
        }
        if got.len() != want.len() {
            return Some(format!("section {s}: {} tokens, ComfyUI {}", got.len(), want.len()));
        }
    }
    None
}

#[test]
fn flux_tokenize_with_weights_matches_comfyuis() {
    let path = fixture(CASES);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let document: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let cases = document["cases"].as_array().expect("cases");
    assert!(cases.len() >= 30, "{} cases", cases.len());

    let clip = clip_text::Tokenizer::bundled().unwrap();
    let t5_tokenizer = t5::Tokenizer::bundled().unwrap();
    let mut failures = Vec::new();
    for case in cases {
        let prompt = case["prompt"].as_str().expect("a prompt");
        let encoders: [(&str, &prompt_weights::Layout, WordIds); 2] = [
            ("l", &clip_text::PROMPT_LAYOUT, &|w| clip.word_ids(w)),
            ("t5xxl", &t5::FLUX_PROMPT_LAYOUT, &|w| t5_tokenizer.word_ids(w)),
        ];
        for (key, layout, word_ids) in encoders {
            let want: Vec<Vec<(u32, f64)>> =
                case[key].as_array().expect("sections").iter().map(section).collect();
            let got = prompt_weights::tokenize(prompt, layout, word_ids).unwrap();
            if let Some(what) = difference(&got, &want) {
                failures.push(format!("{key} {prompt:?}: {what}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} differ from ComfyUI:\n{}",
        failures.len(),
        cases.len() * 2,
        failures.join("\n")
    );
}
