//! Qwen2.5-VL's language model (Qwen-Image's text encoder) against `scripts/reference/qwen25vl.py`'s fixtures:
//! hidden states of transformers' `Qwen2_5_VLForConditionalGeneration` (tiny config, bf16 weights, text only),
//! detection that tells it from Qwen3, and refusals naming what is wrong.

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType};
use kiln_models::qwen3::{self, Config, Qwen3, Variant};
use kiln_models::{Error, Header};

use crate::common::{assert_close, cpu, fixture, read_tensors};

const WEIGHTS: &str = "qwen25vl/weights.safetensors";

/// The tiny reference model's config (head width 128, as released).
const TINY: Config = Config {
    vocab: 1024,
    hidden: 256,
    layers: 2,
    heads: 2,
    kv_heads: 1,
    head_dim: 128,
    intermediate: 384,
    rms_eps: 1e-6,
    rope_theta: 1e6,
    variant: Variant::Qwen25Vl,
};

#[test]
fn detects_qwen25vl_and_not_qwen3() {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    assert_eq!(qwen3::detect_qwen25vl(&header).unwrap(), Some(TINY));
    assert_eq!(qwen3::detect(&header).unwrap(), None, "not a Qwen3 file");
    let qwen3_file = SafetensorsFile::open(fixture("qwen3/weights.safetensors")).unwrap();
    assert_eq!(qwen3::detect_qwen25vl(&Header::new(&qwen3_file, "")).unwrap(), None);
    let plan = qwen3::load_plan(&header, &TINY);
    assert_eq!(plan.slots.len(), 1 + 12 * 2 + 1);
}

#[test]
fn hidden_states_match_transformers() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let config = qwen3::detect_qwen25vl(&header).unwrap().unwrap();
    let weights = manager.load(&qwen3::load_plan(&header, &config), &mut |_, _| {}).unwrap();
    let model = Qwen3::new(config, weights);
    let expected = read_tensors("qwen25vl/hidden.safetensors");
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("qwen25vl/cases.json")).unwrap())
            .unwrap();
    for (name, case) in cases.as_object().unwrap() {
        let ids: Vec<u32> =
            case.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let (shape, want) = &expected[&format!("hidden.{name}")];
        let got = model.hidden_state(&*b, &ids).unwrap();
        assert_eq!(got.shape(), shape.as_slice(), "{name}");
        assert_eq!(got.dtype(), DType::F32);
        assert_close(name, &b.to_f32(&got).unwrap(), want, 1e-4);
    }
    let outside = model.hidden_state(&*b, &[5, 1024]);
    assert!(matches!(outside, Err(Error::Invalid(m)) if m.contains("1024")));
}
