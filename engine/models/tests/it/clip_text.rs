//! The CLIP text encoder and its tokenizer against `scripts/reference/clip_text.py`'s fixtures: token ids from
//! transformers' `CLIPTokenizer` loaded from ComfyUI's `sd1_tokenizer` folder, the final-normed states, pooled
//! vector and per-layer outputs of a tiny transformers `CLIPTextModel` (bf16 weights under ComfyUI's names), and
//! detection of good, foreign and broken files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType};
use kiln_models::clip_text::{self, Activation, ClipText, Config, Tokenizer, Variant};
use kiln_models::{Error, Header};

use crate::common::{assert_close, cpu, fixture, ids, json, read_tensors, write_header_only};

const WEIGHTS: &str = "clip_text/weights.safetensors";

/// The tiny reference model's config as detection reads it (its EOS, 999, is the test's to set).
const TINY: Config = Config {
    variant: Variant::L,
    layout: clip_text::Layout::Transformers,
    vocab: 1000,
    hidden: 128,
    layers: 3,
    heads: 2,
    head_dim: 64,
    intermediate: 256,
    positions: 77,
    activation: Activation::QuickGelu,
    eps: 1e-5,
    eos: clip_text::EOS,
};

/// The tiny model's end-of-text id.
const TINY_EOS: u32 = 999;

// --- Tokenizer ---------------------------------------------------------------------------------------------

#[test]
fn tokenizer_matches_transformers() {
    let tokenizer = Tokenizer::bundled().unwrap();
    let cases = json("clip_text/tokenizer_ids.json");
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 30);
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        assert_eq!(tokenizer.word_ids(prompt).unwrap(), ids(&case["ids"]), "word_ids({prompt:?})");
    }
}

#[test]
fn tokenizer_special_ids() {
    let tokenizer = Tokenizer::bundled().unwrap();
    assert_eq!(clip_text::BOS, 49406);
    assert_eq!(clip_text::EOS, 49407);
    assert_eq!(tokenizer.word_ids("").unwrap(), Vec::<u32>::new());
    assert_eq!(tokenizer.word_ids("<|endoftext|>").unwrap(), [clip_text::EOS]);
}

// --- Model ---------------------------------------------------------------------------------------------------

/// The tiny model, loaded on the CPU backend.
fn tiny_model() -> (std::sync::Arc<Cpu>, ClipText) {
    let (b, manager) = cpu(1 << 30);
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let header = Header::new(&file, "");
    let mut config = clip_text::detect(&header).unwrap().unwrap();
    config.eos = TINY_EOS;
    let weights = manager.load(&clip_text::load_plan(&header, &config), &mut |_, _| {}).unwrap();
    (b, ClipText::new(config, weights))
}

#[test]
fn outputs_match_transformers() {
    let (b, model) = tiny_model();
    let expected = read_tensors("clip_text/outputs.safetensors");
    let cases = json("clip_text/cases.json");
    let cases = cases.as_object().unwrap();
    assert_eq!(cases.len(), 4);
    let mut worst = 0f32;
    let mut check = |what: &str, got: &kiln_compute::Tensor<Cpu>, key: &str| {
        let (shape, want) = &expected[key];
        assert_eq!(got.shape(), shape.as_slice(), "{what}");
        assert_eq!(got.dtype(), DType::F32, "{what}");
        let got = b.to_f32(got).unwrap();
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = got.iter().zip(want).fold(0f32, |m, (g, w)| m.max((g - w).abs())) / scale;
        worst = worst.max(err);
        assert_close(what, &got, want, 1e-4);
    };
    for (name, case) in cases {
        let ids = ids(case);
        assert_eq!(ids.len(), 77);
        for k in 0..TINY.layers {
            let out = model.encode(&*b, &ids, Some(k)).unwrap();
            check(&format!("{name} last"), &out.last, &format!("last.{name}"));
            check(&format!("{name} pooled"), &out.pooled, &format!("pooled.{name}"));
            let hidden = out.hidden.expect("the layer asked for");
            check(&format!("{name} layer {k}"), &hidden, &format!("hidden.{name}.{k}"));
        }
        let out = model.encode(&*b, &ids, None).unwrap();
        assert!(out.hidden.is_none());
    }
    eprintln!("CLIP text: worst relative error {worst:e}");
}

#[test]
fn the_last_layer_normed_is_the_last_state() {
    let (b, model) = tiny_model();
    let cases = json("clip_text/cases.json");
    let ids = ids(&cases["short"]);
    let out = model.encode(&*b, &ids, Some(TINY.layers - 1)).unwrap();
    let normed = model.final_norm(&*b, &out.hidden.unwrap()).unwrap();
    assert_eq!(b.to_f32(&normed).unwrap(), b.to_f32(&out.last).unwrap());
}

#[test]
fn the_projected_pooled_vector_is_the_pooled_one_through_text_projection() {
    let (b, model) = tiny_model();
    let ids = ids(&json("clip_text/cases.json")["short"]);
    let out = model.encode(&*b, &ids, None).unwrap();
    let projected = b.to_f32(&model.project_pooled(&*b, &out.pooled).unwrap()).unwrap();
    // ComfyUI's `text_projection` is a Linear without bias: y = W · pooled.
    let (shape, w) = &read_tensors(WEIGHTS)["text_projection.weight"];
    let pooled = b.to_f32(&out.pooled).unwrap();
    let want: Vec<f32> = (0..shape[0])
        .map(|i| (0..shape[1]).map(|j| w[i * shape[1] + j] * pooled[j]).sum())
        .collect();
    assert_close("projected pooled", &projected, &want, 1e-5);
}

#[test]
fn pooled_is_at_the_first_eos_or_the_last_position() {
    let (b, model) = tiny_model();
    let hidden = TINY.hidden;
    let row = |out: &clip_text::ClipOutput<Cpu>, at: usize| {
        b.to_f32(&out.last).unwrap()[at * hidden..(at + 1) * hidden].to_vec()
    };
    // A shorter input (positions are the first N rows), EOS at 3 and again at 5.
    let ids = [998, 10, 20, TINY_EOS, 30, TINY_EOS];
    let out = model.encode(&*b, &ids, None).unwrap();
    assert_eq!(out.last.shape(), [1, 6, hidden]);
    assert_eq!(b.to_f32(&out.pooled).unwrap(), row(&out, 3));
    // No EOS at all: the last position (ComfyUI's count of unmasked tokens − 1).
    let ids = [998, 10, 20, 30];
    let out = model.encode(&*b, &ids, None).unwrap();
    assert_eq!(b.to_f32(&out.pooled).unwrap(), row(&out, 3));
}

#[test]
fn encode_rejects_bad_input() {
    let (b, model) = tiny_model();
    let invalid = |r: kiln_models::Result<clip_text::ClipOutput<Cpu>>, word: &str| match r {
        Err(Error::Invalid(m)) => assert!(m.contains(word), "{m:?} does not say {word}"),
        other => panic!("expected Invalid naming {word}, got {other:?}"),
    };
    invalid(model.encode(&*b, &[], None), "0");
    invalid(model.encode(&*b, &[1; 78], None), "78");
    invalid(model.encode(&*b, &[998, 1000], None), "1000");
    invalid(model.encode(&*b, &[998, 999], Some(3)), "layer 3");
}

// --- Detection -----------------------------------------------------------------------------------------------

#[test]
fn detects_the_tiny_model() {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    assert_eq!(clip_text::detect(&Header::new(&file, "")).unwrap(), Some(TINY));
}

#[test]
fn the_plan_loads_embeddings_layers_final_norm_and_projection() {
    let file = SafetensorsFile::open(fixture(WEIGHTS)).unwrap();
    let plan = clip_text::load_plan(&Header::new(&file, ""), &TINY);
    assert_eq!(plan.files, [fixture(WEIGHTS)]);
    // The projection (HiDream's projected pooled vector) where the file has it, as this one does.
    assert_eq!(plan.slots.len(), 2 + 16 * 3 + 2 + 1);
    for slot in &plan.slots {
        assert_eq!(slot.parts, [(0, slot.name.clone())]);
        let ours = slot.name.starts_with("text_model.") || slot.name == "text_projection.weight";
        assert!(ours, "{}", slot.name);
    }
    assert!(plan.slots.iter().any(|s| s.name == "text_model.final_layer_norm.bias"));
    assert!(plan.slots.iter().any(|s| s.name == "text_model.encoder.layers.2.mlp.fc2.bias"));
}

/// A fresh directory for one test's files (the test removes it).
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-clip-text-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The names and shapes of a safetensors file's tensors.
fn header_of(path: &Path) -> BTreeMap<String, Vec<usize>> {
    let file = SafetensorsFile::open(path).unwrap();
    file.tensors().map(|(name, info)| (name.to_owned(), info.shape.clone())).collect()
}

/// Detection (under `prefix`) of a zero-filled file of `tensors`, in a file of its own.
fn detect_tensors(
    test: &str,
    tensors: &BTreeMap<String, Vec<usize>>,
    prefix: &str,
) -> (PathBuf, kiln_models::Result<Option<Config>>) {
    let dir = scratch(test);
    let path = dir.join("clip.safetensors");
    let shapes: Vec<(String, Vec<usize>)> =
        tensors.iter().map(|(n, s)| (n.clone(), s.clone())).collect();
    write_header_only(&path, &shapes);
    let file = SafetensorsFile::open(&path).unwrap();
    let detected = clip_text::detect(&Header::new(&file, prefix));
    drop(file);
    std::fs::remove_dir_all(dir).unwrap();
    (path, detected)
}

/// Detection of the fixture's tensors changed by `edit`.
fn detect_edited(
    test: &str,
    edit: impl FnOnce(&mut BTreeMap<String, Vec<usize>>),
) -> (PathBuf, kiln_models::Result<Option<Config>>) {
    let mut tensors = header_of(&fixture(WEIGHTS));
    edit(&mut tensors);
    detect_tensors(test, &tensors, "")
}

/// Asserts an `Error::Unsupported` about `path` whose message names `key`.
#[track_caller]
fn assert_unsupported(result: kiln_models::Result<Option<Config>>, path: &Path, key: &str) {
    match result {
        Err(Error::Unsupported { path: p, msg }) => {
            assert_eq!(p, path);
            assert!(msg.contains(key), "{msg:?} does not name {key}");
        }
        other => panic!("expected Unsupported naming {key}, got {other:?}"),
    }
}

/// The tensors of a CLIP text tower of real widths (`hidden`, `layers`, MLP 4 × hidden).
fn real_tower(hidden: usize, layers: usize) -> BTreeMap<String, Vec<usize>> {
    let mut t = BTreeMap::new();
    t.insert("text_model.embeddings.token_embedding.weight".into(), vec![49408, hidden]);
    t.insert("text_model.embeddings.position_embedding.weight".into(), vec![77, hidden]);
    let (d, f) = (hidden, 4 * hidden);
    for i in 0..layers {
        let p = format!("text_model.encoder.layers.{i}.");
        for norm in ["layer_norm1", "layer_norm2"] {
            t.insert(format!("{p}{norm}.weight"), vec![d]);
            t.insert(format!("{p}{norm}.bias"), vec![d]);
        }
        for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            t.insert(format!("{p}self_attn.{proj}.weight"), vec![d, d]);
            t.insert(format!("{p}self_attn.{proj}.bias"), vec![d]);
        }
        t.insert(format!("{p}mlp.fc1.weight"), vec![f, d]);
        t.insert(format!("{p}mlp.fc1.bias"), vec![f]);
        t.insert(format!("{p}mlp.fc2.weight"), vec![d, f]);
        t.insert(format!("{p}mlp.fc2.bias"), vec![d]);
    }
    t.insert("text_model.final_layer_norm.weight".into(), vec![d]);
    t.insert("text_model.final_layer_norm.bias".into(), vec![d]);
    t.insert("text_projection.weight".into(), vec![d, d]);
    t
}

#[test]
fn detects_clip_l_and_clip_g_by_comfyui_rule() {
    let (_, l) = detect_tensors("clip-l", &real_tower(768, 12), "");
    let l = l.unwrap().unwrap();
    assert_eq!((l.variant, l.activation), (Variant::L, Activation::QuickGelu));
    assert_eq!((l.vocab, l.hidden, l.layers, l.heads, l.intermediate), (49408, 768, 12, 12, 3072));
    assert_eq!(l.variant.name(), clip_text::family::NAME);
    let (_, g) = detect_tensors("clip-g", &real_tower(1280, 32), "");
    let g = g.unwrap().unwrap();
    assert_eq!((g.variant, g.activation), (Variant::G, Activation::Gelu));
    assert_eq!((g.hidden, g.layers, g.heads, g.intermediate), (1280, 32, 20, 5120));
    assert_eq!(g.variant.name(), clip_text::family::G_NAME);
    let (_, h) = detect_tensors("clip-h", &real_tower(1024, 24), "");
    let h = h.unwrap().unwrap();
    assert_eq!((h.variant, h.activation, h.heads), (Variant::H, Activation::Gelu, 16));
}

#[test]
fn detects_under_a_checkpoint_prefix() {
    let prefix = "text_encoders.clip_l.transformer.";
    let mut tensors: BTreeMap<String, Vec<usize>> = header_of(&fixture(WEIGHTS))
        .into_iter()
        .map(|(name, shape)| (format!("{prefix}{name}"), shape))
        .collect();
    tensors.insert("model.diffusion_model.img_in.weight".into(), vec![3072, 64]);
    let dir = scratch("prefixed");
    let path = dir.join("checkpoint.safetensors");
    let shapes: Vec<(String, Vec<usize>)> = tensors.into_iter().collect();
    write_header_only(&path, &shapes);
    let file = SafetensorsFile::open(&path).unwrap();
    let header = Header::new(&file, prefix);
    let config = clip_text::detect(&header).unwrap().unwrap();
    assert_eq!(config, TINY);
    let plan = clip_text::load_plan(&header, &config);
    assert_eq!(plan.slots[0].name, "text_model.embeddings.token_embedding.weight");
    assert_eq!(
        plan.slots[0].parts,
        [(0, format!("{prefix}text_model.embeddings.token_embedding.weight"))]
    );
    // Without the prefix the same file is no CLIP text tower.
    assert!(matches!(clip_text::detect(&Header::new(&file, "")), Ok(None)));
    drop(file);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn other_families_are_not_clip_text() {
    let qwen3 = SafetensorsFile::open(fixture("qwen3/weights.safetensors")).unwrap();
    assert!(matches!(clip_text::detect(&Header::new(&qwen3, "")), Ok(None)));
    let mut t5 = BTreeMap::new();
    t5.insert("shared.weight".to_owned(), vec![32128, 64]);
    t5.insert("encoder.block.1.layer.1.DenseReluDense.wi_1.weight".to_owned(), vec![128, 64]);
    t5.insert("encoder.final_layer_norm.weight".to_owned(), vec![64]);
    let (_, detected) = detect_tensors("t5", &t5, "");
    assert!(matches!(detected, Ok(None)), "{detected:?}");
    // A CLIP vision tower has the same layer names under `vision_model.`.
    let vision: BTreeMap<String, Vec<usize>> = header_of(&fixture(WEIGHTS))
        .into_iter()
        .map(|(name, shape)| (name.replacen("text_model.", "vision_model.", 1), shape))
        .collect();
    let (_, detected) = detect_tensors("vision", &vision, "");
    assert!(matches!(detected, Ok(None)), "{detected:?}");
}

#[test]
fn a_missing_tensor_is_unsupported() {
    for key in [
        "text_model.encoder.layers.2.self_attn.k_proj.bias",
        "text_model.embeddings.position_embedding.weight",
        "text_model.final_layer_norm.weight",
    ] {
        let (path, detected) = detect_edited("missing", |t| {
            t.remove(key);
        });
        assert_unsupported(detected, &path, key);
    }
}

#[test]
fn a_wrong_shape_is_unsupported() {
    let key = "text_model.encoder.layers.1.mlp.fc2.weight";
    let (path, detected) = detect_edited("shape", |t| {
        t.insert(key.into(), vec![128, 96]);
    });
    assert_unsupported(detected, &path, key);
    let key = "text_model.embeddings.position_embedding.weight";
    let (path, detected) = detect_edited("positions", |t| {
        t.insert(key.into(), vec![77, 64]);
    });
    assert_unsupported(detected, &path, key);
}

#[test]
fn a_width_of_partial_heads_is_unsupported() {
    let mut tensors = real_tower(768, 12);
    tensors.insert("text_model.embeddings.token_embedding.weight".into(), vec![49408, 96]);
    let (path, detected) = detect_tensors("heads", &tensors, "");
    assert_unsupported(detected, &path, "96");
}

#[test]
fn a_gap_in_the_layers_is_unsupported() {
    let (path, detected) = detect_edited("gap", |t| {
        let moved: Vec<(String, Vec<usize>)> = t
            .iter()
            .filter(|(n, _)| n.starts_with("text_model.encoder.layers.2."))
            .map(|(n, s)| (n.replace("layers.2.", "layers.4."), s.clone()))
            .collect();
        t.retain(|n, _| !n.starts_with("text_model.encoder.layers.2."));
        t.extend(moved);
    });
    assert_unsupported(detected, &path, "text_model.encoder.layers.4.");
}
