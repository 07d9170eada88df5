//! `GLSLShader`, `CurveEditor` and `ImageHistogram` in a prompt, as the template `basic_image_color_adjustment`
//! wires them: a histogram behind a curve, the curve a shader's lookup table, a primitive its uniform.

use kiln_engine::cache::CachePolicy;
use kiln_engine::exec::Outcome;
use kiln_engine::graph::NodeId;
use kiln_engine::nodes::FileKind;
use serde_json::json;

use crate::harness::Harness;

/// The red channel through the curve, green scaled by a uniform, blue kept, alpha one half; the second output
/// the texture coordinate.
const SHADER: &str = "#version 300 es
precision highp float;
uniform sampler2D u_image0;
uniform sampler2D u_curve0;
uniform float u_float0;
in vec2 v_texCoord;
layout(location = 0) out vec4 fragColor0;
layout(location = 1) out vec4 fragColor1;
void main() {
    vec4 c = texture(u_image0, v_texCoord);
    fragColor0 = vec4(texture(u_curve0, vec2(c.r, 0.5)).r, c.g * u_float0, c.b, 0.5);
    fragColor1 = vec4(v_texCoord, 0.0, 1.0);
}
";

#[test]
fn a_shader_draws_each_image_through_a_curve_and_a_uniform() {
    let mut h = Harness::new(CachePolicy::Classic);
    let ran = h.run(json!({
        // 0x336699: red 0.2, green 0.4, blue 0.6.
        "1": {"class_type": "EmptyImage", "inputs": {"width": 6, "height": 4, "batch_size": 2, "color": 0x336699}},
        "2": {"class_type": "ImageHistogram", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "CurveEditor", "inputs": {
            "curve": {"points": [[1.0, 0.5], [0.0, 0.0]], "interpolation": "linear"},
            "histogram": ["2", 2]}},
        "4": {"class_type": "PrimitiveFloat", "inputs": {"value": 0.25}},
        // The float on u_float1 alone is bound as u_float0, as ComfyUI binds the connected ones in order.
        "5": {"class_type": "GLSLShader", "inputs": {
            "fragment_shader": SHADER, "size_mode": "from_input", "images.image0": ["1", 0],
            "floats.u_float1": ["4", 0], "curves.u_curve0": ["3", 0]}},
        "6": {"class_type": "PreviewAny", "inputs": {"source": ["5", 1]}},
        "7": {"class_type": "SaveImage", "inputs": {"images": ["5", 0], "filename_prefix": "shaded"}},
        "8": {"class_type": "GLSLShader", "inputs": {
            "fragment_shader": SHADER, "size_mode": "custom", "size_mode.width": 3, "size_mode.height": 2,
            "images.image0": ["1", 0]}},
        "9": {"class_type": "PreviewAny", "inputs": {"source": ["8", 3]}},
        "10": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.summary.outcome);
    assert_eq!(
        ran.text("6"),
        ["tensor[2, 4, 6, 4]"],
        "four RGBA outputs, one per image of the batch"
    );
    assert_eq!(ran.text("9"), ["tensor[2, 2, 3, 4]"], "the custom size; an unused output is black");
    let curve: serde_json::Value = serde_json::from_str(&ran.text("10").concat()).expect("JSON");
    assert_eq!(curve["points"], json!([[0.0, 0.0], [1.0, 0.5]]), "the points sorted by x");

    let saved = image::open(h.roots.output.join("shaded_00002_.png")).expect("saved").to_rgba8();
    // Curve(0.2) = 0.1 (a lookup table sampled linearly); 0.4 × 0.25 = 0.1; 0.6; 0.5.
    let [r, g, b, a] = saved.get_pixel(5, 3).0;
    assert!((i32::from(r) - 25).abs() <= 1 && (i32::from(g) - 25).abs() <= 1, "{r} {g}");
    assert_eq!((b, a), (153, 127));

    let histogram = &ran.summary.outputs[&NodeId::from("3")].data;
    assert_eq!(histogram.len(), 1);
    assert_eq!(histogram[0].0, "histogram");
    let bins = histogram[0].1.as_array().expect("a list");
    assert_eq!(bins.len(), 256);
    assert_eq!(bins[51], json!(24), "every red value of the first image is 0.2 · 255 = 51");

    let shown = &ran.summary.outputs[&NodeId::from("5")];
    assert_eq!(shown.named.len(), 1);
    assert_eq!(shown.named[0].0, "input_images");
    assert_eq!(shown.named[0].1.len(), 2);
    let names: Vec<&str> = shown.images.iter().map(|f| f.filename.as_str()).collect();
    assert_eq!(names, ["GLSLShader_output_00001_.png", "GLSLShader_output_00002_.png"]);
    assert!(shown.images.iter().all(|f| f.kind == FileKind::Temp));
}

#[test]
fn a_shader_that_does_not_compile_fails_naming_the_problem() {
    let mut h = Harness::new(CachePolicy::Classic);
    let source = "#version 300 es\nprecision highp float;\nout vec4 fragColor0;\nvoid main() { fragColor0 = nope; }\n";
    let ran = h.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 2, "height": 2, "batch_size": 1, "color": 0}},
        "2": {"class_type": "GLSLShader", "inputs": {
            "fragment_shader": source, "size_mode": "from_input", "images.image0": ["1", 0]}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }));
    let Outcome::Failed(failure) = &ran.summary.outcome else { panic!("must fail") };
    assert!(failure.message.starts_with("Shader compilation failed"), "{}", failure.message);
    assert!(failure.message.contains("`nope` is not declared"), "{}", failure.message);
}
