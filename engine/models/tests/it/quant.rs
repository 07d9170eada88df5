//! ComfyUI's quantized weight files against ComfyUI's own reading of them (`scripts/reference/quant.py`): a
//! Linear stored as legacy scaled fp8, in the mixed-precision map (e4m3fn, e5m2), as int8 (a tensor scale,
//! per-row scales, ConvRot at groups of 64 and 256), MXFP8 or NVFP4 loads quantized and gives ComfyUI's CPU
//! output (comfy-kitchen's eager kernels); the formats Kiln cannot run are refused by name, before anything
//! is read; a LoRA on a per-tensor scaled fp8 weight or an int8 one is re-quantized with new scales as ComfyUI
//! does, one on the block formats is refused rather than applied wrongly.

use std::collections::HashMap;

use kiln_compute::Backend as _;
use kiln_compute::memory::lora::{Adapter, Patch, PatchSet, PatchTensor};
use kiln_compute::memory::{LoadPlan, SafetensorsFile, SlotPlan};
use kiln_compute::quant::Quant;
use kiln_models::Error;
use kiln_models::quant::{LinearPath, Quantization};

use crate::common::{assert_close, cpu, fixture, read_tensors};

/// Loads `layer.weight` and `layer.bias` of a fixture with the scale its quantization gives.
fn load(
    name: &str,
) -> (std::sync::Arc<kiln_compute::backend::cpu::Cpu>, kiln_compute::memory::Model) {
    load_as(name, LinearPath::Quantized)
}

/// [`load`], for a model that runs its linear layers `path`.
fn load_as(
    name: &str,
    path: LinearPath,
) -> (std::sync::Arc<kiln_compute::backend::cpu::Cpu>, kiln_compute::memory::Model) {
    let fixture_path = fixture(&format!("quant/{name}.safetensors"));
    let file = SafetensorsFile::open(&fixture_path).expect("a fixture");
    let quant = Quantization::read(&file).expect("its quantization");
    quant.refuse_unsupported(&file, "").expect("fp8 runs");
    let mut plan = LoadPlan {
        files: vec![fixture_path.clone()],
        slots: vec![
            SlotPlan::new("layer.weight", vec![(0, "layer.weight".into())]),
            SlotPlan::new("layer.bias", vec![(0, "layer.bias".into())]),
        ],
    };
    quant.apply(&file, &mut plan, path).expect("scales");
    assert_ne!(plan.slots[0].quant, Quant::None, "{name}: the weight is quantized");
    assert_eq!(plan.slots[1].quant, Quant::None, "{name}: the bias is not");
    let (b, manager) = cpu(64 << 20);
    let model = manager.load(&plan, &mut |_, _| {}).expect("loads");
    (b, model)
}

/// `layer(x)` on the CPU for a loaded one-layer fixture.
fn run(
    b: &kiln_compute::backend::cpu::Cpu,
    model: &kiln_compute::memory::Model,
    shape: &[usize],
    x: &[f32],
) -> Vec<f32> {
    let layer = model.fetch(b, &["layer.weight", "layer.bias"]).expect("fetch");
    let xs = b.from_f32(shape, x, kiln_compute::DType::F32).expect("x");
    b.linear(&xs, &layer.weight(0), Some(&layer.weight(1)))
        .and_then(|y| b.to_f32(&y))
        .expect("linear")
}

#[test]
fn int8_mxfp8_and_nvfp4_layers_give_comfyuis_cpu_output() {
    let reference = read_tensors("quant/reference.safetensors");
    let int8 = |per_row, convrot| Quant::Int8 { per_row, convrot, activations: true };
    for (name, want) in [
        ("int8_tensorwise", int8(false, None)),
        ("int8_rowwise", int8(true, None)),
        ("int8_convrot64", int8(true, Some(64))),
        ("int8_convrot256", int8(true, Some(256))),
        ("mxfp8", Quant::Mxfp8),
    ] {
        let (b, model) = load(name);
        let (x_shape, x) = &reference[&format!("x/{name}")];
        let layer = model.fetch(&*b, &["layer.weight"]).expect("fetch");
        assert_eq!(layer.weight(0).quant(), want, "{name}");
        drop(layer);
        let y = run(&b, &model, x_shape, x);
        // int8: the integer product is exact; the rotation's f32 sums and the row scales may differ from
        // torch's in the last bit, which the final f32 product carries.
        assert_close(name, &y, &reference[&format!("y/{name}")].1, 1e-6);
    }
    // A text encoder's int8 weights are dequantized instead (rotated back for ConvRot): no activation rounding.
    for name in ["int8_tensorwise", "int8_rowwise", "int8_convrot64", "int8_convrot256"] {
        let (b, model) = load_as(name, LinearPath::Dequantized);
        let (x_shape, x) = &reference[&format!("x/{name}")];
        let y = run(&b, &model, x_shape, x);
        assert_close(name, &y, &reference[&format!("y_dequantized/{name}")].1, 1e-5);
        let quantized = &reference[&format!("y/{name}")].1;
        assert!(y.iter().zip(quantized).any(|(a, b)| a != b), "{name}: a path of its own");
    }
    // A view of some rows (a fused qkv split into q, k, v) keeps its rows' scales: its outputs are the
    // whole layer's columns, for int8's per-row scales and for the block formats past the first 128-row tile.
    // (Bit for bit where kiln-compute's AVX-512 kernels run; the gemm crate, elsewhere, blocks a product of
    // fewer columns otherwise, which may round the last bit differently. A wrong scale is off by far more.)
    for (name, start, rows) in [("int8_rowwise", 2, 3), ("mxfp8", 130, 20), ("nvfp4", 100, 40)] {
        let (b, model) = load(name);
        let (x_shape, x) = &reference[&format!("x/{name}")];
        let layer = model.fetch(&*b, &["layer.weight"]).expect("fetch");
        let xs = b.from_f32(x_shape, x, kiln_compute::DType::F32).expect("x");
        let whole =
            b.linear(&xs, &layer.weight(0), None).and_then(|y| b.to_f32(&y)).expect("whole");
        let view = layer.weight(0).rows(start, rows).expect("rows");
        let part = b.linear(&xs, &view, None).and_then(|y| b.to_f32(&y)).expect("part");
        let n = whole.len() / x_shape[0];
        let want: Vec<f32> =
            whole.chunks_exact(n).flat_map(|row| row[start..start + rows].to_vec()).collect();
        assert_close(&format!("{name}: rows {start}..{}", start + rows), &part, &want, 1e-6);
    }
    let (b, model) = load("nvfp4");
    let layer = model.fetch(&*b, &["layer.weight"]).expect("fetch");
    assert!(matches!(layer.weight(0).quant(), Quant::Nvfp4 { global } if global > 0.0));
    drop(layer);
    let (x_shape, x) = &reference["x/nvfp4"];
    assert_close("nvfp4", &run(&b, &model, x_shape, x), &reference["y/nvfp4"].1, 1e-6);
    // Its values as a tensor are the unpacked matrix (two values a byte), whose product is the layer's.
    let layer = model.fetch(&*b, &["layer.weight"]).expect("fetch");
    let w = b.weight_to_tensor(&layer.weight(0), kiln_compute::DType::F32).expect("values");
    let (rows, cols) = (w.shape()[0], w.shape()[1]);
    assert_eq!((rows, cols * x_shape[0]), (160, x.len()), "the values' shape");
    let w = b.to_f32(&w).expect("values");
    let y: Vec<f32> = x
        .chunks_exact(cols)
        .flat_map(|xr| w.chunks_exact(cols).map(|wr| xr.iter().zip(wr).map(|(a, b)| a * b).sum()))
        .collect();
    let xs = b.from_f32(x_shape, x, kiln_compute::DType::F32).expect("x");
    let want = b.linear(&xs, &layer.weight(0), None).and_then(|y| b.to_f32(&y)).expect("linear");
    assert_close("nvfp4 values", &y, &want, 1e-5);
}

#[test]
fn scaled_fp8_layers_give_comfyuis_cpu_output() {
    let reference = read_tensors("quant/reference.safetensors");
    let (x_shape, x) = &reference["x"];
    for name in ["scaled_fp8", "mixed_e4m3fn", "mixed_e5m2"] {
        let (b, model) = load(name);
        let y = run(&b, &model, x_shape, x);
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
        ("convrot_w4a4", safetensors::Dtype::I8, 8 * 16),
        ("asym_w4a8_int8", safetensors::Dtype::I8, 8 * 16),
        ("svdquant", safetensors::Dtype::U8, 8 * 16),
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

/// The spacing of `dtype`'s grid around `q` (one step between the two fp8 neighbours of `q`).
fn fp8_step(dtype: kiln_compute::DType, q: f32) -> f32 {
    let (mantissa_bits, min_exponent) = match dtype {
        kiln_compute::DType::F8E4M3 => (3, -6),
        _ => (2, -14),
    };
    let exponent = (q.abs().log2().floor() as i32).max(min_exponent);
    2f32.powi(exponent - mantissa_bits)
}

#[test]
fn a_lora_on_a_scaled_fp8_weight_is_requantized_as_comfyui_does() {
    let reference = read_tensors("quant/reference.safetensors");
    for (name, dtype) in [
        ("scaled_fp8", kiln_compute::DType::F8E4M3),
        ("mixed_e4m3fn", kiln_compute::DType::F8E4M3),
        ("mixed_e5m2", kiln_compute::DType::F8E5M2),
    ] {
        let (b, model) = load(name);
        let get = |key: &str| &reference[&format!("lora/{name}/{key}")];
        let tensor = |key: &str| {
            let (shape, values) = get(key);
            PatchTensor::from_f32(kiln_compute::DType::F32, shape, values)
        };
        let original = model.fetch(&*b, &["layer.weight"]).expect("fetch").weight(0).scale();
        let adapter = Adapter::Lora {
            up: tensor("up"),
            down: tensor("down"),
            alpha: Some(get("alpha").1[0]),
            dora_scale: None,
        };
        let set = PatchSet {
            patches: vec![Patch { strength: get("strength").1[0], strength_model: 1.0, adapter }],
        };
        model.set_patches(vec![("layer.weight".into(), set)]).expect("a LoRA on scaled fp8");
        // Fetched twice: the second reads the weight patched by the first (resident) or patches it again.
        for _ in 0..2 {
            let layer = model.fetch(&*b, &["layer.weight", "layer.bias"]).expect("fetch");
            let weight = layer.weight(0);
            // The new scale is ComfyUI's: the patched weight's largest magnitude over the type's largest value.
            let scale = weight.scale().expect("still scaled");
            let want_scale = get("scale").1[0];
            assert!(
                (scale - want_scale).abs() <= want_scale * 1e-6,
                "{name}: {scale} vs {want_scale}"
            );
            // Each value is one of the two fp8 neighbours of the exact patched value (stochastic rounding),
            // as ComfyUI's are (its own random draws pick other neighbours).
            let got = b
                .weight_to_tensor(&weight, kiln_compute::DType::F32)
                .and_then(|t| b.to_f32(&t))
                .expect("read the patched weight");
            let exact = &get("exact").1;
            for (who, values) in [("kiln", &got), ("comfyui", &get("weight").1)] {
                for (i, (v, e)) in values.iter().zip(exact).enumerate() {
                    let step = fp8_step(dtype, e / scale) * scale;
                    assert!(
                        (v - e).abs() <= step * 1.000_01,
                        "{name} {who} [{i}]: {v} vs exact {e}"
                    );
                }
            }
            // The layer reads the weight with its new scale.
            let (x_shape, x) = &reference["x"];
            let xs = b.from_f32(x_shape, x, kiln_compute::DType::F32).expect("x");
            let y = b
                .linear(&xs, &weight, Some(&layer.weight(1)))
                .and_then(|y| b.to_f32(&y))
                .expect("linear");
            let bias = b
                .weight_to_tensor(&layer.weight(1), kiln_compute::DType::F32)
                .and_then(|t| b.to_f32(&t))
                .expect("bias");
            let (rows, n, k) = (x_shape[0], bias.len(), x_shape[1]);
            let want: Vec<f32> = (0..rows * n)
                .map(|i| {
                    let (r, o) = (i / n, i % n);
                    (0..k).map(|j| x[r * k + j] * got[o * k + j]).sum::<f32>() + bias[o]
                })
                .collect();
            assert_close(name, &y, &want, 1e-5);
        }
        // Without patches the weight is the file's again, with the file's scale.
        model.set_patches(Vec::new()).expect("unpatch");
        let restored = model.fetch(&*b, &["layer.weight"]).expect("fetch").weight(0).scale();
        assert_eq!(restored, original, "{name}: restored");
    }
}

#[test]
fn a_lora_on_an_int8_weight_is_requantized_as_comfyui_does() {
    for name in ["int8_tensorwise", "int8_rowwise", "int8_convrot64", "int8_convrot256"] {
        let (b, model) = load(name);
        let read = |weight: &kiln_compute::tensor::Weight<'_>| {
            b.weight_to_tensor(weight, kiln_compute::DType::F32)
                .and_then(|t| b.to_f32(&t))
                .expect("read the weight")
        };
        let original = read(&model.fetch(&*b, &["layer.weight"]).expect("fetch").weight(0));
        let shape = [8, original.len() / 8];
        // A difference large enough to move the rows' largest magnitudes (and so their scales).
        let delta: Vec<f32> =
            (0..original.len()).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.01).collect();
        let set = PatchSet {
            patches: vec![Patch {
                strength: 1.0,
                strength_model: 1.0,
                adapter: Adapter::Diff(PatchTensor::from_f32(
                    kiln_compute::DType::F32,
                    &shape,
                    &delta,
                )),
            }],
        };
        model.set_patches(vec![("layer.weight".into(), set)]).expect("a LoRA on int8");
        let exact: Vec<f32> = original.iter().zip(&delta).map(|(o, d)| o + d).collect();
        // ComfyUI's new scales: the (rotated) patched rows' largest magnitudes over 127; each stored value one
        // of the two int8 neighbours of the exact one (stochastic rounding), so the weight read back is within
        // one step of each row's (or the tensor's) scale, spread by the rotation over the group.
        let mut rotated = exact.clone();
        let group = match name {
            "int8_convrot64" => Some(64),
            "int8_convrot256" => Some(256),
            _ => None,
        };
        if let Some(g) = group {
            kiln_compute::quant::hadamard_rotate(&mut rotated, g);
        }
        let rows = if name == "int8_tensorwise" { 1 } else { shape[0] };
        let width = rotated.len() / rows;
        let scales: Vec<f32> = rotated
            .chunks_exact(width)
            .map(|row| row.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0)
            .collect();
        for _ in 0..2 {
            let layer = model.fetch(&*b, &["layer.weight", "layer.bias"]).expect("fetch");
            let got = read(&layer.weight(0));
            for (i, (v, e)) in got.iter().zip(&exact).enumerate() {
                let step = scales[i / width] * group.map_or(1.0, |g| (g as f32).sqrt());
                assert!(
                    (v - e).abs() <= step * 1.0001,
                    "{name} [{i}]: {v} vs exact {e} (step {step})"
                );
            }
            let error =
                got.iter().zip(&exact).map(|(v, e)| (v - e).abs()).sum::<f32>() / got.len() as f32;
            assert!(
                error < scales.iter().fold(0f32, |m, &s| m.max(s)),
                "{name}: mean error {error}"
            );
            // The layer reads the re-quantized weight as it reads the file's.
            let (x_shape, x) = (&[2usize, shape[1]], vec![0.5f32; 2 * shape[1]]);
            let xs = b.from_f32(x_shape, &x, kiln_compute::DType::F32).expect("x");
            b.linear(&xs, &layer.weight(0), Some(&layer.weight(1))).expect("linear");
        }
        model.set_patches(Vec::new()).expect("unpatch");
        let restored = read(&model.fetch(&*b, &["layer.weight"]).expect("fetch").weight(0));
        assert_eq!(restored, original, "{name}: restored");
    }
}
