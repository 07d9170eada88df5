use super::camera_embedding;
use crate::tensor::Tensor;

/// A case of `scripts/reference/wan_camera.py`: name, pose, width, height, length, speed, [fx, fy, cx, cy].
type Case = (&'static str, &'static str, usize, usize, usize, f64, [f64; 4]);

const CASES: [Case; 4] = [
    ("zoom_in", "Zoom In", 32, 16, 5, 1.0, [0.5, 0.5, 0.5, 0.5]),
    ("pan_left", "Pan Left", 16, 24, 9, 1.7, [0.4, 0.6, 0.45, 0.55]),
    ("clockwise", "ClockWise (CW)", 48, 16, 5, 2.5, [0.5, 0.5, 0.5, 0.5]),
    ("static", "Static", 16, 16, 1, 1.0, [0.5, 0.5, 0.5, 0.5]),
];

fn fixture(name: &str) -> Tensor {
    crate::fixtures::tensors("wan_camera/io.safetensors")[name].clone()
}

/// Every case against ComfyUI's own `WanCameraEmbedding` (`scripts/reference/wan_camera.py`).
#[test]
fn camera_embeddings_match_comfyuis_node() {
    for (case, pose, width, height, length, speed, k) in CASES {
        let want = fixture(&format!("out.{case}"));
        let got = camera_embedding(pose, (width, height, length), speed, k).expect("an embedding");
        assert_eq!(got.shape(), want.shape(), "{case}");
        let worst =
            got.data().iter().zip(want.data()).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{case}: differs by up to {worst}");
    }
}

#[test]
fn a_length_that_is_not_4k_plus_1_and_an_unknown_pose_are_refused() {
    let err = camera_embedding("Static", (16, 16, 8), 1.0, [0.5; 4]).expect_err("refused");
    assert!(err.to_string().contains("4k + 1"), "{err}");
    let err = camera_embedding("Dolly", (16, 16, 5), 1.0, [0.5; 4]).expect_err("refused");
    assert!(err.to_string().contains("unknown camera pose `Dolly`"), "{err}");
}
