//! Image filter nodes (V3 classes): `Canny` (`comfy_extras.nodes_canny`, which runs kornia's `canny`),
//! `ImageBlur` and `ImageSharpen` (`comfy_extras.nodes_post_processing`), and `ImageAddNoise`
//! (`comfy_extras.nodes_images`).
//!
//! Both compute in f32, each value with the operations torch applies to it, in the order torch's reference
//! kernels would; only the order in which a convolution sums its taps is torch's own choice (oneDNN, cuDNN), so a
//! blurred value can differ from ComfyUI's in its last bits. The reference is scripts/reference/canny.py (kornia
//! 0.9.0, the newest release ComfyUI's `kornia>=0.7.1` takes), its fixture engine/tests/fixtures/canny.

use kiln_models::gaussian::{self, reflect};

use super::image::dims;
use super::mask::tensor;
use super::pure::Pure;
use crate::nodes::{ErrorKind, InputDef, Inputs, NodeError, NodeSpec, OutputDef};
use crate::value::Value;

/// A V3 node of `module` in `category`.
fn spec(name: &str, display: &str, category: &str, module: &str) -> NodeSpec {
    NodeSpec::new(name, display, category).python_module(module).v3()
}

/// The nodes, in ComfyUI's registration order.
pub(super) fn nodes() -> Vec<Pure> {
    let step = |input: InputDef, step: f64| input.option("step", step);
    vec![
        Pure::new(
            spec("ImageBlur", "Blur Image", "image/filters", "comfy_extras.nodes_post_processing")
                .input(InputDef::typed("image", "IMAGE"))
                .input(InputDef::int("blur_radius", 1, 1, 31).option("step", 1))
                .input(step(InputDef::float("sigma", 1.0, 0.1, 10.0), 0.1))
                .output(OutputDef::new("IMAGE")),
            image_blur,
        ),
        Pure::new(
            spec(
                "ImageSharpen",
                "Sharpen Image",
                "image/filters",
                "comfy_extras.nodes_post_processing",
            )
            .input(InputDef::typed("image", "IMAGE").with_options())
            .input(advanced("sharpen_radius", "INT", [1.0, 1.0, 31.0, 1.0]))
            .input(advanced("sigma", "FLOAT", [1.0, 0.1, 10.0, 0.01]))
            .input(advanced("alpha", "FLOAT", [1.0, 0.0, 5.0, 0.01]))
            .output(OutputDef::new("IMAGE")),
            image_sharpen,
        ),
        Pure::new(
            spec(
                "ImageAddNoise",
                "Add Noise to Image",
                "image/filters",
                "comfy_extras.nodes_images",
            )
            .input(InputDef::typed("image", "IMAGE").with_options())
            .input(
                InputDef::bare("seed", "INT")
                    .tooltip("The random seed used for creating the noise.")
                    .option("default", 0)
                    .option("min", 0)
                    .option("max", u64::MAX)
                    .option("control_after_generate", true),
            )
            .input(step(InputDef::float("strength", 0.5, 0.0, 1.0), 0.01))
            .output(OutputDef::new("IMAGE"))
            .aliases(&["film grain"]),
            image_add_noise,
        ),
        Pure::new(
            spec("Canny", "Detect Edges (Canny)", "image/filters", "comfy_extras.nodes_canny")
                .input(InputDef::typed("image", "IMAGE"))
                .input(step(InputDef::float("low_threshold", 0.4, 0.01, 0.99), 0.01))
                .input(step(InputDef::float("high_threshold", 0.8, 0.01, 0.99), 0.01))
                .output(OutputDef::new("IMAGE"))
                .aliases(&["edge detection", "outline", "contour detection", "line art"])
                .essentials("Image Tools"),
            canny_node,
        ),
    ]
}

/// An advanced numeric input (V3 writes `advanced` first) with its default, range and step; an `INT` one's
/// numbers are integers.
fn advanced(name: &str, ty: &str, [default, min, max, step]: [f64; 4]) -> InputDef {
    let input = InputDef::bare(name, ty).option("advanced", true);
    if ty == "INT" {
        let int = |v: f64| v as i64;
        input
            .option("default", int(default))
            .option("min", int(min))
            .option("max", int(max))
            .option("step", int(step))
    } else {
        input.option("default", default).option("min", min).option("max", max).option("step", step)
    }
}

/// The index of `i` clamped into `0..len` (torch's `replicate` padding).
fn replicate(i: isize, len: usize) -> usize {
    i.clamp(0, len as isize - 1) as usize
}

/// `ImageBlur`: each channel convolved with ComfyUI's `gaussian_kernel` of `2 · blur_radius + 1` taps, over the
/// image mirrored at its borders (`reflect`); ComfyUI's zero padding around that is cropped off again.
fn image_blur(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let image = inputs.image("image")?;
    let Some(radius) = radius(inputs, "blur_radius", image)? else {
        return Ok(vec![Value::Image(image.clone())]);
    };
    let kernel = gaussian::kernel(2 * radius + 1, inputs.float("sigma")?);
    let out = convolve(image, &kernel, radius)?;
    Ok(vec![Value::Image(tensor(image.shape().to_vec(), out)?)])
}

/// `ImageSharpen`: each channel convolved, as `ImageBlur`, with ComfyUI's `gaussian_kernel` times −10·alpha
/// whose middle tap is raised so the taps sum to 1 (an unsharp mask), clamped to 0..=1.
fn image_sharpen(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let image = inputs.image("image")?;
    let Some(radius) = radius(inputs, "sharpen_radius", image)? else {
        return Ok(vec![Value::Image(image.clone())]);
    };
    let kernel =
        gaussian::sharpen_kernel(2 * radius + 1, inputs.float("sigma")?, inputs.float("alpha")?);
    let out = convolve(image, &kernel, radius)?.into_iter().map(|v| v.clamp(0.0, 1.0)).collect();
    Ok(vec![Value::Image(tensor(image.shape().to_vec(), out)?)])
}

/// `ImageAddNoise`: the image plus `strength` times torch's CPU normal noise of the image's shape from `seed`,
/// clamped to 0..=1.
fn image_add_noise(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let image = inputs.image("image")?;
    // The seed widget spans 0..2^64, carried as its bits.
    let seed = inputs.int("seed")? as u64;
    let strength = inputs.float("strength")? as f32;
    let noise = kiln_models::noise::initial_noise(seed, image.shape(), None)
        .map_err(|e| NodeError::new(e.to_string()))?;
    let out =
        image.data().iter().zip(noise).map(|(v, n)| (v + strength * n).clamp(0.0, 1.0)).collect();
    Ok(vec![Value::Image(tensor(image.shape().to_vec(), out)?)])
}

/// A filter's radius input `name`: `None` at 0 (the image passes), refused when negative or when the image is
/// not larger than it on both sides (torch's `reflect` padding needs that).
fn radius(
    inputs: &Inputs,
    name: &str,
    image: &crate::tensor::Tensor,
) -> Result<Option<usize>, NodeError> {
    let (_, h, w, _) = dims(image)?;
    let radius = inputs.int(name)?;
    if radius == 0 {
        return Ok(None);
    }
    let radius = usize::try_from(radius).map_err(|_| {
        NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("{name} must not be negative, got {radius}"),
        )
    })?;
    if radius >= h || radius >= w {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "{name} {radius} needs an image larger than the radius on both sides (reflect padding), got \
                 {w}x{h}"
            ),
        ));
    }
    Ok(Some(radius))
}

/// Each channel of `image` `[B, H, W, C]` convolved with the `(2·radius + 1)²` taps `kernel` over the image
/// mirrored at its borders ([`gaussian::convolve_plane`]).
fn convolve(
    image: &crate::tensor::Tensor,
    kernel: &[f32],
    radius: usize,
) -> Result<Vec<f32>, NodeError> {
    let (b, h, w, c) = dims(image)?;
    let mut out = vec![0.0f32; image.data().len()];
    let mut plane = vec![0.0f32; h * w];
    let mut convolved = vec![0.0f32; h * w];
    for i in 0..b {
        let src = &image.data()[i * h * w * c..(i + 1) * h * w * c];
        for k in 0..c {
            for (p, v) in plane.iter_mut().zip(src.iter().skip(k).step_by(c)) {
                *p = *v;
            }
            gaussian::convolve_plane(&plane, (h, w), kernel, radius, &mut convolved);
            for (p, v) in convolved.iter().enumerate() {
                out[(i * h * w + p) * c + k] = *v;
            }
        }
    }
    Ok(out)
}

/// `Canny`: kornia's `canny(image, low_threshold, high_threshold)` edges (0 or 1) in all three channels.
fn canny_node(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let image = inputs.image("image")?;
    let (b, h, w, c) = dims(image)?;
    let (low, high) = (inputs.float("low_threshold")?, inputs.float("high_threshold")?);
    if low > high {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("low_threshold ({low}) must not be above high_threshold ({high})"),
        ));
    }
    if low <= 0.0 {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("low_threshold must be positive, got {low}"),
        ));
    }
    if c != 1 && c != 3 {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("Canny takes an image of 1 or 3 channels, got {c}"),
        ));
    }
    if h < 3 || w < 3 {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "Canny needs an image of at least 3x3 pixels (its blur mirrors 2), got {w}x{h}"
            ),
        ));
    }
    let mut out = Vec::with_capacity(b * h * w * 3);
    for pixels in image.data().chunks_exact(h * w * c) {
        let gray: Vec<f32> = if c == 3 { grayscale(pixels) } else { pixels.to_vec() };
        let (_, edges) = canny(&gray, h, w, low as f32, high as f32);
        out.extend(edges.into_iter().flat_map(|e| [e, e, e]));
    }
    Ok(vec![Value::Image(tensor(vec![b, h, w, 3], out)?)])
}

/// kornia's `rgb_to_grayscale` of interleaved RGB pixels: `r · 0.299 + g · 0.587 + b · 0.114` in f32, summed in
/// that order.
fn grayscale(pixels: &[f32]) -> Vec<f32> {
    let (wr, wg, wb) = (0.299f32, 0.587f32, 0.114f32);
    pixels.chunks_exact(3).map(|p| p[0] * wr + p[1] * wg + p[2] * wb).collect()
}

/// The `(dy, dx)` of the neighbour in direction `k` (0: right, then 45° steps towards down), as kornia numbers
/// them.
const DIRECTIONS: [(isize, isize); 8] =
    [(0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1)];

/// kornia's `canny` on one grey `h × w` image (both at least 3) with its defaults (a 5 × 5 Gaussian blur of
/// sigma 1, mirrored at the borders; the unnormalised Sobel gradient, borders replicated; eps 1e-6; hysteresis):
/// the gradient magnitude after non-maximum suppression, and the edges, 0 or 1.
fn canny(gray: &[f32], h: usize, w: usize, low: f32, high: f32) -> (Vec<f32>, Vec<f32>) {
    let blurred = gaussian_blur_5(gray, h, w);
    let at = |y: isize, x: isize| blurred[replicate(y, h) * w + replicate(x, w)];
    let eps = 1e-6f32;
    // The magnitude of a pixel beyond the image, where kornia pads the gradients with zeros.
    let border = eps.sqrt();
    let n = h * w;
    let (mut magnitude, mut angle) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for y in 0..h as isize {
        for x in 0..w as isize {
            // The Sobel taps in the kernels' row-major order (the zero taps add nothing).
            let gx = -at(y - 1, x - 1) + at(y - 1, x + 1) - 2.0 * at(y, x - 1) + 2.0 * at(y, x + 1)
                - at(y + 1, x - 1)
                + at(y + 1, x + 1);
            let gy = -at(y - 1, x - 1) - 2.0 * at(y - 1, x) - at(y - 1, x + 1)
                + at(y + 1, x - 1)
                + 2.0 * at(y + 1, x)
                + at(y + 1, x + 1);
            magnitude.push((gx * gx + gy * gy + eps).sqrt());
            // The direction rounded to a multiple of 45°, as an index 0..8 of DIRECTIONS.
            let octant = (gy.atan2(gx) * (4.0 / std::f64::consts::PI) as f32).round_ties_even();
            angle.push((octant as i64).rem_euclid(8) as usize);
        }
    }
    let neighbour = |y: usize, x: usize, k: usize| {
        let (dy, dx) = DIRECTIONS[k];
        let (ny, nx) = (y as isize + dy, x as isize + dx);
        if ny < 0 || nx < 0 || ny >= h as isize || nx >= w as isize {
            border
        } else {
            magnitude[ny as usize * w + nx as usize]
        }
    };
    // Right (0) and down (2) keep a pixel that ties with its neighbour there; the other directions need more.
    let beats = |m: f32, other: f32, k: usize| m > other || ((k == 0 || k == 2) && m == other);
    let mut kept = vec![0.0f32; n];
    let mut state = vec![0u8; n];
    for y in 0..h {
        for x in 0..w {
            let i = y * w + x;
            let (m, forward) = (magnitude[i], angle[i]);
            let backward = (forward + 4) % 8;
            let is_max = beats(m, neighbour(y, x, forward), forward)
                && beats(m, neighbour(y, x, backward), backward)
                && m > border;
            kept[i] = if is_max { m } else { 0.0 };
            state[i] = u8::from(kept[i] > low) + u8::from(kept[i] > high);
        }
    }
    // Hysteresis: kornia repeats "a weak pixel next to a strong one becomes strong" until nothing changes; that
    // ends with every weak pixel strong that a chain of weak pixels joins to a strong one (8-connected).
    let mut stack: Vec<usize> = (0..n).filter(|&i| state[i] == 2).collect();
    while let Some(i) = stack.pop() {
        let (y, x) = ((i / w) as isize, (i % w) as isize);
        for (dy, dx) in DIRECTIONS {
            let (ny, nx) = (y + dy, x + dx);
            if ny < 0 || nx < 0 || ny >= h as isize || nx >= w as isize {
                continue;
            }
            let j = ny as usize * w + nx as usize;
            if state[j] == 1 {
                state[j] = 2;
                stack.push(j);
            }
        }
    }
    let edges = state.iter().map(|&s| if s == 2 { 1.0 } else { 0.0 }).collect();
    (kept, edges)
}

/// kornia's `gaussian_blur2d(image, (5, 5), (1, 1))` of one grey `h × w` image: rows, then columns, each with
/// the five taps of `exp(-x² / 2)` normalised to sum 1, mirrored at the borders.
fn gaussian_blur_5(gray: &[f32], h: usize, w: usize) -> Vec<f32> {
    let taps = [-2.0f32, -0.5, 0.0, -0.5, -2.0].map(f32::exp);
    let sum = taps.iter().fold(0.0f32, |acc, &t| acc + t);
    let taps = taps.map(|t| t / sum);
    let pass = |src: &[f32], along_rows: bool| -> Vec<f32> {
        let mut out = vec![0.0f32; h * w];
        for y in 0..h {
            for x in 0..w {
                out[y * w + x] = taps.iter().enumerate().fold(0.0f32, |acc, (k, &t)| {
                    let offset = k as isize - 2;
                    let v = if along_rows {
                        src[y * w + reflect(x as isize + offset, w)]
                    } else {
                        src[reflect(y as isize + offset, h) * w + x]
                    };
                    acc + t * v
                });
            }
        }
        out
    };
    pass(&pass(gray, true), false)
}

#[cfg(test)]
mod tests {
    //! Kiln's filters against ComfyUI's own nodes (kornia 0.9.0, torch 2.15 on the CPU), as
    //! scripts/reference/canny.py recorded them.

    use super::*;
    use crate::tensor::Tensor;
    use serde_json::Value as Json;

    fn run_node(name: &str, inputs: Vec<(&str, crate::value::Value)>) -> Tensor {
        use crate::nodes::Node;
        let node = nodes().into_iter().find(|n| n.spec().name == name).expect("the node");
        crate::fixtures::node_tensors(&node, inputs).remove(0)
    }

    /// `scripts/reference/image_filters.py`'s record of ComfyUI's ImageSharpen and ImageAddNoise.
    #[test]
    fn sharpen_and_noise_are_comfyuis() {
        use crate::value::Value as V;
        let io = crate::fixtures::tensors("image_filters/io.safetensors");
        let image = || V::Image(io["image"].clone());
        for (radius, sigma, alpha) in [(1, 1.0, 1.0), (3, 2.5, 0.4), (2, 0.5, 5.0)] {
            let got = run_node(
                "ImageSharpen",
                vec![
                    ("image", image()),
                    ("sharpen_radius", V::Int(radius)),
                    ("sigma", V::Float(sigma)),
                    ("alpha", V::Float(alpha)),
                ],
            );
            let key = format!("sharpen.{radius}.{sigma:?}.{alpha:?}");
            crate::fixtures::assert_within(&key, got.data(), io[&key].data(), 1e-5);
        }
        for (seed, strength) in [(0u64, 0.5), (123_456_789, 0.2), (u64::MAX, 1.0)] {
            let inputs = vec![
                ("image", image()),
                ("seed", V::Int(seed as i64)),
                ("strength", V::Float(strength)),
            ];
            let key = format!("noise.{seed}.{strength:?}");
            crate::fixtures::assert_within(
                &key,
                run_node("ImageAddNoise", inputs).data(),
                io[&key].data(),
                1e-6,
            );
        }
    }

    /// The fixture scripts/reference/canny.py wrote.
    fn fixture() -> Json {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/canny/cases.json");
        let text = std::fs::read_to_string(&path).expect("the canny fixture");
        serde_json::from_str(&text).expect("JSON")
    }

    /// A JSON array of numbers as `T`s.
    fn numbers<T>(value: &Json, f: impl Fn(&Json) -> Option<T>) -> Vec<T> {
        value.as_array().expect("an array").iter().map(|v| f(v).expect("a number")).collect()
    }

    /// f32s from their bit patterns.
    fn floats(value: &Json) -> Vec<f32> {
        numbers(value, |v| v.as_u64().map(|b| f32::from_bits(b as u32)))
    }

    /// The fixture's input image, `pixel / 255` in f32 as LoadImage makes it.
    fn input_image(fixture: &Json) -> Tensor {
        let shape = numbers(&fixture["image"]["shape"], |v| v.as_u64().map(|v| v as usize));
        let pixels = numbers(&fixture["image"]["pixels"], |v| v.as_u64().map(|p| p as f32 / 255.0));
        Tensor::new(shape, pixels).expect("shape")
    }

    /// The one output image of a filter node run on `inputs`.
    fn run(
        node: fn(&Inputs) -> Result<Vec<Value>, NodeError>,
        inputs: Vec<(&str, Value)>,
    ) -> Tensor {
        let inputs = Inputs::from_values(inputs.into_iter().map(|(k, v)| (k.to_owned(), v)));
        match node(&inputs).expect("runs").as_slice() {
            [Value::Image(t)] => t.clone(),
            other => panic!("not one image: {other:?}"),
        }
    }

    #[test]
    fn canny_matches_comfyui_and_kornia() {
        let fixture = fixture();
        let image = input_image(&fixture);
        let (b, h, w, _) = dims(&image).expect("an image");
        for case in fixture["canny"].as_array().expect("cases") {
            let (low, high) =
                (case["low"].as_f64().expect("low"), case["high"].as_f64().expect("high"));
            let out = run(
                canny_node,
                vec![
                    ("image", Value::Image(image.clone())),
                    ("low_threshold", Value::Float(low)),
                    ("high_threshold", Value::Float(high)),
                ],
            );
            assert_eq!(out.shape(), &[b, h, w, 3]);
            let expected = numbers(&case["edges"], |v| v.as_u64().map(|e| e as f32));
            let got: Vec<f32> = out.data().chunks_exact(3).map(|p| p[0]).collect();
            assert!(out.data().chunks_exact(3).all(|p| p[0] == p[1] && p[1] == p[2]));
            let differ: Vec<usize> = (0..got.len()).filter(|&i| got[i] != expected[i]).collect();
            assert!(differ.is_empty(), "{low}/{high}: edges differ at {differ:?}");

            // kornia's magnitude after non-maximum suppression, which ComfyUI drops, within f32 noise.
            let magnitude = floats(&case["magnitude_bits"]);
            for (i, pixels) in image.data().chunks_exact(h * w * 3).enumerate() {
                let (kept, _) = canny(&grayscale(pixels), h, w, low as f32, high as f32);
                for (j, (a, e)) in kept.iter().zip(&magnitude[i * h * w..]).enumerate() {
                    assert!((a - e).abs() <= 1e-5, "{low}/{high}: magnitude {i}/{j}: {a} vs {e}");
                }
            }
        }
    }

    #[test]
    fn image_blur_matches_comfyui() {
        let fixture = fixture();
        let image = input_image(&fixture);
        for case in fixture["blur"].as_array().expect("cases") {
            let radius = case["blur_radius"].as_i64().expect("radius");
            let sigma = case["sigma"].as_f64().expect("sigma");
            let out = run(
                image_blur,
                vec![
                    ("image", Value::Image(image.clone())),
                    ("blur_radius", Value::Int(radius)),
                    ("sigma", Value::Float(sigma)),
                ],
            );
            assert_eq!(out.shape(), image.shape());
            let expected = floats(&case["output_bits"]);
            let worst =
                out.data().iter().zip(&expected).map(|(a, e)| (a - e).abs()).fold(0.0, f32::max);
            assert!(worst <= 1e-6, "radius {radius}, sigma {sigma}: off by {worst}");
        }
    }

    #[test]
    fn blur_kernels_sum_to_one_and_peak_in_the_middle() {
        for (size, sigma) in [(3, 1.0), (5, 0.1), (63, 10.0)] {
            let kernel = gaussian::kernel(size, sigma);
            let sum: f32 = kernel.iter().sum();
            assert!((sum - 1.0).abs() < 1e-5, "{size}: {sum}");
            let middle = kernel[size * size / 2];
            assert!(kernel.iter().all(|&v| v <= middle), "{size}");
        }
    }

    #[test]
    fn filters_refuse_what_comfyui_cannot_compute() {
        let image = |c: usize, h: usize| Value::Image(Tensor::full(vec![1, h, 4, c], 0.5));
        let canny = |image: Value, low: f64, high: f64| {
            let inputs = Inputs::from_values([
                ("image".to_owned(), image),
                ("low_threshold".to_owned(), Value::Float(low)),
                ("high_threshold".to_owned(), Value::Float(high)),
            ]);
            canny_node(&inputs).map(|_| ()).map_err(|e| e.kind)
        };
        assert_eq!(canny(image(3, 4), 0.4, 0.8), Ok(()));
        assert_eq!(canny(image(3, 4), 0.8, 0.4), Err(ErrorKind::InvalidValue));
        assert_eq!(canny(image(4, 4), 0.4, 0.8), Err(ErrorKind::InvalidValue));
        assert_eq!(canny(image(1, 2), 0.4, 0.8), Err(ErrorKind::InvalidValue));
        let blur = Inputs::from_values([
            ("image".to_owned(), image(3, 4)),
            ("blur_radius".to_owned(), Value::Int(4)),
            ("sigma".to_owned(), Value::Float(1.0)),
        ]);
        assert_eq!(image_blur(&blur).map(|_| ()).map_err(|e| e.kind), Err(ErrorKind::InvalidValue));
    }

    #[test]
    fn a_one_channel_image_skips_the_grey_conversion() {
        // A vertical step: the edge is kept on the brighter side's left neighbour column only.
        let (h, w) = (6, 8);
        let gray: Vec<f32> = (0..h * w).map(|i| if i % w >= 4 { 1.0 } else { 0.0 }).collect();
        let out = run(
            canny_node,
            vec![
                ("image", Value::Image(Tensor::new(vec![1, h, w, 1], gray).expect("shape"))),
                ("low_threshold", Value::Float(0.4)),
                ("high_threshold", Value::Float(0.8)),
            ],
        );
        let columns: Vec<usize> =
            (0..w).filter(|&x| (0..h).all(|y| out.data()[(y * w + x) * 3] == 1.0)).collect();
        assert_eq!(columns, [3]);
    }
}
