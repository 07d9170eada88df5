//! Wan's umT5-XXL text encoder through the nodes, on synthetic files (`kiln_models::synth`): `CLIPLoader` type
//! `wan` on `umt5_xxl_fp8_e4m3fn_scaled.safetensors` (scaled fp8, as the templates' file) and `CLIPTextEncode` give
//! ComfyUI's CONDITIONING, `[1, max(512, N + 1), 4096]` with the rows after the EOS zero and no pooled vector;
//! other types refuse the file, and type `wan` refuses T5-XXL.

use std::sync::{Arc, Mutex};

use kiln_engine::cache::{Cache, CachePolicy};
use kiln_engine::exec::{Executor, Outcome};
use kiln_engine::models::{Cond, ModelEnv};
use kiln_engine::nodes::{
    Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, builtin_registry,
};
use kiln_models::family::TextEncoderFamily;
use kiln_models::synth::{self, SynthDtype, SynthFamily, ZImageTurboSet};
use kiln_models::t5;
use serde_json::json;

use crate::harness::Harness;

/// `TestConditioningProbe`: records the conditioning it is given.
struct Probe(Arc<NodeSpec>, Arc<Mutex<Vec<Cond>>>);

impl Node for Probe {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let conditioning = inputs.conditioning("conditioning")?;
        self.1.lock().expect("probe").extend(conditioning.entries.iter().cloned());
        Ok(NodeResult { outputs: Vec::new(), ui: None })
    }
}

/// A harness whose registry is the built-ins and the probe, with the tiny umT5 (scaled fp8) and T5-XXL files in
/// its models folder; and what the probe records.
fn harness() -> (Harness, Arc<Mutex<Vec<Cond>>>) {
    let mut h = Harness::new(CachePolicy::None);
    let models = h.roots.input.join("models");
    let set = ZImageTurboSet::tiny();
    for (family, path, dtype) in [
        (
            SynthFamily::TextEncoder(TextEncoderFamily::Umt5Xxl),
            "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors",
            SynthDtype::Fp8Scaled,
        ),
        (
            SynthFamily::TextEncoder(TextEncoderFamily::T5Xxl),
            "text_encoders/t5xxl_fp16.safetensors",
            SynthDtype::F16,
        ),
    ] {
        synth::write_family(&models.join(path), family, &set, dtype, 5, &mut |_, _| {})
            .expect("a tiny file");
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut registry = builtin_registry(&h.roots, ModelEnv::cpu(models));
    let spec = NodeSpec::new("TestConditioningProbe", "Probe", "testing")
        .input(InputDef::typed("conditioning", "CONDITIONING"))
        .output_node();
    registry.register(Probe(Arc::new(spec), seen.clone()));
    h.registry = Arc::new(registry);
    h.executor = Executor::new(h.registry.clone(), Cache::new(CachePolicy::None), h.roots.clone());
    (h, seen)
}

/// The graph of the Wan templates' text side: CLIPLoader (`kind`) → CLIPTextEncode(`prompt`) → the probe.
fn graph(clip_name: &str, kind: &str, prompt: &str) -> serde_json::Value {
    json!({
        "38": {"class_type": "CLIPLoader", "inputs": {"clip_name": clip_name, "type": kind, "device": "default"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": prompt, "clip": ["38", 0]}},
        "9": {"class_type": "TestConditioningProbe", "inputs": {"conditioning": ["6", 0]}},
    })
}

const UMT5_FILE: &str = "umt5_xxl_fp8_e4m3fn_scaled.safetensors";

#[test]
fn issue_24_wan_clip_loader_conditions_like_comfyui() {
    let (mut h, seen) = harness();
    let tokenizer = t5::SentencePiece::from_proto(t5::synth_model()).unwrap();
    let negative = "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量";
    let long = "a ".repeat(600);
    for prompt in ["a cat walks on the grass", negative, "", "a (cat:1.3) walks", long.as_str()] {
        seen.lock().unwrap().clear();
        let ran = h.run(graph(UMT5_FILE, "wan", prompt));
        assert_eq!(ran.summary.outcome, Outcome::Success, "{prompt:?}: {:?}", ran.summary.outcome);
        let conds = seen.lock().unwrap().clone();
        assert_eq!(conds.len(), 1);
        let cond = &conds[0];
        assert!(cond.pooled.is_none(), "umT5 has no pooled output");
        // The prompt's tokens (each weighted segment tokenised on its own) and the EOS, padded to 512.
        let sections = t5::umt5_tokens(prompt, |w| tokenizer.word_ids(w)).unwrap();
        let eos = sections[0].iter().position(|&(id, _)| id == t5::EOS).unwrap();
        let tokens = (eos + 1).max(512);
        assert_eq!(cond.cond.shape(), [1, tokens, 4096], "{prompt:?}");
        let rows: Vec<&[f32]> = cond.cond.data().chunks_exact(4096).collect();
        for (i, row) in rows.iter().enumerate() {
            let zero = row.iter().all(|&v| v == 0.0);
            assert_eq!(zero, i > eos, "{prompt:?}: row {i} (EOS at {eos})");
            assert!(row.iter().all(|v| v.is_finite()), "{prompt:?}: row {i}");
        }
    }
}

#[test]
fn issue_24_clip_types_must_match_umt5_and_t5_xxl() {
    let (mut h, _) = harness();
    let mut fails = |clip_name: &str, kind: &str| {
        let ran = h.run(graph(clip_name, kind, "x"));
        let Outcome::Failed(failure) = &ran.summary.outcome else {
            panic!("{clip_name} as {kind}: expected a failure, got {:?}", ran.summary.outcome);
        };
        failure.message.clone()
    };
    for kind in ["stable_diffusion", "sd3", "flux2"] {
        let message = fails(UMT5_FILE, kind);
        assert!(
            message.contains("umT5-XXL") && message.contains("type `wan`"),
            "{kind}: {message}"
        );
    }
    let message = fails("t5xxl_fp16.safetensors", "wan");
    assert!(message.contains("type `wan`") && message.contains("T5-XXL"), "{message}");
}
