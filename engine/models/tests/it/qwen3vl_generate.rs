//! Text generation with images on ComfyUI's generic Qwen3-VL encoder (CLIPLoader type `ideogram4` with a file
//! that is not Qwen3-VL 8B) against ComfyUI 0f1fa67a's `TextGenerate`, greedy, 12 tokens
//! (`scripts/reference/qwen3vl_generate.py`, fixtures in `fixtures/qwen3vl_generate/`), on the tiny Qwen3-VL file
//! of `fixtures/qwen3vl_te_images/` (its 1000-row token table tiled, so the logits repeat every 1000 ids). Kiln is
//! fed the node's IMAGE inputs and resizes them itself, so what is checked is: each placed image's patch grid and
//! patches against those of the copy ComfyUI's tokenizer resized; the prompt ids Kiln frames (template, image
//! slots, the empty `<think>` block, the template off); the generated ids and their decoded text; each step's
//! logits (the first 1000) within 1e-4; and the tokenizer-only prompts. The same file under type `joyimage`
//! generates as JoyImage's encoder does in ComfyUI (the images inline, no DeepStack).

use std::sync::Arc;

use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::Header;
use kiln_models::family::{TextEncoderDetected, TextEncoderFamily, TextEncoderNet};
use kiln_models::qwen_vl::VisionInput;
use kiln_models::qwen3::{self, ImageTokens};
use kiln_models::textgen::{ChatOptions, Decoding};

use crate::common::{
    Io, assert_close, assert_within, cpu, ids, json, read_tensors, relative_error, tiled_table,
};

/// The token table's stored rows: the logits repeat with this period.
const ROWS: usize = 1000;

/// The fixture file, its 1000-row token table tiled to the vocabulary, as `CLIPLoader` type `kind` loads it:
/// `ideogram4` the generic Qwen3-VL encoder, `joyimage` JoyImage's.
fn encoder(kind: &str) -> (Arc<Cpu>, TextEncoderNet) {
    let (b, manager) = cpu(512 << 20);
    let file = tiled_table(
        "qwen3vl_te_images/qwen3vl.safetensors",
        "model.language_model.embed_tokens.weight",
        151_936,
    );
    let file = SafetensorsFile::open(&file.0).expect("open");
    let header = Header::new(&file, "");
    let found = TextEncoderDetected::detect(&header).expect("detect").expect("a text encoder");
    let found = found.for_clip_type(kind).expect(kind);
    assert!(matches!(found, TextEncoderDetected::Qwen3Vl(_, Some(_), Some(_))), "{found:?}");
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).expect("load");
    let net = found.build_for_clip_type(weights, kind).expect("build");
    let family =
        if kind == "joyimage" { TextEncoderFamily::JoyImage } else { TextEncoderFamily::Qwen3Vl };
    assert_eq!(net.family(), family);
    (b, net)
}

/// The placed images' tokens for the language model: each through the vision tower.
fn image_tokens(
    b: &Cpu,
    net: &TextEncoderNet,
    images: &[VisionInput],
    placed: usize,
) -> Vec<ImageTokens<Cpu>> {
    let TextEncoderNet::Qwen3Vl { model, vision: Some(vision), .. } = net else {
        panic!("not a Qwen3-VL with a tower")
    };
    images
        .iter()
        .take(placed)
        .map(|input| {
            let out = kiln_models::qwen3vl_vision::embed_image(b, &model.weights, vision, input)
                .expect("embed image");
            ImageTokens {
                embeds: out.merged,
                deepstack: out.deepstack,
                rows: input.grid_h / 2,
                cols: input.grid_w / 2,
            }
        })
        .collect()
}

/// Generates `prompt_ids` with `tokens` laid out as `layout`, greedily, recording each step's logits: checks the
/// ids against `generated` and the logits (the first 1000) against `io`'s `<name>.logits` within 1e-4; returns
/// the largest relative error.
#[allow(clippy::too_many_arguments)]
fn check_logits(
    b: &Cpu,
    net: &TextEncoderNet,
    name: &str,
    prompt_ids: &[u32],
    tokens: &[ImageTokens<Cpu>],
    layout: qwen3::ImageLayout,
    generated: &[u32],
    io: &Io,
) -> f32 {
    let TextEncoderNet::Qwen3Vl { model, .. } = net else { panic!("not a Qwen3-VL") };
    let mut steps: Vec<Vec<f32>> = Vec::new();
    let mut pick = |logits: Vec<f32>| {
        let id = argmax(&logits);
        steps.push(logits);
        id
    };
    let max_new = generated.len();
    let again = model
        .generate_with_images(
            b,
            prompt_ids,
            tokens,
            layout,
            max_new,
            &qwen3::STOP_TOKENS,
            &mut pick,
            &mut |_| Ok(()),
        )
        .expect("generate with images");
    assert_eq!(again, generated, "{name}: the model's own loop");
    let (shape, logits) = &io[&format!("{name}.logits")];
    assert_eq!(shape[..], [max_new, ROWS], "{name}");
    assert_eq!(steps.len(), max_new, "{name}");
    let mut worst = 0f32;
    for (s, (got, want)) in steps.iter().zip(logits.chunks_exact(ROWS)).enumerate() {
        assert_eq!(got.len(), 151_936, "{name} step {s}");
        let got = &got[..ROWS];
        worst = worst.max(relative_error(got, want));
        assert_close(&format!("{name} step {s} logits"), got, want, 1e-4);
    }
    worst
}

/// The node's IMAGE input `name` (`[b, H, W, 3]`) as the images ComfyUI's tokenizer splits it into, each through
/// Kiln's vision input (the generic encoder's: ComfyUI's defaults, bilinear).
fn node_images(net: &TextEncoderNet, io: &Io, name: Option<&str>) -> Vec<VisionInput> {
    let Some(name) = name else { return Vec::new() };
    let (shape, values) = &io[&format!("input.{name}")];
    let [n, h, w, c] = shape[..] else { panic!("input.{name} is {shape:?}") };
    values
        .chunks_exact(h * w * c)
        .take(n)
        .map(|image| net.vision_input(image, h, w, c).expect("vision input"))
        .collect()
}

/// The case's widgets as `TextGenerate` takes them.
fn chat(case: &serde_json::Value) -> ChatOptions {
    let widgets = &case["widgets"];
    ChatOptions {
        thinking: widgets["thinking"].as_bool().expect("thinking"),
        default_template: widgets["use_default_template"].as_bool().expect("use_default_template"),
    }
}

/// The first index of the largest value (`torch.argmax`).
fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Every recorded `TextGenerate` run: the placed images' grids and patches, the prompt ids, the generated ids
/// and text, and each step's logits, against ComfyUI's.
#[test]
fn text_generate_with_images_matches_comfyui() {
    let (b, net) = encoder("ideogram4");
    let TextEncoderNet::Qwen3Vl { tokenizer, .. } = &net else { panic!("not a Qwen3-VL") };
    let cases = json("qwen3vl_generate/cases.json");
    let io = read_tensors("qwen3vl_generate/io.safetensors");
    let mut worst = 0f32;
    let cases = cases["cases"].as_object().expect("cases");
    assert_eq!(cases.len(), 8);
    for (name, case) in cases {
        let prompt = case["widgets"]["prompt"].as_str().expect("prompt");
        let max_new = case["widgets"]["max_length"].as_u64().expect("max_length") as usize;
        let chat = chat(case);
        let images = node_images(&net, &io, case["image"].as_str());
        assert_eq!(
            images.len(),
            case["image_batch"].as_u64().expect("image_batch") as usize,
            "{name}"
        );

        // The images ComfyUI placed: Kiln's grid and patches against those of ComfyUI's resized copy.
        let placed = ids(&case["image_positions"]).len();
        assert_eq!(case["grids"].as_array().expect("grids").len(), placed, "{name}");
        for (j, input) in images.iter().take(placed).enumerate() {
            let grid = ids(&case["grids"][j]);
            assert_eq!(
                [1, input.grid_h, input.grid_w],
                [grid[0], grid[1], grid[2]].map(|g| g as usize),
                "{name} image {j}"
            );
            let (shape, copy) = &io[&format!("{name}.copy.{j}")];
            let copied =
                net.vision_input(copy, shape[1], shape[2], shape[3]).expect("vision input");
            assert_eq!(
                (copied.grid_h, copied.grid_w),
                (input.grid_h, input.grid_w),
                "{name} image {j}"
            );
            let most = input
                .patches
                .iter()
                .zip(&copied.patches)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            eprintln!("{name} image {j}: grid {grid:?}, patches within {most:e} of the copy's");
            assert_within(
                &format!("{name} image {j} patches"),
                &input.patches,
                &copied.patches,
                1e-5,
            );
        }

        // The prompt ids.
        let prompt_ids =
            tokenizer.qwen3vl_plain_prompt(prompt, images.len(), chat).expect("prompt ids");
        assert_eq!(prompt_ids, ids(&case["ids"]), "{name} ids");
        let slots = prompt_ids.iter().filter(|&&id| id == qwen3::IMAGE_PAD).count();
        assert_eq!(slots, placed, "{name}: image slots");

        // Generation as the node runs it.
        let generated = net
            .generate(b.as_ref(), prompt, &images, chat, max_new, Decoding::Greedy, &mut |_| Ok(()))
            .expect("generate");
        let want = ids(&case["generated"]);
        if let Some(at) = generated.iter().zip(&want).position(|(g, w)| g != w) {
            panic!("{name}: generated {generated:?}, ComfyUI {want:?}: first differs at {at}");
        }
        assert_eq!(generated, want, "{name} generated");
        let text = net.decode(&generated).expect("decode");
        assert_eq!(text, case["text"].as_str().expect("text"), "{name} text");

        // Each step's logits, through the language model with the placed images' tokens.
        let tokens = image_tokens(b.as_ref(), &net, &images, placed);
        let layout = qwen3::ImageLayout::Grid;
        let error = check_logits(b.as_ref(), &net, name, &prompt_ids, &tokens, layout, &want, &io);
        worst = worst.max(error);
        eprintln!("{name}: {} ids, generated {generated:?} = {text:?}", prompt_ids.len());
    }
    eprintln!("qwen3vl generate: max relative logits error {worst:e}");
}

/// The prompts the node only tokenized: empty with and without thinking, and with the template off (one
/// `<|endoftext|>`: `min_length=1`), a prompt already templated (kept as written, no `<think>` block), two images
/// with thinking.
#[test]
fn text_generate_token_ids_match_comfyui() {
    let (_, net) = encoder("ideogram4");
    let TextEncoderNet::Qwen3Vl { tokenizer, .. } = &net else { panic!("not a Qwen3-VL") };
    let cases = json("qwen3vl_generate/cases.json");
    let io = read_tensors("qwen3vl_generate/io.safetensors");
    let token_cases = cases["token_cases"].as_object().expect("token cases");
    assert_eq!(token_cases.len(), 5);
    for (name, case) in token_cases {
        let images = case["image"].as_str().map_or(0, |x| io[&format!("input.{x}")].0[0]);
        let chat = ChatOptions {
            thinking: case["thinking"].as_bool().expect("thinking"),
            default_template: case["use_default_template"].as_bool().expect("use_default_template"),
        };
        let prompt = case["prompt"].as_str().expect("prompt");
        let got = tokenizer.qwen3vl_plain_prompt(prompt, images, chat).expect("prompt ids");
        assert_eq!(got, ids(&case["ids"]), "{name}");
    }
}

/// `TextGenerate` on JoyImage's encoder (type `joyimage`): ComfyUI generates through `SDClipModel.generate`, so
/// the images' tokens sit inline at running positions with no DeepStack, unlike the generic encoder's grid. The
/// prompt ids, the placed images' grids (bicubic, at least 65536 pixels), the generated ids and text, and each
/// step's logits against ComfyUI's.
#[test]
fn joyimage_text_generate_matches_comfyui() {
    let (b, net) = encoder("joyimage");
    let TextEncoderNet::Qwen3Vl { tokenizer, .. } = &net else { panic!("not a Qwen3-VL") };
    let cases = json("qwen3vl_generate/cases.json");
    let io = read_tensors("qwen3vl_generate/io.safetensors");
    let cases = cases["joy_cases"].as_object().expect("joy cases");
    assert_eq!(cases.len(), 3);
    let mut worst = 0f32;
    for (name, case) in cases {
        let prompt = case["widgets"]["prompt"].as_str().expect("prompt");
        let max_new = case["widgets"]["max_length"].as_u64().expect("max_length") as usize;
        let images = node_images(&net, &io, case["image"].as_str());
        let placed = ids(&case["image_positions"]).len();
        assert_eq!(images.len(), placed, "{name}");
        for (j, input) in images.iter().enumerate() {
            let grid = ids(&case["grids"][j]);
            assert_eq!(
                [1, input.grid_h, input.grid_w],
                [grid[0], grid[1], grid[2]].map(|g| g as usize)
            );
        }
        let prompt_ids = tokenizer.joyimage_prompt(prompt, images.len(), true).expect("prompt ids");
        assert_eq!(prompt_ids, ids(&case["ids"]), "{name} ids");

        let generated = net
            .generate(
                b.as_ref(),
                prompt,
                &images,
                chat(case),
                max_new,
                Decoding::Greedy,
                &mut |_| Ok(()),
            )
            .expect("generate");
        let want = ids(&case["generated"]);
        assert_eq!(generated, want, "{name} generated");
        assert_eq!(net.decode(&generated).expect("decode"), case["text"].as_str().expect("text"));

        let tokens = image_tokens(b.as_ref(), &net, &images, placed);
        let layout = qwen3::ImageLayout::Inline;
        let error = check_logits(b.as_ref(), &net, name, &prompt_ids, &tokens, layout, &want, &io);
        worst = worst.max(error);
    }
    eprintln!("joyimage generate: max relative logits error {worst:e}");
}
