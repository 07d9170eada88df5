//! Boogu-Image's text encoder against ComfyUI 0f1fa67a (`scripts/reference/boogu.py`, fixtures in
//! `fixtures/boogu/`; transformers' `Qwen3VLTextModel` agrees with it there): Qwen3-VL's language model under
//! `CLIPLoader` type `boogu` (RoPE θ 5·10⁶, the last layer through the final norm) over Boogu's templates (the
//! "drop" one for an empty prompt), weights disabled, on four prompts and two tokenizer-only ones. The DiT's tests
//! are in `omnigen2.rs`.

use std::collections::BTreeMap;

use kiln_compute::Backend;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::Header;
use kiln_models::family::{
    BOOGU_CLIP_TYPE, PromptTokens, Qwen3VlRole, TextEncoderDetected, TextEncoderFamily,
};

use crate::common::{TempTensors, assert_close, cpu, ids, json, read_tensors};

/// The reference's encoder in the text layout Kiln reads (`model.layers.*`: the fixture keeps transformers'
/// `model.language_model.*` names, as Comfy-Org's file may), its 1000-row token table tiled to the vocabulary.
fn text_layout_file() -> TempTensors {
    let tensors = read_tensors("boogu/te.safetensors");
    let mut renamed: BTreeMap<String, (Vec<usize>, Vec<f32>)> = tensors
        .into_iter()
        .map(|(name, t)| (name.replacen("model.language_model.", "model.", 1), t))
        .collect();
    let (shape, values) = renamed.remove("model.embed_tokens.weight").expect("the token table");
    let (rows, width) = (shape[0], shape[1]);
    let vocab = 151_936;
    let tiled: Vec<f32> =
        (0..vocab).flat_map(|id| values[(id % rows) * width..][..width].to_vec()).collect();
    renamed.insert("model.embed_tokens.weight".to_owned(), (vec![vocab, width], tiled));
    TempTensors::new("boogu-te", renamed)
}

#[test]
fn text_encoder_matches_comfyui() {
    let (b, manager) = cpu(256 << 20);
    let te = text_layout_file();
    let file = SafetensorsFile::open(&te.0).expect("open");
    let header = Header::new(&file, "");
    let found = TextEncoderDetected::detect(&header).expect("detect").expect("a Qwen3");
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).expect("load");
    let found = found.for_clip_type(BOOGU_CLIP_TYPE).expect("boogu");
    let TextEncoderDetected::Qwen3Vl(config, None, Some(Qwen3VlRole::Boogu)) = &found else {
        panic!("{found:?}")
    };
    assert_eq!((config.rope_theta, config.head_dim), (5e6, 8));
    let net = found.build(weights).expect("build");
    assert_eq!(net.family(), TextEncoderFamily::Boogu);

    let cases = json("boogu/te_cases.json");
    let io = read_tensors("boogu/te_io.safetensors");
    for case in ["caption", "empty", "weighted", "newlines"] {
        let want = &cases["cases"][case];
        let prompt = want["prompt"].as_str().expect("prompt");
        let tokens = net.tokenize(prompt).expect("tokenize");
        let PromptTokens::Ids(got) = &tokens else { panic!("ids") };
        assert_eq!(*got, ids(&want["ids"]), "{case}");
        let encoded = net.encode(b.as_ref(), &tokens).expect("encode");
        let cond = &io[&format!("{case}.cond")];
        assert_eq!(encoded.cond.shape(), cond.0.as_slice(), "{case}");
        let values = b.to_f32(&encoded.cond).expect("read");
        assert_close(&format!("Boogu text {case}"), &values, &cond.1, 1e-4);
    }
    for case in ["escaped", "whitespace"] {
        let want = &cases["tokenizer_only"][case];
        let tokens = net.tokenize(want["prompt"].as_str().expect("prompt")).expect("tokenize");
        let PromptTokens::Ids(got) = &tokens else { panic!("ids") };
        assert_eq!(*got, ids(&want["ids"]), "{case}");
    }
}
