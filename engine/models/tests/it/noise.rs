//! torch's CPU `randn`, bit for bit: Kiln's generator against values recorded from torch 2.15
//! (`scripts/reference/noise.py`): seeds, sizes below, at and above 16, multiples of 16 and not, consecutive calls
//! on one generator (the f64 path's cached value), a seed above 2³², and ComfyUI's batch_index noise. Both f32
//! kernels: the AVX2 one torch runs on x86 (the default) and the scalar libm one (`ATEN_CPU_CAPABILITY=default`).

use kiln_models::noise::{NormalMath, TorchGenerator, initial_noise};

use crate::common::{fixture, read_tensors};

fn cases() -> serde_json::Value {
    let path = fixture("noise/cases.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("cases.json")
}

/// Every recorded case with `math`: the number of values that differ from torch's, and their count.
fn compare_all(math: NormalMath, recorded: &str) -> (usize, usize) {
    let tensors = read_tensors(recorded);
    let cases = cases();
    let (mut differ, mut total) = (0, 0);
    for (name, case) in cases["cases"].as_object().expect("cases") {
        let seed: u64 = case["seed"].as_str().expect("seed").parse().expect("seed");
        let mut generator = TorchGenerator::with_math(seed, math);
        for (k, size) in case["sizes"].as_array().expect("sizes").iter().enumerate() {
            let size = size.as_u64().expect("size") as usize;
            let got = generator.randn(size);
            let (_, want) = &tensors[&format!("{name}/{k}")];
            assert_eq!(got.len(), want.len(), "{name}/{k}");
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                total += 1;
                if g.to_bits() != w.to_bits() {
                    differ += 1;
                    // Both kernels agree with each other to a few ulp; anything larger is a real bug.
                    assert!(
                        (g - w).abs() <= 4e-6 * w.abs().max(1.0),
                        "{name}/{k}[{i}]: {g} vs {w}"
                    );
                }
            }
        }
    }
    (differ, total)
}

#[test]
fn default_kernel_is_bit_exact_with_torch() {
    let (differ, total) = compare_all(NormalMath::default(), "noise/randn.safetensors");
    assert_eq!(differ, 0, "{differ} of {total} values differ from torch's");
}

#[test]
fn libm_kernel_is_bit_exact_with_torch_default_capability() {
    let (differ, total) = compare_all(NormalMath::Libm, "noise/randn_libm.safetensors");
    assert_eq!(differ, 0, "{differ} of {total} values differ from torch's scalar kernel");
}

#[test]
fn engine_matches_mt19937_test_vectors() {
    let mut g = TorchGenerator::new(0);
    assert_eq!([g.next_u32(), g.next_u32(), g.next_u32()], [2357136044, 2546248239, 3071714933]);
    let mut g = TorchGenerator::new(42);
    assert_eq!([g.next_u32(), g.next_u32(), g.next_u32()], [1608637542, 3421126067, 4083286876]);
}

#[test]
fn only_the_low_32_bits_of_the_seed_count() {
    let a = TorchGenerator::new(5).randn(40);
    let b = TorchGenerator::new((1 << 32) + 5).randn(40);
    assert_eq!(a, b);
}

#[test]
fn initial_noise_is_one_randn_of_the_shape() {
    let tensors = read_tensors("noise/randn.safetensors");
    let got = initial_noise(2024, &[1, 16, 4, 4], None).expect("noise");
    assert_eq!(got, tensors["global_2024/0"].1);
}

#[test]
fn initial_noise_follows_batch_index() {
    let tensors = read_tensors("noise/randn.safetensors");
    let got = initial_noise(11, &[3, 16, 2, 2], Some(&[2, 0, 2])).expect("noise");
    assert_eq!(got, tensors["batch_index_latent"].1);
    let got = initial_noise(11, &[2, 1, 1, 3], Some(&[1, 3, 1])).expect("noise");
    assert_eq!(got, tensors["batch_index_small"].1);
}

#[test]
fn initial_noise_rejects_a_negative_batch_index() {
    let err = initial_noise(0, &[1, 16, 2, 2], Some(&[0, -1])).expect_err("negative index");
    assert!(err.to_string().contains("-1"), "{err}");
}
