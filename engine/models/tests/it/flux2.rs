//! The FLUX.2 DiT against `scripts/reference/flux2.py`'s fixtures: ComfyUI's own `Flux` with FLUX.2's parameters
//! (cross-checked there with diffusers' `Flux2Transformer2DModel`) on a tiny random Klein-shaped model, for an
//! even latent, two samples at different σ, the dev shape (guidance embedding), reference latents by `index` (the
//! default) and `index_timestep_zero`, `FluxKVCache`'s two calls of a run, and the same weights in diffusers'
//! layout.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType};
use kiln_models::family::{DiffusionDetected, DiffusionFamily, VaeFamily};
use kiln_models::flux::{self, Config, Flux, FluxInput, Generation, KvCache, Layout};
use kiln_models::header::diffusion_prefix;
use kiln_models::{Error, Header};

use crate::common::{TempTensors, assert_close, cpu, fixture, read_tensors};

const WEIGHTS: &str = "flux2/weights.safetensors";

/// The tiny reference model's config.
fn tiny() -> Config {
    Config {
        generation: Generation::Two,
        dim: 128,
        heads: 1,
        double_blocks: 1,
        single_blocks: 2,
        mlp_hidden: 384,
        in_channels: 128,
        text_dim: 96,
        vec_dim: None,
        guidance: false,
        longcat: false,
        approximator: None,
        ovis: false,
    }
}

/// The model in `path` as detection and the loader see it, on the CPU.
fn load(path: &Path) -> (Arc<Cpu>, DiffusionDetected, Flux) {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(path).unwrap();
    let prefix = diffusion_prefix(file.names());
    let header = Header::new(&file, &prefix);
    let detected = DiffusionDetected::detect(&header).unwrap().unwrap();
    let DiffusionDetected::Flux2(config, layout) = detected.clone() else {
        panic!("{detected:?} is not FLUX.2");
    };
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).unwrap();
    (b, detected, Flux::new(config, layout, weights))
}

/// Runs `model` on the fixture's inputs `input` with `refs` and compares with `out.<case>`.
fn check(b: &Cpu, model: &Flux, case: &str, input: &str, refs: &[&str], method: Option<&str>) {
    check_at(b, model, case, input, refs, method, None, None);
}

/// [`check`] at the fixture's `sigma` (else the input's), with `kv_cache`.
#[allow(clippy::too_many_arguments)]
fn check_at(
    b: &Cpu,
    model: &Flux,
    case: &str,
    input: &str,
    refs: &[&str],
    method: Option<&str>,
    sigma: Option<&str>,
    kv_cache: Option<&KvCache<Cpu>>,
) {
    let io = read_tensors("flux2/io.safetensors");
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).unwrap();
    let (x, context) = (tensor(&format!("x.{input}")), tensor(&format!("context.{input}")));
    let references: Vec<_> = refs.iter().map(|r| tensor(r)).collect();
    let guidance = io.get(&format!("guidance.{input}")).map(|g| g.1.as_slice());
    let out = model
        .forward(
            b,
            &FluxInput {
                x: &x,
                timesteps: &io[sigma.unwrap_or(&format!("sigma.{input}"))].1,
                context: &context,
                pooled: None,
                guidance,
                references: &references,
                method,
                kv_cache,
                text_prefix: None,
            },
        )
        .unwrap();
    let (shape, want) = &io[&format!("out.{case}")];
    assert_eq!(out.shape(), shape.as_slice(), "{case}");
    assert_close(case, &b.to_f32(&out).unwrap(), want, 1e-4);
}

#[test]
fn outputs_match_comfyui() {
    let (b, detected, model) = load(&fixture(WEIGHTS));
    assert_eq!(detected, DiffusionDetected::Flux2(tiny(), Layout::Comfy));
    assert_eq!(detected.family(), DiffusionFamily::Flux2);
    assert_eq!(model.config.variant(), "FLUX.2 Klein");
    assert_eq!(
        detected.sampling().flow().expect("flow sampling").shift(),
        flux::family::FLUX2_SHIFT
    );
    assert_eq!(detected.family().checkpoint_vae().0, VaeFamily::Flux2);
    for case in ["even", "odd"] {
        check(&b, &model, case, case, &[], None);
    }
    // FLUX.2's default method is `index`, at 10 and 20 on the first axis.
    check(&b, &model, "refs.index", "even", &["ref.1", "ref.2"], None);
    check(&b, &model, "refs.index", "even", &["ref.1", "ref.2"], Some("index"));
    check(
        &b,
        &model,
        "refs.index_timestep_zero",
        "even",
        &["ref.1", "ref.2"],
        Some("index_timestep_zero"),
    );
}

#[test]
fn kv_cache_stores_the_references_then_replays_them() {
    let (b, _, model) = load(&fixture(WEIGHTS));
    let cache = KvCache::new();
    let refs = ["ref.1", "ref.2"];
    let method = Some("index_timestep_zero");
    // The first call fills the cache (and is an ordinary call), the second leaves the references' tokens out.
    check_at(&b, &model, "kv.1", "even", &refs, method, None, Some(&cache));
    assert!(cache.is_filled());
    check_at(&b, &model, "kv.2", "even", &refs, method, Some("sigma.kv.2"), Some(&cache));
}

#[test]
fn dev_embeds_the_guidance() {
    let mut tensors = read_tensors(WEIGHTS);
    tensors.extend(read_tensors("flux2/guidance_in.safetensors"));
    let file = TempTensors::new("flux2-dev", tensors);
    let (b, detected, model) = load(&file.0);
    assert_eq!(
        detected,
        DiffusionDetected::Flux2(Config { guidance: true, ..tiny() }, Layout::Comfy)
    );
    assert_eq!(model.config.variant(), "FLUX.2 dev");
    check(&b, &model, "dev", "dev", &[], None);
}

/// The fixture's weights in diffusers' `Flux2Transformer2DModel` names: the double blocks' fused qkv split by
/// rows, the final modulation's halves swapped, everything else renamed.
fn to_diffusers(
    old: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let d = tiny().dim;
    let rows = |(shape, values): &(Vec<usize>, Vec<f32>), start: usize, len: usize| {
        let cols: usize = shape[1..].iter().product();
        let mut shape = shape.clone();
        shape[0] = len;
        (shape, values[start * cols..(start + len) * cols].to_vec())
    };
    let mut out = BTreeMap::new();
    for (name, tensor) in &old {
        let stem = name.strip_suffix(".weight").or_else(|| name.strip_suffix(".scale")).unwrap();
        let parts: Vec<&str> = stem.split('.').collect();
        let renamed = match parts.as_slice() {
            ["img_in"] => "x_embedder".to_owned(),
            ["txt_in"] => "context_embedder".to_owned(),
            [embedder, layer] if embedder.ends_with("_in") => {
                let which = if *embedder == "time_in" { "timestep" } else { "guidance" };
                let linear = if *layer == "in_layer" { "linear_1" } else { "linear_2" };
                format!("time_guidance_embed.{which}_embedder.{linear}")
            }
            [modulation, "lin"] => format!("{modulation}.linear"),
            ["final_layer", "linear"] => "proj_out".to_owned(),
            ["final_layer", "adaLN_modulation", "1"] => {
                let (shift, scale) = (rows(tensor, 0, d), rows(tensor, d, d));
                let values = [scale.1, shift.1].concat();
                out.insert("norm_out.linear.weight".to_owned(), (tensor.0.clone(), values));
                continue;
            }
            ["double_blocks", i, rest @ ..] => {
                let q = format!("transformer_blocks.{i}");
                match rest {
                    [stream, "qkv"] => {
                        let names = if *stream == "img_attn" {
                            ["to_q", "to_k", "to_v"]
                        } else {
                            ["add_q_proj", "add_k_proj", "add_v_proj"]
                        };
                        for (k, n) in names.iter().enumerate() {
                            out.insert(format!("{q}.attn.{n}.weight"), rows(tensor, k * d, d));
                        }
                        continue;
                    }
                    ["img_attn", "proj"] => format!("{q}.attn.to_out.0"),
                    ["txt_attn", "proj"] => format!("{q}.attn.to_add_out"),
                    ["img_attn", "norm", "query_norm"] => format!("{q}.attn.norm_q"),
                    ["img_attn", "norm", "key_norm"] => format!("{q}.attn.norm_k"),
                    ["txt_attn", "norm", "query_norm"] => format!("{q}.attn.norm_added_q"),
                    ["txt_attn", "norm", "key_norm"] => format!("{q}.attn.norm_added_k"),
                    ["img_mlp", "0"] => format!("{q}.ff.linear_in"),
                    ["img_mlp", "2"] => format!("{q}.ff.linear_out"),
                    ["txt_mlp", "0"] => format!("{q}.ff_context.linear_in"),
                    ["txt_mlp", "2"] => format!("{q}.ff_context.linear_out"),
                    other => panic!("unexpected double-block tensor {other:?}"),
                }
            }
            ["single_blocks", i, rest @ ..] => {
                let q = format!("single_transformer_blocks.{i}");
                match rest {
                    ["linear1"] => format!("{q}.attn.to_qkv_mlp_proj"),
                    ["linear2"] => format!("{q}.attn.to_out"),
                    ["norm", "query_norm"] => format!("{q}.attn.norm_q"),
                    ["norm", "key_norm"] => format!("{q}.attn.norm_k"),
                    other => panic!("unexpected single-block tensor {other:?}"),
                }
            }
            other => panic!("unexpected tensor {other:?}"),
        };
        out.insert(format!("{renamed}.weight"), tensor.clone());
    }
    out
}

#[test]
fn diffusers_layout_gives_the_same_outputs() {
    let file = TempTensors::new("flux2-diffusers", to_diffusers(read_tensors(WEIGHTS)));
    let (b, detected, model) = load(&file.0);
    assert_eq!(detected, DiffusionDetected::Flux2(tiny(), Layout::Diffusers));
    check(&b, &model, "even", "even", &[], None);
    check(&b, &model, "refs.index", "even", &["ref.1", "ref.2"], None);
}

#[test]
fn wrong_conditioning_width_names_the_encoder() {
    let (b, _, model) = load(&fixture(WEIGHTS));
    let x = b.from_f32(&[1, 128, 2, 2], &[0.0; 512], DType::F32).unwrap();
    let context = b.from_f32(&[1, 3, 32], &[0.0; 96], DType::F32).unwrap();
    let err = model
        .forward(
            &*b,
            &FluxInput {
                x: &x,
                timesteps: &[0.5],
                context: &context,
                pooled: None,
                guidance: None,
                references: &[],
                method: None,
                kv_cache: None,
                text_prefix: None,
            },
        )
        .expect_err("a 32-wide conditioning is refused");
    let Error::Invalid(msg) = err else { panic!("{err:?}") };
    assert!(msg.contains("FLUX.2 Klein") && msg.contains("Qwen3"), "{msg}");
}

/// `kiln model synth --size real` writes the released FLUX DiTs: their parameter counts from the shapes
/// (models-flux.md §3.3: FLUX.1 dev 11.901 B, Klein 4B 3.876 B, Klein 9B 9.079 B, FLUX.2 dev 32.223 B).
#[test]
fn the_real_synthetic_dits_have_the_released_parameter_counts() {
    let set = kiln_models::synth::ZImageTurboSet::real();
    let params = |cfg: &Config| -> u64 {
        flux::expected_shapes(cfg).iter().map(|(_, s)| s.iter().product::<usize>() as u64).sum()
    };
    let billions = |cfg: &Config| (params(cfg) as f64 / 1e9 * 1000.0).round() / 1000.0;
    assert_eq!(billions(&set.flux), 11.901);
    assert_eq!(billions(&set.flux2), 3.876);
    assert_eq!(billions(&set.flux2_klein_9b), 9.079);
    assert_eq!(billions(&set.flux2_dev), 32.223);
    assert_eq!(set.flux2.variant(), "FLUX.2 Klein");
    assert_eq!(set.flux2_dev.variant(), "FLUX.2 dev");
}
