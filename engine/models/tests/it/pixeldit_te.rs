//! PixelDiT's text encoder against ComfyUI 0f1fa67a (`scripts/reference/pixeldit_te.py`, fixtures in
//! `fixtures/pixeldit_te/`): Lumina 2's tiny Gemma 2 file (`fixtures/lumina2/te.safetensors`) under `CLIPLoader`
//! type `pixeldit`: the ids (PixelDiT's instruction before the prompt, weights disabled, padded to the
//! instruction's length + 298; an empty or blank prompt `<bos>` and 299 pads) and the conditioning (the last
//! layer through the final norm under the padding mask, `<bos>`'s row and the last 299) within 1e-4.

use kiln_compute::Backend as _;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::Header;
use kiln_models::family::{PromptTokens, TextEncoderDetected, TextEncoderFamily};
use kiln_models::gemma2::Gemma2File;

use crate::common::{assert_close, cpu, fixture, ids, json, read_tensors, relative_error};

#[test]
fn pixeldit_conditioning_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture("lumina2/te.safetensors")).expect("open");
    let header = Header::new(&file, "");
    let found = TextEncoderDetected::Gemma2(Gemma2File::of(&header, crate::lumina2::TINY_GEMMA));
    let found = found.for_clip_type("pixeldit").expect("pixeldit");
    assert_eq!(found.family(), TextEncoderFamily::PixelDit);
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).expect("load");
    let net = found.build(weights).expect("build");
    assert_eq!(net.family(), TextEncoderFamily::PixelDit);

    let cases = json("pixeldit_te/cases.json");
    let io = read_tensors("pixeldit_te/io.safetensors");
    let cases = cases["cases"].as_object().expect("cases");
    assert_eq!(cases.len(), 6);
    let mut worst = 0f32;
    for (name, case) in cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let PromptTokens::Ids(got) = net.tokenize(prompt).expect("tokenize") else {
            panic!("ids for {prompt:?}")
        };
        assert_eq!(got, ids(&case["ids"]), "{name} ids");
        let encoded = net.encode(b.as_ref(), &PromptTokens::Ids(got)).expect("encode");
        let (shape, want) = &io[&format!("cond.{name}")];
        assert_eq!(encoded.cond.shape(), shape.as_slice(), "{name}");
        let cond = b.to_f32(&encoded.cond).expect("read");
        worst = worst.max(relative_error(&cond, want));
        assert_close(&format!("{name} cond"), &cond, want, 1e-4);
    }
    eprintln!("pixeldit conditioning: max relative error {worst:e}");
}
