//! `GLSLShader` (`comfy_extras.nodes_glsl`): a GLSL ES fragment shader drawn over images. ComfyUI renders it
//! with OpenGL ES through ANGLE; Kiln interprets it on the CPU (`crate::shader`), with the same inputs bound
//! the same way: `u_image0`–`u_image4`, `u_float0`–`u_float19`, `u_int0`–`u_int19`, `u_bool0`–`u_bool9`,
//! `u_curve0`–`u_curve3` (256-entry lookup tables), `u_resolution` and, with `#pragma passes N`, `u_pass`.
//! As in ComfyUI, each kind's connected inputs are bound in order, without gaps (a lone `u_float2` input
//! becomes `u_float0`), and every image of the batch is drawn in turn.

use std::sync::Arc;

use super::curve::{Curve, curve_input};
use super::files::save_temp_pngs;
use super::image::dims;
use super::mask::tensor;
use crate::nodes::{
    Context, DYNAMIC_COMBO, DynamicOption, ErrorKind, InputDef, Inputs, Node, NodeError,
    NodeResult, NodeSpec, OutputDef, UiOutput,
};
use crate::shader::{Bindings, MAX_OUTPUTS, Shader, Texture, Uniform};
use crate::tensor::Tensor;
use crate::value::Value;

/// ComfyUI's `DEFAULT_FRAGMENT_SHADER`: the first image, copied.
const DEFAULT_SHADER: &str = "#version 300 es\nprecision highp float;\n\nuniform sampler2D u_image0;\nuniform vec2 u_resolution;\n\nin vec2 v_texCoord;\nlayout(location = 0) out vec4 fragColor0;\n\nvoid main() {\n    fragColor0 = texture(u_image0, v_texCoord);\n}\n";

const MAX_IMAGES: usize = 5;
const MAX_UNIFORMS: usize = 20;
const MAX_BOOLS: usize = 10;
const MAX_CURVES: usize = 4;

/// `nodes.MAX_RESOLUTION`.
const MAX_RESOLUTION: i64 = 16384;

/// The lookup-table size of a curve (`CurveInput.to_lut()`'s default).
const LUT_SIZE: usize = 256;

pub(super) struct GlslShader(Arc<NodeSpec>);

impl GlslShader {
    pub(super) fn new() -> GlslShader {
        let size = |name| InputDef::int(name, 512, 1, MAX_RESOLUTION);
        let options = [
            DynamicOption { key: "from_input", required: Vec::new(), optional: Vec::new() },
            DynamicOption {
                key: "custom",
                required: vec![size("width"), size("height")],
                optional: Vec::new(),
            },
        ];
        let forced = |def: InputDef| def.option("forceInput", true);
        let tooltips: Vec<String> = (0..MAX_OUTPUTS)
            .map(|i| {
                format!(
                    "Available via layout(location = {i}) out vec4 fragColor{i} in the shader code"
                )
            })
            .collect();
        let mut spec = NodeSpec::new("GLSLShader", "GLSL Shader", "image/shader")
            .python_module("comfy_extras.nodes_glsl")
            .v3()
            .experimental()
            .intermediate_output()
            .description(
                "Apply GLSL ES fragment shaders to images. u_resolution (vec2) is always available.",
            )
            .input(
                InputDef::bare("fragment_shader", "STRING")
                    .tooltip("GLSL fragment shader source code (GLSL ES 3.00 / WebGL 2.0 compatible)")
                    .option("default", DEFAULT_SHADER)
                    .option("multiline", true),
            )
            .dynamic_combo_of(
                InputDef::bare("size_mode", DYNAMIC_COMBO).tooltip(
                    "Output size: 'from_input' uses first input image dimensions, 'custom' allows manual size",
                ),
                &options,
            )
            .described_autogrow_prefix(
                "images",
                &format!("Images are available as u_image0-{} (sampler2D) in the shader code", MAX_IMAGES - 1),
                InputDef::typed("image", "IMAGE"),
                "image",
                (1, MAX_IMAGES),
            )
            .described_autogrow_prefix(
                "floats",
                &format!("Floats are available as u_float0-{} in the shader code", MAX_UNIFORMS - 1),
                forced(InputDef::bare("float", "FLOAT").option("default", 0.0)),
                "u_float",
                (0, MAX_UNIFORMS),
            )
            .described_autogrow_prefix(
                "ints",
                &format!("Ints are available as u_int0-{} in the shader code", MAX_UNIFORMS - 1),
                forced(InputDef::bare("int", "INT").option("default", 0)),
                "u_int",
                (0, MAX_UNIFORMS),
            )
            .described_autogrow_prefix(
                "bools",
                &format!("Booleans are available as u_bool0-{} (bool) in the shader code", MAX_BOOLS - 1),
                forced(InputDef::bare("bool", "BOOLEAN").option("default", false)),
                "u_bool",
                (0, MAX_BOOLS),
            )
            .described_autogrow_prefix(
                "curves",
                &format!(
                    "Curves are available as u_curve0-{} (sampler2D, 1D LUT) in the shader code. Sample \
                     with texture(u_curve0, vec2(x, 0.5)).r",
                    MAX_CURVES - 1
                ),
                forced(curve_input("curve")),
                "u_curve",
                (0, MAX_CURVES),
            );
        for (i, tooltip) in tooltips.iter().enumerate() {
            spec =
                spec.output(OutputDef::new("IMAGE").named(&format!("IMAGE{i}")).tooltip(tooltip));
        }
        GlslShader(Arc::new(spec))
    }
}

/// The values of an autogrow input's connected entries `group.prefix0` … in order (ComfyUI's
/// `[v for v in group.values()]`: only the entries the prompt holds, without gaps).
fn grown<'a>(inputs: &'a Inputs, group: &str, prefix: &str, max: usize) -> Vec<&'a Value> {
    grown_named(inputs, group, prefix, max).into_iter().map(|(_, v)| v).collect()
}

/// [`grown`] with each entry's input name.
fn grown_named<'a>(
    inputs: &'a Inputs,
    group: &str,
    prefix: &str,
    max: usize,
) -> Vec<(String, &'a Value)> {
    (0..max)
        .filter_map(|i| {
            let name = format!("{group}.{prefix}{i}");
            inputs.get(&name).map(|v| (name, v))
        })
        .collect()
}

impl Node for GlslShader {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let images: Vec<&Tensor> = grown(inputs, "images", "image", MAX_IMAGES)
            .into_iter()
            .filter_map(|v| match v {
                Value::Image(t) => Some(t),
                _ => None,
            })
            .collect();
        let Some(first) = images.first() else {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                "At least one input image is required",
            ));
        };
        let mut uniforms = Vec::new();
        let number = |v: &Value| match v {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        };
        for (i, v) in grown(inputs, "floats", "u_float", MAX_UNIFORMS).into_iter().enumerate() {
            let f = number(v).unwrap_or(0.0) as f32;
            uniforms.push((format!("u_float{i}"), Uniform::Float(f)));
        }
        for (i, v) in grown(inputs, "ints", "u_int", MAX_UNIFORMS).into_iter().enumerate() {
            let n = number(v).unwrap_or(0.0) as i32;
            uniforms.push((format!("u_int{i}"), Uniform::Int(n)));
        }
        for (i, v) in grown(inputs, "bools", "u_bool", MAX_BOOLS).into_iter().enumerate() {
            let b = matches!(v, Value::Bool(true));
            uniforms.push((format!("u_bool{i}"), Uniform::Int(i32::from(b))));
        }
        let mut curves = Vec::new();
        for (name, v) in grown_named(inputs, "curves", "u_curve", MAX_CURVES) {
            let Value::Json(json) = v else { continue };
            if json.is_null() {
                continue;
            }
            let curve = Curve::from_json(json, &name)?;
            let lut: Vec<f32> = curve.lut(LUT_SIZE).into_iter().map(|v| v as f32).collect();
            curves.push((format!("u_curve{}", curves.len()), Texture::lookup_table(&lut)));
        }

        let (batch, first_h, first_w, _) = dims(first)?;
        let (width, height) = if inputs.string("size_mode")? == "custom" {
            let side = |name: &str| -> Result<usize, NodeError> {
                let v = inputs.int(name)?;
                usize::try_from(v).ok().filter(|&v| v >= 1).ok_or_else(|| {
                    NodeError::of_kind(
                        ErrorKind::InvalidValue,
                        format!("{name} must be at least 1"),
                    )
                })
            };
            (side("size_mode.width")?, side("size_mode.height")?)
        } else {
            (first_w, first_h)
        };
        let shader = Shader::compile(inputs.string("fragment_shader")?)
            .map_err(|e| NodeError::new(format!("Shader compilation failed:\n{e}")))?;

        let mut shaped = Vec::with_capacity(images.len());
        for (i, image) in images.iter().enumerate() {
            let (b, h, w, c) = dims(image)?;
            if b < batch {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!("image {i} holds {b} images; the first holds {batch}"),
                ));
            }
            if c == 0 || c > 4 {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!("image {i} has {c} channels; a texture takes 1 to 4"),
                ));
            }
            shaped.push((h, w, c));
        }
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        let stop = || ctx.check_interrupt().is_err();
        let mut outputs: Vec<Vec<f32>> =
            (0..MAX_OUTPUTS).map(|_| Vec::with_capacity(batch * height * width * 4)).collect();
        for b in 0..batch {
            let textures: Vec<Texture> = images
                .iter()
                .zip(&shaped)
                .map(|(image, &(h, w, c))| {
                    let per = h * w * c;
                    Texture::from_image(w, h, c, &image.data()[b * per..(b + 1) * per])
                })
                .collect();
            let mut bound: Vec<(String, &Texture)> =
                textures.iter().enumerate().map(|(i, t)| (format!("u_image{i}"), t)).collect();
            bound.extend(curves.iter().map(|(name, t)| (name.clone(), t)));
            let bindings =
                Bindings { textures: bound, uniforms: uniforms.clone(), unit0: &textures[0] };
            let drawn = shader
                .render(width, height, &bindings, threads, &stop)
                .map_err(|e| NodeError::new(format!("the shader failed: {e}")))?;
            let Some(drawn) = drawn else {
                ctx.check_interrupt()?;
                return Err(NodeError::of_kind(ErrorKind::Interrupted, "interrupted"));
            };
            for (k, out) in outputs.iter_mut().enumerate() {
                match drawn.get(k) {
                    Some(image) => out.extend(image.iter().flatten()),
                    None => out.resize(out.len() + height * width * 4, 0.0),
                }
            }
            ctx.progress((b + 1) as f64, batch as f64);
        }
        let values = outputs
            .into_iter()
            .map(|data| tensor(vec![batch, height, width, 4], data).map(Value::Image))
            .collect::<Result<Vec<_>, _>>()?;

        let mut ui = UiOutput::default();
        let mut inputs_shown = Vec::new();
        for image in &images {
            inputs_shown.extend(save_temp_pngs(image, "GLSLShader_input", ctx)?);
        }
        ui.named.push(("input_images".to_owned(), inputs_shown));
        if let Value::Image(first_output) = &values[0] {
            ui.images = save_temp_pngs(first_output, "GLSLShader_output", ctx)?;
        }
        let mut result = NodeResult::values(values);
        result.ui = Some(ui);
        Ok(result)
    }
}
