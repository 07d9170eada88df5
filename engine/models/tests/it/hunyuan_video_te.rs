//! HunyuanVideo 1.5's text encoders against ComfyUI 0f1fa67a (`scripts/reference/hunyuan_video15_te.py`, fixtures
//! in `fixtures/hunyuan_video15_te/`; transformers' `Qwen2Model` and `T5EncoderModel` agree with it there): the
//! tokens `HunyuanVideo15Tokenizer` makes of 17 prompts (Qwen2.5-VL's ids in the template, ByT5's of the quoted
//! passages with their weights), ByT5 alone on four token lists, and both encoders as `DualCLIPLoader` type
//! `hunyuan_video_15` combines them, on nine prompts (the template cut, the refiner's fixed cut, a written
//! `<|endoftext|>`, quoted passages with weights).

use kiln_compute::Backend;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::Header;
use kiln_models::family::{
    HUNYUAN_VIDEO15_CLIP_TYPE, PromptTokens, Qwen25Role, TextEncoderDetected, TextEncoderFamily,
    TextEncoderNet,
};
use kiln_models::{qwen3, t5};

use crate::common::{assert_close, cpu, fixture, ids, json, read_tensors, tiled_table};

/// The reference's tiny Qwen2.5-VL language model (4 layers, so layer −3 is an inner one; eps and θ as
/// released).
const TINY_QWEN: qwen3::Config = qwen3::Config {
    vocab: 152_064,
    hidden: 64,
    layers: 4,
    heads: 2,
    kv_heads: 1,
    head_dim: 32,
    intermediate: 128,
    rms_eps: 1e-6,
    rope_theta: 1e6,
    variant: qwen3::Variant::Qwen25Vl,
};

/// `value`'s weights (one list per batch) as one flat list.
fn weights(value: &serde_json::Value) -> Vec<f32> {
    let lists: Vec<Vec<f64>> = serde_json::from_value(value.clone()).expect("weights");
    lists.into_iter().flatten().map(|w| w as f32).collect()
}

#[test]
fn tokens_match_comfyui() {
    let tokenizer = qwen3::Tokenizer::bundled().expect("tokenizer");
    let cases = json("hunyuan_video15_te/tokenizer_cases.json");
    let cases = cases["cases"].as_object().expect("cases");
    assert!(cases.len() >= 17);
    for (name, case) in cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let want = &case["qwen25_7b"]["ids"][0];
        // `embedding:` splits ComfyUI's tokenisation at the word (a caveat of every Qwen template in Kiln).
        if case["qwen_equals_whole_text"].as_bool() == Some(true) {
            let got = tokenizer.hunyuan_video15_prompt(prompt).expect("qwen ids");
            assert_eq!(got, ids(want), "{name}: Qwen ids");
        }
        assert!(weights(&case["qwen25_7b"]["weights"]).iter().all(|&w| w == 1.0), "{name}");
        let got = t5::byt5_tokens(prompt).expect("byt5 tokens");
        match case.get("byt5") {
            None => assert_eq!(got, None, "{name}: no quoted passage"),
            Some(want) => {
                assert_eq!(
                    t5::quoted_text(prompt).as_deref(),
                    case["byt5_text"].as_str(),
                    "{name}: ByT5 text"
                );
                let got = got.expect("ByT5 tokens");
                assert_eq!(got.len(), 1, "{name}: one section");
                let got_ids: Vec<u32> = got[0].iter().map(|&(id, _)| id).collect();
                let got_weights: Vec<f32> = got[0].iter().map(|&(_, w)| w).collect();
                assert_eq!(got_ids, ids(&want["ids"][0]), "{name}: ByT5 ids");
                for (g, w) in got_weights.iter().zip(weights(&want["weights"])) {
                    assert!((g - w).abs() < 1e-6, "{name}: ByT5 weight {g} for {w}");
                }
            }
        }
    }
}

/// Both files loaded as `DualCLIPLoader` type `hunyuan_video_15` combines them: the tiny Qwen by hand (Kiln's
/// detection takes Qwen2.5-VL's heads to be 128 wide, as released), ByT5 as detected.
fn encoders() -> (std::sync::Arc<kiln_compute::backend::cpu::Cpu>, TextEncoderNet) {
    let (b, manager) = cpu(256 << 20);
    let qwen =
        tiled_table("hunyuan_video15_te/qwen.safetensors", "model.embed_tokens.weight", 152_064);
    let files = [
        SafetensorsFile::open(&qwen.0).expect("qwen"),
        SafetensorsFile::open(fixture("hunyuan_video15_te/byt5.safetensors")).expect("byt5"),
    ];
    let byt5_header = Header::new(&files[1], "");
    let byt5 = TextEncoderDetected::detect(&byt5_header).expect("detect").expect("a T5 encoder");
    let TextEncoderDetected::T5(config) = &byt5 else { panic!("ByT5 detected as {byt5:?}") };
    assert_eq!((config.vocab, config.d_model, config.blocks, config.heads), (1510, 32, 2, 4));
    let tiny_qwen = TextEncoderDetected::Qwen25Vl(TINY_QWEN, None, Qwen25Role::QwenImage);
    let mut parts = Vec::new();
    for (found, header) in [(tiny_qwen, Header::new(&files[0], "")), (byt5, byt5_header)] {
        let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).expect("load");
        parts.push((found, weights));
    }
    let net = TextEncoderNet::combine(parts, HUNYUAN_VIDEO15_CLIP_TYPE).expect("combine");
    assert_eq!(net.family(), TextEncoderFamily::HunyuanVideo15);
    (b, net)
}

#[test]
fn encoders_match_comfyui() {
    let (b, net) = encoders();
    let cases = json("hunyuan_video15_te/te_cases.json");
    let io = read_tensors("hunyuan_video15_te/te_io.safetensors");
    let cases = cases["te_cases"].as_object().expect("te_cases");
    assert_eq!(cases.len(), 9);
    for (name, case) in cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let tokens = net.tokenize(prompt).expect("tokenize");
        let PromptTokens::HunyuanVideo15(got) = &tokens else { panic!("HunyuanVideo 1.5 tokens") };
        assert_eq!(got.qwen, ids(&case["ids"]), "{name}: ids");
        let encoded = net.encode(b.as_ref(), &tokens).expect("encode");
        let cond = &io[&format!("{name}.cond")];
        assert_eq!(encoded.cond.shape(), cond.0.as_slice(), "{name}: cond shape");
        assert_close(
            &format!("{name} cond"),
            &b.to_f32(&encoded.cond).expect("read"),
            &cond.1,
            1e-4,
        );
        assert!(encoded.pooled.is_none(), "{name}: no pooled vector");
        match io.get(&format!("{name}.conditioning_byt5small")) {
            None => assert!(encoded.byt5.is_none(), "{name}: no ByT5 states"),
            Some(want) => {
                let got = encoded.byt5.as_ref().expect("ByT5 states");
                assert_eq!(got.shape(), want.0.as_slice(), "{name}: ByT5 shape");
                assert_close(&format!("{name} byt5"), &b.to_f32(got).expect("read"), &want.1, 1e-4);
            }
        }
    }
}

#[test]
fn byt5_matches_comfyui() {
    let (b, net) = encoders();
    let TextEncoderNet::HunyuanVideo15(encoders) = &net else {
        panic!("HunyuanVideo 1.5's encoders")
    };
    let cases = json("hunyuan_video15_te/te_cases.json");
    let io = read_tensors("hunyuan_video15_te/byt5_io.safetensors");
    for (name, case) in cases["byt5_cases"].as_object().expect("byt5_cases") {
        let token_ids = ids(&case["ids"]);
        let token_weights = weights(&serde_json::json!([case["weights"]]));
        let section: Vec<(u32, f32)> = token_ids.into_iter().zip(token_weights).collect();
        let tokens = kiln_models::family::HunyuanVideo15Tokens {
            // `<|im_start|>user\n` and a space: the cut keeps the space.
            qwen: vec![151_644, 872, 198, 220],
            byt5: Some(vec![section]),
        };
        let encoded = encoders.encode(b.as_ref(), &tokens).expect("encode");
        let got = encoded.byt5.expect("ByT5 states");
        let want = &io[&format!("{name}.out")];
        assert_eq!(got.shape(), want.0.as_slice(), "{name}");
        assert_close(&format!("{name} byt5"), &b.to_f32(&got).expect("read"), &want.1, 1e-4);
    }
}

#[test]
fn refuses_what_is_not_its_pair() {
    let tiny_qwen = TextEncoderDetected::Qwen25Vl(TINY_QWEN, None, Qwen25Role::QwenImage);
    let err =
        TextEncoderNet::check_combination(&[&tiny_qwen, &tiny_qwen], HUNYUAN_VIDEO15_CLIP_TYPE)
            .expect_err("two Qwens");
    assert!(err.to_string().contains("a Qwen2.5-VL 7B and a ByT5"), "{err}");
}
