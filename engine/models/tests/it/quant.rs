//! ComfyUI's quantized weight files against ComfyUI's own reading of them (`scripts/reference/quant.py`): a
//! Linear stored as legacy scaled fp8 or in the mixed-precision map (e4m3fn, e5m2) loads with its scale and
//! gives ComfyUI's CPU output; the formats Kiln cannot run are refused by name, before anything is read, and a
//! LoRA on a scaled weight is refused rather than applied wrongly.

use std::collections::HashMap;

use kiln_compute::Backend as _;
use kiln_compute::memory::lora::{Adapter, Patch, PatchSet, PatchTensor};
use kiln_compute::memory::{LoadPlan, SafetensorsFile, SlotPlan};
use kiln_models::Error;
use kiln_models::quant::Quantization;

use crate::common::{assert_close, cpu, fixture, read_tensors};

/// Loads `layer.weight` and `layer.bias` of a fixture with the scale its quantization gives.
fn load(
    name: &str,
) -> (std::sync::Arc<kiln_compute::backend::cpu::Cpu>, kiln_compute::memory::Model) {
    let path = fixture(&format!("quant/{name}.safetensors"));
    let file = SafetensorsFile::open(&path).expect("a fixture");
    let quant = Quantization::read(&file).expect("its quantization");
    quant.refuse_unsupported(&file, "").expect("fp8 runs");
    let mut plan = LoadPlan {
        files: vec![path.clone()],
        slots: vec![
            SlotPlan::new("layer.weight", vec![(0, "layer.weight".into())]),
            SlotPlan::new("layer.bias", vec![(0, "layer.bias".into())]),
        ],
    };
    quant.apply(&file, &mut plan).expect("scales");
    assert!(plan.slots[0].scale.is_some_and(|s| s > 0.0), "{name}: the weight is scaled");
    assert_eq!(plan.slots[1].scale, None, "{name}: the bias is not");
    let (b, manager) = cpu(64 << 20);
    let model = manager.load(&plan, &mut |_, _| {}).expect("loads");
    (b, model)
}

#[test]
fn scaled_fp8_layers_give_comfyuis_cpu_output() {
    let reference = read_tensors("quant/reference.safetensors");
    let (x_shape, x) = &reference["x"];
    for name in ["scaled_fp8", "mixed_e4m3fn", "mixed_e5m2"] {
        let (b, model) = load(name);
        let layer = model.fetch(&*b, &["layer.weight", "layer.bias"]).expect("fetch");
        let xs = b.from_f32(x_shape, x, kiln_compute::DType::F32).expect("x");
        let y = b
            .linear(&xs, &layer.weight(0), Some(&layer.weight(1)))
            .and_then(|y| b.to_f32(&y))
            .expect("linear");
        assert_close(name, &y, &reference[&format!("y/{name}")].1, 1e-6);
    }
}

/// Writes a one-layer safetensors file with `metadata`.
fn write(
    path: &std::path::Path,
    tensors: &[(&str, safetensors::Dtype, Vec<usize>, Vec<u8>)],
    metadata: HashMap<String, String>,
) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                (*n).to_owned(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).expect("a view"),
            )
        })
        .collect();
    let bytes = safetensors::serialize(views, Some(metadata)).expect("serializes");
    std::fs::write(path, bytes).expect("writes");
}

#[test]
fn formats_kiln_cannot_run_are_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("kiln-quant-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    for (format, dtype, bytes) in [
        ("int8_tensorwise", safetensors::Dtype::I8, 8 * 32),
        ("nvfp4", safetensors::Dtype::U8, 8 * 16),
        ("mxfp8", safetensors::Dtype::F8_E4M3, 32 * 32),
    ] {
        let path = dir.join(format!("{format}.safetensors"));
        let rows = bytes / 32;
        let map = serde_json::json!({"layers": {"blocks.0.proj": {"format": format}}});
        write(
            &path,
            &[
                ("blocks.0.proj.weight", dtype, vec![rows, 32], vec![0; bytes]),
                ("blocks.0.proj.weight_scale", safetensors::Dtype::F32, vec![], vec![0; 4]),
            ],
            HashMap::from([("_quantization_metadata".to_owned(), map.to_string())]),
        );
        let file = SafetensorsFile::open(&path).expect("opens");
        let quant = Quantization::read(&file).expect("reads");
        let err = quant.refuse_unsupported(&file, "").expect_err(format);
        assert!(matches!(err, Error::Unsupported { .. }), "{format}: {err}");
        let msg = err.to_string();
        assert!(msg.contains(format) && msg.contains("blocks.0.proj"), "{msg}");
        // Under another prefix (the text encoder of a checkpoint whose diffusion model is quantized), it is not
        // this loader's business.
        quant.refuse_unsupported(&file, "text_encoders.").expect("another part");
    }
}

#[test]
fn a_lora_on_a_scaled_weight_is_refused() {
    let (_b, model) = load("scaled_fp8");
    let delta = PatchTensor::from_f32(kiln_compute::DType::F32, &[8, 32], &[0.01; 8 * 32]);
    let set = PatchSet {
        patches: vec![Patch { strength: 1.0, strength_model: 1.0, adapter: Adapter::Diff(delta) }],
    };
    let err = model.set_patches(vec![("layer.weight".into(), set)]).expect_err("refused");
    assert!(err.to_string().contains("quantized"), "{err}");
    // The bias is not quantized: an empty patch list for the weight changes nothing either.
    model.set_patches(vec![("layer.weight".into(), PatchSet::default())]).expect("no patch");
}
