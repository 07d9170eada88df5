//! The Wan Fun Camera nodes: `WanCameraEmbedding` (a preset camera motion as Plücker rays, ComfyUI's
//! `comfy_extras.nodes_camera_trajectory`, after CameraCtrl) and `WanCameraImageToVideo` (the empty latent, the
//! start image encoded with its frame mask, the CLIP vision states and the camera embedding set on both
//! prompts; `comfy_extras.nodes_wan`).

use std::sync::Arc;

use kiln_models::latent::LatentFormat;

use super::pure::Pure;
use super::vae::encode_video;
use super::wan::{
    VideoRequest, WAN21_CHANNELS, conditioned, conditioning_spec, encoded_then_zero,
    first_last_mask, fit_frames, latent_frames, penultimate, size,
};
use crate::compute::Compute;
use crate::models::CondExtras;
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::Value;

/// ComfyUI's `MAX_RESOLUTION`.
const MAX_RESOLUTION: i64 = 16384;
/// The camera motions, in ComfyUI's order, with their rotation (radians per unit, of the base angle) and
/// translation (of the base distance) axes (`CAMERA_DICT`).
const POSES: [(&str, [f64; 3], [f64; 3]); 9] = [
    ("Static", [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]),
    ("Pan Up", [0.0, 0.0, 0.0], [0.0, -1.0, 0.0]),
    ("Pan Down", [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]),
    ("Pan Left", [0.0, 0.0, 0.0], [-1.0, 0.0, 0.0]),
    ("Pan Right", [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]),
    ("Zoom In", [0.0, 0.0, 0.0], [0.0, 0.0, 2.0]),
    ("Zoom Out", [0.0, 0.0, 0.0], [0.0, 0.0, -2.0]),
    ("Anti Clockwise (ACW)", [0.0, 0.0, -1.0], [0.0, 0.0, 0.0]),
    ("ClockWise (CW)", [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]),
];
/// The distance a unit of translation moves over the clip (`base_T_norm`).
const BASE_DISTANCE: f64 = 1.5;
/// The angle a unit of rotation turns over the clip (`base_angle`, π/3).
const BASE_ANGLE: f64 = std::f64::consts::FRAC_PI_3;
/// The frame size the CameraCtrl poses were made for; the intrinsics are refitted to the asked aspect.
const POSE_SIZE: (f64, f64) = (1280.0, 720.0);
/// Plücker components per pixel: the moment o × d, then the direction d.
const PLUCKER: usize = 6;
/// Video frames per latent frame.
const TEMPORAL: usize = 4;

/// The camera pose of frame `i` of `n`: the rotation Rz·Ry·Rx and the translation, as `get_camera_motion`.
fn camera_motion(
    angle: [f64; 3],
    translation: [f64; 3],
    speed: f64,
    i: usize,
    n: usize,
) -> [[f64; 4]; 3] {
    let progress = i as f64 / n as f64 * speed;
    let [x, y, z] = angle.map(|a| progress * BASE_ANGLE * a);
    let rx = [[1.0, 0.0, 0.0], [0.0, x.cos(), -x.sin()], [0.0, x.sin(), x.cos()]];
    let ry = [[y.cos(), 0.0, y.sin()], [0.0, 1.0, 0.0], [-y.sin(), 0.0, y.cos()]];
    let rz = [[z.cos(), -z.sin(), 0.0], [z.sin(), z.cos(), 0.0], [0.0, 0.0, 1.0]];
    let r = matmul3(&rz, &matmul3(&ry, &rx));
    let t = translation.map(|t| progress * BASE_DISTANCE * t);
    std::array::from_fn(|row| [r[row][0], r[row][1], r[row][2], t[row]])
}

fn matmul3(a: &[[f64; 3]; 3], b: &[[f64; 3]; 3]) -> [[f64; 3]; 3] {
    std::array::from_fn(|i| std::array::from_fn(|j| (0..3).map(|k| a[i][k] * b[k][j]).sum()))
}

/// The camera intrinsics in pixels `[fx, fy, cx, cy]` for a `width` × `height` frame: the CameraCtrl poses'
/// 16:9 focal lengths refitted to the frame's aspect (`process_pose_params`), then rounded to f32.
fn intrinsics(width: usize, height: usize, [fx, fy, cx, cy]: [f64; 4]) -> [f32; 4] {
    let (w, h) = (width as f64, height as f64);
    let pose_ratio = POSE_SIZE.0 / POSE_SIZE.1;
    let (fx, fy) = if pose_ratio > w / h {
        (h * pose_ratio * fx / w, fy)
    } else {
        (fx, w / pose_ratio * fy / h)
    };
    [(fx * w) as f32, (fy * h) as f32, (cx * w) as f32, (cy * h) as f32]
}

/// One frame's Plücker rays `[6, height, width]` (f32, as `ray_condition`): each pixel centre's unit ray
/// direction d rotated by the pose, and its moment o × d with the pose's origin o.
fn plucker_frame(pose: &[[f64; 4]; 3], k: [f32; 4], width: usize, height: usize) -> Vec<f32> {
    let [fx, fy, cx, cy] = k;
    let r: [[f32; 3]; 3] = std::array::from_fn(|i| std::array::from_fn(|j| pose[i][j] as f32));
    let o: [f32; 3] = std::array::from_fn(|i| pose[i][3] as f32);
    let plane = width * height;
    let mut out = vec![0.0f32; PLUCKER * plane];
    for y in 0..height {
        for x in 0..width {
            let (i, j) = (x as f32 + 0.5, y as f32 + 0.5);
            let dir = [(i - cx) / fx, (j - cy) / fy, 1.0f32];
            let norm = (dir[0] * dir[0] + dir[1] * dir[1] + dir[2] * dir[2]).sqrt();
            let dir = dir.map(|v| v / norm);
            let d: [f32; 3] = std::array::from_fn(|row| {
                dir[0] * r[row][0] + dir[1] * r[row][1] + dir[2] * r[row][2]
            });
            let moment =
                [o[1] * d[2] - o[2] * d[1], o[2] * d[0] - o[0] * d[2], o[0] * d[1] - o[1] * d[0]];
            let at = y * width + x;
            for (c, v) in moment.into_iter().chain(d).enumerate() {
                out[c * plane + at] = v;
            }
        }
    }
    out
}

/// The camera embedding `[1, 24, (length + 3) / 4, height, width]` of a preset motion: each frame's Plücker
/// rays, the first frame taken four times, then every four frames' rays stacked on the channels (component
/// c of frame k of a group is channel 4c + k), as `WanCameraEmbedding`.
pub(super) fn camera_embedding(
    pose: &str,
    (width, height, length): (usize, usize, usize),
    speed: f64,
    k: [f64; 4],
) -> Result<Tensor, NodeError> {
    let &(_, angle, translation) = POSES
        .iter()
        .find(|(name, _, _)| *name == pose)
        .ok_or_else(|| NodeError::new(format!("unknown camera pose `{pose}`")))?;
    if length == 0 || length % TEMPORAL != 1 {
        return Err(NodeError::new(format!(
            "WanCameraEmbedding needs a length of 4k + 1 frames (1, 5, ..., 81), got {length}"
        )));
    }
    let intrinsics = intrinsics(width, height, k);
    let frames: Vec<Vec<f32>> = (0..length)
        .map(|i| {
            plucker_frame(
                &camera_motion(angle, translation, speed, i, length),
                intrinsics,
                width,
                height,
            )
        })
        .collect();
    let groups = length.div_ceil(TEMPORAL);
    let plane = width * height;
    let mut values = vec![0.0f32; PLUCKER * TEMPORAL * groups * plane];
    for c in 0..PLUCKER {
        for sub in 0..TEMPORAL {
            for g in 0..groups {
                // The first frame stands in for the three before it.
                let frame = (g * TEMPORAL + sub).saturating_sub(TEMPORAL - 1);
                let dst = ((c * TEMPORAL + sub) * groups + g) * plane;
                values[dst..dst + plane].copy_from_slice(&frames[frame][c * plane..][..plane]);
            }
        }
    }
    Tensor::new(vec![1, PLUCKER * TEMPORAL, groups, height, width], values)
        .map_err(|e| NodeError::new(e.to_string()))
}

/// `WanCameraEmbedding`: the camera embedding of a preset motion, with the width, height and length it was
/// made for (which `WanCameraImageToVideo` takes).
pub(super) fn wan_camera_embedding() -> Pure {
    let float = |name: &str, default: f64, max: serde_json::Value, step: f64, advanced: bool| {
        let input = InputDef::bare(name, "FLOAT");
        let input = if advanced { input.option("advanced", true) } else { input };
        input.option("default", default).option("min", 0).option("max", max).option("step", step)
    };
    let spec = NodeSpec::new("WanCameraEmbedding", "", "model/conditioning/wan/camera")
        .python_module("comfy_extras.nodes_camera_trajectory")
        .v3()
        .input(
            InputDef::bare("camera_pose", "COMBO")
                .option("default", "Static")
                .option("multiselect", false)
                .option("options", POSES.map(|(name, _, _)| name.to_owned()).to_vec()),
        )
        .input(InputDef::int("width", 832, 16, MAX_RESOLUTION).option("step", 16))
        .input(InputDef::int("height", 480, 16, MAX_RESOLUTION).option("step", 16))
        .input(InputDef::int("length", 81, 1, MAX_RESOLUTION).option("step", 4))
        .optional(float("speed", 1.0, serde_json::json!(10.0), 0.1, false))
        .optional(float("fx", 0.5, serde_json::json!(1), 1e-9, true))
        .optional(float("fy", 0.5, serde_json::json!(1), 1e-9, true))
        .optional(float("cx", 0.5, serde_json::json!(1), 0.01, true))
        .optional(float("cy", 0.5, serde_json::json!(1), 0.01, true))
        .output(OutputDef::new("WAN_CAMERA_EMBEDDING").named("camera_embedding"))
        .output(OutputDef::new("INT").named("width"))
        .output(OutputDef::new("INT").named("height"))
        .output(OutputDef::new("INT").named("length"));
    Pure::new(spec, |inputs| {
        let (width, height, length) =
            (size(inputs, "width")?, size(inputs, "height")?, size(inputs, "length")?);
        let optional = |name: &str, default: f64| match inputs.get(name) {
            Some(_) => inputs.float(name),
            None => Ok(default),
        };
        let k = [
            optional("fx", 0.5)?,
            optional("fy", 0.5)?,
            optional("cx", 0.5)?,
            optional("cy", 0.5)?,
        ];
        let embedding = camera_embedding(
            inputs.string("camera_pose")?,
            (width, height, length),
            optional("speed", 1.0)?,
            k,
        )?;
        let int = |v: usize| Value::Int(v as i64);
        Ok(vec![Value::WanCameraEmbedding(embedding), int(width), int(height), int(length)])
    })
}

/// `WanCameraImageToVideo`: an empty Wan 2.1 latent; with a start image, its frames encoded (the later latent
/// frames the latent space's zero) and the mask of the frames it covers; the CLIP vision states and the
/// camera embedding; all set on both prompts.
pub(super) struct WanCameraImageToVideo {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl WanCameraImageToVideo {
    pub(super) fn new(compute: Arc<Compute>) -> WanCameraImageToVideo {
        let optional = ["clip_vision_output", "start_image"];
        let spec =
            conditioning_spec("WanCameraImageToVideo", "model/conditioning/wan/camera", &optional);
        // `conditioning_spec`'s outputs stay; the camera embedding joins the optional inputs last.
        let spec = spec.optional(InputDef::typed("camera_conditions", "WAN_CAMERA_EMBEDDING"));
        WanCameraImageToVideo { spec: Arc::new(spec), compute }
    }
}

impl Node for WanCameraImageToVideo {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let VideoRequest { vae, width, height, length, batch } = VideoRequest::read(inputs)?;
        let (frames, h, w) = (latent_frames(length), height / 8, width / 8);
        let latent = Tensor::full(vec![batch, WAN21_CHANNELS, frames, h, w], 0.0);
        let concat = match inputs.get("start_image") {
            None => None,
            Some(_) => {
                let start = fit_frames(inputs.image("start_image")?, ..length, width, height)?;
                let encoded = encode_video(&self.compute, vae, &start, ctx)?;
                let image = start_latent(&encoded, (frames, h, w))?;
                let mask = first_last_mask((h, w), frames, Some(&start), None)?;
                Some((image, mask))
            }
        };
        let clip_vision = penultimate(inputs, "clip_vision_output")?;
        let camera = match inputs.get("camera_conditions") {
            Some(Value::WanCameraEmbedding(camera)) => Some(camera.clone()),
            Some(other) => {
                return Err(NodeError::new(format!(
                    "`camera_conditions` must be a WAN_CAMERA_EMBEDDING, got {}",
                    other.type_name()
                )));
            }
            None => None,
        };
        let set = |extras: &mut CondExtras| {
            if let Some((image, mask)) = &concat {
                extras.concat_latent_image = Some(image.clone());
                extras.concat_mask = Some(mask.clone());
            }
            if let Some(camera) = &camera {
                extras.camera = Some(camera.clone());
            }
            if let Some(states) = &clip_vision {
                extras.clip_vision = Some(states.clone());
            }
        };
        Ok(NodeResult::values(conditioned(inputs, set, latent)?))
    }
}

/// The conditioning latent `[1, 16, frames, h, w]` (VAE space) of an encoded start `[1, 16, n, h, w]`: its
/// frames first, the Wan 2.1 latent space's zero (each channel's mean) after, as the node's
/// `Wan21().process_out(zeros)` with the encoded frames written over it.
fn start_latent(
    encoded: &Tensor,
    (frames, h, w): (usize, usize, usize),
) -> Result<Tensor, NodeError> {
    let &[1, WAN21_CHANNELS, _, eh, ew] = encoded.shape() else {
        return Err(NodeError::new(format!(
            "WanCameraImageToVideo needs a Wan 2.1 VAE (16 channels); this one made {:?}",
            encoded.shape()
        )));
    };
    if (eh, ew) != (h, w) {
        return Err(NodeError::new(format!(
            "the start image's latent is {eh}×{ew}, the video's {h}×{w}"
        )));
    }
    let values = encoded_then_zero(encoded, &LatentFormat::WAN21, frames)?;
    Tensor::new(vec![1, WAN21_CHANNELS, frames, h, w], values)
        .map_err(|e| NodeError::new(e.to_string()))
}

#[cfg(test)]
mod tests;
