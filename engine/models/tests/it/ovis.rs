//! Ovis-Image against ComfyUI 0f1fa67a (`scripts/reference/ovis.py`, fixtures in `fixtures/ovis/`; diffusers'
//! `OvisImageTransformer2DModel` and transformers' `Qwen3Model` agree with it there): the DiT (ComfyUI's FLUX.1
//! with `yak_mlp` and `txt_norm`) on an even, a batched non-square and an odd-sided latent, and the text encoder
//! (Ovis 2.5, a Qwen3, with ComfyUI's template, padding mask, zeroed pads and template strip).

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend, DType};
use kiln_models::Header;
use kiln_models::family::{
    DiffusionDetected, DiffusionFamily, OVIS_CLIP_TYPE, PromptTokens, TextEncoderDetected,
    TextEncoderFamily,
};
use kiln_models::flux::{Flux, FluxInput};

use crate::common::{assert_close, cpu, fixture, ids, json, read_tensors, tiled_table};

#[test]
fn dit_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture("ovis/dit.safetensors")).expect("open");
    let header = Header::new(&file, "");
    let detected = DiffusionDetected::detect(&header).expect("detect").expect("a DiT");
    assert_eq!(detected.family(), DiffusionFamily::OvisImage);
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).expect("load");
    let DiffusionDetected::Flux(config, layout) = detected else { panic!("not a FLUX DiT") };
    assert!(config.ovis && !config.guidance && config.vec_dim.is_none());
    let model = Flux::new(config, layout, weights);
    let io = read_tensors("ovis/dit_io.safetensors");
    for case in ["a", "b", "c"] {
        let t = |name: &str| &io[&format!("{case}.{name}")];
        let x = b.from_f32(&t("x").0, &t("x").1, DType::F32).expect("x");
        let context = b.from_f32(&t("context").0, &t("context").1, DType::F32).expect("context");
        let input = FluxInput {
            x: &x,
            timesteps: &t("t").1,
            context: &context,
            pooled: None,
            guidance: None,
            references: &[],
            method: None,
            kv_cache: None,
            text_prefix: None,
        };
        let out = model.forward(b.as_ref(), &input).expect("forward");
        assert_eq!(out.shape(), t("out").0.as_slice(), "{case}");
        assert_close(
            &format!("Ovis-Image {case}"),
            &b.to_f32(&out).expect("read"),
            &t("out").1,
            1e-4,
        );
    }
}

#[test]
fn text_encoder_matches_comfyui() {
    // The tiny encoder reads row `id % 1000` of its table for the real ids: written out to the real vocabulary.
    let file = tiled_table("ovis/te.safetensors", "model.embed_tokens.weight", 151_936);

    let (b, manager) = cpu(256 << 20);
    let safetensors = SafetensorsFile::open(&file.0).expect("open");
    let header = Header::new(&safetensors, "");
    let found = TextEncoderDetected::detect(&header).expect("detect").expect("a Qwen3");
    let found = found.for_clip_type(OVIS_CLIP_TYPE).expect("type ovis");
    assert_eq!(found.family(), TextEncoderFamily::Ovis);
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).expect("load");
    let net = found.build_for_clip_type(weights, OVIS_CLIP_TYPE).expect("build");

    let cases = json("ovis/te_cases.json");
    let io = read_tensors("ovis/te_io.safetensors");
    // Case `b` starts with pads, which ComfyUI masks without ending the text; no template makes one.
    for case in ["a", "cat", "empty"] {
        let ids = ids(&cases["cases"][case]["ids"]);
        let encoded = net.encode(b.as_ref(), &PromptTokens::Ids(ids)).expect("encode");
        let want = &io[&format!("{case}.out")];
        assert_eq!(encoded.cond.shape(), want.0.as_slice(), "{case}");
        assert_close(
            &format!("Ovis {case}"),
            &b.to_f32(&encoded.cond).expect("read"),
            &want.1,
            1e-4,
        );
        assert!(encoded.pooled.is_none());
    }
    // The bundled tokenizer lays prompts out as ComfyUI's OvisTokenizer does.
    for (prompt, case) in [("a photo of a cat", "cat"), ("", "empty")] {
        let PromptTokens::Ids(got) = net.tokenize(prompt).expect("tokenize") else { panic!("ids") };
        assert_eq!(got, ids(&cases["cases"][case]["ids"]), "{prompt:?}");
    }
}
