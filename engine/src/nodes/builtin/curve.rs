//! `comfy_extras.nodes_curve`: `CurveEditor` (a `CURVE` from the frontend's curve widget) and `ImageHistogram`
//! (an image's 256-bin histograms, which the curve editor draws behind the curve), and the curve itself as
//! ComfyUI's `CurveInput` evaluates it (`comfy_api/latest/_input/curve_types.py`): monotone cubic Hermite
//! interpolation through the control points (the frontend's `createMonotoneInterpolator`) or piecewise linear.

use std::sync::Arc;

use serde_json::{Value as Json, json};

use super::image::dims;
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef,
    UiOutput,
};
use crate::value::Value;

/// A curve over `[0, 1]`: control points sorted by x, and how to interpolate between them.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Curve {
    points: Vec<(f64, f64)>,
    linear: bool,
}

impl Curve {
    /// ComfyUI's `CurveInput.from_raw`: `{"points": [[x, y], ...], "interpolation": ...}` or a bare list of
    /// points (monotone cubic); an unknown interpolation is monotone cubic too.
    pub(super) fn from_json(value: &Json, input: &str) -> Result<Curve, NodeError> {
        let invalid = |what: &str| {
            NodeError::of_kind(ErrorKind::InvalidValue, format!("input `{input}`: {what}"))
        };
        let (points, interpolation) = match value {
            Json::Object(map) => (
                map.get("points").ok_or_else(|| invalid("a curve needs `points`"))?,
                map.get("interpolation").and_then(Json::as_str).unwrap_or("monotone_cubic"),
            ),
            other => (other, "monotone_cubic"),
        };
        let points = points.as_array().ok_or_else(|| invalid("`points` must be a list"))?;
        let mut parsed = Vec::with_capacity(points.len());
        for point in points {
            let xy = point.as_array().filter(|p| p.len() == 2);
            let pair = xy.and_then(|p| Some((p[0].as_f64()?, p[1].as_f64()?)));
            parsed.push(pair.ok_or_else(|| invalid("each point must be [x, y] numbers"))?);
        }
        // Python's sort by x is stable, as this one is.
        parsed.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(Curve { points: parsed, linear: interpolation == "linear" })
    }

    /// The curve as `CurveEditor` passes it on.
    pub(super) fn to_json(&self) -> Json {
        let points: Vec<Json> = self.points.iter().map(|(x, y)| json!([x, y])).collect();
        let interpolation = if self.linear { "linear" } else { "monotone_cubic" };
        json!({"points": points, "interpolation": interpolation})
    }

    /// `to_lut(size)`: the curve at `size` evenly spaced x in `[0, 1]` (numpy's `linspace`).
    pub(super) fn lut(&self, size: usize) -> Vec<f64> {
        let xs: Vec<f64> = (0..size)
            .map(|i| {
                if size < 2 {
                    0.0
                } else if i == size - 1 {
                    1.0
                } else {
                    i as f64 * (1.0 / (size - 1) as f64)
                }
            })
            .collect();
        let slopes = if self.linear { Vec::new() } else { self.slopes() };
        xs.into_iter().map(|x| self.at(x, &slopes)).collect()
    }

    /// The curve at `x` (`interp_array`'s vectorised form, or `np.interp` when linear): at or past the last
    /// point its y, before (or, for the cubic, at) the first point its y, between points interpolated.
    fn at(&self, x: f64, slopes: &[f64]) -> f64 {
        let n = self.points.len();
        match n {
            0 => return 0.0,
            1 => return self.points[0].1,
            _ => {}
        }
        let (first, last) = (self.points[0], self.points[n - 1]);
        // The last point wins where both apply (numpy's second `where`; `np.interp`'s `x == xp[-1]`).
        if x >= last.0 {
            return last.1;
        }
        if x < first.0 || (!self.linear && x <= first.0) {
            return first.1;
        }
        // numpy's searchsorted(side='right'), clipped to [1, n - 1]: past duplicates of x, to the last.
        let hi = self.points.partition_point(|p| p.0 <= x).clamp(1, n - 1);
        let lo = hi - 1;
        let ((x0, y0), (x1, y1)) = (self.points[lo], self.points[hi]);
        let dx = x1 - x0;
        if self.linear {
            return if dx == 0.0 { y1 } else { y0 + (x - x0) * ((y1 - y0) / dx) };
        }
        let t = if dx == 0.0 { 0.0 } else { (x - x0) / dx };
        let (t2, t3) = (t * t, t * t * t);
        let h00 = 2.0 * t3 - 3.0 * t2 + 1.0;
        let h10 = t3 - 2.0 * t2 + t;
        let h01 = -2.0 * t3 + 3.0 * t2;
        let h11 = t3 - t2;
        h00 * y0 + h10 * dx * slopes[lo] + h01 * y1 + h11 * dx * slopes[hi]
    }

    /// The tangents of the monotone cubic (Fritsch-Carlson, as `MonotoneCubicCurve._compute_slopes`).
    fn slopes(&self) -> Vec<f64> {
        let n = self.points.len();
        if n < 2 {
            return vec![0.0; n];
        }
        let deltas: Vec<f64> = self
            .points
            .windows(2)
            .map(|w| {
                let dx = w[1].0 - w[0].0;
                if dx == 0.0 { 0.0 } else { (w[1].1 - w[0].1) / dx }
            })
            .collect();
        let mut slopes = vec![0.0; n];
        slopes[0] = deltas[0];
        slopes[n - 1] = deltas[n - 2];
        for i in 1..n - 1 {
            slopes[i] = if deltas[i - 1] * deltas[i] <= 0.0 {
                0.0
            } else {
                (deltas[i - 1] + deltas[i]) / 2.0
            };
        }
        for i in 0..n - 1 {
            if deltas[i] == 0.0 {
                slopes[i] = 0.0;
                slopes[i + 1] = 0.0;
            } else {
                let alpha = slopes[i] / deltas[i];
                let beta = slopes[i + 1] / deltas[i];
                let s = alpha * alpha + beta * beta;
                if s > 9.0 {
                    let t = 3.0 / s.sqrt();
                    slopes[i] = t * alpha * deltas[i];
                    slopes[i + 1] = t * beta * deltas[i];
                }
            }
        }
        slopes
    }
}

/// The default of a `CURVE` widget: the identity.
fn identity() -> Json {
    json!({"points": [[0.0, 0.0], [1.0, 1.0]], "interpolation": "monotone_cubic"})
}

/// A `CURVE` input as ComfyUI declares it (a socketless widget with the identity as its default).
pub(super) fn curve_input(name: &str) -> InputDef {
    InputDef::bare(name, "CURVE").option("default", identity()).option("socketless", true)
}

/// `CurveEditor`: the curve drawn in the widget, passed on; with a histogram, the histogram shown behind it.
pub(super) struct CurveEditor(Arc<NodeSpec>);

impl CurveEditor {
    pub(super) fn new() -> CurveEditor {
        CurveEditor(Arc::new(
            NodeSpec::new("CurveEditor", "Curve Editor", "utilities")
                .python_module("comfy_extras.nodes_curve")
                .v3()
                .intermediate_output()
                .input(curve_input("curve"))
                .optional(InputDef::typed("histogram", "HISTOGRAM"))
                .output(OutputDef::new("CURVE").named("curve")),
        ))
    }
}

impl Node for CurveEditor {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _ctx: &Context) -> Result<NodeResult, NodeError> {
        let curve = match inputs.get("curve") {
            Some(Value::Json(json)) => Curve::from_json(json, "curve")?,
            _ => Curve::from_json(&identity(), "curve")?,
        };
        let mut result = NodeResult::values([Value::Json(Arc::new(curve.to_json()))]);
        if let Some(Value::Json(histogram)) = inputs.get("histogram")
            && !histogram.is_null()
        {
            let ui = UiOutput {
                data: vec![("histogram".to_owned(), (**histogram).clone())],
                ..UiOutput::default()
            };
            result.ui = Some(ui);
        }
        Ok(result)
    }
}

/// `ImageHistogram`: the first image's 256-bin histograms of its channels (values × 255, truncated to 8
/// bits), the RGB composite (their mean, floored) and BT.709 luminance.
pub(super) struct ImageHistogram(Arc<NodeSpec>);

impl ImageHistogram {
    pub(super) fn new() -> ImageHistogram {
        let histogram = |name| OutputDef::new("HISTOGRAM").named(name);
        ImageHistogram(Arc::new(
            NodeSpec::new("ImageHistogram", "Image Histogram", "utilities")
                .python_module("comfy_extras.nodes_curve")
                .v3()
                .input(InputDef::typed("image", "IMAGE"))
                .output(histogram("rgb"))
                .output(histogram("luminance"))
                .output(histogram("red"))
                .output(histogram("green"))
                .output(histogram("blue")),
        ))
    }
}

impl Node for ImageHistogram {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _ctx: &Context) -> Result<NodeResult, NodeError> {
        let image = inputs.image("image")?;
        let (batch, h, w, c) = dims(image)?;
        if batch == 0 {
            return Err(NodeError::of_kind(ErrorKind::InvalidValue, "ImageHistogram got no image"));
        }
        if c < 3 {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("ImageHistogram needs red, green and blue channels; the image has {c}"),
            ));
        }
        // numpy's clip(x * 255, 0, 255).astype(uint8), in f32.
        let bin = |v: f32| (v * 255.0).clamp(0.0, 255.0) as usize;
        let mut channels = [[0u64; 256]; 3];
        let mut luminance = [0u64; 256];
        for pixel in image.data()[..h * w * c].chunks_exact(c) {
            for (k, hist) in channels.iter_mut().enumerate() {
                hist[bin(pixel[k])] += 1;
            }
            let lum = 0.2126f32 * pixel[0] + 0.7152f32 * pixel[1] + 0.0722f32 * pixel[2];
            luminance[bin(lum)] += 1;
        }
        let rgb: Vec<u64> =
            (0..256).map(|i| (channels[0][i] + channels[1][i] + channels[2][i]) / 3).collect();
        let list = |bins: &[u64]| Value::Json(Arc::new(json!(bins)));
        Ok(NodeResult::values([
            list(&rgb),
            list(&luminance),
            list(&channels[0]),
            list(&channels[1]),
            list(&channels[2]),
        ]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curves_evaluate_as_comfyui_tabulates_them() {
        // The fixture's curves and ComfyUI's `CurveInput.to_lut()` of each (scripts/reference/glsl_shader.py).
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/glsl");
        let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
        let fixture: Json = serde_json::from_str(&text).unwrap();
        let case = &fixture["cases"][0];
        let curves = case["curves"].as_array().unwrap();
        assert_eq!(curves.len(), 4);
        for (curve, lut) in curves.iter().zip(case["luts"].as_array().unwrap()) {
            let ours = Curve::from_json(curve, "curve").unwrap().lut(256);
            for (i, (a, b)) in ours.iter().zip(lut.as_array().unwrap()).enumerate() {
                assert_eq!(*a as f32, b.as_f64().unwrap() as f32, "{curve} at {i}");
            }
        }
    }

    #[test]
    fn repeated_end_points_take_the_last_as_numpy_does() {
        // np.interp(0, [0, 0, 1], [0.2, 0.8, 1]) = 0.8; the cubic of [[1, .2], [1, .8]] at 1 is 0.8.
        let linear =
            json!({"points": [[0.0, 0.2], [0.0, 0.8], [1.0, 1.0]], "interpolation": "linear"});
        assert_eq!(Curve::from_json(&linear, "curve").unwrap().lut(3)[0], 0.8);
        let cubic = json!({"points": [[1.0, 0.2], [1.0, 0.8]]});
        assert_eq!(Curve::from_json(&cubic, "curve").unwrap().lut(3)[2], 0.8);
    }

    #[test]
    fn a_curve_without_points_is_refused_by_name() {
        let err =
            Curve::from_json(&json!({"interpolation": "linear"}), "curves.u_curve0").unwrap_err();
        assert!(err.message.contains("curves.u_curve0"), "{}", err.message);
    }
}
