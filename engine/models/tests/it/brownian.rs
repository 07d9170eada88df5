//! The noise of ComfyUI's `BrownianTreeNoiseSampler` (torchsde's Brownian tree) against
//! `scripts/reference/brownian.py`: the steps of a schedule, dpmpp_sde's midpoints, and steps out of order. The
//! tree's increments are torchsde's bit for bit; the noise divides them by the step's f32 square root, which
//! torch takes with MKL (one ulp away from the correctly rounded root for some values), so it is compared within
//! an ulp.

use kiln_models::brownian::BrownianNoise;

use crate::common::{fixture, read_tensors};

#[test]
fn brownian_tree_noise_is_torchsdes() {
    let tensors = read_tensors("brownian/brownian.safetensors");
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("brownian/cases.json")).expect("cases"),
    )
    .expect("json");
    let size: usize = cases["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|d| d.as_u64().expect("d") as usize)
        .product();
    let (sigma_min, sigma_max) = (
        cases["sigma_min"].as_f64().expect("min") as f32,
        cases["sigma_max"].as_f64().expect("max") as f32,
    );
    let mut checked = 0;
    for case in cases["cases"].as_array().expect("cases") {
        let seed = case["seed"].as_u64().expect("seed");
        let mut noise = BrownianNoise::new(sigma_min, sigma_max, seed, size);
        for (step, key) in case["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .zip(case["keys"].as_array().expect("keys"))
        {
            let (sigma, next) =
                (step[0].as_f64().expect("s") as f32, step[1].as_f64().expect("n") as f32);
            let key = key.as_str().expect("key");
            let (lo, hi) = if sigma < next { (sigma, next) } else { (next, sigma) };
            let w_key = key.replacen("case/", "w/", 1);
            let w = noise.increment(lo, hi);
            assert_eq!(w, tensors[&w_key].1, "{w_key}: seed {seed}, W({lo}..{hi})");
            let got = noise.sample(sigma, next);
            for (g, e) in got.iter().zip(&tensors[key].1) {
                assert!((g - e).abs() <= e.abs() * 2.4e-7, "{key}: {g} against {e}");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 16);
}
