use super::{TrackRequest, generate, move_features, track_positions};
use crate::tensor::Tensor;
use crate::value::Tracks;

fn tensor(name: &str) -> Tensor {
    crate::fixtures::tensors("wan_move/io.safetensors")[name].clone()
}

fn cases(kind: &str) -> serde_json::Map<String, serde_json::Value> {
    let text = crate::fixtures::text("wan_move/cases.json");
    let all: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    all[kind].as_object().expect("an object").clone()
}

fn worst(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max)
}

/// Every `GenerateTracks` case of `scripts/reference/wan_move.py` against ComfyUI's node.
#[test]
fn generated_tracks_match_comfyuis_node() {
    for (case, c) in cases("generate") {
        let number = |key: &str| c[key].as_f64().expect(key);
        let (width, height) = (number("width"), number("height"));
        let request = TrackRequest {
            start: [number("start_x") * width, number("start_y") * height],
            mid: [number("mid_x") * width, number("mid_y") * height],
            end: [number("end_x") * width, number("end_y") * height],
            frames: number("num_frames") as usize,
            tracks: number("num_tracks") as usize,
            spread: number("track_spread") * (width + height) / 2.0,
            bezier: c["bezier"].as_bool().expect("bezier"),
            interpolation: c["interpolation"].as_str().expect("interpolation").to_owned(),
        };
        let got = generate(&request).expect("tracks");
        let want = tensor(&format!("path.{case}"));
        assert_eq!(want.shape(), [got.frames, got.count, 2], "{case}");
        let flat: Vec<f32> = got.path.iter().flatten().copied().collect();
        // Float32 positions of up to a few hundred pixels: at most an ulp apart (3e-5 at 500).
        let d = worst(&flat, want.data());
        assert!(d < 1e-4, "{case}: differs by {d}");
        assert!(got.visible.iter().all(|&v| v), "{case}");
    }
}

/// ComfyUI's `create_pos_embeddings` and `replace_feature` on the fixture's tracks and latents.
#[test]
fn moved_features_match_comfyuis_replace_feature() {
    for (case, c) in cases("move") {
        let number = |key: &str| c[key].as_f64().expect(key);
        let (width, height, length) =
            (number("width") as usize, number("height") as usize, number("length") as usize);
        let path = tensor(&format!("tracks.{case}"));
        let visible = tensor(&format!("visible.{case}"));
        let tracks = Tracks {
            frames: path.shape()[0],
            count: path.shape()[1],
            path: path.data().chunks_exact(2).map(|p| [p[0], p[1]]).collect(),
            visible: visible.data().iter().map(|&v| v > 0.5).collect(),
        };
        let latent = tensor(&format!("latent.{case}"));
        let shape = [16, latent.shape()[2], latent.shape()[3], latent.shape()[4]];
        let positions = track_positions(&tracks, length, [height, width]);
        let mut moved = latent.data().to_vec();
        move_features(&mut moved, shape, &positions, number("strength") as f32);
        let want = tensor(&format!("moved.{case}"));
        let d = worst(&moved, want.data());
        assert!(d < 1e-6, "{case}: differs by {d}");
        assert!(worst(&moved, latent.data()) > 0.5, "{case}: features moved");
    }
}

#[test]
fn hidden_and_outside_points_have_no_position() {
    let tracks = Tracks {
        frames: 5,
        count: 2,
        path: vec![
            [4.0, 4.0],
            [-1.0, 3.0],
            [9.0, 9.0],
            [8.0, 8.0],
            [0.0, 0.0],
            [0.0, 0.0],
            [0.0, 0.0],
            [0.0, 0.0],
            [15.9, 17.0],
            [16.0, 0.0],
        ],
        visible: vec![true, true, true, true, true, true, true, true, true, false],
    };
    let positions = track_positions(&tracks, 5, [24, 16]);
    // Frames 0 and 4 (every fourth): track 0 at (0, 0) then (2, 1); track 1 off the frame, then hidden.
    assert_eq!(positions, [vec![Some([0, 0]), Some([2, 1])], vec![None, None]]);
    // A clip shorter than the tracks reads only its own frames.
    assert_eq!(track_positions(&tracks, 1, [24, 16])[0], [Some([0, 0])]);
}

/// `WanMoveTracksFromCoords` on the JSON `scripts/reference/wan_move_visualize.py` handed ComfyUI's node
/// (single quotes, three tracks of six points): its path and length; a mask sets each frame's visibility.
#[test]
fn tracks_from_coordinates_read_comfyuis_json() {
    use crate::value::Value;
    let io = crate::fixtures::tensors("wan_move/visualize.safetensors");
    let recorded: serde_json::Value =
        serde_json::from_str(&crate::fixtures::text("wan_move/visualize.json")).expect("JSON");
    let coords = Value::String(recorded["coords"].as_str().expect("coords").to_owned());
    let node = super::tracks_from_coords();
    let run = |inputs| crate::fixtures::node_outputs(&node, inputs);
    let out = run(vec![("track_coords", coords.clone())]).expect("runs");
    let Value::Tracks(tracks) = &out[0] else { panic!("tracks") };
    assert_eq!(out[1], Value::Int(recorded["track_length"].as_i64().expect("length")));
    assert_eq!((tracks.frames, tracks.count), (6, 3));
    let path: Vec<f32> = tracks.path.iter().flatten().copied().collect();
    assert_eq!(path, io["path"].data());
    assert!(tracks.visible.iter().all(|&v| v));
    // A mask empty on frames 2 and 3 hides every track there.
    let mut mask = vec![1.0f32; 6 * 2];
    mask[4..8].fill(0.0);
    let mask = Value::Mask(Tensor::new(vec![6, 1, 2], mask).expect("mask"));
    let out = run(vec![("track_coords", coords), ("track_mask", mask)]).expect("runs");
    let Value::Tracks(masked) = &out[0] else { panic!("tracks") };
    let hidden: Vec<usize> = (0..18).filter(|&i| !masked.visible[i]).collect();
    assert_eq!(hidden, (6..12).collect::<Vec<_>>());
    // No tracks is an error, naming the input.
    let Err(err) = run(vec![]) else { panic!("no coordinates") };
    assert!(err.message.contains("track_coords"), "{}", err.message);
}
