//! HunyuanVideo 1.0's text encoders against ComfyUI 0f1fa67a (`scripts/reference/hunyuan_video1_te.py`, fixtures in
//! `fixtures/hunyuan_video1_te/`; transformers' `LlamaModel` and `CLIPTextModel` agree with it there): the tokens
//! `HunyuanVideoTokenizer` makes of 17 prompts (Llama's ids in the template with their weights, CLIP-L's
//! sections), and both encoders as `DualCLIPLoader` type `hunyuan_video` runs them on nine prompts (the template
//! cut, a prompt starting with a newline, its own user header or template, a written `<|eot_id|>` and `<pad>`,
//! weights, two CLIP-L sections).

use kiln_compute::Backend;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::Header;
use kiln_models::clip_text::{self, ClipText};
use kiln_models::family::{HunyuanVideo1Encoders, TextEncoderDetected};
use kiln_models::qwen3::{self, Qwen3};

use crate::common::{assert_close, cpu, ids, json, read_tensors, tiled_table};

/// The reference's tiny LLaVA-Llama 3 (4 layers, so layer −3 is an inner one; heads 128 wide, the vocabulary, ε
/// and θ as released), as Kiln's Llama 3 detection reads it.
const TINY_LLAMA: qwen3::Config = qwen3::Config {
    vocab: 128_320,
    hidden: 64,
    layers: 4,
    heads: 2,
    kv_heads: 1,
    head_dim: 128,
    intermediate: 128,
    rms_eps: 1e-5,
    rope_theta: 500_000.0,
    variant: qwen3::Variant::Llama3,
};

/// `value`'s lists of weights.
fn weights(value: &serde_json::Value) -> Vec<Vec<f64>> {
    serde_json::from_value(value.clone()).expect("weights")
}

/// `got`'s sections as ids and weights, checked against ComfyUI's `want` (`{"ids": [[..]], "weights": [[..]]}`).
fn assert_sections(what: &str, got: &[Vec<(u32, f32)>], want: &serde_json::Value) {
    let got_ids: Vec<Vec<u32>> =
        got.iter().map(|s| s.iter().map(|&(id, _)| id).collect()).collect();
    let want_ids: Vec<Vec<u32>> =
        want["ids"].as_array().expect("sections").iter().map(ids).collect();
    assert_eq!(got_ids, want_ids, "{what}: ids");
    let want_weights = weights(&want["weights"]);
    for (got, want) in got.iter().flatten().zip(want_weights.iter().flatten()) {
        assert!((f64::from(got.1) - want).abs() < 1e-6, "{what}: weight {} for {want}", got.1);
    }
}

/// Both files loaded as `DualCLIPLoader` type `hunyuan_video` reads them: the Llama as Kiln detects it, CLIP-L as
/// detected but for its heads (Kiln takes them to be 64 wide, as released; the tiny one has two of 32).
fn encoders() -> (std::sync::Arc<Cpu>, HunyuanVideo1Encoders) {
    let (b, manager) = cpu(256 << 20);
    let llama =
        tiled_table("hunyuan_video1_te/llama.safetensors", "model.embed_tokens.weight", 128_320);
    let clip = tiled_table(
        "hunyuan_video1_te/clip_l.safetensors",
        "text_model.embeddings.token_embedding.weight",
        49_408,
    );
    let files = [
        SafetensorsFile::open(&llama.0).expect("llama"),
        SafetensorsFile::open(&clip.0).expect("clip"),
    ];
    let llama_header = Header::new(&files[0], "");
    let found = TextEncoderDetected::detect(&llama_header).expect("detect");
    let Some(TextEncoderDetected::Llama3(config)) = found else {
        panic!("the LLaVA-Llama 3 file detected as {found:?}")
    };
    assert_eq!(config, TINY_LLAMA);
    let llama_found = TextEncoderDetected::Llama3(config);
    let llama_weights =
        manager.load(&llama_found.load_plan(&llama_header), &mut |_, _| {}).expect("load llama");
    let clip_header = Header::new(&files[1], "");
    let Some(TextEncoderDetected::ClipL(clip_config)) =
        TextEncoderDetected::detect(&clip_header).expect("detect")
    else {
        panic!("not CLIP-L")
    };
    let clip_config = clip_text::Config { heads: 2, head_dim: 32, ..clip_config };
    let clip_found = TextEncoderDetected::ClipL(clip_config);
    let clip_weights =
        manager.load(&clip_found.load_plan(&clip_header), &mut |_, _| {}).expect("load clip");
    let encoders = HunyuanVideo1Encoders::new(
        Qwen3::new(config, llama_weights),
        ClipText::new(clip_config, clip_weights),
    )
    .expect("encoders");
    (b, encoders)
}

#[test]
fn tokens_match_comfyui() {
    let (_, encoders) = encoders();
    let cases = json("hunyuan_video1_te/tokenizer_cases.json");
    let cases = cases["cases"].as_object().expect("cases");
    assert_eq!(cases.len(), 17);
    for (name, case) in cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let got = encoders.tokenize(prompt).expect("tokenize");
        assert_sections(&format!("{name} llama"), std::slice::from_ref(&got.llama), &case["llama"]);
        assert_sections(&format!("{name} clip_l"), &got.clip_l, &case["l"]);
    }
}

#[test]
fn encoders_match_comfyui() {
    let (b, encoders) = encoders();
    assert_eq!(encoders.models().len(), 2);
    let cases = json("hunyuan_video1_te/te_cases.json");
    let io = read_tensors("hunyuan_video1_te/te_io.safetensors");
    let cases = cases["te_cases"].as_object().expect("te_cases");
    assert_eq!(cases.len(), 9);
    for (name, case) in cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let tokens = encoders.tokenize(prompt).expect("tokenize");
        let got_ids: Vec<u32> = tokens.llama.iter().map(|&(id, _)| id).collect();
        assert_eq!(got_ids, ids(&case["ids"]), "{name}: ids");
        let window = (
            case["cond_start"].as_u64().expect("start") as usize,
            case["cond_end"].as_u64().expect("end") as usize,
        );
        assert_eq!(tokens.conditioning_window(), window, "{name}: window");
        let mask: Option<Vec<bool>> = case["attention_mask"]
            .as_array()
            .map(|m| m.iter().map(|v| v.as_i64() == Some(1)).collect());
        assert_eq!(tokens.attention_mask(), mask, "{name}: attention mask");

        let encoded = encoders.encode(b.as_ref(), &tokens).expect("encode");
        let cond = &io[&format!("{name}.cond")];
        assert_eq!(encoded.cond.shape(), cond.0.as_slice(), "{name}: cond shape");
        assert_close(
            &format!("{name} cond"),
            &b.to_f32(&encoded.cond).expect("read"),
            &cond.1,
            1e-4,
        );
        let pooled = &io[&format!("{name}.pooled")];
        let got = encoded.pooled.as_ref().expect("a pooled vector");
        assert_eq!(got.shape(), pooled.0.as_slice(), "{name}: pooled shape");
        assert_close(&format!("{name} pooled"), &b.to_f32(got).expect("read"), &pooled.1, 1e-4);
        assert!(encoded.llama.is_none() && encoded.byt5.is_none(), "{name}");
    }
}

#[test]
fn the_whole_window_is_the_prompt_and_its_eot() {
    let (_, encoders) = encoders();
    let tokens = encoders.tokenize("a red fox").expect("tokenize");
    let (start, end) = tokens.conditioning_window();
    let ids: Vec<u32> = tokens.llama[start..end].iter().map(|&(id, _)| id).collect();
    let mut want = encoders.tokenizer.word_ids("a red fox").expect("ids");
    want.push(kiln_models::llama3::EOT);
    assert_eq!((start, ids), (95, want));
    let empty = encoders.tokenize("").expect("tokenize");
    assert_eq!(empty.conditioning_window(), (95, 96));
    assert_eq!(empty.llama.len(), 96);
}

#[test]
fn refuses_a_decoder_that_is_not_llama() {
    let (_, encoders) = encoders();
    let HunyuanVideo1Encoders { llama, clip_l, .. } = encoders;
    let config = qwen3::Config { variant: qwen3::Variant::Qwen25Vl, ..llama.config };
    let Err(err) = HunyuanVideo1Encoders::new(Qwen3::new(config, llama.weights), clip_l) else {
        panic!("a Qwen2.5-VL decoder taken for HunyuanVideo's Llama")
    };
    assert!(err.to_string().contains("Llama 3"), "{err}");
}
