//! SaveImage → LoadImage round trip, PNG metadata, counters, subfolders and path escapes.

use kiln_engine::cache::CachePolicy;
use kiln_engine::exec::{Event, Outcome};
use kiln_engine::graph::NodeId;
use kiln_engine::nodes::{ErrorKind, FileKind, PreviewFormat};
use serde_json::{Value, json};

use crate::harness::Harness;

fn text_chunks(path: &std::path::Path) -> Vec<(String, String)> {
    let decoder =
        png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).expect("png exists")));
    let reader = decoder.read_info().expect("a PNG");
    let info = reader.info();
    let mut chunks: Vec<(String, String)> =
        info.uncompressed_latin1_text.iter().map(|t| (t.keyword.clone(), t.text.clone())).collect();
    chunks.extend(
        info.utf8_text.iter().map(|t| (t.keyword.clone(), t.get_text().unwrap_or_default())),
    );
    chunks
}

#[test]
fn save_then_load_round_trips_pixels_and_keeps_metadata() {
    let mut h = Harness::new(CachePolicy::Classic);
    let workflow = json!({"workflow": {"id": "wf-1", "nodes": []}});
    let prompt = h.validate(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 4, "batch_size": 2, "color": 0x336699}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "sub/kiln"}},
    }));
    let ran = h.run_validated(&prompt, workflow);
    assert_eq!(ran.summary.outcome, Outcome::Success);
    let images = &ran.summary.outputs[&NodeId::from("2")].images;
    assert_eq!(
        images.iter().map(|i| i.filename.as_str()).collect::<Vec<_>>(),
        ["kiln_00001_.png", "kiln_00002_.png"]
    );
    assert!(images.iter().all(|i| i.subfolder == "sub" && i.kind == FileKind::Output));

    let saved = h.roots.output.join("sub/kiln_00001_.png");
    let decoded = image::open(&saved).expect("the image crate reads it").to_rgb8();
    assert_eq!((decoded.width(), decoded.height()), (8, 4));
    assert_eq!(decoded.get_pixel(0, 0).0, [0x33, 0x66, 0x99]);
    let chunks = text_chunks(&saved);
    let prompt_chunk = chunks.iter().find(|c| c.0 == "prompt").expect("a prompt chunk");
    let prompt_json: serde_json::Value = serde_json::from_str(&prompt_chunk.1).expect("JSON");
    assert_eq!(prompt_json["2"]["class_type"], "SaveImage");
    let workflow_chunk = chunks.iter().find(|c| c.0 == "workflow").expect("a workflow chunk");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&workflow_chunk.1).expect("JSON")["id"],
        "wf-1"
    );

    // A second save continues the counter.
    let again = h.run_validated(&h.validate(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 4, "batch_size": 1, "color": 0}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "sub/kiln"}},
    })), json!(null));
    assert_eq!(again.summary.outputs[&NodeId::from("2")].images[0].filename, "kiln_00003_.png");

    // Load it back through the input directory and invert it.
    std::fs::copy(&saved, h.roots.input.join("in.png")).expect("copy");
    let ran = h.run(json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": "in.png"}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "PreviewImage", "inputs": {"images": ["2", 0]}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success);
    let preview = &ran.summary.outputs[&NodeId::from("3")].images[0];
    assert_eq!(preview.kind, FileKind::Temp);
    assert!(preview.filename.starts_with("ComfyUI_temp_"));
    let inverted = image::open(h.roots.temp.join(&preview.filename)).expect("readable").to_rgb8();
    // float32 arithmetic and truncation to u8, as upstream (so 255 - 153 comes out as 101, not 102).
    let expect = |v: u8| ((1.0f32 - f32::from(v) / 255.0) * 255.0) as u8;
    assert_eq!(inverted.get_pixel(3, 2).0, [expect(0x33), expect(0x66), expect(0x99)]);
}

#[test]
fn load_image_gives_a_mask_from_alpha() {
    let mut h = Harness::new(CachePolicy::Classic);
    let mut rgba = image::RgbaImage::new(2, 1);
    rgba.put_pixel(0, 0, image::Rgba([10, 20, 30, 255]));
    rgba.put_pixel(1, 0, image::Rgba([10, 20, 30, 0]));
    rgba.save(h.roots.input.join("alpha.png")).expect("save");
    let ran = h.run(json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": "alpha.png"}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 1]}},
    }));
    assert_eq!(ran.text("2"), ["tensor[1, 1, 2]"]);
}

#[test]
fn saving_outside_the_output_folder_fails_the_node() {
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 2, "height": 2, "batch_size": 1, "color": 0}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "../escape"}},
    }));
    let Outcome::Failed(failure) = ran.summary.outcome else { panic!("expected a failure") };
    assert!(failure.message.contains("outside the output folder"), "{}", failure.message);
    assert!(!h.roots.output.parent().expect("parent").join("escape_00001_.png").exists());
}

/// Each failure carries the kind of what went wrong; the server reports it as ComfyUI's exception name.
#[test]
fn file_failures_have_the_kind_of_what_went_wrong() {
    let mut h = Harness::new(CachePolicy::None);
    let kind_of = |ran: crate::harness::Ran| match ran.summary.outcome {
        Outcome::Failed(failure) => (failure.kind, failure.message),
        other => panic!("expected a failure: {other:?}"),
    };

    // A file that exists but is not an image passes validation and fails to decode (ws_execution_error).
    std::fs::write(h.roots.input.join("bad.png"), b"not an image").expect("write");
    let load = |name: &str| {
        json!({
            "1": {"class_type": "LoadImage", "inputs": {"image": name}},
            "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
        })
    };
    let (kind, message) = kind_of(h.run(load("bad.png")));
    assert_eq!(kind, ErrorKind::ImageDecode);
    assert!(message.starts_with("cannot identify image file 'bad.png'"), "{message}");

    // A file removed between validation and execution.
    std::fs::write(h.roots.input.join("gone.png"), b"soon gone").expect("write");
    let validated = h.validate(load("gone.png"));
    std::fs::remove_file(h.roots.input.join("gone.png")).expect("remove");
    let (kind, _) = kind_of(h.run_validated(&validated, json!(null)));
    assert_eq!(kind, ErrorKind::FileNotFound);

    // A prefix that names no file.
    let (kind, message) = kind_of(h.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 2, "height": 2, "batch_size": 1, "color": 0}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "./"}},
    })));
    assert_eq!((kind, message.as_str()), (ErrorKind::InvalidValue, "filename_prefix is empty"));

    // An output folder that cannot be created.
    std::fs::write(h.roots.output.join("taken"), b"a file, not a folder").expect("write");
    let (kind, _) = kind_of(h.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 2, "height": 2, "batch_size": 1, "color": 0}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "taken/x"}},
    })));
    assert_eq!(kind, ErrorKind::Io);
}

#[test]
fn image_nodes_compute_what_they_say() {
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 4, "batch_size": 1, "color": 0xFFFFFF}},
        "2": {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "upscale_method": "bilinear", "width": 16, "height": 0, "crop": "disabled"}},
        "3": {"class_type": "ImageBatch", "inputs": {"image1": ["2", 0], "image2": ["1", 0]}},
        "4": {"class_type": "GetImageSize", "inputs": {"image": ["3", 0]}},
        "5": {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}},
        "6": {"class_type": "PreviewAny", "inputs": {"source": ["4", 1]}},
        "7": {"class_type": "PreviewAny", "inputs": {"source": ["4", 2]}},
        "8": {"class_type": "ImageBlend", "inputs": {"image1": ["1", 0], "image2": ["1", 0], "blend_factor": 1.0, "blend_mode": "difference"}},
        "9": {"class_type": "ImageScaleBy", "inputs": {"image": ["8", 0], "upscale_method": "area", "scale_by": 0.5}},
        "10": {"class_type": "SaveImage", "inputs": {"images": ["9", 0], "filename_prefix": "blend"}},
        "11": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 32, "batch_size": 2}},
        "12": {"class_type": "LatentUpscale", "inputs": {"samples": ["11", 0], "upscale_method": "nearest-exact", "width": 128, "height": 0, "crop": "disabled"}},
        "13": {"class_type": "PreviewAny", "inputs": {"source": ["12", 0]}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success);
    assert_eq!(
        (ran.text("5"), ran.text("6"), ran.text("7")),
        (vec!["16".to_owned()], vec!["8".to_owned()], vec!["2".to_owned()])
    );
    assert_eq!(ran.text("13"), ["tensor[2, 4, 8, 16]"]);
    let blend = image::open(h.roots.output.join("blend_00001_.png")).expect("saved").to_rgb8();
    assert_eq!((blend.width(), blend.height(), blend.get_pixel(0, 0).0), (4, 2, [0, 0, 0]));
}

#[test]
fn mask_and_batch_nodes_compute_what_they_say() {
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(json!({
        // Three images of a red pixel row; the last one, given a quarter-transparent alpha.
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 4, "batch_size": 1, "color": 0xFF0000}},
        "2": {"class_type": "RepeatImageBatch", "inputs": {"image": ["1", 0], "amount": 3}},
        "3": {"class_type": "ImageFromBatch", "inputs": {"image": ["2", 0], "batch_index": -1, "length": 5}},
        "4": {"class_type": "SolidMask", "inputs": {"value": 0.25, "width": 4, "height": 2}},
        "5": {"class_type": "JoinImageWithAlpha", "inputs": {"image": ["3", 0], "alpha": ["4", 0]}},
        "6": {"class_type": "SaveImage", "inputs": {"images": ["5", 0], "filename_prefix": "alpha"}},
        // The red channel as a mask, inverted, and back to an image.
        "7": {"class_type": "ImageToMask", "inputs": {"image": ["1", 0], "channel": "red"}},
        "8": {"class_type": "InvertMask", "inputs": {"mask": ["7", 0]}},
        "9": {"class_type": "MaskToImage", "inputs": {"mask": ["8", 0]}},
        "10": {"class_type": "SaveImage", "inputs": {"images": ["9", 0], "filename_prefix": "mask"}},
        "11": {"class_type": "GetImageSize", "inputs": {"image": ["2", 0]}},
        "12": {"class_type": "PreviewAny", "inputs": {"source": ["11", 2]}},
        "13": {"class_type": "ImageScaleToTotalPixels", "inputs": {"image": ["1", 0], "upscale_method": "nearest-exact", "megapixels": 0.01, "resolution_steps": 2}},
        "14": {"class_type": "GetImageSize", "inputs": {"image": ["13", 0]}},
        "15": {"class_type": "PreviewAny", "inputs": {"source": ["14", 0]}},
        // An RGBA image and a smaller RGB one in one batch: padded to four channels, resized to the first.
        "16": {"class_type": "EmptyImage", "inputs": {"width": 4, "height": 2, "batch_size": 2, "color": 0x00FF00}},
        "17": {"class_type": "BatchImagesNode", "inputs": {"images.image0": ["5", 0], "images.image1": ["16", 0]}},
        "18": {"class_type": "GetImageSize", "inputs": {"image": ["17", 0]}},
        "19": {"class_type": "PreviewAny", "inputs": {"source": ["18", 0]}},
        "20": {"class_type": "PreviewAny", "inputs": {"source": ["18", 2]}},
        "21": {"class_type": "SaveImage", "inputs": {"images": ["17", 0], "filename_prefix": "batched"}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    assert_eq!(ran.text("12"), ["3"]);
    // 0.01 MP of 1024² is 10485.76 px: 8 × 4 scaled by 18.1 is 144.8 × 72.4, rounded to steps of 2.
    assert_eq!(ran.text("15"), ["144"]);
    let alpha = image::open(h.roots.output.join("alpha_00001_.png")).expect("saved").to_rgba8();
    assert_eq!((alpha.width(), alpha.height()), (8, 4));
    assert_eq!(alpha.get_pixel(3, 2).0, [255, 0, 0, 191], "1 − 0.25, resized to the image");
    let mask = image::open(h.roots.output.join("mask_00001_.png")).expect("saved").to_rgb8();
    assert_eq!(mask.get_pixel(0, 0).0, [0, 0, 0], "red 1 inverted");
    assert_eq!((ran.text("19"), ran.text("20")), (vec!["8".to_owned()], vec!["3".to_owned()]));
    let green = image::open(h.roots.output.join("batched_00002_.png")).expect("saved").to_rgba8();
    assert_eq!(
        (green.width(), green.get_pixel(5, 3).0),
        (8, [0, 255, 0, 255]),
        "padded with alpha 1"
    );
}

#[test]
fn math_expressions_take_grown_inputs_as_the_frontend_sends_them() {
    let mut h = Harness::new(CachePolicy::Classic);
    // The frontend sends an Autogrow input's slots as `values.a`, `values.b`, ...: links or literals.
    let ran = h.run(json!({
        "1": {"class_type": "PrimitiveInt", "inputs": {"value": 1000}},
        "2": {"class_type": "ComfyMathExpression", "inputs": {"expression": "(a + 7) & -8", "values.a": ["1", 0]}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 1]}},
        "4": {"class_type": "ComfyMathExpression", "inputs": {"expression": "max(values) / b if c else 0", "values.a": ["2", 0], "values.b": 4, "values.c": true}},
        "5": {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}},
        "6": {"class_type": "PreviewAny", "inputs": {"source": ["4", 2]}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    assert_eq!(ran.text("3"), ["1000"]);
    assert_eq!(ran.text("5"), ["250.0"]);
    assert_eq!(ran.text("6"), ["True"]);
}

#[test]
fn save_image_advanced_writes_8_and_16_bit_pngs_as_comfyui_names_them() {
    let mut h = Harness::new(CachePolicy::Classic);
    let save = |depth: &str, prefix: &str| json!({"class_type": "SaveImageAdvanced", "inputs": {"images": ["1", 0], "filename_prefix": prefix, "format": "png", "format.bit_depth": depth, "format.input_color_space": "sRGB"}});
    let ran = h.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 4, "height": 2, "batch_size": 1, "color": 0x8040C0}},
        "2": save("8-bit", "eight"),
        "3": save("16-bit", "deep/sixteen"),
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    // `<prefix>_<counter>.png`, no trailing underscore.
    let eight = image::open(h.roots.output.join("eight_00001.png")).expect("saved");
    assert_eq!(eight.color(), image::ColorType::Rgb8);
    assert_eq!(eight.to_rgb8().get_pixel(0, 0).0, [128, 64, 192]);
    let sixteen = image::open(h.roots.output.join("deep/sixteen_00001.png")).expect("saved");
    assert_eq!(sixteen.color(), image::ColorType::Rgb16);
    // 0x80 / 255 · 65535, truncated.
    assert_eq!(sixteen.to_rgb16().get_pixel(0, 0).0[0], 32896);

    // A bit depth of the other format passes validation (every option's choices) but not the node.
    let ran = h.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 4, "height": 2, "batch_size": 1, "color": 0}},
        "2": {"class_type": "SaveImageAdvanced", "inputs": {"images": ["1", 0], "filename_prefix": "bad", "format": "png", "format.bit_depth": "32-bit float", "format.input_color_space": "sRGB"}},
    }));
    assert!(matches!(ran.summary.outcome, Outcome::Failed { .. }), "{:?}", ran.summary.outcome);
}

#[test]
fn resize_image_mask_resizes_images_and_masks_as_its_resize_type_says() {
    let mut h = Harness::new(CachePolicy::Classic);
    let resize = |input: Value, kind: &str, children: Value| {
        let mut inputs =
            json!({"input": input, "resize_type": kind, "scale_method": "nearest-exact"});
        for (k, v) in children.as_object().expect("children") {
            inputs[format!("resize_type.{k}")] = v.clone();
        }
        json!({"class_type": "ResizeImageMaskNode", "inputs": inputs})
    };
    let size = |node: &str| json!({"class_type": "GetImageSize", "inputs": {"image": [node, 0]}});
    let show = |node: &str, slot: u32| json!({"class_type": "PreviewAny", "inputs": {"source": [node, slot]}});
    let ran = h.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 4, "batch_size": 1, "color": 0}},
        "2": resize(json!(["1", 0]), "scale by multiplier", json!({"multiplier": 2.0})),
        "3": size("2"), "4": show("3", 0), "5": show("3", 1),
        "6": resize(json!(["1", 0]), "scale to multiple", json!({"multiple": 3})),
        "7": size("6"), "8": show("7", 0), "9": show("7", 1),
        // A mask stays a mask: its longer side to 6.
        "10": {"class_type": "SolidMask", "inputs": {"value": 1.0, "width": 8, "height": 4}},
        "11": resize(json!(["10", 0]), "scale longer dimension", json!({"longer_size": 6})),
        "12": {"class_type": "MaskToImage", "inputs": {"mask": ["11", 0]}},
        "13": size("12"), "14": show("13", 0), "15": show("13", 1),
        "16": resize(json!(["1", 0]), "match size", json!({"match": ["12", 0], "crop": "center"})),
        "17": size("16"), "18": show("17", 0),
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    let shown = |a: &str, b: &str| (ran.text(a), ran.text(b));
    assert_eq!(shown("4", "5"), (vec!["16".to_owned()], vec!["8".to_owned()]));
    assert_eq!(shown("8", "9"), (vec!["6".to_owned()], vec!["3".to_owned()]));
    assert_eq!(shown("14", "15"), (vec!["6".to_owned()], vec!["3".to_owned()]));
    assert_eq!(ran.text("18"), ["6"]);
}

#[test]
fn image_stitch_puts_images_side_by_side_as_comfyui_does() {
    let mut h = Harness::new(CachePolicy::Classic);
    let stitch = |direction: &str, matched: bool, spacing: u32| json!({"class_type": "ImageStitch", "inputs": {"image1": ["1", 0], "image2": ["2", 0], "direction": direction, "match_image_size": matched, "spacing_width": spacing, "spacing_color": "black"}});
    let size = |node: &str| json!({"class_type": "GetImageSize", "inputs": {"image": [node, 0]}});
    let show = |node: &str, slot: u32| json!({"class_type": "PreviewAny", "inputs": {"source": [node, slot]}});
    let ran = h.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 4, "batch_size": 1, "color": 0xFF0000}},
        "2": {"class_type": "EmptyImage", "inputs": {"width": 4, "height": 2, "batch_size": 2, "color": 0x00FF00}},
        // Resized to the first's height (8 × 4), a 2-pixel strip between: 18 wide, two images.
        "3": stitch("right", true, 1), "4": size("3"), "5": show("4", 0), "6": show("4", 2),
        // Not resized, stacked: padded to the wider, 4 + 2 high.
        "7": stitch("up", false, 0), "8": size("7"), "9": show("8", 0), "10": show("8", 1),
        "11": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "stitched"}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    assert_eq!((ran.text("5"), ran.text("6")), (vec!["18".to_owned()], vec!["2".to_owned()]));
    assert_eq!((ran.text("9"), ran.text("10")), (vec!["8".to_owned()], vec!["6".to_owned()]));
    let saved = image::open(h.roots.output.join("stitched_00001_.png")).expect("saved").to_rgb8();
    let row: Vec<[u8; 3]> = [0, 8, 9].iter().map(|&x| saved.get_pixel(x, 1).0).collect();
    assert_eq!(row, [[255, 0, 0], [0, 0, 0], [0, 0, 0]], "image1, then the black strip");
    // Then image2, resized (Kiln's lanczos lands a step under full green).
    let green = saved.get_pixel(10, 1).0;
    assert!(green[0] == 0 && green[1] >= 254 && green[2] == 0, "{green:?}");
}

#[test]
fn save_image_websocket_sends_each_image_as_a_png_preview_and_saves_nothing() {
    let mut h = Harness::new(CachePolicy::Classic);
    let prompt = json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 4, "height": 2, "batch_size": 2, "color": 0x102030}},
        "2": {"class_type": "SaveImageWebsocket", "inputs": {"images": ["1", 0]}},
    });
    let ran = h.run(prompt.clone());
    assert_eq!(ran.summary.outcome, Outcome::Success);
    assert!(
        !ran.summary.outputs.contains_key(&NodeId::from("2")),
        "nothing in the history's outputs"
    );
    let node_events: Vec<String> = ran
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Progress { node, value, max } if node.0 == "2" => {
                Some(format!("progress {value}/{max}"))
            }
            Event::Preview { node, preview } if node.0 == "2" => {
                assert_eq!(preview.format, PreviewFormat::Png);
                let decoded = image::load_from_memory(&preview.bytes).expect("a PNG").to_rgb8();
                assert_eq!((decoded.width(), decoded.height()), (4, 2));
                assert_eq!(decoded.get_pixel(3, 1).0, [0x10, 0x20, 0x30]);
                Some("preview".to_owned())
            }
            Event::Executed { node, .. } if node.0 == "2" => Some("executed".to_owned()),
            _ => None,
        })
        .collect();
    assert_eq!(node_events, ["progress 0/2", "preview", "progress 1/2", "preview"]);
    let saved = std::fs::read_dir(&h.roots.output).map_or(0, |d| d.count());
    assert_eq!(saved, 0, "no file is written");

    // Upstream's IS_CHANGED is the time: a second run sends the images again.
    let again = h.run(prompt);
    assert_eq!(again.events.iter().filter(|e| matches!(e, Event::Preview { .. })).count(), 2);
}

#[test]
fn issue_21_outpaint_padding_scaling_and_empty_latents_compute_what_comfyui_does() {
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(json!({
        // A white 8×8 image padded by 8 on the left and 4 at the bottom, feathered over 2 pixels.
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0xFFFFFF}},
        "2": {"class_type": "ImagePadForOutpaint", "inputs": {"image": ["1", 0], "left": 8, "top": 0, "right": 0, "bottom": 4, "feathering": 2}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "padded"}},
        "4": {"class_type": "MaskToImage", "inputs": {"mask": ["2", 1]}},
        "5": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "pad_mask"}},
        // The longer side to 6, the ratio kept; the Kontext size nearest a 2:1 image.
        "6": {"class_type": "EmptyImage", "inputs": {"width": 16, "height": 8, "batch_size": 1, "color": 0}},
        "7": {"class_type": "ImageScaleToMaxDimension", "inputs": {"image": ["6", 0], "upscale_method": "area", "largest_size": 6}},
        "8": {"class_type": "GetImageSize", "inputs": {"image": ["7", 0]}},
        "9": {"class_type": "PreviewAny", "inputs": {"source": ["8", 1]}},
        "10": {"class_type": "FluxKontextImageScale", "inputs": {"image": ["6", 0]}},
        "11": {"class_type": "GetImageSize", "inputs": {"image": ["10", 0]}},
        "12": {"class_type": "PreviewAny", "inputs": {"source": ["11", 0]}},
        // Flux.2's latent (128 channels, a sixteenth) and Chroma Radiance's (pixels).
        "13": {"class_type": "EmptyFlux2LatentImage", "inputs": {"width": 64, "height": 32, "batch_size": 2}},
        "14": {"class_type": "PreviewAny", "inputs": {"source": ["13", 0]}},
        "15": {"class_type": "EmptyChromaRadianceLatentImage", "inputs": {"width": 48, "height": 16, "batch_size": 1}},
        "16": {"class_type": "PreviewAny", "inputs": {"source": ["15", 0]}},
        "17": {"class_type": "Flux2Scheduler", "inputs": {"steps": 4, "width": 1024, "height": 1024}},
        "18": {"class_type": "PreviewAny", "inputs": {"source": ["17", 0]}},
        // A mask previewed; two images compared.
        "19": {"class_type": "MaskPreview", "inputs": {"mask": ["2", 1]}},
        "20": {"class_type": "ImageCompare", "inputs": {"image_a": ["1", 0], "image_b": ["6", 0], "compare_view": ""}},
        "21": {"class_type": "ImageCompare", "inputs": {"image_b": ["6", 0], "compare_view": ""}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    let padded = image::open(h.roots.output.join("padded_00001_.png")).expect("saved").to_rgb8();
    assert_eq!((padded.width(), padded.height()), (16, 12));
    assert_eq!(padded.get_pixel(0, 0).0, [127, 127, 127], "the new canvas is grey 0.5");
    assert_eq!(padded.get_pixel(8, 0).0, [255, 255, 255], "the image at its offset");
    let mask = image::open(h.roots.output.join("pad_mask_00001_.png")).expect("saved").to_luma8();
    // New area 1; within 2 pixels of a grown side ((2 − d)/2)²: d 0 → 1, d 1 → 0.25; the rest 0.
    assert_eq!(mask.get_pixel(3, 3).0, [255]);
    assert_eq!(mask.get_pixel(8, 3).0, [255]);
    assert_eq!(mask.get_pixel(9, 3).0, [63]);
    assert_eq!(mask.get_pixel(12, 3).0, [0]);
    assert_eq!(mask.get_pixel(12, 6).0, [0], "two pixels from the grown bottom");
    assert_eq!(mask.get_pixel(12, 7).0, [63], "one pixel from the grown bottom");
    assert_eq!(mask.get_pixel(12, 10).0, [255]);
    assert_eq!(ran.text("9"), ["3"], "16×8 at a longer side of 6 is 6×3");
    assert_eq!(ran.text("12"), ["1456"], "2:1 is nearest Kontext's 1456×720");
    assert_eq!(ran.text("14"), ["tensor[2, 128, 2, 4]"]);
    assert_eq!(ran.text("16"), ["tensor[1, 3, 16, 48]"]);
    assert_eq!(ran.text("18").len(), 1);
    let previews = &ran.summary.outputs[&NodeId::from("19")];
    assert_eq!(previews.images.len(), 1);
    assert_eq!(previews.images[0].kind, FileKind::Temp);
    let compared = &ran.summary.outputs[&NodeId::from("20")];
    let names: Vec<(&str, usize)> =
        compared.named.iter().map(|(k, files)| (k.as_str(), files.len())).collect();
    assert_eq!(names, [("a_images", 1), ("b_images", 1)]);
    let a = &compared.named[0].1[0];
    assert!(a.filename.starts_with("comfy.compare.a_temp_"), "{}", a.filename);
    assert!(
        text_chunks(&h.roots.temp.join(&a.filename)).is_empty(),
        "ImageCompare's previews carry no prompt"
    );
    let only_b = &ran.summary.outputs[&NodeId::from("21")];
    let names: Vec<(&str, usize)> =
        only_b.named.iter().map(|(k, files)| (k.as_str(), files.len())).collect();
    assert_eq!(names, [("a_images", 0), ("b_images", 1)]);
}

// Filters and compositing: Canny, ImageBlur, ImageCompositeMasked, ImageCrop, GrowMask, RebatchImages.

/// The fixture scripts/reference/canny.py recorded from ComfyUI's own nodes (kornia 0.9.0, torch 2.15 on the CPU).
fn canny_fixture() -> Value {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/canny/cases.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("the canny fixture")).expect("JSON")
}

/// A JSON array of unsigned numbers.
fn unsigned(value: &Value) -> Vec<u64> {
    value.as_array().expect("an array").iter().map(|v| v.as_u64().expect("a number")).collect()
}

#[test]
fn canny_and_blur_of_a_loaded_image_save_what_comfyui_computes() {
    let mut h = Harness::new(CachePolicy::Classic);
    let fixture = canny_fixture();
    let shape = unsigned(&fixture["image"]["shape"]);
    let (height, width) = (shape[1] as u32, shape[2] as u32);
    // The fixture's first image as a PNG to load.
    let pixels: Vec<u8> = unsigned(&fixture["image"]["pixels"])
        .into_iter()
        .take((height * width * 3) as usize)
        .map(|p| u8::try_from(p).expect("8-bit"))
        .collect();
    image::RgbImage::from_raw(width, height, pixels)
        .expect("an image")
        .save(h.roots.input.join("pattern.png"))
        .expect("saves");
    let canny = &fixture["canny"][0];
    let blur = &fixture["blur"][0];
    let ran = h.run(json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": "pattern.png"}},
        "2": {"class_type": "Canny", "inputs": {"image": ["1", 0], "low_threshold": canny["low"], "high_threshold": canny["high"]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "edges"}},
        "4": {"class_type": "ImageBlur", "inputs": {"image": ["1", 0], "blur_radius": blur["blur_radius"], "sigma": blur["sigma"]}},
        "5": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "blurred"}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    let edges = image::open(h.roots.output.join("edges_00001_.png")).expect("saved").to_rgb8();
    assert_eq!((edges.width(), edges.height()), (width, height));
    let expected: Vec<[u8; 3]> = unsigned(&canny["edges"])
        .into_iter()
        .take((height * width) as usize)
        .map(|e| [255 * e as u8; 3])
        .collect();
    let got: Vec<[u8; 3]> = edges.pixels().map(|p| p.0).collect();
    assert_eq!(got, expected, "the edges ComfyUI finds, white on black in all three channels");
    // Saved as 8 bits (v · 255, truncated): ComfyUI's f32 values within a step.
    let blurred = image::open(h.roots.output.join("blurred_00001_.png")).expect("saved").to_rgb8();
    let expected = unsigned(&blur["output_bits"]);
    for (got, bits) in blurred.as_raw().iter().zip(expected) {
        let want = (f32::from_bits(bits as u32) * 255.0) as u8;
        assert!(got.abs_diff(want) <= 1, "{got} vs {want}");
    }
}

#[test]
fn composite_crop_grow_mask_and_rebatch_compute_what_comfyui_does() {
    let mut h = Harness::new(CachePolicy::Classic);
    let size = |node: &str| json!({"class_type": "GetImageSize", "inputs": {"image": [node, 0]}});
    let show = |node: &str, slot: u32| json!({"class_type": "PreviewAny", "inputs": {"source": [node, slot]}});
    let ran = h.run(json!({
        // A red 3×2 source pasted at half strength into two black 8×4 images at (6, 3): cut to 2×1.
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 4, "batch_size": 2, "color": 0}},
        "2": {"class_type": "EmptyImage", "inputs": {"width": 3, "height": 2, "batch_size": 1, "color": 0xFF0000}},
        "3": {"class_type": "SolidMask", "inputs": {"value": 0.5, "width": 3, "height": 2}},
        "4": {"class_type": "ImageCompositeMasked", "inputs": {"destination": ["1", 0], "source": ["2", 0], "x": 6, "y": 3, "resize_source": false, "mask": ["3", 0]}},
        "5": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "pasted"}},
        // A crop reaching past the right edge is cut there: 3 × 3.
        "6": {"class_type": "ImageCrop", "inputs": {"image": ["4", 0], "width": 4, "height": 3, "x": 5, "y": 1}},
        "7": size("6"), "8": show("7", 0), "9": show("7", 1),
        // The red channel as a mask, grown by a square (one pixel all round) and shrunk away by a cross.
        "10": {"class_type": "ImageToMask", "inputs": {"image": ["4", 0], "channel": "red"}},
        "11": {"class_type": "GrowMask", "inputs": {"mask": ["10", 0], "expand": 1, "tapered_corners": false}},
        "12": {"class_type": "MaskToImage", "inputs": {"mask": ["11", 0]}},
        "13": {"class_type": "SaveImage", "inputs": {"images": ["12", 0], "filename_prefix": "grown"}},
        "14": {"class_type": "GrowMask", "inputs": {"mask": ["10", 0], "expand": -1, "tapered_corners": true}},
        "15": {"class_type": "MaskToImage", "inputs": {"mask": ["14", 0]}},
        "16": {"class_type": "SaveImage", "inputs": {"images": ["15", 0], "filename_prefix": "shrunk"}},
        // Five images in batches of two: a list of three batches, each node after it run once per batch.
        "17": {"class_type": "EmptyImage", "inputs": {"width": 4, "height": 2, "batch_size": 5, "color": 0}},
        "18": {"class_type": "RebatchImages", "inputs": {"images": ["17", 0], "batch_size": 2}},
        "19": size("18"), "20": show("19", 2),
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    for file in ["pasted_00001_.png", "pasted_00002_.png"] {
        let pasted = image::open(h.roots.output.join(file)).expect("saved").to_rgb8();
        let row: Vec<[u8; 3]> = (5..8).map(|x| pasted.get_pixel(x, 3).0).collect();
        assert_eq!(row, [[0, 0, 0], [127, 0, 0], [127, 0, 0]], "{file}");
        assert_eq!(pasted.get_pixel(6, 2).0, [0, 0, 0], "{file}");
    }
    assert_eq!((ran.text("8"), ran.text("9")), (vec!["3".to_owned()], vec!["3".to_owned()]));
    let grown = image::open(h.roots.output.join("grown_00001_.png")).expect("saved").to_luma8();
    let lit: Vec<(u32, u32)> =
        grown.enumerate_pixels().filter(|p| p.2.0 == [127]).map(|p| (p.0, p.1)).collect();
    assert_eq!(lit, [(5, 2), (6, 2), (7, 2), (5, 3), (6, 3), (7, 3)]);
    let shrunk = image::open(h.roots.output.join("shrunk_00001_.png")).expect("saved").to_luma8();
    assert!(shrunk.pixels().all(|p| p.0 == [0]), "a one-pixel strip erodes away");
    assert_eq!(ran.text("20"), ["2", "2", "1"]);
}
