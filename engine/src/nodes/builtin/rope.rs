//! `ScaleROPE` (`comfy_extras.nodes_rope`): the model with its token positions scaled and shifted on each axis
//! (ComfyUI's `set_model_rope_options`). ChronoEdit's template stretches the time axis with it (`scale_t` 7),
//! so its two frames sit as far apart as a longer clip's ends.

use std::sync::Arc;

use kiln_models::RopeOptions;

use super::pure::Pure;
use crate::models::DiffusionModel;
use crate::nodes::{InputDef, NodeSpec, OutputDef};
use crate::value::Value;

/// The axes in the node's order: its inputs `scale_{axis}`, `shift_{axis}`, and the axis' index in
/// [`RopeOptions`] (t, y, x).
const AXES: [(&str, usize); 3] = [("x", 2), ("y", 1), ("t", 0)];

/// `ScaleROPE`.
pub(super) fn scale_rope() -> Pure {
    // ComfyUI serialises `advanced` first.
    let float = |name: String, default: f64, min: f64, max: f64| {
        InputDef::bare(&name, "FLOAT")
            .option("advanced", true)
            .option("default", default)
            .option("min", min)
            .option("max", max)
            .option("step", 0.1)
    };
    let mut spec = NodeSpec::new("ScaleROPE", "", "model/patch")
        .python_module("comfy_extras.nodes_rope")
        .v3()
        .experimental()
        .description("Scale and shift the ROPE of the model.")
        .input(InputDef::typed("model", "MODEL"));
    for (axis, _) in AXES {
        spec = spec.input(float(format!("scale_{axis}"), 1.0, 0.0, 100.0)).input(float(
            format!("shift_{axis}"),
            0.0,
            -256.0,
            256.0,
        ));
    }
    Pure::new(spec.output(OutputDef::new("MODEL")), |inputs| {
        let model = inputs.model("model")?;
        let mut rope = RopeOptions::default();
        for (axis, index) in AXES {
            rope.scale[index] = inputs.float(&format!("scale_{axis}"))?;
            rope.shift[index] = inputs.float(&format!("shift_{axis}"))?;
        }
        let patched = DiffusionModel { rope, ..model.as_ref().clone() };
        Ok(vec![Value::Model(Arc::new(patched))])
    })
}
