//! Malformed prompts from random JSON never panic validation or execution.

use kiln_engine::cache::CachePolicy;
use kiln_engine::graph::{Prompt, validate};
use serde_json::{Value, json};

use crate::harness::Harness;

/// xorshift64*: deterministic, so a failure reproduces from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

const CLASSES: &[&str] = &[
    "EmptyImage",
    "ImageInvert",
    "SaveImage",
    "PreviewImage",
    "ImageScale",
    "ImageBlend",
    "ImageBatch",
    "GetImageSize",
    "EmptyLatentImage",
    "LatentUpscale",
    "PrimitiveInt",
    "PrimitiveString",
    "PreviewAny",
    "ComfySwitchNode",
    "LoadImage",
    "TestMix",
    "TestRange",
    "TestSum",
    "TestOutput",
    "NoSuchNode",
];
const NAMES: &[&str] = &[
    "image",
    "images",
    "width",
    "height",
    "batch_size",
    "color",
    "value",
    "source",
    "switch",
    "on_true",
    "on_false",
    "a",
    "b",
    "t",
    "count",
    "upscale_method",
    "crop",
    "image1",
    "image2",
    "blend_factor",
    "blend_mode",
    "filename_prefix",
    "samples",
];

fn random_json(rng: &mut Rng, depth: u32) -> Value {
    match rng.below(if depth > 2 { 6 } else { 9 }) {
        0 => Value::Null,
        1 => json!(rng.below(2) == 1),
        2 => json!(rng.below(40000) as i64 - 100),
        3 => json!((rng.below(10000) as f64) / 7.0 - 3.0),
        4 => json!(rng.pick(&[
            "",
            "abc",
            "64",
            "nearest-exact",
            "center",
            "x.png",
            "../x",
            "normal"
        ])),
        5 => json!([rng.below(6).to_string(), rng.below(4)]),
        6 => Value::Array((0..rng.below(4)).map(|_| random_json(rng, depth + 1)).collect()),
        7 => json!([rng.below(3) as i64, "x"]),
        _ => Value::Object(
            (0..rng.below(3))
                .map(|_| (rng.pick(NAMES).to_owned(), random_json(rng, depth + 1)))
                .collect(),
        ),
    }
}

fn random_prompt(rng: &mut Rng) -> Value {
    let mut nodes = serde_json::Map::new();
    for id in 0..rng.below(7) {
        let node = if rng.below(15) == 0 {
            random_json(rng, 0)
        } else {
            let inputs: serde_json::Map<String, Value> = (0..rng.below(6))
                .map(|_| (rng.pick(NAMES).to_owned(), random_json(rng, 1)))
                .collect();
            json!({"class_type": rng.pick(CLASSES), "inputs": inputs})
        };
        nodes.insert(id.to_string(), node);
    }
    Value::Object(nodes)
}

#[test]
fn random_prompts_never_panic() {
    let mut h = Harness::new(CachePolicy::Lru(8));
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut accepted = 0;
    for _ in 0..3000 {
        let value =
            if rng.below(20) == 0 { random_json(&mut rng, 0) } else { random_prompt(&mut rng) };
        let Ok(prompt) = Prompt::from_json(&value) else { continue };
        if let Ok(validated) = validate(&prompt, &h.registry, None) {
            accepted += 1;
            let _ = h.run_validated(&validated, json!(null));
        }
    }
    assert!(accepted > 0, "some random prompts should validate and run");
}

#[test]
fn a_long_chain_validates_and_runs() {
    let mut nodes = serde_json::Map::new();
    nodes.insert("0".into(), json!({"class_type": "EmptyImage", "inputs": {"width": 2, "height": 2, "batch_size": 1, "color": 0}}));
    for i in 1..=3000 {
        nodes.insert(
            i.to_string(),
            json!({"class_type": "ImageInvert", "inputs": {"image": [(i - 1).to_string(), 0]}}),
        );
    }
    nodes.insert(
        "out".into(),
        json!({"class_type": "PreviewAny", "inputs": {"source": ["3000", 0]}}),
    );
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(Value::Object(nodes));
    assert_eq!(ran.executed().len(), 3002);
}
