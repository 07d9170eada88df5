//! InfiniteTalk's model patch against `scripts/reference/infinite_talk.py`'s fixtures, recorded from ComfyUI's
//! own `model_multitalk.py` on a tiny patch (2 blocks of the tiny Wan's width, 3 × 4 features a frame, 32
//! tokens 8 wide): the audio windows and projection, the speakers' attention map, the tiny Wan 2.1 DiT with the
//! patch for one and two speakers, the refusals, and detection of the released layout.

use kiln_compute::backend::cpu::Cpu;
use std::sync::Arc;

use kiln_compute::memory::{MemoryManager, SafetensorsFile};
use kiln_compute::{Backend as _, DType, Tensor};
use kiln_models::Header;
use kiln_models::family::{DiffusionInput, ModelPatchDetected, ModelPatchNet};
use kiln_models::synth::ZImageTurboSet;
use kiln_models::wan::infinite_talk::{
    InfiniteTalk, SpeakerFeatures, TalkConfig, TalkInput, audio_windows,
};

use crate::common::{TempTensors, assert_close, cpu, fixture, read_tensors, write_header_only};
use crate::wan::{Tensors, Variant, io_tensor, load_on, weight_list};

/// The tiny patch's widths.
const TINY: TalkConfig =
    TalkConfig { dim: 256, hidden: 16, features: 12, tokens: 32, audio_dim: 8, blocks: 2 };

fn fixture_tensors() -> Tensors {
    read_tensors("wan/infinite_talk.safetensors")
}

/// The tiny patch written from the fixture's `patch.*` tensors, detected and loaded by `manager`.
fn tiny_patch(manager: &Arc<MemoryManager>, fixture: &Tensors) -> ModelPatchNet {
    let tensors: Tensors = fixture
        .iter()
        .filter_map(|(name, t)| Some((name.strip_prefix("patch.")?.to_owned(), t.clone())))
        .collect();
    let file = TempTensors::new("infinite-talk", tensors);
    let safetensors = SafetensorsFile::open(&file.0).unwrap();
    let header = Header::new(&safetensors, "");
    let detected = ModelPatchDetected::detect(&header).unwrap().expect("a model patch");
    assert_eq!(detected, ModelPatchDetected::InfiniteTalk(TINY));
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).unwrap();
    detected.build(weights)
}

fn talk(net: &ModelPatchNet) -> &InfiniteTalk {
    let ModelPatchNet::InfiniteTalk(talk) = net else { panic!("InfiniteTalk") };
    talk
}

#[test]
fn audio_windows_project_to_each_latent_frames_tokens_as_comfyui_does() {
    let fixture = fixture_tensors();
    let (b, manager) = cpu(64 << 20);
    let net = tiny_patch(&manager, &fixture);
    for case in ["single", "padded", "late", "two"] {
        let speakers: Vec<&(Vec<usize>, Vec<f32>)> =
            (0..2).filter_map(|k| fixture.get(&format!("audio.{case}.{k}"))).collect();
        let features: Vec<SpeakerFeatures<'_>> = speakers
            .iter()
            .map(|(shape, values)| SpeakerFeatures { values, frames: shape[0] })
            .collect();
        let window = &fixture[&format!("window.{case}")].1;
        let windows =
            audio_windows(&features, TINY.features, window[0] as usize, window[1] as usize)
                .unwrap();
        let got = talk(&net).project(&*b, &windows).unwrap();
        let want = &fixture[&format!("embeds.{case}")];
        assert_eq!(got.shape(), want.0.as_slice(), "{case}");
        assert_close(case, &b.to_f32(&got).unwrap(), &want.1, 1e-5);
    }
}

#[test]
fn the_speakers_attention_map_is_comfyuis() {
    let fixture = fixture_tensors();
    let (b, _) = cpu(16 << 20);
    // [1, N, H, 128] → heads [1, H, N, 128], as the block holds its roped queries and keys.
    let heads = |name: &str| {
        let t = io_tensor(&b, &fixture, name);
        b.permute(&t, &[0, 2, 1, 3]).unwrap()
    };
    let map = InfiniteTalk::attention_map(
        &*b,
        &heads("map.q"),
        &heads("map.k"),
        &fixture["map.masks"].1,
        6,
    )
    .unwrap();
    let got: Vec<f32> = map.concat();
    assert_close("map", &got, &fixture["map.out"].1, 1e-5);
}

#[test]
fn wan_with_the_patch_attends_to_one_or_two_speakers_as_comfyui_does() {
    let fixture = fixture_tensors();
    let (b, manager) = cpu(256 << 20);
    let model_file = TempTensors::new("infinite-talk-expert", Variant::Expert.tensors());
    let (_, net) = load_on(&manager, &model_file.0);
    let patch_net = tiny_patch(&manager, &fixture);
    let io = |name: &str| io_tensor(&b, &fixture, name);
    let (x, context) = (io("fwd.x"), io("fwd.context"));
    let t = &fixture["fwd.t"].1;
    let audio = |name: &str| -> Tensor<Cpu> {
        let t = io(name);
        let shape = t.shape()[1..].to_vec();
        t.reshape(&shape).unwrap()
    };
    let (single, two) = (audio("fwd.embeds.single"), audio("fwd.embeds.two"));
    let masks = &fixture["fwd.masks"].1;
    let run = |talk: Option<TalkInput<'_, Cpu>>| {
        let input = DiffusionInput { talk, ..DiffusionInput::new(&x, t, &context) };
        b.to_f32(&net.forward(&*b, input).unwrap()).unwrap()
    };
    let patch = talk(&patch_net);
    let with = |audio, scale, masks| Some(TalkInput { patch, audio, scale, masks });
    assert_close("plain", &run(None), &fixture["fwd.out.plain"].1, 1e-4);
    assert_close("single", &run(with(&single, 1.0, None)), &fixture["fwd.out.single"].1, 1e-4);
    assert_close("scaled", &run(with(&single, -0.5, None)), &fixture["fwd.out.scaled"].1, 1e-4);
    assert_close("two", &run(with(&two, 1.0, Some(masks))), &fixture["fwd.out.two"].1, 1e-4);

    // Audio for another number of latent frames, and masks without a second speaker, are refused by name.
    let short = b.full(&[2, 32, 8], 0.0, DType::F32).unwrap();
    let refused = |talk| {
        let input = DiffusionInput { talk, ..DiffusionInput::new(&x, t, &context) };
        let Err(err) = net.forward(&*b, input) else { panic!("refused") };
        err.to_string()
    };
    let err = refused(with(&short, 1.0, None));
    assert!(err.contains("WanInfiniteTalkToVideo") && err.contains("3 latent frames"), "{err}");
    let err = refused(with(&single, 1.0, Some(masks)));
    assert!(err.contains("takes no speaker masks"), "{err}");

    // Wan 2.2 S2V is no model the patch runs on (its forward pass would never read the audio).
    let (_, s2v) = load_on(&manager, &crate::common::fixture("wan/s2v_weights.safetensors"));
    let x = b.full(&[1, 16, 3, 8, 8], 0.0, DType::F32).unwrap();
    let input =
        DiffusionInput { talk: with(&single, 1.0, None), ..DiffusionInput::new(&x, t, &context) };
    let Err(err) = s2v.forward(&*b, input) else { panic!("InfiniteTalk on S2V") };
    assert!(err.to_string().contains("S2V"), "{err}");
}

#[test]
fn the_released_layout_is_detected_with_its_widths() {
    let released: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fixture("wan/infinite_talk_released.json")).expect("the list"),
    )
    .expect("JSON");
    let all = weight_list(&released, "MultiTalkModelPatch");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("infinite-talk-released");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("wan2.1_infiniteTalk_multi_fp16.safetensors");
    write_header_only(&path, &all);
    let file = SafetensorsFile::open(&path).unwrap();
    let found = ModelPatchDetected::detect(&Header::new(&file, "")).unwrap();
    assert_eq!(found, Some(ModelPatchDetected::InfiniteTalk(ZImageTurboSet::real().infinite_talk)));

    // A block that does not match the others is refused naming it.
    let bad: Vec<(String, Vec<usize>)> = all
        .iter()
        .map(|(n, s)| match n.as_str() {
            "blocks.7.audio_cross_attn.kv_linear.weight" => (n.clone(), vec![10240, 512]),
            _ => (n.clone(), s.clone()),
        })
        .collect();
    write_header_only(&path, &bad);
    let file = SafetensorsFile::open(&path).unwrap();
    let err = ModelPatchDetected::detect(&Header::new(&file, "")).unwrap_err().to_string();
    assert!(err.contains("blocks.7.audio_cross_attn.kv_linear.weight"), "{err}");
}
