//! Krea 2's and Mage-Flow's text encoder against ComfyUI 0f1fa67a (`scripts/reference/qwen3vl_te.py`, fixtures in
//! `fixtures/qwen3vl_te/`; transformers' `Qwen3VLModel` agrees with it there): a Qwen3-VL 4B file in transformers'
//! layout (the language model under `model.language_model.`, a vision tower under `model.visual.` whose merger has
//! the released 2560 rows, so ComfyUI's own detection says 4B) under `CLIPLoader` type `krea2` (hidden states 2, 5,
//! …, 35 side by side per token, none through the final norm) and type `mage` (the last layer through the final
//! norm), both over Qwen-Image's template with weights disabled and the system turn and user header cut off: the
//! ids of 14 prompts and the conditioning of 10 (an already templated prompt, one with a bare `<|im_start|>`, one
//! writing `<|endoftext|>`, which ComfyUI's attention mask hides from the tokens after it).

use std::sync::Arc;

use kiln_compute::Backend;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::Header;
use kiln_models::family::{
    KREA2_CLIP_TYPE, MAGE_CLIP_TYPE, PromptTokens, TextEncoderDetected, TextEncoderFamily,
    TextEncoderNet,
};
use kiln_models::qwen3;

use crate::common::{assert_close, cpu, ids, json, read_tensors, tiled_table};

/// The reference's tiny Qwen3-VL 4B language model (36 layers, so Krea 2's last tap, 35, is an inner state; 4 heads
/// of 16 over 2 kv heads, a query width of 64 against a hidden width of 32 as 4096 against 2560 released), as
/// `CLIPLoader`'s types `krea2` and `mage` make it: RoPE θ Qwen3-VL's.
const TINY: qwen3::Config = qwen3::Config {
    vocab: 151_936,
    hidden: 32,
    layers: 36,
    heads: 4,
    kv_heads: 2,
    head_dim: 16,
    intermediate: 64,
    rms_eps: 1e-6,
    rope_theta: 5e6,
    variant: qwen3::Variant::Qwen3Vl,
};

/// The fixture file, its 1000-row token table tiled to the vocabulary, as `CLIPLoader` type `kind` loads it.
fn encoder(kind: &str) -> (Arc<Cpu>, TextEncoderNet) {
    let (b, manager) = cpu(256 << 20);
    let file = tiled_table(
        "qwen3vl_te/qwen3vl_4b.safetensors",
        "model.language_model.embed_tokens.weight",
        151_936,
    );
    let file = SafetensorsFile::open(&file.0).expect("open");
    let header = Header::new(&file, "");
    let found = TextEncoderDetected::detect(&header).expect("detect");
    // A Qwen3-VL file (its DeepStack mergers tell it): the language model and the vision tower, whose encoder it
    // is left to CLIPLoader's type.
    let Some(found @ TextEncoderDetected::Qwen3Vl(_, Some(_), None)) = found else {
        panic!("the Qwen3-VL 4B file detected as {found:?}")
    };
    let found = found.for_clip_type(kind).expect(kind);
    let TextEncoderDetected::Qwen3Vl(config, Some(_), Some(_)) = &found else {
        panic!("{kind}: {found:?}")
    };
    assert_eq!(*config, TINY, "{kind}");
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).expect("load");
    let net = found.build_for_clip_type(weights, kind).expect("build");
    let family = if kind == KREA2_CLIP_TYPE {
        TextEncoderFamily::Krea2
    } else {
        TextEncoderFamily::MageFlow
    };
    assert_eq!(net.family(), family);
    (b, net)
}

/// The ids `net` makes of `prompt`.
fn tokens(net: &TextEncoderNet, prompt: &str) -> Vec<u32> {
    let PromptTokens::Ids(ids) = net.tokenize(prompt).expect("tokenize") else {
        panic!("ids for {prompt:?}")
    };
    ids
}

#[test]
fn tokens_match_comfyui() {
    let cases = json("qwen3vl_te/te_cases.json");
    let prompts = cases["tokenizer_cases"].as_object().expect("tokenizer cases");
    assert_eq!(prompts.len(), 14);
    for kind in [KREA2_CLIP_TYPE, MAGE_CLIP_TYPE] {
        let (_, net) = encoder(kind);
        for (name, case) in prompts {
            let prompt = case["prompt"].as_str().expect("prompt");
            assert_eq!(tokens(&net, prompt), ids(&case["ids"]), "{kind} {name}");
        }
        // Kiln keeps `embedding:` as text where ComfyUI looks the name up in its embeddings folder and drops it
        // (the template's tail then loses its newlines): `qwen3::Tokenizer::zimage_prompt` says so.
        let divergent = &cases["divergent"]["embedding"];
        let got = tokens(&net, divergent["prompt"].as_str().expect("prompt"));
        assert_eq!(got, ids(&divergent["ids_as_literal_text"]), "{kind} embedding");
        assert_ne!(got, ids(&divergent["ids"]), "{kind} embedding");
    }
}

/// Every encoder case of `kind` against ComfyUI's cond; the largest relative error.
fn check_conditioning(kind: &str, width: usize) -> f32 {
    let (b, net) = encoder(kind);
    let cases = json("qwen3vl_te/te_cases.json");
    let io = read_tensors("qwen3vl_te/te_io.safetensors");
    let cases = cases["encoder_cases"][kind].as_object().expect("encoder cases");
    assert_eq!(cases.len(), 10);
    let mut worst = 0f32;
    for (name, case) in cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let got = tokens(&net, prompt);
        let want = ids(&case["ids"]);
        assert_eq!(got, want, "{kind} {name}");
        let start = case["cond_start"].as_u64().expect("start") as usize;
        let encoded = net.encode(b.as_ref(), &PromptTokens::Ids(got)).expect("encode");
        let (shape, values) = &io[&format!("{kind}.{name}.cond")];
        assert_eq!(shape, &[1, want.len() - start, width], "{kind} {name}");
        assert_eq!(encoded.cond.shape(), shape.as_slice(), "{kind} {name}");
        assert!(encoded.pooled.is_none(), "{kind} {name}");
        let cond = b.to_f32(&encoded.cond).expect("read");
        let scale = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        let error = cond.iter().zip(values).fold(0f32, |m, (g, w)| m.max((g - w).abs())) / scale;
        worst = worst.max(error);
        assert_close(&format!("{kind} {name}"), &cond, values, 1e-4);
    }
    worst
}

#[test]
fn krea2_conditioning_matches_comfyui() {
    // Twelve taps of 32 features side by side per token.
    let worst = check_conditioning(KREA2_CLIP_TYPE, 12 * 32);
    eprintln!("krea2: max relative error {worst:e}");
}

#[test]
fn mage_conditioning_matches_comfyui() {
    let worst = check_conditioning(MAGE_CLIP_TYPE, 32);
    eprintln!("mage: max relative error {worst:e}");
}

/// ComfyUI gives the Qwen3-VL roles by size (`load_text_encoder_state_dicts`): Boogu and JoyImage to 8B, Krea 2
/// and Mage-Flow to 4B, the other released size the generic encoder; Qwen3-VL 32B is MiniMax H3's, which Kiln
/// refuses; a Qwen3 without the tower of a released width is Z-Image's (4B) or FLUX.2 Klein's (8B) whatever the
/// type. A width of neither released size (the tiny files) takes the role its type names.
#[test]
fn clip_types_give_qwen3vl_roles_by_size_as_comfyui_does() {
    let vl = |hidden| qwen3::Config { hidden, variant: qwen3::Variant::Qwen3Vl, ..TINY };
    let family =
        |found: TextEncoderDetected, kind: &str| found.for_clip_type(kind).map(|f| f.family());
    let roles = [
        ("boogu", TextEncoderFamily::Boogu),
        ("joyimage", TextEncoderFamily::JoyImage),
        (KREA2_CLIP_TYPE, TextEncoderFamily::Krea2),
        (MAGE_CLIP_TYPE, TextEncoderFamily::MageFlow),
    ];
    for (kind, role) in roles {
        let eight = matches!(kind, "boogu" | "joyimage");
        let on_8b = family(TextEncoderDetected::Qwen3Vl(vl(4096), None, None), kind).expect(kind);
        let on_4b = family(TextEncoderDetected::Qwen3Vl(vl(2560), None, None), kind).expect(kind);
        let (right, wrong) = if eight { (on_8b, on_4b) } else { (on_4b, on_8b) };
        assert_eq!(right, role, "{kind} on its size");
        assert_eq!(wrong, TextEncoderFamily::Qwen3Vl, "{kind} on the other size");
        let tiny = family(TextEncoderDetected::Qwen3Vl(vl(TINY.hidden), None, None), kind);
        assert_eq!(tiny.expect(kind), role, "{kind} on a tiny file");

        let text_only = |hidden| qwen3::Config { hidden, variant: qwen3::Variant::Qwen3, ..TINY };
        let z_image = family(TextEncoderDetected::Qwen3(text_only(2560)), kind).expect(kind);
        assert_eq!(z_image, TextEncoderFamily::Qwen3, "{kind} on a Qwen3-4B");
        let klein = family(TextEncoderDetected::Qwen3(text_only(4096)), kind).expect(kind);
        assert_eq!(klein, TextEncoderFamily::Flux2Klein, "{kind} on a Qwen3-8B");
        let tiny = family(TextEncoderDetected::Qwen3(text_only(TINY.hidden)), kind).expect(kind);
        assert_eq!(tiny, role, "{kind} on a tiny Qwen3");

        let err = family(TextEncoderDetected::Qwen3Vl(vl(5120), None, None), kind).unwrap_err();
        assert!(err.to_string().contains("Qwen3-VL 32B"), "{err}");
    }
    let generic = family(TextEncoderDetected::Qwen3Vl(vl(2560), None, None), "stable_diffusion");
    assert_eq!(generic.expect("generic"), TextEncoderFamily::Qwen3Vl);

    // Ovis 2.5's Qwen3 2B by its width, whatever the type; type `ovis` never makes a released 4B or 8B Ovis's.
    let text_only = |hidden| qwen3::Config { hidden, variant: qwen3::Variant::Qwen3, ..TINY };
    for (hidden, kind, want) in [
        (2048, "stable_diffusion", TextEncoderFamily::Ovis),
        (2048, "ovis", TextEncoderFamily::Ovis),
        (2560, "ovis", TextEncoderFamily::Qwen3),
        (4096, "ovis", TextEncoderFamily::Flux2Klein),
        (TINY.hidden, "ovis", TextEncoderFamily::Ovis),
    ] {
        let got = family(TextEncoderDetected::Qwen3(text_only(hidden)), kind).expect(kind);
        assert_eq!(got, want, "{hidden} wide, type {kind}");
    }
}
