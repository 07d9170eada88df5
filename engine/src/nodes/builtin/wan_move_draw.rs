//! `WanMoveVisualizeTracks` (`comfy_extras.nodes_wanmove`): tracks drawn over the frames as ComfyUI's
//! `draw_tracks_on_video` draws them with PIL: on each frame a circle at every visible point and, behind it,
//! its trail over the last `line_resolution` frames, fading and thinning with its distance from the point.
//!
//! Invariant: pixels are 8-bit as there (the frame truncated to bytes, both overlays blended over it in f64,
//! the result truncated once). The trail's strokes are PIL's exactly (each a two-pixel horizontal line of the
//! stroke's width); a circle covers the pixels whose centres lie within its radius + ½, where PIL's integer
//! ellipse differs from a true circle by a few pixels of its rim.

use std::sync::Arc;

use super::image::dims;
use super::mask::tensor;
use super::pure::Pure;
use super::wan_move::count;
use crate::nodes::{InputDef, NodeError, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::{Tracks, Value};

/// The colours the tracks take in turn.
const COLOURS: [[u8; 3]; 5] =
    [[102, 153, 255], [0, 255, 255], [255, 255, 0], [255, 102, 204], [0, 255, 0]];

/// How the tracks are drawn.
struct Style {
    /// How many frames back a trail reaches.
    trail_frames: usize,
    /// A circle's radius in pixels.
    radius: i64,
    /// The overlays' opacity (0..=1).
    opacity: f64,
    /// A trail's width where it starts.
    line_width: i64,
}

/// `WanMoveVisualizeTracks`.
pub(super) fn visualize_tracks() -> Pure {
    let spec = NodeSpec::new("WanMoveVisualizeTracks", "", "model/conditioning/wan/move")
        .python_module("comfy_extras.nodes_wanmove")
        .v3()
        .input(InputDef::typed("images", "IMAGE"))
        .optional(InputDef::typed("tracks", "TRACKS"))
        .input(InputDef::int("line_resolution", 24, 1, 1024))
        .input(advanced_int("circle_size", 12, 128))
        .input(InputDef::float("opacity", 0.75, 0.0, 1.0).option("step", 0.01))
        .input(advanced_int("line_width", 16, 128))
        .output(OutputDef::new("IMAGE"));
    Pure::new(spec, |inputs| {
        let images = inputs.image("images")?;
        let Some(Value::Tracks(tracks)) = inputs.get("tracks") else {
            return Ok(vec![Value::Image(images.clone())]);
        };
        let style = Style {
            trail_frames: count(inputs, "line_resolution")?,
            radius: inputs.int("circle_size")?,
            opacity: inputs.float("opacity")?,
            line_width: inputs.int("line_width")?,
        };
        Ok(vec![Value::Image(draw(images, tracks, &style)?)])
    })
}

fn advanced_int(name: &str, default: i64, max: i64) -> InputDef {
    InputDef::bare(name, "INT")
        .option("advanced", true)
        .option("default", default)
        .option("min", 1)
        .option("max", max)
}

/// The frames with the tracks drawn. A batch other than the tracks' frame count is repeated whole as many times
/// as fits in it (ComfyUI's `repeat(frames // batch)`).
fn draw(images: &Tensor, tracks: &Arc<Tracks>, style: &Style) -> Result<Tensor, NodeError> {
    let (batch, h, w, c) = dims(images)?;
    if c < 3 {
        return Err(NodeError::new(format!(
            "WanMoveVisualizeTracks draws on RGB images, not {c} channels"
        )));
    }
    let frames = if batch == tracks.frames { batch } else { tracks.frames / batch.max(1) * batch };
    if frames == 0 {
        return Err(NodeError::new(format!(
            "WanMoveVisualizeTracks: {batch} images for tracks of {} frames; give at most as many images as \
             the tracks have frames",
            tracks.frames
        )));
    }
    let plane = h * w;
    let mut out = Vec::with_capacity(frames * plane * 3);
    for t in 0..frames {
        let source = &images.data()[(t % batch) * plane * c..][..plane * c];
        // torch's `.byte()` of image · 255: truncated.
        let mut frame: Vec<f64> = source
            .chunks(c)
            .flat_map(|p| p[..3].iter().map(|v| f64::from((v * 255.0) as u8)))
            .collect();
        let mut circles = Overlay::new(w, h);
        let mut trails = Vec::new();
        let alpha = (255.0 * style.opacity) as u8;
        for n in 0..tracks.count {
            if !tracks.visible[t * tracks.count + n] {
                continue;
            }
            let colour = COLOURS[n % COLOURS.len()];
            let [x, y] = point(tracks, t, n);
            circles.circle(x, y, style.radius, [colour[0], colour[1], colour[2], alpha]);
            let first = t.saturating_sub(style.trail_frames);
            if t > first {
                trails.push(((first..=t).map(|f| point(tracks, f, n)).collect::<Vec<_>>(), colour));
            }
        }
        circles.blend_onto(&mut frame);
        if !trails.is_empty() {
            let mut lines = Overlay::new(w, h);
            for (points, colour) in &trails {
                lines.trail(points, *colour, style);
            }
            lines.blend_onto(&mut frame);
        }
        // `astype(np.uint8)`, then `to_tensor`'s / 255.
        out.extend(frame.iter().map(|&v| f32::from(v as u8) / 255.0));
    }
    tensor(vec![frames, h, w, 3], out)
}

/// Track `n`'s point on frame `t` in whole pixels (torch's `.long()`: truncated).
fn point(tracks: &Tracks, t: usize, n: usize) -> [i64; 2] {
    let [x, y] = tracks.path[t * tracks.count + n];
    [x as i64, y as i64]
}

/// An RGBA picture drawn by overwriting (PIL's drawing on an RGBA image: no blending between strokes).
struct Overlay {
    w: usize,
    h: usize,
    rgba: Vec<[u8; 4]>,
}

impl Overlay {
    fn new(w: usize, h: usize) -> Overlay {
        Overlay { w, h, rgba: vec![[0; 4]; w * h] }
    }

    /// Sets the pixels of rows `ys` and columns `xs` (clipped to the picture) to `ink`.
    fn fill(
        &mut self,
        xs: std::ops::RangeInclusive<i64>,
        ys: std::ops::RangeInclusive<i64>,
        ink: [u8; 4],
    ) {
        let (w, h) = (self.w as i64, self.h as i64);
        for y in (*ys.start()).max(0)..=(*ys.end()).min(h - 1) {
            for x in (*xs.start()).max(0)..=(*xs.end()).min(w - 1) {
                self.rgba[(y * w + x) as usize] = ink;
            }
        }
    }

    /// A filled circle about (`cx`, `cy`) in the box of side 2r + 1 (PIL's `ellipse` of that box).
    fn circle(&mut self, cx: i64, cy: i64, r: i64, ink: [u8; 4]) {
        let reach = (r as f64 + 0.5).powi(2);
        for dy in -r..=r {
            let half = (reach - (dy * dy) as f64).sqrt().floor() as i64;
            let (half, y) = (half.min(r), cy.saturating_add(dy));
            self.fill(cx.saturating_sub(half)..=cx.saturating_add(half), y..=y, ink);
        }
    }

    /// ComfyUI's `_draw_gradient_polyline_on_overlay`: from the newest point back, a stroke at every pixel of
    /// length whose alpha and width fall off with the distance travelled, each a two-pixel horizontal line of
    /// PIL's width (rows y − ⌊(w − 1)/2⌋ … y + ⌊w/2⌋).
    fn trail(&mut self, points: &[[i64; 2]], colour: [u8; 3], style: &Style) {
        let newest_first: Vec<[i64; 2]> = points.iter().rev().copied().collect();
        // In f64 from i128 differences: coordinates far off the picture must not overflow.
        let lengths: Vec<f64> = newest_first
            .windows(2)
            .map(|p| {
                let d = |k: usize| (i128::from(p[1][k]) - i128::from(p[0][k])) as f64;
                (d(0) * d(0) + d(1) * d(1)).sqrt()
            })
            .collect();
        let total: f64 = lengths.iter().sum();
        if total == 0.0 {
            return;
        }
        let mut travelled = 0.0;
        for (segment, length) in newest_first.windows(2).zip(&lengths) {
            let ([x0, y0], [x1, y1]) = (segment[0], segment[1]);
            let steps = (*length as i64).max(1);
            for i in 0..steps {
                let ratio = (travelled + (i as f64 / steps as f64) * length) / total;
                let alpha = (255.0 * (1.0 - ratio) * style.opacity) as u8;
                // numpy's int64 (b − a)·i, then a true division (exact in i128 here).
                let along = |a: i64, b: i64| {
                    let step = ((i128::from(b) - i128::from(a)) * i128::from(i)) as f64;
                    (a as f64 + step / steps as f64) as i64
                };
                let (x, y) = (along(x0, x1), along(y0, y1));
                let width = ((style.line_width as f64 * (1.0 - ratio)) as i64).max(1);
                let ink = [colour[0], colour[1], colour[2], alpha];
                let rows = y.saturating_sub((width - 1) / 2)..=y.saturating_add(width / 2);
                self.fill(x..=x.saturating_add(1), rows, ink);
            }
            travelled += length;
        }
    }

    /// `frame` (RGB, 0..=255) under this picture: ink · a + frame · (1 − a), a = alpha / 255, in f64.
    fn blend_onto(&self, frame: &mut [f64]) {
        for (pixel, ink) in frame.chunks_mut(3).zip(&self.rgba) {
            let a = f64::from(ink[3]) / 255.0;
            for (v, &i) in pixel.iter_mut().zip(&ink[..3]) {
                *v = f64::from(i) * a + *v * (1.0 - a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ComfyUI's node on two frames repeated to the tracks' six, three tracks (one hidden on two frames)
    /// (`scripts/reference/wan_move_visualize.py`): the trails are PIL's to the byte; the circles differ only
    /// on their rims, where PIL's integer ellipse is not a true circle.
    #[test]
    fn tracks_are_drawn_as_comfyuis_visualizer_draws_them() {
        let io = crate::fixtures::tensors("wan_move/visualize.safetensors");
        let (path, visible) = (&io["path"], &io["visible"]);
        let tracks = Arc::new(Tracks {
            frames: path.shape()[0],
            count: path.shape()[1],
            path: path.data().chunks(2).map(|p| [p[0], p[1]]).collect(),
            visible: visible.data().iter().map(|&v| v > 0.0).collect(),
        });
        let style = Style { trail_frames: 3, radius: 5, opacity: 0.6, line_width: 7 };
        let got = draw(&io["images"], &tracks, &style).unwrap();
        let want = &io["out"];
        assert_eq!(got.shape(), want.shape());
        let (h, w) = (want.shape()[1], want.shape()[2]);
        let mut differing = 0;
        for (i, (g, e)) in got.data().chunks(3).zip(want.data().chunks(3)).enumerate() {
            if g == e {
                continue;
            }
            differing += 1;
            // Every differing pixel is on a circle's rim: within a pixel of radius + ½ from a visible point.
            let (t, y, x) = (i / (h * w), (i / w) % h, i % w);
            let on_rim = (0..tracks.count).any(|n| {
                let [px, py] = point(&tracks, t, n);
                let d = (((x as i64 - px).pow(2) + (y as i64 - py).pow(2)) as f64).sqrt();
                tracks.visible[t * tracks.count + n] && (d - 5.5).abs() <= 1.0
            });
            assert!(
                on_rim,
                "frame {t} pixel ({x}, {y}) differs off the circles' rims: {g:?} vs {e:?}"
            );
        }
        // And they are few: under 1.5 % of the pixels.
        assert!(differing * 1000 < got.data().len() / 3 * 15, "{differing} pixels differ");
        // More images than the tracks have frames cannot be drawn.
        let many = Tensor::full(vec![7, 4, 4, 3], 0.5);
        assert!(draw(&many, &tracks, &style).is_err());
    }
}
