//! ComfyUI's wav2vec2 audio encoder against `scripts/reference/wav2vec2.py`'s fixtures, recorded from ComfyUI
//! itself (its `Wav2Vec2Model` in the large and the base configuration with tiny dims, run as its
//! `encode_audio` does, with torchaudio 2.11.1's resample): every layer's state of a stereo clip, a batch
//! (normalised as one by the large model), every key layout, and the files refused.

use std::collections::BTreeMap;
use std::path::Path;

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType};
use kiln_models::Header;
use kiln_models::wav2vec2::{self, Config, Layout, Prefix, Variant, Wav2Vec2, WeightNorm};

use crate::common::{TempTensors, assert_close, cpu, fixture, read_tensors};

type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// The fixtures' tiny encoders, by the name of their file and outputs.
const TINY: [(&str, Config); 2] = [
    ("large", Config { width: 128, conv_dim: 32, layers: 2, variant: Variant::Large }),
    ("base", Config { width: 128, conv_dim: 32, layers: 2, variant: Variant::Base }),
];

/// The relative error ‖got − want‖∞ / ‖want‖∞.
fn relative(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    got.iter().zip(want).fold(0f32, |m, (g, w)| m.max((g - w).abs())) / scale
}

/// The encoder of `file`, detected as `config` in `layout`.
fn load(
    file: &Path,
    config: Config,
    layout: Layout,
) -> (std::sync::Arc<kiln_compute::backend::cpu::Cpu>, Wav2Vec2) {
    let sf = SafetensorsFile::open(file).unwrap();
    let header = Header::new(&sf, "");
    let found = wav2vec2::detect(&header).unwrap().expect("a wav2vec2 encoder");
    assert_eq!(found, (config, layout));
    let (b, manager) = cpu(64 << 20);
    let weights =
        manager.load(&wav2vec2::load_plan(&header, &config, layout), &mut |_, _| {}).unwrap();
    (b, Wav2Vec2::new(config, weights))
}

/// The encoder of `file` on `audio` `[B, C, T]` at 16 kHz: every state.
fn run(
    file: &Path,
    config: Config,
    layout: Layout,
    audio: &(Vec<usize>, Vec<f32>),
) -> Vec<Vec<f32>> {
    let (b, model) = load(file, config, layout);
    let x = b.from_f32(&audio.0, &audio.1, DType::F32).unwrap();
    let out = model.forward(&*b, &x).unwrap();
    assert_eq!(out.states.len(), config.layers + 1);
    assert_eq!(b.to_f32(&out.last).unwrap(), b.to_f32(&out.states[config.layers]).unwrap());
    out.states.iter().map(|s| b.to_f32(s).unwrap()).collect()
}

#[test]
fn wav2vec2_encodes_audio_as_comfyui() {
    let io = read_tensors("wav2vec2/io.safetensors");
    let (audio_shape, audio) = &io["audio"];
    let &[batch, channels, samples] = audio_shape.as_slice() else { panic!("audio [B, C, T]") };
    for (name, config) in TINY {
        // ComfyUI's encode_audio: resampled from 24 kHz to 16 kHz, the channels averaged, the encoder.
        let (b, model) =
            load(&fixture(&format!("wav2vec2/{name}.safetensors")), config, Layout::RELEASED);
        let encoded = model.encode_audio(&*b, audio, [batch, channels, samples], 24000).unwrap();
        assert_eq!(encoded.samples, 16000);
        assert_eq!(encoded.output.last.shape(), [batch, wav2vec2::frames(16000), config.width]);
        assert_eq!(encoded.output.states.len(), config.layers + 1);
        for (i, state) in encoded.output.states.iter().enumerate() {
            let got = b.to_f32(state).unwrap();
            let want = &io[&format!("{name}.state.{i}")].1;
            assert_close(&format!("{name} state {i}"), &got, want, 1e-4);
        }
        assert_eq!(
            b.to_f32(&encoded.output.last).unwrap(),
            b.to_f32(&encoded.output.states[config.layers]).unwrap()
        );
    }
}

#[test]
fn wav2vec2_batch_is_normalised_as_one() {
    let io = read_tensors("wav2vec2/io.safetensors");
    let audio = &io["batch.audio"];
    for (name, config) in TINY {
        let file = fixture(&format!("wav2vec2/{name}.safetensors"));
        let states = run(&file, config, Layout::RELEASED, audio);
        let want = &io[&format!("{name}.batch.last")].1;
        assert_close(&format!("{name} batch"), &states[config.layers], want, 1e-4);
    }
    // The large model's quiet item alone is normalised on its own: another answer than in the batch.
    let (shape, values) = audio;
    let quiet = (vec![1, shape[1], shape[2]], values[shape[2]..].to_vec());
    let alone = run(&fixture("wav2vec2/large.safetensors"), TINY[0].1, Layout::RELEASED, &quiet);
    let in_batch = &io["large.batch.last"].1[alone[2].len()..];
    assert!(relative(&alone[2], in_batch) > 0.1);
}

#[test]
fn wav2vec2_reads_every_layout_and_ignores_other_heads() {
    let io = read_tensors("wav2vec2/io.safetensors");
    let (shape, audio) = &io["audio"];
    // The clip at 16 kHz, as the encoder takes it.
    let resampler = kiln_models::resample::Resampler::new(24000, 16000).unwrap();
    let resampled: Vec<f32> =
        audio.chunks_exact(shape[2]).flat_map(|c| resampler.apply(c)).collect();
    let input = (vec![shape[0], shape[1], 16000], resampled);
    for (name, config) in TINY {
        let weights = read_tensors(&format!("wav2vec2/{name}.safetensors"));
        let want = &io[&format!("{name}.state.{}", config.layers)].1;
        for prefix in [Prefix::Wav2Vec2, Prefix::Bare] {
            for weight_norm in [WeightNorm::Legacy, WeightNorm::Parametrized] {
                let layout = Layout { prefix, weight_norm };
                let mut renamed: Tensors = weights
                    .iter()
                    .map(|(key, t)| {
                        let key = key.strip_prefix("wav2vec2.").expect("wav2vec2.*");
                        let key = match weight_norm {
                            WeightNorm::Legacy => key.to_owned(),
                            WeightNorm::Parametrized => key
                                .replace("conv.weight_g", "conv.parametrizations.weight.original0")
                                .replace("conv.weight_v", "conv.parametrizations.weight.original1"),
                        };
                        (format!("{}{key}", layout.prefix()), t.clone())
                    })
                    .collect();
                // The heads of Hugging Face's CTC and pretraining models, which ComfyUI leaves unread.
                renamed.insert("lm_head.weight".into(), (vec![32, 128], vec![0.5; 32 * 128]));
                renamed.insert("lm_head.bias".into(), (vec![32], vec![0.5; 32]));
                renamed.insert("quantizer.codevectors".into(), (vec![1, 8, 4], vec![1.0; 32]));
                renamed.insert("project_q.weight".into(), (vec![4, 4], vec![1.0; 16]));
                let file = TempTensors::new(
                    &format!("wav2vec2-{name}-{prefix:?}-{weight_norm:?}"),
                    renamed,
                );
                let states = run(&file.0, config, layout, &input);
                assert_close(&format!("{name} {layout:?}"), &states[config.layers], want, 1e-4);
            }
        }
    }
}

/// The large fixture with `name` replaced by zeros of `shape`.
fn with(name: &str, shape: Vec<usize>) -> TempTensors {
    let mut weights = read_tensors("wav2vec2/large.safetensors");
    let len = shape.iter().product();
    weights.insert(name.to_owned(), (shape, vec![0.0; len]));
    TempTensors::new(&format!("wav2vec2-{}", name.replace('.', "-")), weights)
}

/// What detection says of `file`.
fn detect(file: &Path) -> kiln_models::Result<Option<(Config, Layout)>> {
    let sf = SafetensorsFile::open(file).unwrap();
    wav2vec2::detect(&Header::new(&sf, ""))
}

#[test]
fn wav2vec2_refuses_widths_comfyui_does_not_build() {
    for width in [1280, 800, 96] {
        let file = with("wav2vec2.encoder.layer_norm.bias", vec![width]);
        let err = detect(&file.0).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{width} wide")) && err.contains("1024") && err.contains("768"),
            "{err}"
        );
    }
    // ComfyUI builds a 768-wide file as the base model; the large model's norms are refused.
    let file = with("wav2vec2.encoder.layer_norm.bias", vec![768]);
    let err = detect(&file.0).unwrap_err().to_string();
    assert!(
        err.contains("768-wide") && err.contains("Base") && err.contains("conv_layers.1"),
        "{err}"
    );

    // A misshapen weight is named.
    let file =
        with("wav2vec2.encoder.layers.1.feed_forward.intermediate_dense.weight", vec![256, 128]);
    let err = detect(&file.0).unwrap_err().to_string();
    assert!(
        err.contains("wav2vec2.encoder.layers.1.feed_forward.intermediate_dense.weight")
            && err.contains("[512, 128]"),
        "{err}"
    );

    // Whisper encoders are not wav2vec2 ones, in ComfyUI's layout or a bare one.
    assert!(detect(&fixture("whisper/weights.safetensors")).unwrap().is_none());
    let bare: Tensors = read_tensors("whisper/weights.safetensors")
        .into_iter()
        .map(|(name, t)| (name.strip_prefix("model.").expect("model.encoder.*").to_owned(), t))
        .collect();
    let file = TempTensors::new("wav2vec2-whisper-bare", bare);
    assert!(detect(&file.0).unwrap().is_none());
}

#[test]
fn wav2vec2_refuses_audio_shorter_than_its_receptive_field() {
    assert_eq!(wav2vec2::frames(16000), 49);
    assert_eq!(wav2vec2::frames(400), 1);
    assert_eq!(wav2vec2::frames(399), 0);
    let (b, model) = load(&fixture("wav2vec2/base.safetensors"), TINY[1].1, Layout::RELEASED);
    let x = b.from_f32(&[1, 1, 399], &[0.1; 399], DType::F32).unwrap();
    let err = model.forward(&*b, &x).unwrap_err().to_string();
    assert!(err.contains("400 samples") && err.contains("399"), "{err}");
}

#[test]
fn wav2vec2_expected_shapes_are_the_released_names() {
    let shapes = wav2vec2::expected_shapes(&Config::large());
    let get = |name: &str| shapes.iter().find(|(n, _)| n == name).map(|(_, s)| s.clone());
    assert_eq!(get("wav2vec2.feature_extractor.conv_layers.0.conv.weight"), Some(vec![512, 1, 10]));
    assert_eq!(get("wav2vec2.feature_extractor.conv_layers.6.layer_norm.bias"), Some(vec![512]));
    assert_eq!(get("wav2vec2.encoder.pos_conv_embed.conv.weight_g"), Some(vec![1, 1, 128]));
    assert_eq!(get("wav2vec2.encoder.pos_conv_embed.conv.weight_v"), Some(vec![1024, 64, 128]));
    assert_eq!(
        get("wav2vec2.encoder.layers.23.feed_forward.intermediate_dense.weight"),
        Some(vec![4096, 1024])
    );
    assert_eq!(get("wav2vec2.masked_spec_embed"), Some(vec![1024]));
    assert_eq!(Config::large().heads(), 16);

    let base = wav2vec2::expected_shapes(&Config::base());
    let get = |name: &str| base.iter().find(|(n, _)| n == name).map(|(_, s)| s.clone());
    assert_eq!(get("wav2vec2.feature_extractor.conv_layers.0.layer_norm.weight"), Some(vec![512]));
    assert_eq!(get("wav2vec2.feature_extractor.conv_layers.0.conv.bias"), None);
    assert_eq!(get("wav2vec2.feature_extractor.conv_layers.1.layer_norm.weight"), None);
    assert_eq!(get("wav2vec2.encoder.pos_conv_embed.conv.weight_v"), Some(vec![768, 48, 128]));
    assert_eq!(Config::base().heads(), 12);

    // The fixtures' files have exactly these names for their configs.
    for (name, config) in TINY {
        let weights = read_tensors(&format!("wav2vec2/{name}.safetensors"));
        let names: Vec<&String> = weights.keys().collect();
        let mut want: Vec<String> =
            wav2vec2::expected_shapes(&config).into_iter().map(|(n, _)| n).collect();
        want.sort();
        assert_eq!(names, want.iter().collect::<Vec<_>>(), "{name}");
    }
}
