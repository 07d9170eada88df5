//! In-place LoRA on the CPU backend: each adapter's maths against a plain f32 reference, through the packed
//! image path (pack on the host, one copy to the device, views, apply, read back).

use crate::common::values;
use std::sync::Arc;

use kiln_compute::OwnedWeight;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::dtype::{DType, round_to, widen};
use kiln_compute::memory::DeviceMemory;
use kiln_compute::memory::lora::{
    Adapter, Factor, Patch, PatchSet, PatchTensor, apply, seed_for_key,
};

fn matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                .sum::<f64>() as f32;
        }
    }
    out
}

fn tensor(shape: &[usize], v: &[f32]) -> PatchTensor {
    PatchTensor::from_f32(DType::F32, shape, v)
}

/// Applies `set` to a bf16 weight holding `w` and returns the patched values.
fn patched(cpu: &Cpu, shape: &[usize], w: &[f32], dtype: DType, set: &PatchSet) -> Vec<f32> {
    let memory: Arc<dyn DeviceMemory> = cpu.sim().clone();
    let weight = OwnedWeight::from_f32(&memory, dtype, shape, w).expect("upload weight");
    let (image, layout) = set.pack().expect("pack");
    assert_eq!(layout.measure(), image.len());
    let base = memory.alloc(image.len() as u64).expect("patch memory");
    memory.copy_h2d_pageable(base, &image).expect("one copy of the image");
    let views = layout.views(base);
    apply(cpu, &weight.view(), &views, seed_for_key("layers.0.w")).expect("apply");
    let mut bytes = vec![0u8; shape.iter().product::<usize>() * dtype.size()];
    cpu.sim().read(weight.view().ptr(), &mut bytes).expect("read back");
    memory.free(base).expect("free");
    widen(dtype, &bytes)
}

fn assert_close(got: &[f32], want: &[f32], dtype: DType) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        // Stochastic rounding lands on one of the two neighbours of the exact value.
        let ulp =
            (round_to(dtype, w.abs() * 1.01) - round_to(dtype, w.abs() * 0.99)).abs().max(1e-6);
        assert!((g - w).abs() <= ulp + 1e-6, "element {i}: got {g}, want {w}");
    }
}

#[test]
fn lora_adds_scaled_up_times_down() {
    let cpu = Cpu::new(64 << 20);
    let (out, inp, rank) = (8, 6, 2);
    let w = values(out * inp, 1);
    let up = values(out * rank, 2);
    let down = values(rank * inp, 3);
    let set = PatchSet {
        patches: vec![Patch {
            strength: 0.7,
            strength_model: 1.0,
            adapter: Adapter::Lora {
                up: tensor(&[out, rank], &up),
                down: tensor(&[rank, inp], &down),
                alpha: Some(1.0),
                dora_scale: None,
            },
        }],
    };
    let delta = matmul(&up, &down, out, rank, inp);
    let w_bf16: Vec<f32> = w.iter().map(|&v| round_to(DType::BF16, v)).collect();
    let want: Vec<f32> = w_bf16.iter().zip(&delta).map(|(w, d)| w + 0.7 * 0.5 * d).collect();
    assert_close(&patched(&cpu, &[out, inp], &w, DType::BF16, &set), &want, DType::BF16);
}

#[test]
fn strength_model_diff_and_set_apply_in_order() {
    let cpu = Cpu::new(64 << 20);
    let w = values(12, 4);
    let diff = values(12, 5);
    let set = PatchSet {
        patches: vec![
            Patch {
                strength: 2.0,
                strength_model: 0.5,
                adapter: Adapter::Diff(tensor(&[3, 4], &diff)),
            },
            Patch {
                strength: 1.0,
                strength_model: 1.0,
                adapter: Adapter::Diff(tensor(&[3, 4], &diff)),
            },
        ],
    };
    let want: Vec<f32> = w.iter().zip(&diff).map(|(w, d)| w * 0.5 + 2.0 * d + d).collect();
    assert_close(&patched(&cpu, &[3, 4], &w, DType::F32, &set), &want, DType::F32);

    let value = values(12, 6);
    let replace = PatchSet {
        patches: vec![Patch {
            strength: 1.0,
            strength_model: 1.0,
            adapter: Adapter::Set(tensor(&[12], &value)),
        }],
    };
    assert_close(&patched(&cpu, &[3, 4], &w, DType::F32, &replace), &value, DType::F32);
}

#[test]
fn loha_and_lokr_follow_their_formulas() {
    let cpu = Cpu::new(64 << 20);
    let (out, inp, r) = (4, 6, 2);
    let w = values(out * inp, 7);
    let (w1a, w1b, w2a, w2b) =
        (values(out * r, 8), values(r * inp, 9), values(out * r, 10), values(r * inp, 11));
    let loha = PatchSet {
        patches: vec![Patch {
            strength: 1.0,
            strength_model: 1.0,
            adapter: Adapter::LoHa {
                w1a: tensor(&[out, r], &w1a),
                w1b: tensor(&[r, inp], &w1b),
                w2a: tensor(&[out, r], &w2a),
                w2b: tensor(&[r, inp], &w2b),
                alpha: Some(4.0),
                dora_scale: None,
            },
        }],
    };
    let (m1, m2) = (matmul(&w1a, &w1b, out, r, inp), matmul(&w2a, &w2b, out, r, inp));
    let want: Vec<f32> = (0..out * inp).map(|i| w[i] + 2.0 * m1[i] * m2[i]).collect();
    assert_close(&patched(&cpu, &[out, inp], &w, DType::F32, &loha), &want, DType::F32);

    // kron of a [2,3] factor with a [2,2] one given as a rank-1 product: alpha/rank = 3.
    let a = values(6, 12);
    let (ca, cb) = (values(2, 13), values(2, 14));
    let c = matmul(&ca, &cb, 2, 1, 2);
    let lokr = PatchSet {
        patches: vec![Patch {
            strength: 0.5,
            strength_model: 1.0,
            adapter: Adapter::LoKr {
                w1: Factor::Full(tensor(&[2, 3], &a)),
                w2: Factor::Product(tensor(&[2, 1], &ca), tensor(&[1, 2], &cb)),
                alpha: Some(3.0),
                dora_scale: None,
            },
        }],
    };
    let mut want = w.clone();
    for i in 0..2 {
        for j in 0..3 {
            for k in 0..2 {
                for l in 0..2 {
                    want[(i * 2 + k) * 6 + j * 2 + l] += 0.5 * 3.0 * a[i * 3 + j] * c[k * 2 + l];
                }
            }
        }
    }
    assert_close(&patched(&cpu, &[out, inp], &w, DType::F32, &lokr), &want, DType::F32);
}

#[test]
fn dora_renormalises_rows_to_the_magnitudes() {
    let cpu = Cpu::new(64 << 20);
    let (out, inp, rank) = (3, 5, 1);
    let w = values(out * inp, 15);
    let (up, down) = (values(out * rank, 16), values(rank * inp, 17));
    let magnitude = [0.5f32, 2.0, 1.0];
    let set = PatchSet {
        patches: vec![Patch {
            strength: 1.0,
            strength_model: 1.0,
            adapter: Adapter::Lora {
                up: tensor(&[out, rank], &up),
                down: tensor(&[rank, inp], &down),
                alpha: None,
                dora_scale: Some(tensor(&[out, 1], &magnitude)),
            },
        }],
    };
    let delta = matmul(&up, &down, out, rank, inp);
    let wc: Vec<f32> = w.iter().zip(&delta).map(|(w, d)| w + d).collect();
    let mut want = wc.clone();
    for r in 0..out {
        let norm = wc[r * inp..(r + 1) * inp].iter().map(|v| v * v).sum::<f32>().sqrt();
        for c in 0..inp {
            want[r * inp + c] = wc[r * inp + c] * magnitude[r] / norm;
        }
    }
    let got = patched(&cpu, &[out, inp], &w, DType::F32, &set);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-4, "got {g}, want {w}");
    }
}

#[test]
fn patching_is_deterministic_and_rejects_misfits() {
    let cpu = Cpu::new(64 << 20);
    let w = values(64, 18);
    let diff = values(64, 19);
    let set = PatchSet {
        patches: vec![Patch {
            strength: 0.3,
            strength_model: 1.0,
            adapter: Adapter::Diff(tensor(&[8, 8], &diff)),
        }],
    };
    let a = patched(&cpu, &[8, 8], &w, DType::F8E4M3, &set);
    let b = patched(&cpu, &[8, 8], &w, DType::F8E4M3, &set);
    assert_eq!(a, b, "same key, same rounding");

    let memory: Arc<dyn DeviceMemory> = cpu.sim().clone();
    let weight =
        OwnedWeight::from_f32(&memory, DType::F32, &[4, 4], &values(16, 20)).expect("upload");
    let bad = PatchSet {
        patches: vec![Patch {
            strength: 1.0,
            strength_model: 1.0,
            adapter: Adapter::Lora {
                up: tensor(&[5, 1], &values(5, 21)),
                down: tensor(&[1, 4], &values(4, 22)),
                alpha: None,
                dora_scale: None,
            },
        }],
    };
    let (image, layout) = bad.pack().expect("pack");
    let base = memory.alloc(image.len() as u64).expect("alloc");
    memory.copy_h2d_pageable(base, &image).expect("copy");
    let err = apply(&cpu, &weight.view(), &layout.views(base), 1)
        .expect_err("a 5×4 delta on a 4×4 weight");
    assert!(err.to_string().contains("does not fit"), "{err}");
}
