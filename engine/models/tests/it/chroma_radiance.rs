//! Chroma Radiance against `scripts/reference/chroma_radiance.py`'s fixtures, ComfyUI 0f1fa67a's own
//! `ChromaRadiance` on two tiny random models (a linear final head; a conv head with the `__x0__` and
//! `__sequential__` markers): detection from shapes and markers, the model output with padding, batches, NeRF
//! tiles and both text-position rules, the released model's shapes, and plain Chroma left alone.

use std::collections::BTreeMap;

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType};
use kiln_models::Header;
use kiln_models::chroma_radiance::{
    self, ChromaRadiance, Config, FinalHead, RadianceOptions, SEQUENTIAL_MARKER, X0_MARKER,
};
use kiln_models::flux::{self, Approximator, Generation};

use crate::common::{
    TempTensors, assert_close, cpu, detect_header_only, fixture, json, read_tensors, scratch_dir,
};

/// The fixtures' directory under `tests/fixtures/`.
const DIR: &str = "chroma_radiance";

/// Chroma's trunk as the tiny models have it: 128 wide (one head), MLP 256, one double and one single block,
/// text 32 wide, the guidance MLP 48 wide and 2 layers deep.
fn tiny_trunk() -> flux::Config {
    flux::Config {
        generation: Generation::One,
        dim: 128,
        heads: 1,
        double_blocks: 1,
        single_blocks: 1,
        mlp_hidden: 256,
        in_channels: 3,
        text_dim: 32,
        vec_dim: None,
        guidance: false,
        longcat: false,
        approximator: Some(Approximator { hidden: 48, layers: 2 }),
        ovis: false,
    }
}

/// The tiny `variant`'s config (`linear` or `conv`).
fn tiny(variant: &str) -> Config {
    let conv = variant == "conv";
    Config {
        trunk: tiny_trunk(),
        patch: 16,
        nerf_hidden: if conv { 16 } else { 32 },
        nerf_mlp_ratio: if conv { 2 } else { 1 },
        nerf_depth: 2,
        nerf_max_freqs: 8,
        head: if conv { FinalHead::Conv } else { FinalHead::Linear },
        x0: conv,
        sequential_txt_ids: conv,
    }
}

/// The released Chroma1-Radiance's config with `head` (ComfyUI's detection: hidden 3072 from `txt_in`, 24 heads of
/// 128, the guidance MLP 64 → 5120 × 5 → 3072, NeRF hidden 64, ratio 4, depth 4, 8 frequencies).
fn released(head: FinalHead, x0: bool) -> Config {
    Config {
        trunk: flux::Config {
            dim: 3072,
            heads: 24,
            double_blocks: 19,
            single_blocks: 38,
            mlp_hidden: 12288,
            text_dim: 4096,
            approximator: Some(Approximator { hidden: 5120, layers: 5 }),
            ..tiny_trunk()
        },
        patch: 16,
        nerf_hidden: 64,
        nerf_mlp_ratio: 4,
        nerf_depth: 4,
        nerf_max_freqs: 8,
        head,
        x0,
        sequential_txt_ids: false,
    }
}

/// Detection of fixture `file` (under [`DIR`]).
fn detect_fixture(file: &str) -> kiln_models::Result<Option<Config>> {
    let sf = SafetensorsFile::open(fixture(&format!("{DIR}/{file}"))).unwrap();
    chroma_radiance::detect(&Header::new(&sf, ""))
}

#[test]
fn the_tiny_files_are_detected_from_shapes_and_markers() {
    for variant in ["linear", "conv"] {
        let file = format!("{variant}.safetensors");
        assert_eq!(detect_fixture(&file).unwrap(), Some(tiny(variant)), "{variant}");
        // `expected` lists every tensor of the file but the markers (norm gains by either spelling).
        let tensors = read_tensors(&format!("{DIR}/{file}"));
        let stored: BTreeMap<String, Vec<usize>> = tensors
            .into_iter()
            .filter(|(name, _)| name != X0_MARKER && name != SEQUENTIAL_MARKER)
            .map(|(name, (shape, _))| (name.replace("norm.weight", "norm.scale"), shape))
            .map(|(name, shape)| (name.replace("norms.0.weight", "norms.0.scale"), shape))
            .collect();
        let listed: BTreeMap<String, Vec<usize>> =
            chroma_radiance::expected(&tiny(variant)).into_iter().collect();
        assert_eq!(stored, listed, "{variant}");
    }
}

#[test]
fn every_case_matches_comfyuis_chroma_radiance() {
    let cases = json(&format!("{DIR}/cases.json"));
    let io = read_tensors(&format!("{DIR}/io.safetensors"));
    let (b, manager) = cpu(64 << 20);
    for variant in ["linear", "conv"] {
        let sf = SafetensorsFile::open(fixture(&format!("{DIR}/{variant}.safetensors"))).unwrap();
        let header = Header::new(&sf, "");
        let config = chroma_radiance::detect(&header).unwrap().unwrap();
        let plan = chroma_radiance::load_plan(&header, &config);
        let model = ChromaRadiance::new(config, manager.load(&plan, &mut |_, _| {}).unwrap());
        for (key, case) in cases.as_object().unwrap() {
            if !key.starts_with(&format!("{variant}.")) {
                continue;
            }
            let tensor = |name: &str| {
                let (shape, values) = &io[&format!("{key}.{name}")];
                b.from_f32(shape, values, DType::F32).unwrap()
            };
            let (x, context) = (tensor("x"), tensor("context"));
            let (sigma, guidance) =
                (&io[&format!("{key}.sigma")].1, &io[&format!("{key}.guidance")].1);
            let want = &io[&format!("{key}.out")].1;
            let options = case["options"].as_object().unwrap();
            let options = RadianceOptions {
                nerf_tile_size: options.get("nerf_tile_size").map(|v| v.as_u64().unwrap() as usize),
                sequential_txt_ids: options
                    .get("use_sequential_txt_ids")
                    .map(|v| v.as_bool().unwrap()),
            };
            let run = |options: &RadianceOptions| {
                let out = model.forward(&*b, &x, sigma, &context, Some(guidance), options).unwrap();
                assert_eq!(out.shape(), x.shape(), "{key}");
                b.to_f32(&out).unwrap()
            };
            let got = run(&options);
            eprintln!("{key}: max relative error {:.2e}", relative_error(&got, want));
            assert_close(key, &got, want, 1e-4);
            // Tiles change no value: every patch at once, one a tile, and the default.
            if options.nerf_tile_size.is_some() {
                for tile in [Some(0), Some(1), Some(3), None] {
                    let tiled = RadianceOptions { nerf_tile_size: tile, ..options };
                    assert_close(&format!("{key} tile {tile:?}"), &run(&tiled), want, 1e-4);
                }
            }
            // The text positions matter: the other rule misses the reference.
            if options.sequential_txt_ids.is_some() {
                let flipped = RadianceOptions {
                    sequential_txt_ids: options.sequential_txt_ids.map(|s| !s),
                    ..options
                };
                assert!(relative_error(&run(&flipped), want) > 1e-3, "{key}: positions ignored");
            }
        }
    }
}

/// ‖got − want‖∞ / ‖want‖∞.
fn relative_error(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    got.iter().zip(want).fold(0f32, |m, (g, w)| m.max((g - w).abs())) / scale
}

#[test]
fn the_released_shapes_are_detected_header_only() {
    let dir = scratch_dir("chroma-radiance", "released");
    for (head, x0) in [(FinalHead::Conv, true), (FinalHead::Linear, false)] {
        let want = released(head, x0);
        let mut shapes = chroma_radiance::expected(&want);
        if x0 {
            shapes.push((X0_MARKER.to_owned(), vec![0]));
        }
        let found =
            detect_header_only(&dir, "radiance.safetensors", &shapes, chroma_radiance::detect);
        assert_eq!(found.unwrap(), Some(want), "{head:?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plain_chroma_and_flux_are_not_radiance() {
    for file in ["chroma/weights.safetensors", "flux/weights.safetensors"] {
        let sf = SafetensorsFile::open(fixture(file)).unwrap();
        let header = Header::new(&sf, "");
        assert!(!chroma_radiance::is_radiance(&header), "{file}");
        assert_eq!(chroma_radiance::detect(&header).unwrap(), None, "{file}");
    }
    let sf = SafetensorsFile::open(fixture(&format!("{DIR}/linear.safetensors"))).unwrap();
    assert!(chroma_radiance::is_radiance(&Header::new(&sf, "")));
}

#[test]
fn a_nerf_head_without_chromas_guidance_layer_is_refused() {
    let mut tensors = read_tensors(&format!("{DIR}/linear.safetensors"));
    tensors.retain(|name, _| !name.starts_with("distilled_guidance_layer.norms."));
    let file = TempTensors::new("chroma-radiance-no-guidance", tensors);
    let sf = SafetensorsFile::open(&file.0).unwrap();
    let err = chroma_radiance::detect(&Header::new(&sf, "")).unwrap_err();
    assert!(err.to_string().contains("distilled_guidance_layer"), "{err}");
}
