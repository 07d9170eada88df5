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

/// The tiny Wan 2.2 Fun Camera model (`wan.py`'s expert variant with `camera_weights`: an adapter reading 1
/// embedding channel), f32, written under `dir`.
fn write_camera_model(dir: &std::path::Path) -> std::path::PathBuf {
    let mut t = crate::fixtures::tiny_wan_expert();
    let (_, v) = t["blocks.1.self_attn.v.weight"].clone();
    let v_bias = t["blocks.1.self_attn.v.bias"].clone();
    t.insert("control_adapter.conv.weight".into(), (vec![256, 64, 2, 2], v));
    t.insert("control_adapter.conv.bias".into(), v_bias);
    for (conv, source) in [("conv1", "q"), ("conv2", "k")] {
        let (_, w) = t[&format!("blocks.0.self_attn.{source}.weight")].clone();
        let spread: Vec<f32> = w.iter().flat_map(|&x| [x / 3.0; 9]).collect();
        let bias = t[&format!("blocks.0.self_attn.{source}.bias")].clone();
        let name = format!("control_adapter.residual_blocks.0.{conv}");
        t.insert(format!("{name}.weight"), (vec![256, 256, 3, 3], spread));
        t.insert(format!("{name}.bias"), bias);
    }
    let path = dir.join("camera.safetensors");
    crate::fixtures::write_f32(&path, &t);
    path
}

/// ComfyUI's CFGGuider (cfg 2, euler, 3 steps) on the tiny Fun Camera model with an image latent, its mask and a
/// camera embedding, plain and in context windows of 3 latent frames: the engine's sampler cuts the camera
/// embedding to each window (with the retained first frame) as ComfyUI does and gives ComfyUI's latents
/// (`scripts/reference/wan_windows.py`).
#[test]
fn camera_embeddings_are_cut_to_context_windows_as_comfyuis() {
    let io = crate::fixtures::tensors("context_windows/camera.safetensors");
    let dir = std::env::temp_dir().join(format!("kiln-camera-windows-{}", std::process::id()));
    let path = write_camera_model(&dir);
    let extras = crate::models::CondExtras {
        concat_latent_image: Some(io["concat_latent_image"].clone()),
        concat_mask: Some(io["concat_mask"].clone()),
        camera: Some(io["camera"].clone()),
        ..Default::default()
    };
    super::super::windowed::check_wan_windows(&path, &io, &extras);
    let _ = std::fs::remove_dir_all(dir);
}
