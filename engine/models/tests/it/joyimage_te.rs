//! JoyAI Image Edit's text encoder (CLIPLoader type `joyimage`) against ComfyUI 0f1fa67a's
//! `TextEncodeJoyImageEdit` (`scripts/reference/joyimage_te.py`, fixtures in `fixtures/joyimage_te/`), on the tiny
//! Qwen3-VL file of `fixtures/qwen3vl_te_images/` (a 16-head tower 128 wide with DeepStack after both its blocks,
//! a 36-layer language model 16 wide). Kiln is fed the node's bucket copies, made here from the node's inputs
//! (the centre crop and torch's bilinear resize, their bucketing being the node's business) and checked bit for
//! bit against what the fixture keeps of ComfyUI's (a 1-in-7 subsample, the SHA-256 and sums of the whole copy:
//! A's and B's an exact 4× of the cropped input, S's an uneven 20.8× in torch's order of operations). Checked
//! against ComfyUI: the ids of the node's prompts and of the tokenizer-only prompts; the patch grid of each copy
//! (kept at its size) and its pixels; the conditioning (the last layer before the final norm, the first 34 states
//! dropped) within 1e-4, a written `<|endoftext|>` masked as ComfyUI masks it; the error for a prompt of 34
//! states or fewer. Not here: the node's bucket table (`buckets`) and its refusal of a batch of two
//! (`batch_of_two`), which are the node's (the engine crate's), not the encoder's.

use std::collections::BTreeMap;
use std::sync::Arc;

use kiln_compute::Backend;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::Header;
use kiln_models::family::{
    EditPrompt, JOYIMAGE_CLIP_TYPE, PromptTokens, TextEncoderDetected, TextEncoderFamily,
    TextEncoderNet,
};
use kiln_models::qwen_vl::VisionInput;

use crate::common::{Io, assert_close, cpu, ids, json, read_tensors, tiled_table};

/// The positions JoyImage's encoder drops (ComfyUI's `JOYIMAGE_DROP_IDX`).
const DROP: usize = 34;

/// The fixture file, its 1000-row token table tiled to the vocabulary, as `CLIPLoader` type `joyimage` loads it.
fn encoder() -> (Arc<Cpu>, TextEncoderNet) {
    let (b, manager) = cpu(512 << 20);
    let file = tiled_table(
        "qwen3vl_te_images/qwen3vl.safetensors",
        "model.language_model.embed_tokens.weight",
        151_936,
    );
    let file = SafetensorsFile::open(&file.0).expect("open");
    let header = Header::new(&file, "");
    let found = TextEncoderDetected::detect(&header).expect("detect");
    let Some(found @ TextEncoderDetected::Qwen3Vl(_, Some(_), None)) = found else {
        panic!("the Qwen3-VL file detected as {found:?}")
    };
    let found = found.for_clip_type(JOYIMAGE_CLIP_TYPE).expect("joyimage");
    let TextEncoderDetected::Qwen3Vl(config, Some(_), Some(_)) = &found else {
        panic!("joyimage: {found:?}")
    };
    assert_eq!((config.hidden, config.layers), (16, 36));
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).expect("load");
    let net = found.build_for_clip_type(weights, JOYIMAGE_CLIP_TYPE).expect("build");
    assert_eq!(net.family(), TextEncoderFamily::JoyImage);
    (b, net)
}

/// The ids Kiln lays out for `prompt` with `images` images: JoyImage's template alone without images, what
/// `TextEncodeJoyImageEdit` tokenizes with them.
fn kiln_ids(net: &TextEncoderNet, prompt: &str, images: usize) -> Vec<u32> {
    if images > 0 {
        return net.tokenize_edit(prompt, EditPrompt::Numbered { images }).expect("tokenize_edit");
    }
    let PromptTokens::Ids(ids) = net.tokenize(prompt).expect("tokenize") else {
        panic!("ids for {prompt:?}")
    };
    ids
}

/// `common_upscale`'s centre crop of an `h × w` input to bucket `bh × bw`'s aspect: (rows, columns) off each
/// side, rounded half to even as Python's `round`.
fn centre_crop(h: usize, w: usize, bh: usize, bw: usize) -> (usize, usize) {
    let (old, new) = (w as f64 / h as f64, bw as f64 / bh as f64);
    if old > new {
        (0, ((w as f64 - w as f64 * (new / old)) / 2.0).round_ties_even() as usize)
    } else if old < new {
        (((h as f64 - h as f64 * (old / new)) / 2.0).round_ties_even() as usize, 0)
    } else {
        (0, 0)
    }
}

/// torch's bilinear source taps along an axis of `input` samples resized to `output` (align_corners False, no
/// antialias, in f32 as its CPU kernel computes them): each output's two indices and their weights.
fn taps(input: usize, output: usize) -> Vec<(usize, usize, f32, f32)> {
    let scale = input as f32 / output as f32;
    (0..output)
        .map(|d| {
            let src = (scale * (d as f32 + 0.5) - 0.5).max(0.0);
            let i0 = (src.floor() as usize).min(input - 1);
            let i1 = (i0 + 1).min(input - 1);
            let l1 = (src - i0 as f32).clamp(0.0, 1.0);
            (i0, i1, 1.0 - l1, l1)
        })
        .collect()
}

/// The node's copy of `image` (`[h, w, c]`): `(y, x)` rows and columns cropped off each side, the rest resized
/// bilinearly to `bh × bw`, the first three channels. The products are summed as torch's generic CPU kernel
/// (the one ComfyUI's run took) does, its compiler fusing each weighted sum `a·x + b·y` into `fma(a, x, b·y)`,
/// first along the row, then down the column: bit for bit its copy whatever the scale (A's and B's exact 4× take
/// any order).
fn node_copy(
    image: &[f32],
    [h, w, c]: [usize; 3],
    (y, x): (usize, usize),
    [bh, bw]: [usize; 2],
) -> Vec<f32> {
    let (rows, cols) = (taps(h - 2 * y, bh), taps(w - 2 * x, bw));
    let at = |r: usize, q: usize, k: usize| image[((r + y) * w + q + x) * c + k];
    let mut out = Vec::with_capacity(bh * bw * 3);
    for &(r0, r1, h0, h1) in &rows {
        for &(q0, q1, w0, w1) in &cols {
            for k in 0..3 {
                let top = w0.mul_add(at(r0, q0, k), w1 * at(r0, q1, k));
                let bottom = w0.mul_add(at(r1, q0, k), w1 * at(r1, q1, k));
                out.push(h0.mul_add(top, h1 * bottom));
            }
        }
    }
    out
}

/// SHA-256 (FIPS 180-4) of `data`, in hex.
fn sha256(data: &[u8]) -> String {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut state: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut message = data.to_vec();
    message.push(0x80);
    message.resize((message.len() + 8).next_multiple_of(64) - 8, 0);
    message.extend_from_slice(&(data.len() as u64 * 8).to_be_bytes());
    for block in message.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = state;
        for (k, w) in K.iter().zip(w) {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let choose = (e & f) ^ (!e & g);
            let t1 = h.wrapping_add(s1).wrapping_add(choose).wrapping_add(*k).wrapping_add(w);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let t2 = s0.wrapping_add((a & b) ^ (a & c) ^ (b & c));
            (h, g, f, e, d, c, b, a) = (g, f, e, d.wrapping_add(t1), c, b, a, t1.wrapping_add(t2));
        }
        for (s, v) in state.iter_mut().zip([a, b, c, d, e, f, g, h]) {
            *s = s.wrapping_add(v);
        }
    }
    state.iter().map(|v| format!("{v:08x}")).collect()
}

/// Input `name`'s bucket copy `[bh, bw, 3]`, made here and checked against `copies[name]`: the crop, the stored
/// 1-in-7 samples, the full copy's SHA-256 and channel sums, and for the exact copies (A, B) their integer
/// checksums.
fn bucket_copy(io: &Io, copies: &serde_json::Value, name: &str) -> ([usize; 2], Vec<f32>) {
    let rec = &copies[name];
    let (shape, image) = &io[&format!("input.{name}")];
    let [1, h, w, c] = shape[..] else { panic!("input.{name} is {shape:?}") };
    assert_eq!(ids(&rec["input"]), [h as u32, w as u32], "{name}");
    let bucket = ids(&rec["bucket"]);
    let [bh, bw] = [bucket[0] as usize, bucket[1] as usize];
    let (y, x) = centre_crop(h, w, bh, bw);
    assert_eq!(ids(&rec["crop"]), [y as u32, x as u32], "{name} crop");
    assert_eq!(ids(&rec["cropped"]), [(h - 2 * y) as u32, (w - 2 * x) as u32], "{name} cropped");
    let copy = node_copy(image, [h, w, c], (y, x), [bh, bw]);

    let (sub_shape, sub) = &io[&format!("copy.{name}.sub7")];
    assert_eq!(sub_shape[..], [1, bh.div_ceil(7), bw.div_ceil(7), 3], "{name} sub7");
    let ours: Vec<f32> = (0..bh)
        .step_by(7)
        .flat_map(|r| {
            (0..bw).step_by(7).flat_map(move |q| (0..3).map(move |k| (r * bw + q) * 3 + k))
        })
        .map(|i| copy[i])
        .collect();
    assert_eq!(ours, *sub, "{name}: the 1-in-7 samples");
    let bytes: Vec<u8> = copy.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(
        sha256(&bytes),
        rec["sha256_f32_le"].as_str().expect("sha256"),
        "{name}: the copy's SHA-256"
    );
    // The f64 channel sums: exact for the exact copies; the others' last bit depends on the order of addition.
    for k in 0..3 {
        let got: f64 = copy.iter().skip(k).step_by(3).map(|&v| f64::from(v)).sum();
        let want = rec["channel_sums"][k].as_f64().expect("a sum");
        assert!((got - want).abs() <= 1e-12 * want, "{name} channel {k}: sum {got}, want {want}");
    }
    if rec["exact"].as_bool().expect("exact") {
        let scale: Vec<f64> = rec["scale"]
            .as_array()
            .expect("scale")
            .iter()
            .map(|v| v.as_f64().expect("a scale"))
            .collect();
        assert_eq!(scale, [4.0, 4.0], "{name}: an exact copy is a 4× resize");
        let q: Vec<i64> = copy
            .iter()
            .map(|&v| {
                let q = f64::from(v) * 4096.0;
                assert_eq!(q, q.round(), "{name}: {v} is no multiple of 2^-12");
                q as i64
            })
            .collect();
        let sum4096: Vec<i64> = (0..3).map(|k| q.iter().skip(k).step_by(3).sum()).collect();
        let want: Vec<i64> = rec["sum4096"]
            .as_array()
            .expect("sum4096")
            .iter()
            .map(|v| v.as_i64().expect("a sum"))
            .collect();
        assert_eq!(sum4096, want, "{name}: sum4096");
        let weighted: i64 = q.iter().enumerate().map(|(i, &v)| v * (i as i64 % 9973 + 1)).sum();
        assert_eq!(
            weighted,
            rec["weighted4096"].as_i64().expect("weighted4096"),
            "{name}: weighted4096"
        );
    }
    ([bh, bw], copy)
}

/// The copies' checksum: SHA-256's test vectors, and messages whose padding takes a block of its own.
#[test]
fn sha256_is_fips_180_4() {
    assert_eq!(sha256(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    assert_eq!(sha256(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    assert_eq!(
        sha256(&[b'a'; 56]),
        "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"
    );
    assert_eq!(
        sha256(&[b'a'; 64]),
        "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"
    );
}

/// Kiln's JoyImage vision input of copy `name` (`[bh, bw, 3]`): the copy's grid (`copies[name].grid`, the
/// node's size kept), and its patches' per-channel sums those of the full copy ComfyUI made, normalised
/// (`(v − 0.5) / 0.5`, each pixel in both frames of its patch).
fn vision(
    net: &TextEncoderNet,
    copies: &serde_json::Value,
    name: &str,
    [bh, bw]: [usize; 2],
    copy: &[f32],
) -> VisionInput {
    let input = net.vision_input(copy, bh, bw, 3).expect("vision input");
    let grid = ids(&copies[name]["grid"]);
    assert_eq!(
        [1, input.grid_h, input.grid_w],
        [grid[0], grid[1], grid[2]].map(|g| g as usize),
        "{name}"
    );
    assert_eq!(
        [input.grid_h * 16, input.grid_w * 16],
        [bh, bw],
        "{name}: the copy is not resized again"
    );
    let per_channel = input.patches.len() / (input.len() * 3);
    for k in 0..3 {
        let got: f64 = input
            .patches
            .chunks_exact(per_channel)
            .skip(k)
            .step_by(3)
            .flatten()
            .map(|&v| f64::from(v))
            .sum();
        let sum = copies[name]["channel_sums"][k].as_f64().expect("a sum");
        let want = 2.0 * (2.0 * sum - (bh * bw) as f64);
        assert!(
            (got - want).abs() <= 1e-6 * (bh * bw) as f64,
            "{name} channel {k}: {got}, want {want}"
        );
    }
    input
}

/// Every node case with a conditioning: its ids from the node's prompt, its copies' grids, and the conditioning
/// (the stored one, or that of the case `same_as` names) against ComfyUI's; the largest relative error.
#[test]
fn joyimage_edit_matches_comfyui() {
    let (b, net) = encoder();
    let cases = json("joyimage_te/cases.json");
    let copies = &cases["copies"];
    let io = read_tensors("joyimage_te/io.safetensors");
    let mut made: BTreeMap<String, VisionInput> = BTreeMap::new();
    let mut worst = 0f32;
    let mut count = 0;
    for (name, case) in cases["cases"].as_object().expect("cases") {
        if case.get("error").is_some() {
            continue;
        }
        count += 1;
        let prompt = case["prompt"].as_str().expect("prompt");
        let images: Vec<&str> = case["images"]
            .as_array()
            .expect("images")
            .iter()
            .map(|n| n.as_str().expect("a name"))
            .collect();
        let got = kiln_ids(&net, prompt, images.len());
        assert_eq!(got, ids(&case["ids"]), "{name} ids");
        let mut inputs = Vec::new();
        for (k, image) in images.iter().enumerate() {
            assert_eq!(ids(&case["copy_sizes"][k]), ids(&copies[image]["bucket"]), "{name} {k}");
            assert_eq!(ids(&case["grids"][k]), ids(&copies[image]["grid"]), "{name} {k}");
            let input = made.entry((*image).to_owned()).or_insert_with(|| {
                let (bucket, copy) = bucket_copy(&io, copies, image);
                vision(&net, copies, image, bucket, &copy)
            });
            inputs.push(input.clone());
        }
        let encoded =
            net.encode_with_images(b.as_ref(), &PromptTokens::Ids(got), &inputs).expect("encode");
        let key = case.get("same_as").map_or(name.as_str(), |s| s.as_str().expect("same_as"));
        let (shape, want) = &io[&format!("{key}.cond")];
        assert_eq!(encoded.cond.shape(), shape.as_slice(), "{name}");
        assert_eq!(
            shape[..],
            ids(&case["cond_shape"]).iter().map(|&v| v as usize).collect::<Vec<_>>()[..],
            "{name}"
        );
        assert_eq!(
            shape[1],
            case["positions"].as_u64().expect("positions") as usize - DROP,
            "{name}"
        );
        assert!(encoded.pooled.is_none(), "{name}");
        let cond = b.to_f32(&encoded.cond).expect("read");
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let error = cond.iter().zip(want).fold(0f32, |m, (g, w)| m.max((g - w).abs())) / scale;
        eprintln!("{name}: cond {shape:?}, relative error {error:e}");
        worst = worst.max(error);
        assert_close(name, &cond, want, 1e-4);
    }
    assert_eq!(count, 9, "the node cases with a conditioning");
    eprintln!("joyimage: max relative error {worst:e}");
}

/// A written `<|endoftext|>`: ComfyUI's `process_tokens` masks it and every text token after it (the image
/// before it stays attended), and the conditioning keeps that mask (`attention_mask`, zeros from the
/// `<|endoftext|>` to the end). Kiln masks the same keys inside the encoder (`joyimage_edit_matches_comfyui`
/// compares the whole conditioning, the masked tail's states included, which attend to the keys before the
/// `<|endoftext|>` only); its `Encoded` carries no mask. Here: the recorded mask starts at the `<|endoftext|>`.
#[test]
fn endoftext_mask_is_comfyuis() {
    let cases = json("joyimage_te/cases.json");
    let case = &cases["cases"]["endoftext"];
    let io = read_tensors("joyimage_te/io.safetensors");
    let (shape, mask) = &io["endoftext.attention_mask"];
    assert_eq!(shape[..], [1, ids(&case["cond_shape"])[1] as usize]);
    let from = case["mask_zeros_from"].as_u64().expect("mask_zeros_from") as usize;
    let want: Vec<f32> = (0..mask.len()).map(|i| if i < from { 1.0 } else { 0.0 }).collect();
    assert_eq!(*mask, want);
    // The `<|endoftext|>`'s position in the conditioning: after the image's tokens, less the dropped prefix.
    let all = ids(&case["ids"]);
    let at = all.iter().position(|&id| id == 151_643).expect("<|endoftext|>");
    let grid = ids(&case["grids"][0]);
    assert!(ids(&case["image_positions"])[0] < at as u32);
    assert_eq!(at + (grid[1] * grid[2] / 4) as usize - 1 - DROP, from);
}

/// A written short user turn: ComfyUI's `JoyImageTEModel` raises for 34 states or fewer; Kiln refuses it too,
/// naming the 34.
#[test]
fn short_prompt_is_refused_as_comfyui() {
    let (b, net) = encoder();
    let cases = json("joyimage_te/cases.json");
    let case = &cases["cases"]["skip.short"];
    assert!(case["error"].as_str().expect("error").contains("drop_idx=34"));
    let got = kiln_ids(&net, case["prompt"].as_str().expect("prompt"), 0);
    assert_eq!(got, ids(&case["ids"]));
    assert!(got.len() <= DROP);
    let err = net.encode(b.as_ref(), &PromptTokens::Ids(got)).map(|_| ()).expect_err("refused");
    assert!(matches!(err, kiln_models::Error::Invalid(_)), "{err:?}");
    assert!(err.to_string().contains("34"), "{err}");
}

/// The tokenizer-only prompts: weights syntax, Unicode, an empty prompt, three images, `thinking` (ignored), a
/// templated prompt with no slot or with more slots than images, a leading space before `<|im_start|>`.
#[test]
fn joyimage_token_ids_match_comfyui() {
    let (_, net) = encoder();
    let cases = json("joyimage_te/cases.json");
    let token_cases = cases["token_cases"].as_object().expect("token cases");
    assert_eq!(token_cases.len(), 9);
    for (name, case) in token_cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let images = case["images"].as_u64().expect("images") as usize;
        assert_eq!(kiln_ids(&net, prompt, images), ids(&case["ids"]), "{name}");
    }
}
