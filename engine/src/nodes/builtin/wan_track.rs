//! `WanTrackToVideo` (`comfy_extras.nodes_wan`, Wan ATI): image to video along point tracks drawn on the start
//! image. The start frame is encoded as `WanImageToVideo` encodes it; then, in the latent's model space, its
//! features at each track's first point are carried along the track into every later latent frame, weighted
//! by how close each position is to where the track has gone (`patch_motion`), and the mask says how much each
//! position took. Without tracks it is `WanImageToVideo`.
//!
//! Tracks are what a trajectory editor writes: a JSON list of tracks, each a list of `{"x", "y"}` points in
//! pixels of the video, one point per frame at 24 fps over 121 points (fewer are padded as invisible, more are
//! cut), single quotes read as double; a bare list of points is one track, a list of lists of tracks one list
//! per batch item. Text that is not JSON counts as no tracks, as in ComfyUI.

use std::sync::Arc;

use super::vae::encode_video;
use super::wan::{
    TEMPORAL, VideoRequest, WAN21_CHANNELS as CHANNELS, WanImageToVideo, fit_frames, grey_video,
    image_conditioned, latent_frames, penultimate, video_inputs,
};
use kiln_models::linspace;

use crate::compute::Compute;
use crate::models::LatentFormat;
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;

#[cfg(test)]
mod tests;

/// Points a track is padded or cut to (121 frames at 24 fps: five seconds).
const TRACK_POINTS: usize = 121;

/// A track: its points (x, y) in pixels.
type Track = Vec<(f32, f32)>;

/// `WanTrackToVideo`.
pub(super) struct WanTrackToVideo {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
    /// What the node does without tracks.
    plain: WanImageToVideo,
}

impl WanTrackToVideo {
    pub(super) fn new(compute: Arc<Compute>) -> WanTrackToVideo {
        let spec = NodeSpec::new("WanTrackToVideo", "", "model/conditioning/wan/move")
            .python_module("comfy_extras.nodes_wan")
            .v3()
            .aliases(&[
                "motion tracking",
                "trajectory video",
                "point tracking",
                "keypoint animation",
            ])
            .input(InputDef::typed("positive", "CONDITIONING"))
            .input(InputDef::typed("negative", "CONDITIONING"))
            .input(InputDef::typed("vae", "VAE"))
            .input(
                InputDef::typed("tracks", "STRING")
                    .option("default", "[]")
                    .option("multiline", true),
            );
        let spec = video_inputs(spec, (832, 480), (16, 16), 81)
            .input(
                InputDef::bare("temperature", "FLOAT")
                    .option("advanced", true)
                    .option("default", 220.0)
                    .option("min", 1.0)
                    .option("max", 1000.0)
                    .option("step", 0.1),
            )
            .input(
                InputDef::bare("topk", "INT")
                    .option("advanced", true)
                    .option("default", 2)
                    .option("min", 1)
                    .option("max", 10),
            )
            .input(InputDef::typed("start_image", "IMAGE"))
            .optional(InputDef::typed("clip_vision_output", "CLIP_VISION_OUTPUT"))
            .output(OutputDef::new("CONDITIONING").named("positive"))
            .output(OutputDef::new("CONDITIONING").named("negative"))
            .output(OutputDef::new("LATENT").named("latent"));
        let plain = WanImageToVideo::start(compute.clone());
        WanTrackToVideo { spec: Arc::new(spec), compute, plain }
    }
}

impl Node for WanTrackToVideo {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let batches = parse_tracks(inputs.string("tracks")?)?;
        if batches.is_empty() {
            return self.plain.execute(inputs, ctx);
        }
        let VideoRequest { vae, width, height, length, batch } = VideoRequest::read(inputs)?;
        if length % TEMPORAL != 1 {
            return Err(NodeError::new(format!(
                "`length` {length} is not 4k + 1: the tracks' points are taken 4 to a latent frame after the \
                 first"
            )));
        }
        let temperature = inputs.float("temperature")? as f32;
        let topk = usize::try_from(inputs.int("topk")?).unwrap_or(1).max(1);
        let rows: Vec<TrackRows> =
            batches.iter().map(|tracks| track_rows(tracks, width, height, length - 1)).collect();
        // The first `batch` start images, each the first frame of its own grey clip, the clips spread over the
        // batch as ComfyUI's `resize_to_batch_size`.
        let starts = fit_frames(inputs.image("start_image")?, ..batch, width, height)?;
        let (count, per) = (starts.shape()[0], starts.data().len() / starts.shape()[0].max(1));
        let mut encoded: Vec<Option<Tensor>> = vec![None; count];
        let format = LatentFormat::WAN21;
        let frames = latent_frames(length);
        let (h, w) = (height / 8, width / 8);
        let (mut features, mut masks) = (Vec::new(), Vec::new());
        for item in 0..batch {
            let source = batch_index(count, batch, item);
            let y = match &encoded[source] {
                Some(y) => y.clone(),
                None => {
                    let start = Tensor::new(
                        [&[1], &starts.shape()[1..]].concat(),
                        starts.data()[source * per..][..per].to_vec(),
                    )
                    .map_err(|e| NodeError::new(e.to_string()))?;
                    let video = grey_video(length, height, width, Some(&start), None)?;
                    let y = encode_video(&self.compute, vae, &video, ctx)?;
                    encoded[source] = Some(y.clone());
                    y
                }
            };
            if y.shape() != [1, CHANNELS, frames, h, w] {
                return Err(NodeError::new(format!(
                    "WanTrackToVideo needs a Wan 2.1 VAE (16 channels, 8x smaller): the start frame encoded to \
                     {:?}",
                    y.shape()
                )));
            }
            let model_space = format.process_in(y.data(), y.shape());
            let tracks = &rows[batch_index(rows.len(), batch, item)];
            let (mask, feature) =
                patch_motion(tracks, &model_space, [CHANNELS, frames, h, w], temperature, topk);
            features.extend(format.process_out(&feature, &[1, CHANNELS, frames, h, w]));
            // ComfyUI inverts it here; the model's concat inverts it back.
            for _ in 0..TEMPORAL {
                masks.extend(mask.iter().map(|m| 1.0 - m));
            }
        }
        let tensor = |channels: usize, values: Vec<f32>| {
            Tensor::new(vec![batch, channels, frames, h, w], values)
                .map_err(|e| NodeError::new(e.to_string()))
        };
        let (image, mask) = (tensor(CHANNELS, features)?, tensor(TEMPORAL, masks)?);
        let clip_vision = penultimate(inputs, "clip_vision_output")?;
        let latent = Tensor::full(vec![batch, CHANNELS, frames, h, w], 0.0);
        Ok(NodeResult::values(image_conditioned(inputs, Some((image, mask)), clip_vision, latent)?))
    }
}

/// Which of `count` items batch item `item` of `batch` takes (ComfyUI's `resize_to_batch_size` and
/// `resize_list_to_batch_size`).
fn batch_index(count: usize, batch: usize, item: usize) -> usize {
    let last = count.saturating_sub(1);
    if count == batch || batch <= 1 {
        item.min(last)
    } else if batch < count {
        let scale = last as f64 / (batch - 1) as f64;
        ((item as f64 * scale).round_ties_even() as usize).min(last)
    } else {
        let scale = count as f64 / batch as f64;
        (((item as f64 + 0.5) * scale).floor() as usize).min(last)
    }
}

/// The tracks of `text`, one list per batch item; empty if it holds none (or is not JSON, as ComfyUI reads it).
pub(super) fn parse_tracks(text: &str) -> Result<Vec<Vec<Track>>, NodeError> {
    let Ok(parsed) = serde_json::from_str::<serde_json::Value>(&text.replace('\'', "\"")) else {
        return Ok(Vec::new());
    };
    let shape_error = || {
        NodeError::new(
            "`tracks` must be a JSON list of tracks, each a list of {\"x\": …, \"y\": …} points (or one such \
             track, or a list of them per batch item)",
        )
    };
    let items = parsed.as_array().ok_or_else(shape_error)?;
    let Some(first) = items.first() else { return Ok(Vec::new()) };
    let is_point = |v: &serde_json::Value| v.get("x").is_some();
    let tracks_of = |v: &serde_json::Value| -> Result<Vec<Track>, NodeError> {
        let tracks = v.as_array().ok_or_else(shape_error)?;
        if tracks.is_empty() {
            return Err(NodeError::new(
                "`tracks` holds an empty list: each track needs its points",
            ));
        }
        tracks.iter().map(|t| track(t.as_array().ok_or_else(shape_error)?)).collect()
    };
    if is_point(first) {
        // A bare list of points: one track.
        Ok(vec![vec![track(items)?]])
    } else if first.as_array().and_then(|t| t.first()).is_some_and(is_point) {
        // A list of tracks.
        Ok(vec![tracks_of(&parsed)?])
    } else {
        // A list of tracks per batch item.
        items.iter().map(tracks_of).collect()
    }
}

/// One track's points.
fn track(points: &[serde_json::Value]) -> Result<Track, NodeError> {
    if points.is_empty() {
        return Err(NodeError::new("`tracks` holds an empty list: each track needs its points"));
    }
    points
        .iter()
        .map(|p| {
            let coordinate = |axis: &str| {
                p.get(axis).and_then(serde_json::Value::as_f64).ok_or_else(|| {
                    NodeError::new(format!("a point in `tracks` has no number `{axis}`: {p}"))
                })
            };
            Ok((coordinate("x")? as f32, coordinate("y")? as f32))
        })
        .collect()
}

/// A batch item's tracks as the model reads them (ComfyUI's `process_tracks` of the padded tracks): `frames + 1`
/// rows of `tracks` entries (t, x, y, visible), t from −1 to 1 over the 121 points, x and y centred and divided
/// by half the short side, visible 1 or −1 (padding).
#[derive(Debug, Clone, PartialEq)]
struct TrackRows {
    tracks: usize,
    values: Vec<[f32; 4]>,
}

/// [`TrackRows`] of `tracks` for a video of `width` × `height` and `frames + 1` frames: the first point, then
/// the 120 others spread over `frames` rows (each repeated `frames / gcd` times, every `120 / gcd`-th taken).
fn track_rows(tracks: &[Track], width: usize, height: usize, frames: usize) -> TrackRows {
    let short = width.min(height) as f32;
    let (cx, cy) = (width as f32 / 2.0, height as f32 / 2.0);
    let times: Vec<f32> = linspace(-1.0, 1.0, TRACK_POINTS).collect();
    let point = |row: usize, track: &Track| -> [f32; 4] {
        let (x, y, visible) = match track.get(row) {
            Some(&(x, y)) => (x, y, 1.0f32),
            None => (0.0, 0.0, 0.0),
        };
        [times[row], (x - cx) / short * 2.0, (y - cy) / short * 2.0, visible * 2.0 - 1.0]
    };
    let gcd = gcd(TRACK_POINTS - 1, frames);
    let (a, b) = ((TRACK_POINTS - 1) / gcd, frames / gcd);
    let rows = std::iter::once(0).chain((0..frames).map(|k| 1 + (1 + k * a) / b));
    let values = rows.flat_map(|row| tracks.iter().map(move |t| point(row, t))).collect();
    TrackRows { tracks: tracks.len(), values }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// ComfyUI's `_patch_motion_single` on one latent `y` `[C, T, H, W]` (model space) and its tracks' rows
/// (`4 (T − 1) + 1` of them): the mask `[T, H, W]` (1 on the first frame, then the summed weights of the
/// `topk` nearest tracks) and the patched latent `[C, T, H, W]` (the first frame kept; each later position the
/// weighted track features plus its own value times 1 − the clamped weight). A track's feature is the first
/// frame sampled bilinearly at its first point (zero outside); its weight at a position is
/// exp(−temperature · squared distance to where its visible points of the latent frame's four frames average),
/// zero while none is visible.
fn patch_motion(
    rows: &TrackRows,
    y: &[f32],
    [channels, frames, h, w]: [usize; 4],
    temperature: f32,
    topk: usize,
) -> (Vec<f32>, Vec<f32>) {
    let n = rows.tracks;
    let short = h.min(w) as f64;
    let (sx, sy) = ((w as f64 / short) as f32, (h as f64 / short) as f32);
    let row = |r: usize, track: usize| rows.values[r * n + track];
    let plane = h * w;
    let at = |c: usize, t: usize, i: usize| y[(c * frames + t) * plane + i];
    // Each track's feature: the first frame sampled at its first point (grid_sample, bilinear, zeros, corners
    // not aligned).
    let features: Vec<Vec<f32>> = (0..n)
        .map(|track| {
            let [_, x, yy, _] = row(0, track);
            let gx = (x / sx).clamp(-1.0, 1.0);
            let gy = (yy / sy).clamp(-1.0, 1.0);
            let ix = ((gx + 1.0) * w as f32 - 1.0) / 2.0;
            let iy = ((gy + 1.0) * h as f32 - 1.0) / 2.0;
            let (x0, y0) = (ix.floor(), iy.floor());
            let (x1, y1) = (x0 + 1.0, y0 + 1.0);
            let corners = [
                (x0, y0, (x1 - ix) * (y1 - iy)),
                (x1, y0, (ix - x0) * (y1 - iy)),
                (x0, y1, (x1 - ix) * (iy - y0)),
                (x1, y1, (ix - x0) * (iy - y0)),
            ];
            (0..channels)
                .map(|c| {
                    corners.iter().fold(0.0f32, |sum, &(cx, cy, weight)| {
                        let inside = cx >= 0.0 && cy >= 0.0 && cx < w as f32 && cy < h as f32;
                        let value =
                            if inside { at(c, 0, cy as usize * w + cx as usize) } else { 0.0 };
                        sum + value * weight
                    })
                })
                .collect()
        })
        .collect();
    // By channel, then track.
    let by_channel: Vec<Vec<f32>> =
        (0..channels).map(|c| features.iter().map(|f| f[c]).collect()).collect();
    let xs: Vec<f32> = linspace(-sx, sx, w).collect();
    let ys: Vec<f32> = linspace(-sy, sy, h).collect();
    let mut mask = vec![1.0f32; frames * plane];
    let mut out = y.to_vec();
    let k = topk.min(n);
    let mut weights: Vec<(f32, usize)> = Vec::with_capacity(n);
    for t in 1..frames {
        // Where each track is over the latent frame's four frames (visible points only), and how visible.
        let aligned: Vec<(f32, f32, f32)> = (0..n)
            .map(|track| {
                let (mut vx, mut vy, mut seen) = (0.0f32, 0.0f32, 0.0f32);
                for s in 0..TEMPORAL {
                    let [_, x, y, visible] = row(1 + (t - 1) * TEMPORAL + s, track);
                    let visible = visible.clamp(0.0, 1.0);
                    vx += x * visible;
                    vy += y * visible;
                    seen += visible;
                }
                (vx / (seen + 1e-5), vy / (seen + 1e-5), seen.clamp(0.0, 1.0))
            })
            .collect();
        for i in 0..plane {
            let (px, py) = (xs[i % w], ys[i / w]);
            weights.clear();
            weights.extend(aligned.iter().enumerate().map(|(track, &(ax, ay, seen))| {
                let distance = (ax - px).powi(2) + (ay - py).powi(2);
                ((-distance * temperature).exp() * seen, track)
            }));
            // The k largest, largest first (torch.topk's order, which the sum follows).
            weights.sort_by(|a, b| b.0.total_cmp(&a.0));
            let chosen = &weights[..k];
            let total: f32 = chosen.iter().map(|&(weight, _)| weight).sum();
            mask[t * plane + i] = total;
            let keep = 1.0 - total.clamp(0.0, 1.0);
            for (c, by_track) in by_channel.iter().enumerate() {
                let carried = chosen
                    .iter()
                    .fold(0.0f32, |sum, &(weight, track)| sum + by_track[track] * weight);
                let index = (c * frames + t) * plane + i;
                out[index] = carried + y[index] * keep;
            }
        }
    }
    (mask, out)
}
