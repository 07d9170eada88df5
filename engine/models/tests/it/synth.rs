//! The synthetic Z-Image-Turbo files: the released configuration's tensor lists match models.md's tables
//! (checked without writing 11.5 GiB), and tiny files parse with the real keys, shapes and dtypes, hold sane
//! values and are deterministic in the seed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kiln_compute::DType;
use kiln_compute::dtype::{narrow, widen};
use kiln_compute::memory::SafetensorsFile;
use kiln_models::family::{
    ControlNetDetected, DiffusionDetected, DiffusionFamily, ModelPatchDetected,
    TextEncoderDetected, TextEncoderFamily, VaeDetected, VaeFamily,
};
use kiln_models::synth::{
    self, LayeredFile, Qwen3Shape, SynthDtype, VaeShape, ZImageShape, ZImageTurboSet,
    flux_vae_tensors, qwen3_tensors, zimage_tensors,
};
use kiln_models::{Error, Header};

/// A fresh scratch folder for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("synth").join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

fn table(list: Vec<(String, Vec<usize>)>) -> BTreeMap<String, Vec<usize>> {
    let n = list.len();
    let map: BTreeMap<_, _> = list.into_iter().collect();
    assert_eq!(map.len(), n, "duplicate names");
    map
}

fn params(list: &BTreeMap<String, Vec<usize>>) -> u64 {
    list.values().map(|s| s.iter().product::<usize>() as u64).sum()
}

#[track_caller]
fn check_shapes(list: &BTreeMap<String, Vec<usize>>, want: &[(&str, &[usize])]) {
    for (name, shape) in want {
        assert_eq!(list.get(*name).map(Vec::as_slice), Some(*shape), "{name}");
    }
}

/// Every tensor of `path`: name → (dtype, shape, raw bytes).
fn read_raw(path: &Path) -> BTreeMap<String, (DType, Vec<usize>, Vec<u8>)> {
    let file = SafetensorsFile::open(path).expect("a safetensors file");
    assert_eq!(file.unsupported().count(), 0);
    let bytes = std::fs::read(path).expect("the file");
    file.tensors()
        .map(|(name, t)| {
            let range = t.offset as usize..(t.offset + t.len) as usize;
            (name.to_string(), (t.dtype, t.shape.clone(), bytes[range].to_vec()))
        })
        .collect()
}

/// Checks that `path` holds exactly `want`'s tensors under `prefix`, every one in `dtype`.
#[track_caller]
fn check_file(path: &Path, prefix: &str, want: &[(String, Vec<usize>)], dtype: DType) {
    let got = read_raw(path);
    let got: BTreeMap<_, _> = got
        .iter()
        .filter_map(|(k, (d, s, _))| Some((k.strip_prefix(prefix)?.to_string(), (*d, s.clone()))))
        .collect();
    let want: BTreeMap<_, _> = want.iter().map(|(k, s)| (k.clone(), (dtype, s.clone()))).collect();
    assert_eq!(got, want, "{}", path.display());
}

#[test]
fn real_zimage_is_models_md_table() {
    let list = table(zimage_tensors(&ZImageShape::real()).unwrap());
    assert_eq!(params(&list), 6_154_908_736);
    assert_eq!(list.len(), 32 * 13 + 2 * 11 + 15);
    check_shapes(
        &list,
        &[
            ("x_embedder.weight", &[3840, 64]),
            ("x_embedder.bias", &[3840]),
            ("x_pad_token", &[1, 3840]),
            ("cap_pad_token", &[1, 3840]),
            ("t_embedder.mlp.0.weight", &[1024, 256]),
            ("t_embedder.mlp.0.bias", &[1024]),
            ("t_embedder.mlp.2.weight", &[256, 1024]),
            ("t_embedder.mlp.2.bias", &[256]),
            ("cap_embedder.0.weight", &[2560]),
            ("cap_embedder.1.weight", &[3840, 2560]),
            ("cap_embedder.1.bias", &[3840]),
            ("final_layer.linear.weight", &[64, 3840]),
            ("final_layer.linear.bias", &[64]),
            ("final_layer.adaLN_modulation.1.weight", &[3840, 256]),
            ("final_layer.adaLN_modulation.1.bias", &[3840]),
        ],
    );
    let blocks = (0..30)
        .map(|i| (format!("layers.{i}"), true))
        .chain((0..2).map(|i| (format!("noise_refiner.{i}"), true)))
        .chain((0..2).map(|i| (format!("context_refiner.{i}"), false)));
    for (block, modulated) in blocks {
        let want: [(&str, &[usize]); 11] = [
            ("attention.qkv.weight", &[11520, 3840]),
            ("attention.out.weight", &[3840, 3840]),
            ("attention.q_norm.weight", &[128]),
            ("attention.k_norm.weight", &[128]),
            ("attention_norm1.weight", &[3840]),
            ("attention_norm2.weight", &[3840]),
            ("ffn_norm1.weight", &[3840]),
            ("ffn_norm2.weight", &[3840]),
            ("feed_forward.w1.weight", &[10240, 3840]),
            ("feed_forward.w2.weight", &[3840, 10240]),
            ("feed_forward.w3.weight", &[10240, 3840]),
        ];
        for (name, shape) in want {
            assert_eq!(
                list.get(&format!("{block}.{name}")).map(Vec::as_slice),
                Some(shape),
                "{block}.{name}"
            );
        }
        let ada = list.get(&format!("{block}.adaLN_modulation.0.weight"));
        assert_eq!(ada.map(Vec::as_slice), modulated.then_some(&[15360usize, 256][..]), "{block}");
        let ada_bias = list.get(&format!("{block}.adaLN_modulation.0.bias"));
        assert_eq!(ada_bias.map(Vec::as_slice), modulated.then_some(&[15360usize][..]), "{block}");
    }
    assert!(!list.contains_key("layers.30.attention.qkv.weight"));
    assert!(!list.contains_key("noise_refiner.2.attention.qkv.weight"));
    assert!(!list.keys().any(|k| k.contains("norm_final") || k.contains("to_q")));
}

#[test]
fn real_qwen3_is_models_md_table() {
    let list = table(qwen3_tensors(&Qwen3Shape::real()).unwrap());
    assert_eq!(params(&list), 4_022_468_096);
    assert_eq!(list.len(), 36 * 11 + 2);
    check_shapes(
        &list,
        &[("model.embed_tokens.weight", &[151936, 2560]), ("model.norm.weight", &[2560])],
    );
    for i in [0, 35] {
        let p = format!("model.layers.{i}");
        let want: [(&str, &[usize]); 11] = [
            ("self_attn.q_proj.weight", &[4096, 2560]),
            ("self_attn.k_proj.weight", &[1024, 2560]),
            ("self_attn.v_proj.weight", &[1024, 2560]),
            ("self_attn.o_proj.weight", &[2560, 4096]),
            ("self_attn.q_norm.weight", &[128]),
            ("self_attn.k_norm.weight", &[128]),
            ("mlp.gate_proj.weight", &[9728, 2560]),
            ("mlp.up_proj.weight", &[9728, 2560]),
            ("mlp.down_proj.weight", &[2560, 9728]),
            ("input_layernorm.weight", &[2560]),
            ("post_attention_layernorm.weight", &[2560]),
        ];
        for (name, shape) in want {
            assert_eq!(
                list.get(&format!("{p}.{name}")).map(Vec::as_slice),
                Some(shape),
                "{p}.{name}"
            );
        }
    }
    assert!(!list.contains_key("model.layers.36.input_layernorm.weight"));
    assert!(!list.keys().any(|k| k.contains("lm_head") || k.ends_with(".bias")));
}

#[test]
fn real_vae_is_models_md_table() {
    let list = table(flux_vae_tensors(&VaeShape::real()).unwrap());
    assert_eq!(params(&list), 83_819_683);
    check_shapes(
        &list,
        &[
            ("decoder.conv_in.weight", &[512, 16, 3, 3]),
            ("decoder.mid.block_1.norm1.weight", &[512]),
            ("decoder.mid.attn_1.norm.weight", &[512]),
            ("decoder.mid.attn_1.q.weight", &[512, 512, 1, 1]),
            ("decoder.mid.attn_1.k.weight", &[512, 512, 1, 1]),
            ("decoder.mid.attn_1.v.weight", &[512, 512, 1, 1]),
            ("decoder.mid.attn_1.proj_out.weight", &[512, 512, 1, 1]),
            ("decoder.up.3.block.0.conv1.weight", &[512, 512, 3, 3]),
            ("decoder.up.3.block.2.conv2.weight", &[512, 512, 3, 3]),
            ("decoder.up.1.block.0.nin_shortcut.weight", &[256, 512, 1, 1]),
            ("decoder.up.0.block.0.nin_shortcut.weight", &[128, 256, 1, 1]),
            ("decoder.up.1.upsample.conv.weight", &[256, 256, 3, 3]),
            ("decoder.up.2.upsample.conv.weight", &[512, 512, 3, 3]),
            ("decoder.up.3.upsample.conv.weight", &[512, 512, 3, 3]),
            ("decoder.norm_out.weight", &[128]),
            ("decoder.conv_out.weight", &[3, 128, 3, 3]),
            ("encoder.conv_in.weight", &[128, 3, 3, 3]),
            ("encoder.down.1.block.0.nin_shortcut.weight", &[256, 128, 1, 1]),
            ("encoder.down.2.block.0.nin_shortcut.weight", &[512, 256, 1, 1]),
            ("encoder.down.0.downsample.conv.weight", &[128, 128, 3, 3]),
            ("encoder.down.2.downsample.conv.weight", &[512, 512, 3, 3]),
            ("encoder.conv_out.weight", &[32, 512, 3, 3]),
            ("encoder.norm_out.bias", &[512]),
        ],
    );
    for absent in [
        "decoder.up.0.upsample.conv.weight",
        "encoder.down.3.downsample.conv.weight",
        "decoder.up.3.block.0.nin_shortcut.weight",
        "decoder.up.0.block.3.conv1.weight",
        "encoder.down.0.block.2.conv1.weight",
        "quant_conv.weight",
        "post_quant_conv.weight",
    ] {
        assert!(!list.contains_key(absent), "{absent}");
    }
    assert!(list.keys().all(|k| k.starts_with("encoder.") || k.starts_with("decoder.")));
}

#[test]
fn tiny_shapes_follow_the_brief() {
    let z = ZImageShape::tiny();
    assert_eq!((z.dim, z.heads, z.head_dim(), z.layers, z.refiners), (64, 2, 32, 2, 2));
    let q = Qwen3Shape::tiny();
    assert_eq!(q.vocab, 151936);
    assert_eq!(z.cap_feat_dim, q.hidden);
    let v = VaeShape::tiny();
    assert!(v.ch_mult.iter().all(|m| (v.ch * m).is_multiple_of(32)));
}

#[test]
fn tiny_files_have_the_layout_in_each_dtype() {
    let dir = scratch("layout");
    let set = ZImageTurboSet::tiny();
    for dtype in SynthDtype::ALL.into_iter().filter(|d| !d.is_scaled()) {
        let path = dir.join(format!("zimage_{dtype}.safetensors"));
        synth::write_zimage(&path, &set.zimage, dtype, 7, &mut |_, _| {}).unwrap();
        check_file(&path, "", &zimage_tensors(&set.zimage).unwrap(), dtype.dtype());

        let path = dir.join(format!("qwen3_{dtype}.safetensors"));
        synth::write_qwen3(&path, &set.qwen3, dtype, 7, &mut |_, _| {}).unwrap();
        check_file(&path, "", &qwen3_tensors(&set.qwen3).unwrap(), dtype.dtype());
    }
    for dtype in [SynthDtype::F32, SynthDtype::Bf16] {
        let path = dir.join(format!("vae_{dtype}.safetensors"));
        synth::write_flux_vae(&path, &set.vae, dtype, 7, &mut |_, _| {}).unwrap();
        check_file(&path, "", &flux_vae_tensors(&set.vae).unwrap(), dtype.dtype());
    }
    // Only complete files are left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".safetensors"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn values_are_sane() {
    let dir = scratch("values");
    let set = ZImageTurboSet::tiny();
    let path = dir.join("zimage.safetensors");
    synth::write_zimage(&path, &set.zimage, SynthDtype::Bf16, 1, &mut |_, _| {}).unwrap();
    let tensors = read_raw(&path);
    for (name, (dtype, shape, bytes)) in &tensors {
        let values = widen(*dtype, bytes);
        assert!(values.iter().all(|v| v.is_finite()), "{name}");
        if name.contains("norm") {
            assert!(values.iter().all(|&v| v == 1.0), "{name}: norm weights are ones");
            continue;
        }
        let fan_in = if shape.len() == 2 && !name.ends_with("pad_token") { shape[1] } else { 0 };
        let bound = match fan_in {
            0 => 1.0,
            n => 1.0 / (n as f32).sqrt() * 1.01,
        };
        assert!(values.iter().all(|v| v.abs() <= bound), "{name}: beyond ±{bound}");
        let mean = values.iter().sum::<f32>() / values.len() as f32;
        let mean_abs = values.iter().map(|v| v.abs()).sum::<f32>() / values.len() as f32;
        assert!(mean_abs > 0.0, "{name}: all zero");
        if values.len() > 10_000 {
            assert!(mean.abs() < 0.1 * mean_abs, "{name}: mean {mean} for mean |v| {mean_abs}");
        }
    }
    let pad = widen(tensors["x_pad_token"].0, &tensors["x_pad_token"].2);
    assert!(pad.iter().all(|v| v.abs() <= 0.0201));

    let path = dir.join("vae.safetensors");
    synth::write_flux_vae(&path, &set.vae, SynthDtype::F32, 1, &mut |_, _| {}).unwrap();
    let tensors = read_raw(&path);
    let (_, _, bias) = &tensors["decoder.norm_out.bias"];
    assert!(widen(DType::F32, bias).iter().all(|&v| v == 0.0), "GroupNorm biases are zero");
    let (_, _, weight) = &tensors["decoder.mid.block_1.norm1.weight"];
    assert!(widen(DType::F32, weight).iter().all(|&v| v == 1.0), "GroupNorm weights are one");
}

#[test]
fn fp8_files_are_fp8_throughout() {
    let dir = scratch("fp8");
    let set = ZImageTurboSet::tiny();
    for (dtype, want) in
        [(SynthDtype::Fp8E4m3fn, DType::F8E4M3), (SynthDtype::Fp8E5m2, DType::F8E5M2)]
    {
        let path = dir.join(format!("zimage_{dtype}.safetensors"));
        synth::write_zimage(&path, &set.zimage, dtype, 3, &mut |_, _| {}).unwrap();
        let tensors = read_raw(&path);
        assert!(tensors.values().all(|(d, _, _)| *d == want), "{dtype}");
        for (name, (d, _, bytes)) in &tensors {
            let values = widen(*d, bytes);
            assert!(values.iter().all(|v| v.is_finite()), "{name}");
            assert!(values.iter().any(|&v| v != 0.0), "{name}: all zero in {dtype}");
        }
        let (d, _, norm) = &tensors["layers.0.ffn_norm1.weight"];
        assert!(widen(*d, norm).iter().all(|&v| v == 1.0));
    }
}

#[test]
fn same_seed_same_bytes() {
    let dir = scratch("determinism");
    let shape = Qwen3Shape::tiny();
    let write = |name: &str, seed| {
        let path = dir.join(name);
        synth::write_qwen3(&path, &shape, SynthDtype::Bf16, seed, &mut |_, _| {}).unwrap();
        std::fs::read(path).unwrap()
    };
    let (a, b, c) =
        (write("a.safetensors", 11), write("b.safetensors", 11), write("c.safetensors", 12));
    assert_eq!(a.len(), c.len());
    assert!(a == b, "the same seed gave different bytes");
    let header = 8 + u64::from_le_bytes(a[..8].try_into().unwrap()) as usize;
    assert!(a[header..] != c[header..], "different seeds gave the same weights");
    // Different tensors of one file draw different values (the streams are keyed by name).
    let tensors = read_raw(&dir.join("a.safetensors"));
    assert_ne!(
        tensors["model.layers.0.mlp.up_proj.weight"].2,
        tensors["model.layers.0.mlp.gate_proj.weight"].2
    );
}

#[test]
fn progress_counts_every_byte() {
    let dir = scratch("progress");
    let path = dir.join("vae.safetensors");
    let mut calls = Vec::new();
    synth::write_flux_vae(&path, &VaeShape::tiny(), SynthDtype::F32, 0, &mut |d, t| {
        calls.push((d, t))
    })
    .unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(calls.len() > 2);
    assert!(calls.iter().all(|&(_, t)| t == size));
    assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0));
    assert_eq!(calls.last(), Some(&(size, size)));
}

#[test]
fn checkpoint_holds_the_three_files_under_comfyui_prefixes() {
    let dir = scratch("checkpoint");
    let set = ZImageTurboSet::tiny();
    let ckpt = dir.join("z_image_turbo_aio.safetensors");
    synth::write_checkpoint(&ckpt, &set, SynthDtype::Bf16, 5, &mut |_, _| {}).unwrap();
    let all = read_raw(&ckpt);
    let z = zimage_tensors(&set.zimage).unwrap();
    let q = qwen3_tensors(&set.qwen3).unwrap();
    let v = flux_vae_tensors(&set.vae).unwrap();
    assert_eq!(all.len(), z.len() + q.len() + v.len());
    let prefixes = [
        (synth::CHECKPOINT_DIFFUSION_PREFIX, &z),
        (synth::CHECKPOINT_TEXT_ENCODER_PREFIX, &q),
        (synth::CHECKPOINT_VAE_PREFIX, &v),
    ];
    for (prefix, list) in prefixes {
        for (name, shape) in list {
            let key = format!("{prefix}{name}");
            assert_eq!(all.get(&key).map(|t| &t.1), Some(shape), "{key}");
        }
    }
    assert!(
        all.contains_key(
            "text_encoders.qwen3_4b.transformer.model.layers.0.self_attn.q_norm.weight"
        )
    );
    assert!(all.contains_key("model.diffusion_model.cap_embedder.1.weight"));
    assert!(all.contains_key("vae.decoder.conv_in.weight"));

    // The parts equal the standalone files written by write_models_dir with the same seed.
    let models = dir.join("models");
    let mut last = (0, 0);
    synth::write_models_dir(&models, &set, SynthDtype::Bf16, 5, &mut |d, t| last = (d, t)).unwrap();
    let sizes: u64 = [synth::DIFFUSION_MODEL_FILE, synth::TEXT_ENCODER_FILE, synth::VAE_FILE]
        .iter()
        .map(|f| std::fs::metadata(models.join(f)).unwrap().len())
        .sum();
    assert_eq!(last, (sizes, sizes));
    let files = [
        (synth::DIFFUSION_MODEL_FILE, synth::CHECKPOINT_DIFFUSION_PREFIX),
        (synth::TEXT_ENCODER_FILE, synth::CHECKPOINT_TEXT_ENCODER_PREFIX),
        (synth::VAE_FILE, synth::CHECKPOINT_VAE_PREFIX),
    ];
    for (file, prefix) in files {
        for (name, (dtype, shape, bytes)) in read_raw(&models.join(file)) {
            let (ckpt_dtype, ckpt_shape, ckpt_bytes) = &all[&format!("{prefix}{name}")];
            assert_eq!(ckpt_shape, &shape, "{file}: {name}");
            if file == synth::VAE_FILE {
                // The released VAE is f32; the checkpoint's is bf16 beside a bf16 model: same values, rounded.
                assert_eq!((dtype, *ckpt_dtype), (DType::F32, DType::BF16), "{name}");
                let rounded = narrow(DType::BF16, &widen(DType::F32, &bytes));
                assert!(&rounded == ckpt_bytes, "{file}: {name}");
            } else {
                assert_eq!((dtype, &bytes), (*ckpt_dtype, ckpt_bytes), "{file}: {name}");
            }
        }
    }
}

#[test]
fn bad_requests_are_invalid() {
    let dir = scratch("invalid");
    let path = dir.join("vae.safetensors");
    let err =
        synth::write_flux_vae(&path, &VaeShape::tiny(), SynthDtype::Fp8E4m3fn, 0, &mut |_, _| {});
    assert!(matches!(err, Err(Error::Invalid(ref m)) if m.contains("fp8_e4m3fn")), "{err:?}");
    assert!(!path.exists());

    let shape = ZImageShape { heads: 3, ..ZImageShape::tiny() };
    assert!(matches!(zimage_tensors(&shape), Err(Error::Invalid(_))));

    let mut set = ZImageTurboSet::tiny();
    set.qwen3.hidden = 48;
    let err = synth::write_checkpoint(
        &dir.join("c.safetensors"),
        &set,
        SynthDtype::Bf16,
        0,
        &mut |_, _| {},
    );
    assert!(matches!(err, Err(Error::Invalid(_))), "{err:?}");

    let err = synth::write_zimage(
        &dir.join("missing/dir/z.safetensors"),
        &ZImageShape::tiny(),
        SynthDtype::Bf16,
        0,
        &mut |_, _| {},
    );
    assert!(matches!(err, Err(Error::Invalid(ref m)) if m.contains("missing/dir")), "{err:?}");

    assert_eq!("fp8_e5m2".parse::<SynthDtype>().unwrap(), SynthDtype::Fp8E5m2);
    assert!("int8".parse::<SynthDtype>().is_err());
}

#[test]
fn a_synthetic_lora_adapts_every_attention_and_ffn_weight_of_the_dit_and_nothing_else() {
    let dir = scratch("lora");
    let set = ZImageTurboSet::tiny();
    let path = dir.join("loras/pixel_art_style_z_image_turbo.safetensors");
    synth::write_family(
        &path,
        synth::SynthFamily::Lora(DiffusionFamily::ZImage),
        &set,
        SynthDtype::Bf16,
        2,
        &mut |_, _| {},
    )
    .unwrap();
    let slots = zimage_tensors(&set.zimage).unwrap();
    let view: Vec<(&str, &[usize])> =
        slots.iter().map(|(n, s)| (n.as_str(), s.as_slice())).collect();
    let lora =
        kiln_models::zimage_lora::patches(&SafetensorsFile::open(&path).unwrap(), &view, 1.0)
            .unwrap();
    assert!(lora.unmatched.is_empty(), "{:?}", lora.unmatched);
    let adapted: Vec<&str> = lora.patches.iter().map(|(name, _)| name.as_str()).collect();
    let expected: Vec<&str> = view
        .iter()
        .map(|(name, _)| *name)
        .filter(|n| {
            ["attention.qkv.", "attention.out.", "feed_forward.w"].iter().any(|p| n.contains(p))
        })
        .collect();
    assert_eq!(adapted, expected);
    assert_eq!(expected.len(), (2 + 2 + 2) * 5, "qkv, out, w1, w2, w3 of every block");
}

#[test]
fn scaled_fp8_files_keep_linear_weights_in_fp8_with_a_scale_each_in_comfyuis_encodings() {
    let dir = scratch("scaled");
    let set = ZImageTurboSet::tiny();
    let want = zimage_tensors(&set.zimage).unwrap();
    for dtype in [SynthDtype::Fp8Scaled, SynthDtype::Fp8Mixed] {
        let path = dir.join(format!("zimage_{dtype}.safetensors"));
        synth::write_zimage(&path, &set.zimage, dtype, 7, &mut |_, _| {}).unwrap();
        let raw = read_raw(&path);
        let file = SafetensorsFile::open(&path).unwrap();
        let scale_suffix =
            if dtype == SynthDtype::Fp8Scaled { ".scale_weight" } else { ".weight_scale" };
        let mut quantized = 0;
        for (name, shape) in &want {
            let (stored, got_shape, _) = &raw[name];
            assert_eq!(got_shape, shape, "{name}");
            let layer = name.strip_suffix(".weight").filter(|_| shape.len() == 2);
            match layer {
                Some(layer) => {
                    assert_eq!(*stored, DType::F8E4M3, "{name}");
                    let (scale_dtype, scale_shape, bytes) = &raw[&format!("{layer}{scale_suffix}")];
                    assert_eq!((*scale_dtype, scale_shape.as_slice()), (DType::F32, &[][..]));
                    assert!(widen(DType::F32, bytes)[0] > 0.0, "{name}");
                    quantized += 1;
                }
                None => assert_eq!(*stored, DType::BF16, "{name}"),
            }
        }
        assert!(quantized > 20, "{dtype}: {quantized} quantized layers");
        // The encoding ComfyUI reads: the legacy marker, or the header's quantization map naming every layer.
        let map = file.metadata().get("_quantization_metadata");
        if dtype == SynthDtype::Fp8Scaled {
            assert!(raw.contains_key("scaled_fp8") && map.is_none());
        } else {
            let map: serde_json::Value = serde_json::from_str(map.expect("a map")).unwrap();
            assert_eq!(map["layers"].as_object().unwrap().len(), quantized);
            assert_eq!(map["layers"]["layers.0.attention.qkv"]["format"], "float8_e4m3fn");
        }
    }
}

#[test]
fn one_file_of_a_family_is_written_under_any_name() {
    let dir = scratch("family");
    let set = ZImageTurboSet::tiny();
    let names: Vec<&str> = synth::SynthFamily::all().iter().map(|f| f.name()).collect();
    assert_eq!(
        names,
        [
            "z-image",
            "lumina2",
            "chroma-radiance",
            "flux1",
            "longcat-image",
            "chroma",
            "ovis-image",
            "flux2",
            "qwen-image",
            "wan21-t2v-1.3b",
            "wan22-ti2v-5b",
            "lotus-depth",
            "hidream",
            "sdxl",
            "sdxl-refiner",
            "sd3.5",
            "kandinsky5-image",
            "kandinsky5-video",
            "anima",
            "omnigen2",
            "boogu",
            "hunyuan-video",
            "hunyuan-video15",
            "krea2",
            "mage-flow",
            "joyimage",
            "ernie-image",
            "pixeldit",
            "qwen3vl-4b",
            "qwen3",
            "gemma2-2b",
            "qwen25vl",
            "clip-l",
            "umt5-xxl",
            "t5xxl",
            "mistral3",
            "llama3",
            "wan21-vae",
            "wan22-vae",
            "hunyuan-video15-vae",
            "hunyuan-video-vae",
            "flux-vae",
            "flux2-vae",
            "mage-flow-vae",
            "z-image-lora",
            "flux1-lora",
            "longcat-image-lora",
            "chroma-lora",
            "flux2-lora",
            "qwen-image-lora",
            "wan21-lora",
            "wan22-lora",
            "hidream-lora",
            "anima-lora",
            "krea2-lora",
            "qwen-image-layered",
            "qwen-image-layered-vae",
            "qwen-image-controlnet-instantx",
            "qwen-image-controlnet-inpaint",
            "qwen-image-controlnet-fun",
            "sd3.5-controlnet-blur",
            "sd3.5-controlnet-canny",
            "sd3.5-controlnet-depth",
            "qwen-image-diffsynth-controlnet",
            "z-image-fun-controlnet",
            "anima-lllite",
            "anima-lllite-inpaint",
            "flux1-schnell",
            "flux1-fill",
            "flux1-canny",
            "flux1-schnell-checkpoint",
            "flux1-dev-checkpoint",
            "flux2-klein-9b",
            "flux2-dev",
            "clip-vision-h",
            "clip-vision-g",
            "siglip-384",
            "qwen25vl-longcat",
            "qwen25vl-3b",
            "qwen3-0.6b",
            "ministral3-3b",
            "clip-g",
            "flux1-redux",
            "uso-flux1-projector",
            "wan21-i2v-14b",
            "wan21-flf2v-14b",
            "wan22-t2v-a14b",
            "wan22-i2v-a14b",
            "wan21-fun-control-1.3b",
            "wan22-fun-control-a14b",
            "wan22-fun-control-5b",
            "wan22-fun-inpaint-5b",
            "wan21-vace-14b",
            "wan21-fun-camera-1.3b",
            "wan22-fun-camera-a14b",
            "wan21-causal-t2v-1.3b",
            "humo-17b",
            "wan22-s2v-14b",
            "wan21-animate2-14b",
            "wan22-dancer-14b",
            "esrgan-x4",
            "whisper-large-v3",
            "wav2vec2-large-english",
            "wav2vec2-chinese-base",
            "wan21-infinitetalk",
            "sd-vae",
            "byt5-small-glyph"
        ]
    );
    for family in synth::SynthFamily::all() {
        assert_eq!(family.name().parse::<synth::SynthFamily>().unwrap(), family);
        let path = dir.join(format!("sub/{family}.safetensors"));
        let dtype = match family {
            synth::SynthFamily::Vae(_) | synth::SynthFamily::QwenImageLayered(LayeredFile::Vae) => {
                SynthDtype::F32
            }
            _ => SynthDtype::F16,
        };
        synth::write_family(&path, family, &set, dtype, 1, &mut |_, _| {}).unwrap();
        let file = SafetensorsFile::open(&path).unwrap();
        // Mistral's tokenizer JSON (`tekken_model`) and umT5's and Gemma 2's SentencePiece models are bytes in
        // every file (Lumina 2's checkpoint keeps its SentencePiece model at `text_encoders.spiece_model`).
        let weight = |name: &str| {
            name != kiln_models::mistral3::TEKKEN && !name.ends_with(kiln_models::t5::SPIECE_MODEL)
        };
        assert!(file.tensors().all(|(n, t)| t.dtype == dtype.dtype() || !weight(n)), "{family}");
        // Loading reads the description synth wrote from: each file is detected as the family it names.
        let header = Header::new(&file, "");
        match family {
            // SDXL's and SD3.5's are all-in-one checkpoints: the network under ComfyUI's prefix, each text
            // encoder under its own (SDXL's CLIP-G in OpenCLIP's layout).
            synth::SynthFamily::Diffusion(
                f @ (DiffusionFamily::Sdxl | DiffusionFamily::SdxlRefiner | DiffusionFamily::Sd3),
            ) => {
                let prefix = kiln_models::header::diffusion_prefix(file.names());
                let net = Header::new(&file, &prefix);
                assert_eq!(DiffusionDetected::detect(&net).unwrap().unwrap().family(), f);
                for prefix in f.checkpoint_text_encoders() {
                    let found = TextEncoderDetected::detect(&Header::new(&file, prefix)).unwrap();
                    let layout = match found {
                        Some(TextEncoderDetected::ClipL(c)) => Some(c.layout),
                        Some(TextEncoderDetected::T5(_)) => None,
                        other => panic!("{family} {prefix}: {other:?}"),
                    };
                    let open_clip = prefix.ends_with(".model.");
                    assert_eq!(layout == Some(kiln_models::clip_text::Layout::OpenClip), open_clip);
                }
            }
            // Lumina 2's is an all-in-one checkpoint: Gemma 2 under its prefix, its SentencePiece model beside it.
            synth::SynthFamily::Diffusion(f @ DiffusionFamily::Lumina2) => {
                let prefix = kiln_models::header::diffusion_prefix(file.names());
                let net = Header::new(&file, &prefix);
                let found = DiffusionDetected::detect(&net).unwrap().unwrap();
                assert_eq!(
                    found,
                    DiffusionDetected::ZImage(
                        set.lumina2.clone(),
                        kiln_models::zimage::Layout::Comfy
                    )
                );
                assert_eq!(found.family(), f);
                let [te] = f.checkpoint_text_encoders() else { panic!("one text encoder") };
                let Some(TextEncoderDetected::Gemma2(gemma)) =
                    TextEncoderDetected::detect(&Header::new(&file, te)).unwrap()
                else {
                    panic!("{family}: no Gemma 2 under {te}")
                };
                assert_eq!(gemma.config, set.gemma2);
                let tokens = gemma.tokenizer().unwrap().tokens("a cat").unwrap();
                assert_eq!(tokens[0][0], (kiln_models::gemma2::START, 1.0));
            }
            synth::SynthFamily::Diffusion(DiffusionFamily::Kandinsky5) => {
                let found = DiffusionDetected::detect(&header).unwrap().unwrap();
                assert_eq!(found, DiffusionDetected::Kandinsky5(set.kandinsky5.clone()));
            }
            synth::SynthFamily::Diffusion(f) => {
                assert_eq!(DiffusionDetected::detect(&header).unwrap().unwrap().family(), f);
            }
            // A Qwen3 file that CLIPLoader makes Anima's encoder by its width, whatever the type.
            synth::SynthFamily::TextEncoder(f @ TextEncoderFamily::Anima) => {
                let found = TextEncoderDetected::detect(&header).unwrap().unwrap();
                assert_eq!(found.for_clip_type("stable_diffusion").unwrap().family(), f);
            }
            // Qwen3-VL 4B in transformers' layout, read under ComfyUI's names, its vision tower too; made Krea 2's
            // or Mage-Flow's encoder by CLIPLoader's type.
            synth::SynthFamily::TextEncoder(TextEncoderFamily::Qwen3Vl) => {
                let found = TextEncoderDetected::detect(&header).unwrap().unwrap();
                let TextEncoderDetected::Qwen3Vl(config, Some(vision), None) = &found else {
                    panic!("{found:?}")
                };
                assert_eq!((config.hidden, config.layers), (set.qwen3vl_4b.hidden, 36));
                assert_eq!(vision, &set.qwen3vl_vision);
                for (kind, f) in [
                    (kiln_models::family::KREA2_CLIP_TYPE, TextEncoderFamily::Krea2),
                    (kiln_models::family::MAGE_CLIP_TYPE, TextEncoderFamily::MageFlow),
                ] {
                    assert_eq!(found.clone().for_clip_type(kind).unwrap().family(), f);
                }
            }
            synth::SynthFamily::TextEncoder(f) => {
                assert_eq!(TextEncoderDetected::detect(&header).unwrap().unwrap().family(), f);
            }
            synth::SynthFamily::Vae(f) => {
                assert_eq!(VaeDetected::detect(&header).unwrap().unwrap().family(), f);
            }
            synth::SynthFamily::Lora(_) => {
                assert!(DiffusionDetected::detect(&header).unwrap().is_none());
            }
            synth::SynthFamily::SdVae => {
                let found = VaeDetected::detect(&header).unwrap().unwrap();
                assert!(
                    matches!(found, VaeDetected::Flux(c, _) if c.z_channels == 4 && c.quant_conv)
                );
            }
            synth::SynthFamily::QwenImageLayered(LayeredFile::Dit) => {
                let found = DiffusionDetected::detect(&header).unwrap().unwrap();
                assert!(matches!(found, DiffusionDetected::QwenImage(c, _) if c.additional_t_cond));
            }
            synth::SynthFamily::QwenImageLayered(LayeredFile::Vae) => {
                let found = VaeDetected::detect(&header).unwrap().unwrap();
                assert!(matches!(found, VaeDetected::Wan21(c, _) if c.in_channels == 4));
            }
            synth::SynthFamily::QwenImageControlNet(file) => {
                let found = ControlNetDetected::detect(&header).unwrap().unwrap();
                let want = ControlNetDetected::QwenImage(file.config(&set.qwen_image));
                assert_eq!(found, want, "{family}");
            }
            synth::SynthFamily::Sd3ControlNet(control_type) => {
                let found = ControlNetDetected::detect(&header).unwrap().unwrap();
                let want = synth::sd3_control_config(&set, control_type);
                assert_eq!(found, ControlNetDetected::Sd3(want), "{family}");
            }
            synth::SynthFamily::QwenImageBlockwise => {
                let found = ModelPatchDetected::detect(&header).unwrap().unwrap();
                let want = synth::blockwise_config(&set.qwen_image);
                assert_eq!(found, ModelPatchDetected::QwenImageBlockwise(want));
            }
            synth::SynthFamily::AnimaLllite(inpaint) => {
                let Some(ModelPatchDetected::AnimaLllite(found)) =
                    ModelPatchDetected::detect(&header).unwrap()
                else {
                    panic!("{family}: not an Anima LLLite")
                };
                let want = synth::lllite_config(&set.anima, inpaint);
                assert_eq!(
                    (found.cond_in_channels, found.inpaint_masked_input, &found.aspp_dilations),
                    (want.cond_in_channels, want.inpaint_masked_input, &want.aspp_dilations)
                );
                assert_eq!(found.modules.len(), want.modules.len(), "{family}");
            }
            synth::SynthFamily::ZImageFunControlNet => {
                let found = ModelPatchDetected::detect(&header).unwrap().unwrap();
                let want = synth::fun_control_config(&set.zimage);
                assert_eq!(found, ModelPatchDetected::ZImageFun(want));
            }
            synth::SynthFamily::Flux(
                checkpoint @ (kiln_models::synth::FluxFile::SchnellCheckpoint
                | kiln_models::synth::FluxFile::DevCheckpoint),
            ) => {
                let prefix = kiln_models::header::diffusion_prefix(file.names());
                let found =
                    DiffusionDetected::detect(&Header::new(&file, &prefix)).unwrap().unwrap();
                let want = checkpoint.config(&set.flux);
                assert_eq!(found, DiffusionDetected::Flux(want, kiln_models::flux::Layout::Comfy));
            }
            synth::SynthFamily::Flux(file) => {
                let found = DiffusionDetected::detect(&header).unwrap().unwrap();
                let want = DiffusionDetected::Flux(
                    file.config(&set.flux),
                    kiln_models::flux::Layout::Comfy,
                );
                assert_eq!(found, want, "{family}");
            }
            synth::SynthFamily::ClipVision(file) => {
                let found = kiln_models::family::ClipVisionDetected::detect(&header).unwrap();
                let want = kiln_models::family::ClipVisionDetected::Vit(file.config(&set));
                assert_eq!(found, Some(want), "{family}");
            }
            synth::SynthFamily::WanInfiniteTalk => {
                let found = ModelPatchDetected::detect(&header).unwrap().unwrap();
                assert_eq!(found, ModelPatchDetected::InfiniteTalk(set.infinite_talk), "{family}");
            }
            synth::SynthFamily::FluxUso => {
                let found = ModelPatchDetected::detect(&header).unwrap().unwrap();
                assert_eq!(found, ModelPatchDetected::Uso(set.uso.clone()), "{family}");
                let grid = set.siglip.image_size / set.siglip.patch;
                assert_eq!(
                    (set.uso.siglip_tokens, set.uso.siglip_dim, set.uso.hidden),
                    (grid * grid, set.siglip.hidden, set.flux.dim)
                );
            }
            synth::SynthFamily::ClipG => {
                let found = TextEncoderDetected::detect(&header).unwrap().unwrap();
                assert_eq!(found, TextEncoderDetected::ClipL(set.clip_g), "{family}");
                // HiDream's pooled vector joins CLIP-L's and CLIP-G's; its text widths are T5-XXL's and Llama's.
                let h = &set.hidream;
                assert_eq!(h.pooled_width, set.clip_l.hidden + set.clip_g.hidden);
                assert_eq!((h.t5_width, h.llama_width), (set.t5.d_model, set.llama3.hidden));
            }
            // Its two key/value heads make it the 3B, OmniGen2's encoder whatever the type.
            synth::SynthFamily::OmniGen2TextEncoder => {
                let found = TextEncoderDetected::detect(&header).unwrap().unwrap();
                let found = found.for_clip_type("stable_diffusion").unwrap();
                let TextEncoderDetected::Qwen25Vl(config, Some(_), role) = found else {
                    panic!("{found:?}");
                };
                assert_eq!(role, kiln_models::family::Qwen25Role::OmniGen2);
                assert_eq!(config.hidden, set.omnigen2.text_feat_dim);
            }
            synth::SynthFamily::LongCatTextEncoder => {
                let found = TextEncoderDetected::detect(&header).unwrap().unwrap();
                let TextEncoderDetected::Qwen25Vl(config, Some(vision), _) = found else {
                    panic!("{found:?}");
                };
                // As wide as the LongCat-Image DiT's text, its tower's output too.
                assert_eq!(
                    (config.hidden, vision.out_hidden),
                    (set.longcat.text_dim, set.longcat.text_dim)
                );
            }
            synth::SynthFamily::FluxRedux => {
                let found = kiln_models::family::StyleModelDetected::detect(&header).unwrap();
                let want = kiln_models::family::StyleModelDetected::FluxRedux(set.redux);
                assert_eq!(found, Some(want), "{family}");
                assert_eq!(
                    (set.redux.input, set.redux.output),
                    (set.siglip.hidden, set.flux.text_dim)
                );
            }
            synth::SynthFamily::ByT5 => {
                let found = TextEncoderDetected::detect(&header).unwrap();
                assert_eq!(found, Some(TextEncoderDetected::T5(set.byt5)), "{family}");
            }
            synth::SynthFamily::Esrgan => {
                let found = kiln_models::esrgan::detect(&header).unwrap();
                assert_eq!(found, Some((set.esrgan, kiln_models::esrgan::Layout::RealEsrgan)));
            }
            synth::SynthFamily::Wav2Vec2(variant) => {
                let found = kiln_models::wav2vec2::detect(&header).unwrap().expect("wav2vec2");
                assert_eq!(found.0.variant, variant);
                assert!(set.wav2vec2.contains(&found.0), "{:?}", found.0);
            }
            synth::SynthFamily::Whisper => {
                let found = kiln_models::whisper::detect(&header).unwrap();
                assert_eq!(found, Some((set.whisper, kiln_models::whisper::Layout::Hf)));
            }
            synth::SynthFamily::Wan(file) => {
                let found = DiffusionDetected::detect(&header).unwrap().unwrap();
                let want =
                    DiffusionDetected::Wan(file.config(&set), kiln_models::wan::Layout::Comfy);
                assert_eq!(found, want, "{family}");
            }
            synth::SynthFamily::Flux2(file) => {
                let found = DiffusionDetected::detect(&header).unwrap().unwrap();
                let want =
                    DiffusionDetected::Flux2(file.config(&set), kiln_models::flux::Layout::Comfy);
                assert_eq!(found, want, "{family}");
            }
        }
    }
    let error = "sd15".parse::<synth::SynthFamily>().unwrap_err();
    assert!(error.to_string().contains("unknown family `sd15`"), "{error}");
    let vae = dir.join("vae.safetensors");
    let refused = synth::write_family(
        &vae,
        synth::SynthFamily::Vae(VaeFamily::Flux),
        &set,
        SynthDtype::Fp8E4m3fn,
        0,
        &mut |_, _| {},
    );
    assert!(matches!(refused, Err(Error::Invalid(_))));
}

#[test]
fn int8_convrot_mxfp8_and_nvfp4_files_quantize_the_linear_weights_their_blocks_fit() {
    let dir = scratch("blocks");
    let set = ZImageTurboSet::tiny();
    for (dtype, format, stored) in [
        (SynthDtype::Int8Convrot, "int8_tensorwise", DType::I8),
        (SynthDtype::Mxfp8, "mxfp8", DType::F8E4M3),
        (SynthDtype::Nvfp4, "nvfp4", DType::U8),
    ] {
        let path = dir.join(format!("zimage_{dtype}.safetensors"));
        synth::write_zimage(&path, &set.zimage, dtype, 7, &mut |_, _| {}).unwrap();
        let file = SafetensorsFile::open(&path).unwrap();
        let map: serde_json::Value =
            serde_json::from_str(file.metadata().get("_quantization_metadata").expect("a map"))
                .unwrap();
        let layers = map["layers"].as_object().unwrap();
        assert!(layers.len() > 20, "{dtype}: {} quantized layers", layers.len());
        for (layer, config) in layers {
            assert_eq!(config["format"], format, "{layer}");
            let weight = file.tensor(&format!("{layer}.weight")).unwrap();
            assert_eq!(weight.dtype, stored, "{layer}");
            if dtype == SynthDtype::Int8Convrot {
                let group = config["convrot_groupsize"].as_u64().unwrap() as usize;
                assert!(weight.shape[1].is_multiple_of(group), "{layer}: groups of {group}");
            }
            if dtype == SynthDtype::Nvfp4 {
                // Random code pairs over every byte value, not a clamped half.
                let bytes = file.raw_bytes(&format!("{layer}.weight")).unwrap();
                let zeros = bytes.iter().filter(|&&b| b == 0).count();
                assert!(
                    zeros * 50 < bytes.len(),
                    "{layer}: {zeros} of {} bytes are 0",
                    bytes.len()
                );
                assert!(file.tensor(&format!("{layer}.weight_scale_2")).is_ok(), "{layer}");
            }
        }
        // Kiln reads what it wrote.
        let quant = kiln_models::quant::Quantization::read(&file).unwrap();
        quant.refuse_unsupported(&file, "").unwrap();
        assert!(quant.has_tables());
    }
}

#[test]
fn a_synthetic_krea2_lora_adapts_every_attention_projection_of_the_dit() {
    let dir = scratch("krea2-lora");
    let set = ZImageTurboSet::tiny();
    let path = dir.join("loras/krea2_darkbrush.safetensors");
    let family = synth::SynthFamily::Lora(DiffusionFamily::Krea2);
    synth::write_family(&path, family, &set, SynthDtype::Bf16, 3, &mut |_, _| {}).unwrap();
    let slots = kiln_models::krea2::expected(&set.krea2);
    let view: Vec<(&str, &[usize])> =
        slots.iter().map(|(n, s)| (n.as_str(), s.as_slice())).collect();
    let file = SafetensorsFile::open(&path).unwrap();
    let lora = kiln_models::krea2::lora::patches(&file, &view, 1.0).unwrap();
    assert!(lora.unmatched.is_empty(), "{:?}", lora.unmatched);
    let adapted: Vec<&str> = lora.patches.iter().map(|(name, _)| name.as_str()).collect();
    let expected: Vec<&str> = view
        .iter()
        .map(|(name, _)| *name)
        .filter(|n| {
            ["wq", "wk", "wv", "wo"].iter().any(|p| n.ends_with(&format!(".attn.{p}.weight")))
        })
        .filter(|n| n.starts_with("blocks."))
        .collect();
    assert_eq!(adapted.len(), 4 * set.krea2.layers);
    assert_eq!(adapted, expected);
}
