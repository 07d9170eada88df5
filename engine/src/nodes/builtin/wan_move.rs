//! Wan Move (`comfy_extras.nodes_wanmove`): `GenerateTracks` (points moving from a start to an end position,
//! straight or along a quadratic Bézier curve, spread across the path), `WanMoveConcatTrack` (two sets of
//! tracks as one) and `WanMoveTrackToVideo` (`WanImageToVideo`'s start clip, whose encoded latent then gets,
//! at each later latent frame, the first frame's features from where each track starts written where it has
//! gone).
//!
//! ComfyUI visits the tracks in a random order (`torch.randperm`) when two of them land on one latent position
//! of one frame; Kiln lets the later track in their given order win there.

use std::sync::Arc;

use super::mask::mask;
use super::pure::Pure;
use super::wan::{
    VideoRequest, WAN21_CHANNELS as CHANNELS, fit_frames, image_conditioned, latent_frames,
    penultimate, start_clip, video_inputs,
};
use kiln_models::linspace;

use crate::compute::Compute;
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::{Tracks, Value};

#[cfg(test)]
mod tests;

const MODULE: &str = "comfy_extras.nodes_wanmove";
const CATEGORY: &str = "model/conditioning/wan/move";
/// Frames, rows and columns per latent position (the Wan 2.1 VAE's).
const DOWNSAMPLE: [usize; 3] = [4, 8, 8];

/// A `FLOAT` input whose tooltip ComfyUI writes before its range.
fn described_float(name: &str, default: f64, step: f64, tooltip: &str) -> InputDef {
    InputDef::bare(name, "FLOAT")
        .option("tooltip", tooltip)
        .option("default", default)
        .option("min", 0.0)
        .option("max", 1.0)
        .option("step", step)
}

/// How a track's points advance along the path over the frames.
const INTERPOLATIONS: [&str; 5] = ["linear", "ease_in", "ease_out", "ease_in_out", "constant"];

/// `GenerateTracks`.
pub(super) fn generate_tracks() -> Pure {
    let position = |axis: &str, end: &str, default: f64| {
        let tooltip = format!("Normalized {axis} coordinate (0-1) for {end} position.");
        described_float(&format!("{end}_{}", axis.to_lowercase()), default, 0.01, &tooltip)
    };
    let control = |axis: &str| {
        let tooltip = format!(
            "Normalized {axis} control point for Bezier curve. Only used when 'bezier' is enabled."
        );
        described_float(&format!("mid_{}", axis.to_lowercase()), 0.5, 0.01, &tooltip)
    };
    let side = |name: &str, default: i64| InputDef::int(name, default, 16, 4096).option("step", 16);
    let spec = NodeSpec::new("GenerateTracks", "Generate Video Tracks", CATEGORY)
        .python_module(MODULE)
        .v3()
        .aliases(&["motion paths", "camera movement", "trajectory"])
        .input(side("width", 832))
        .input(side("height", 480))
        .input(position("X", "start", 0.0))
        .input(position("Y", "start", 0.0))
        .input(position("X", "end", 1.0))
        .input(position("Y", "end", 1.0))
        .input(InputDef::int("num_frames", 81, 1, 1024))
        .input(InputDef::int("num_tracks", 5, 1, 100))
        .input(described_float(
            "track_spread",
            0.025,
            0.001,
            "Normalized distance between tracks. Tracks are spread perpendicular to the motion direction.",
        ))
        .input(
            InputDef::bare("bezier", "BOOLEAN")
                .option("tooltip", "Enable Bezier curve path using the mid point as control point.")
                .option("default", false),
        )
        .input(control("X"))
        .input(control("Y"))
        .input(
            InputDef::bare("interpolation", "COMBO")
                .option("tooltip", "Controls the timing/speed of movement along the path.")
                .option("multiselect", false)
                .option("options", INTERPOLATIONS.map(str::to_owned).to_vec()),
        )
        .optional(
            InputDef::typed("track_mask", "MASK").tooltip("Optional mask to indicate visible frames."),
        )
        .output(OutputDef::new("TRACKS"))
        .output(OutputDef::new("INT").named("track_length"));
    Pure::new(spec, |inputs| {
        let size = |name: &str| -> Result<f64, NodeError> { Ok(inputs.int(name)? as f64) };
        let point = |x: &str, y: &str| -> Result<[f64; 2], NodeError> {
            Ok([inputs.float(x)? * size("width")?, inputs.float(y)? * size("height")?])
        };
        let request = TrackRequest {
            start: point("start_x", "start_y")?,
            mid: point("mid_x", "mid_y")?,
            end: point("end_x", "end_y")?,
            frames: count(inputs, "num_frames")?,
            tracks: count(inputs, "num_tracks")?,
            spread: inputs.float("track_spread")? * (size("width")? + size("height")?) / 2.0,
            bezier: inputs.bool("bezier")?,
            interpolation: inputs.string("interpolation")?.to_owned(),
        };
        let mut tracks = generate(&request)?;
        if inputs.get("track_mask").is_some() {
            let (m, [frames, h, w]) = mask(inputs, "track_mask")?;
            if frames < tracks.frames {
                return Err(NodeError::new(format!(
                    "`track_mask` has {frames} frames; the tracks have {}",
                    tracks.frames
                )));
            }
            // A frame is visible where its mask is set anywhere (for every track).
            for t in 0..tracks.frames {
                let seen = m.data()[t * h * w..][..h * w].iter().any(|&v| v > 0.0);
                tracks.visible[t * tracks.count..][..tracks.count].fill(seen);
            }
        }
        let frames = i64::try_from(tracks.frames).unwrap_or(i64::MAX);
        Ok(vec![Value::Tracks(Arc::new(tracks)), Value::Int(frames)])
    })
}

/// A count input (its declared range keeps it at 1 or more).
pub(super) fn count(inputs: &Inputs, name: &str) -> Result<usize, NodeError> {
    usize::try_from(inputs.int(name)?)
        .map_err(|_| NodeError::new(format!("`{name}` must be positive")))
}

/// What `GenerateTracks` draws: positions in pixels, the spread between neighbouring tracks in pixels.
struct TrackRequest {
    start: [f64; 2],
    mid: [f64; 2],
    end: [f64; 2],
    frames: usize,
    tracks: usize,
    spread: f64,
    bezier: bool,
    interpolation: String,
}

/// The tracks of `request`, as ComfyUI computes them: the path's points and tangents per frame in float32
/// (its tensors), each track offset from the path along the tangent's normal in double (its Python floats),
/// stored as float32; all visible.
fn generate(request: &TrackRequest) -> Result<Tracks, NodeError> {
    let &TrackRequest { start, mid, end, frames, tracks, spread, bezier, .. } = request;
    let f = |v: f64| v as f32;
    let progress = |t: f32| -> Result<f32, NodeError> {
        Ok(match request.interpolation.as_str() {
            "constant" => 0.0,
            "linear" => t,
            "ease_in" => t.powi(2),
            "ease_out" => 1.0 - (1.0 - t).powi(2),
            "ease_in_out" => t * t * (3.0 - 2.0 * t),
            other => {
                return Err(NodeError::new(format!(
                    "unknown interpolation `{other}`: one of {}",
                    INTERPOLATIONS.join(", ")
                )));
            }
        })
    };
    let mut path = Vec::with_capacity(frames * tracks);
    for t in linspace(0.0, 1.0, frames) {
        let s = progress(t)?;
        let (point, tangent) = if bezier {
            let rest = 1.0 - s;
            let at = |a: usize| {
                rest.powi(2) * f(start[a]) + 2.0 * rest * s * f(mid[a]) + s.powi(2) * f(end[a])
            };
            let slope = |a: usize| 2.0 * rest * f(mid[a] - start[a]) + 2.0 * s * f(end[a] - mid[a]);
            ([at(0), at(1)], [slope(0), slope(1)])
        } else {
            let at = |a: usize| f(start[a]) + f(end[a] - start[a]) * s;
            ([at(0), at(1)], [f(end[0] - start[0]), f(end[1] - start[1])])
        };
        let [tx, ty] = tangent.map(f64::from);
        let length = (tx * tx + ty * ty).sqrt();
        let normal = if length > 0.0 { [-ty / length, tx / length] } else { [1.0, 0.0] };
        for track in 0..tracks {
            let offset = (track as f64 - (tracks as f64 - 1.0) / 2.0) * spread;
            let x = f64::from(point[0]) + normal[0] * offset;
            let y = f64::from(point[1]) + normal[1] * offset;
            path.push([x as f32, y as f32]);
        }
    }
    Ok(Tracks { frames, count: tracks, visible: vec![true; path.len()], path })
}

/// `WanMoveConcatTrack`.
pub(super) fn concat_tracks() -> Pure {
    let spec = NodeSpec::new("WanMoveConcatTrack", "", CATEGORY)
        .python_module(MODULE)
        .v3()
        .input(InputDef::typed("tracks_1", "TRACKS"))
        .optional(InputDef::typed("tracks_2", "TRACKS"))
        .output(OutputDef::new("TRACKS"));
    Pure::new(spec, |inputs| {
        let first = tracks(inputs, "tracks_1")?;
        let Some(second) = optional_tracks(inputs, "tracks_2")? else {
            return Ok(vec![Value::Tracks(first)]);
        };
        if first.frames != second.frames {
            return Err(NodeError::new(format!(
                "`tracks_1` has {} frames and `tracks_2` {}: tracks join frame by frame",
                first.frames, second.frames
            )));
        }
        let count = first.count + second.count;
        let mut path = Vec::with_capacity(first.frames * count);
        let mut visible = Vec::with_capacity(first.frames * count);
        for t in 0..first.frames {
            for set in [&first, &second] {
                path.extend_from_slice(&set.path[t * set.count..][..set.count]);
                visible.extend_from_slice(&set.visible[t * set.count..][..set.count]);
            }
        }
        Ok(vec![Value::Tracks(Arc::new(Tracks { frames: first.frames, count, path, visible }))])
    })
}

/// `WanMoveTracksFromCoords`: tracks from coordinates as JSON (a list of tracks, each a list of `{"x", "y"}`
/// points in pixels, as a spline editor writes them; one track alone, or single quotes, read too), as many
/// frames as the first track has points; visible on every frame, or, with `track_mask`, on the frames where
/// the mask is set anywhere.
pub(super) fn tracks_from_coords() -> Pure {
    let spec = NodeSpec::new("WanMoveTracksFromCoords", "", CATEGORY)
        .python_module(MODULE)
        .v3()
        .optional(
            InputDef::bare("track_coords", "STRING")
                .option("default", "[]")
                .option("forceInput", true)
                .option("multiline", false),
        )
        .optional(InputDef::typed("track_mask", "MASK"))
        .output(OutputDef::new("TRACKS"))
        .output(OutputDef::new("INT").named("track_length"));
    Pure::new(spec, |inputs| {
        let text = if inputs.has("track_coords") { inputs.string("track_coords")? } else { "[]" };
        // The parser's messages name WanTrackToVideo's `tracks`; here they are `track_coords`.
        let mut batches = super::wan_track::parse_tracks(text)
            .map_err(|e| NodeError::new(e.message.replace("`tracks`", "`track_coords`")))?;
        let tracks = match batches.len() {
            1 => batches.remove(0),
            0 => return Err(NodeError::new("`track_coords` holds no tracks")),
            n => {
                return Err(NodeError::new(format!(
                    "`track_coords` holds {n} lists of tracks; WanMoveTracksFromCoords reads one list of \
                     tracks"
                )));
            }
        };
        let frames = tracks[0].len();
        if let Some(short) = tracks.iter().position(|t| t.len() < frames) {
            return Err(NodeError::new(format!(
                "track {short} has {} points where the first has {frames}: every track needs a point for \
                 each frame",
                tracks[short].len()
            )));
        }
        let count = tracks.len();
        let path = (0..frames)
            .flat_map(|t| tracks.iter().map(move |track| [track[t].0, track[t].1]))
            .collect();
        let visible = match inputs.get("track_mask") {
            None => vec![true; frames * count],
            Some(_) => {
                let (mask, [mask_frames, h, w]) = super::mask::mask(inputs, "track_mask")?;
                if mask_frames != frames && mask_frames != 1 {
                    return Err(NodeError::new(format!(
                        "`track_mask` has {mask_frames} frames for tracks of {frames}: give one mask or one \
                         per frame"
                    )));
                }
                // A mask of no area is set nowhere.
                let set: Vec<bool> = match h * w {
                    0 => vec![false; mask_frames.max(1)],
                    area => mask.data().chunks(area).map(|p| p.iter().any(|&v| v > 0.0)).collect(),
                };
                (0..frames * count).map(|i| set[(i / count) % set.len()]).collect()
            }
        };
        let tracks = Tracks { frames, count, path, visible };
        Ok(vec![Value::Tracks(Arc::new(tracks)), Value::Int(frames as i64)])
    })
}

/// A `TRACKS` input.
fn tracks(inputs: &Inputs, name: &str) -> Result<Arc<Tracks>, NodeError> {
    optional_tracks(inputs, name)?
        .ok_or_else(|| NodeError::new(format!("input `{name}` is missing")))
}

/// A `TRACKS` input that may be left unconnected.
fn optional_tracks(inputs: &Inputs, name: &str) -> Result<Option<Arc<Tracks>>, NodeError> {
    match inputs.get(name) {
        None => Ok(None),
        Some(Value::Tracks(t)) => Ok(Some(t.clone())),
        Some(other) => {
            Err(NodeError::new(format!("input `{name}` is {}, not TRACKS", other.type_name())))
        }
    }
}

/// `WanMoveTrackToVideo`.
pub(super) struct WanMoveTrackToVideo {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl WanMoveTrackToVideo {
    pub(super) fn new(compute: Arc<Compute>) -> WanMoveTrackToVideo {
        let spec = NodeSpec::new("WanMoveTrackToVideo", "", CATEGORY)
            .python_module(MODULE)
            .v3()
            .input(InputDef::typed("positive", "CONDITIONING"))
            .input(InputDef::typed("negative", "CONDITIONING"))
            .input(InputDef::typed("vae", "VAE"))
            .input(
                InputDef::bare("strength", "FLOAT")
                    .option("tooltip", "Strength of the track conditioning.")
                    .option("default", 1.0)
                    .option("min", 0.0)
                    .option("max", 100.0)
                    .option("step", 0.01),
            );
        let spec = video_inputs(spec, (832, 480), (16, 16), 81)
            .input(InputDef::typed("start_image", "IMAGE"))
            .optional(InputDef::typed("tracks", "TRACKS"))
            .optional(InputDef::typed("clip_vision_output", "CLIP_VISION_OUTPUT"))
            .output(OutputDef::new("CONDITIONING").named("positive"))
            .output(OutputDef::new("CONDITIONING").named("negative"))
            .output(OutputDef::new("LATENT").named("latent"));
        WanMoveTrackToVideo { spec: Arc::new(spec), compute }
    }
}

impl Node for WanMoveTrackToVideo {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let VideoRequest { vae, width, height, length, batch } = VideoRequest::read(inputs)?;
        let strength = inputs.float("strength")? as f32;
        let frames = latent_frames(length);
        let start = fit_frames(inputs.image("start_image")?, ..length, width, height)?;
        let (mut image, mask) =
            start_clip(&self.compute, vae, &start, [length, height, width], ctx)?;
        if let Some(tracks) = optional_tracks(inputs, "tracks")?
            && strength > 0.0
        {
            if batch != 1 {
                return Err(NodeError::new(
                    "WanMoveTrackToVideo moves the features of one start clip: `batch_size` must be 1 with \
                     tracks (as in ComfyUI)",
                ));
            }
            let positions = track_positions(&tracks, length, [height, width]);
            let shape = image.shape().to_vec();
            let &[1, CHANNELS, t, h, w] = shape.as_slice() else {
                return Err(NodeError::new(format!(
                    "WanMoveTrackToVideo needs a Wan 2.1 VAE (16 channels, 8x smaller): the start clip encoded \
                     to {shape:?}"
                )));
            };
            let mut values = image.data().to_vec();
            move_features(&mut values, [CHANNELS, t, h, w], &positions, strength);
            image = Tensor::new(shape, values).map_err(|e| NodeError::new(e.to_string()))?;
        }
        let clip_vision = penultimate(inputs, "clip_vision_output")?;
        let latent = Tensor::full(vec![batch, CHANNELS, frames, height / 8, width / 8], 0.0);
        // Both prompts get the moved latent: ComfyUI moves the features in place, in the tensor the negative
        // prompt gets too.
        Ok(NodeResult::values(image_conditioned(inputs, Some((image, mask)), clip_vision, latent)?))
    }
}

/// Each track's latent position `(row, column)` on every fourth frame of the first `length` (ComfyUI's
/// `create_pos_embeddings` sampling in time): `None` where it is hidden or off the `height` × `width` frame.
/// Indexed `[track][latent frame]`.
fn track_positions(
    tracks: &Tracks,
    length: usize,
    [height, width]: [usize; 2],
) -> Vec<Vec<Option<[i64; 2]>>> {
    let frames = tracks.frames.min(length);
    let [t_down, h_down, w_down] = DOWNSAMPLE;
    let steps = if frames == 0 { 0 } else { (frames - 1) / t_down + 1 };
    (0..tracks.count)
        .map(|n| {
            (0..steps)
                .map(|s| {
                    let t = s * t_down;
                    let [x, y] = tracks.path[t * tracks.count + n];
                    let inside = x >= 0.0 && y >= 0.0 && x < width as f32 && y < height as f32;
                    (tracks.visible[t * tracks.count + n] && inside).then(|| {
                        [(y / h_down as f32).floor() as i64, (x / w_down as f32).floor() as i64]
                    })
                })
                .collect()
        })
        .collect()
}

/// ComfyUI's `replace_feature` on a latent `[C, T, H, W]`: at each later latent frame where a track is, the
/// value there moves toward the first frame's value where the track starts by `strength` (all read before
/// any is written). A track hidden on the first frame starts at the last row and column, as ComfyUI's index
/// −1 reads.
fn move_features(
    latent: &mut [f32],
    [channels, frames, h, w]: [usize; 4],
    positions: &[Vec<Option<[i64; 2]>>],
    strength: f32,
) {
    let plane = h * w;
    let wrap =
        |v: i64, side: usize| if v < 0 { (side as i64 + v).max(0) as usize } else { v as usize };
    let mut writes = Vec::new();
    for track in positions {
        let [sr, sc] = track.first().copied().flatten().unwrap_or([-1, -1]);
        let source = wrap(sr, h) * w + wrap(sc, w);
        for (t, position) in track.iter().enumerate().skip(1) {
            let Some([r, c]) = *position else { continue };
            if t >= frames || r as usize >= h || c as usize >= w {
                continue;
            }
            let target = r as usize * w + c as usize;
            for ch in 0..channels {
                let from = latent[ch * frames * plane + source];
                let to = latent[(ch * frames + t) * plane + target];
                writes.push(((ch * frames + t) * plane + target, to + (from - to) * strength));
            }
        }
    }
    for (index, value) in writes {
        latent[index] = value;
    }
}
