use super::{Track, TrackRows, batch_index, parse_tracks, patch_motion, track_rows};
use crate::tensor::Tensor;

fn tensor(name: &str) -> Tensor {
    crate::fixtures::tensors("wan_track/io.safetensors")[name].clone()
}

fn worst(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max)
}

/// Every case of `scripts/reference/wan_track.py` against ComfyUI's own `parse_json_tracks`, `pad_pts`,
/// `process_tracks` and `patch_motion`.
#[test]
fn tracks_and_the_patched_latent_match_comfyuis_functions() {
    let text = crate::fixtures::text("wan_track/cases.json");
    let cases: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    for (case, c) in cases.as_object().expect("an object") {
        let number = |key: &str| c[key].as_f64().expect(key);
        let (width, height, length) =
            (number("width") as usize, number("height") as usize, number("length") as usize);
        let batches = parse_tracks(c["tracks"].as_str().expect("tracks")).expect("parsed");
        assert_eq!(batches.len(), 1, "{case}");
        let rows = track_rows(&batches[0], width, height, length - 1);
        let want_rows = tensor(&format!("rows.{case}"));
        assert_eq!(want_rows.shape(), [1, length, rows.tracks, 4], "{case}");
        let flat: Vec<f32> = rows.values.iter().flatten().copied().collect();
        assert!(worst(&flat, want_rows.data()) < 1e-6, "{case}: rows");

        let y = tensor(&format!("y.{case}"));
        let shape = [16, y.shape()[2], y.shape()[3], y.shape()[4]];
        let topk = number("topk") as usize;
        let (mask, feature) =
            patch_motion(&rows, y.data(), shape, number("temperature") as f32, topk);
        let want_mask = tensor(&format!("mask.{case}"));
        let want_feature = tensor(&format!("feature.{case}"));
        // ComfyUI's mask repeats the one plane on its 4 channels.
        let plane = mask.len();
        for k in 0..4 {
            let channel = &want_mask.data()[k * plane..][..plane];
            let d = worst(&mask, channel);
            assert!(d < 1e-5, "{case}: mask channel {k} differs by {d}");
        }
        let d = worst(&feature, want_feature.data());
        assert!(d < 1e-5, "{case}: patched latent differs by {d}");
        assert!(worst(&feature, y.data()) > 0.1, "{case}: the tracks moved features");
    }
}

#[test]
fn tracks_parse_in_every_shape_comfyui_reads_and_bad_ones_are_refused_by_name() {
    let one: Track = vec![(1.0, 2.0), (3.0, 4.0)];
    assert_eq!(parse_tracks("[{'x': 1, 'y': 2}, {'x': 3, 'y': 4}]").unwrap(), [vec![one.clone()]]);
    assert_eq!(
        parse_tracks(r#"[[{"x": 1, "y": 2}, {"x": 3, "y": 4}], [{"x": 5, "y": 6}]]"#).unwrap(),
        [vec![one.clone(), vec![(5.0, 6.0)]]]
    );
    assert_eq!(
        parse_tracks(r#"[[[{"x": 1, "y": 2}, {"x": 3, "y": 4}]], [[{"x": 5, "y": 6}]]]"#).unwrap(),
        [vec![one], vec![vec![(5.0, 6.0)]]]
    );
    // No tracks: the node is WanImageToVideo (text that is not JSON too, as ComfyUI reads it).
    assert!(parse_tracks("[]").unwrap().is_empty());
    assert!(parse_tracks("not json").unwrap().is_empty());
    for (bad, says) in [
        (r#"{"x": 1}"#, "must be a JSON list"),
        (r#"[[{"x": 1}]]"#, "no number `y`"),
        ("[[]]", "empty list"),
        ("[[{\"x\": 1, \"y\": 2}], []]", "empty list"),
        ("[1, 2]", "must be a JSON list"),
    ] {
        let err = parse_tracks(bad).expect_err(bad).to_string();
        assert!(err.contains(says), "{bad}: {err}");
    }
}

#[test]
fn batches_take_their_items_as_comfyuis_resize_to_batch_size() {
    let picks = |count, batch| (0..batch).map(|i| batch_index(count, batch, i)).collect::<Vec<_>>();
    assert_eq!(picks(1, 3), [0, 0, 0]);
    assert_eq!(picks(2, 4), [0, 0, 1, 1]);
    assert_eq!(picks(5, 3), [0, 2, 4]);
    assert_eq!(picks(4, 3), [0, 2, 3]);
    assert_eq!(picks(3, 3), [0, 1, 2]);
    assert_eq!(picks(3, 1), [0]);
}

#[test]
fn a_clip_of_one_frame_has_only_the_first_row() {
    let rows: TrackRows = track_rows(&[vec![(8.0, 8.0)]], 16, 16, 0);
    assert_eq!(rows.values, [[-1.0, 0.0, 0.0, 1.0]]);
}
