//! `ContextWindowsManual` (`comfy_extras.nodes_context_windows`): the model with context windows, which the
//! sampler reads (`crate::models::context_windows`).

use std::sync::Arc;

use super::pure::Pure;
use crate::models::DiffusionModel;
use crate::models::context_windows::{ContextWindows, Fuse, Schedule, parse_index_list};
use crate::nodes::{ErrorKind, InputDef, NodeError, NodeSpec, OutputDef};
use crate::value::Value;

/// The schedules and fuse methods, in ComfyUI's order.
const SCHEDULES: [&str; 4] = ["standard_static", "standard_uniform", "looped_uniform", "batched"];
const FUSES: [&str; 4] = ["pyramid", "relative", "flat", "overlap-linear"];

/// `ContextWindowsManual`.
pub(super) fn context_windows_manual() -> Pure {
    let int = |name: &str, tooltip: &str, default: i64, min: i64| {
        InputDef::bare(name, "INT").tooltip(tooltip).option("default", default).option("min", min)
    };
    let boolean = |name: &str, tooltip: &str, default: bool| {
        InputDef::bare(name, "BOOLEAN").tooltip(tooltip).option("default", default)
    };
    let string = |name: &str, tooltip: &str| {
        InputDef::bare(name, "STRING")
            .tooltip(tooltip)
            .option("default", "")
            .option("multiline", false)
    };
    let spec = NodeSpec::new("ContextWindowsManual", "Context Windows (Manual)", "model/patch")
        .python_module("comfy_extras.nodes_context_windows")
        .v3()
        .experimental()
        .description("Manually set context windows.")
        .input(
            InputDef::typed("model", "MODEL")
                .tooltip("The model to apply context windows to during sampling."),
        )
        .input(int("context_length", "The length of the context window.", 16, 1))
        .input(int("context_overlap", "The overlap of the context window.", 4, 0))
        .input(
            InputDef::v3_combo_described(
                "context_schedule",
                &SCHEDULES,
                "Step-dependent scheduling algorithm for context windows.",
                "standard_static",
            ),
        )
        .input(int(
            "context_stride",
            "The stride of the context window; only applicable to uniform schedules.",
            1,
            1,
        ))
        .input(boolean(
            "closed_loop",
            "Whether to close the context window loop; only applicable to looped schedules.",
            false,
        ))
        .input(
            InputDef::v3_combo_described(
                "fuse_method",
                &FUSES,
                "The method to use to fuse the context windows.",
                "pyramid",
            ),
        )
        .input(
            int("dim", "The dimension to apply the context windows to.", 0, 0).option("max", 5),
        )
        .input(boolean(
            "freenoise",
            "Whether to apply FreeNoise noise shuffling, improves window blending.",
            false,
        ))
        .input(string(
            "cond_retain_index_list",
            "List of latent indices to retain in the conditioning tensors for each window. For concat-style I2V \
             models (e.g. Wan I2V, HunyuanVideo I2V, Cosmos I2V, SVD) the encoded start image lives in the \
             c_concat conditioning channels; setting this to '0' will retain that start image content at \
             sub-pos 0 of every window.",
        ))
        .input(boolean(
            "split_conds_to_windows",
            "Whether to split multiple conditionings (created by ConditionCombine) to each window based on \
             region index.",
            false,
        ))
        .input(string(
            "latent_retain_index_list",
            "List of latent indices to retain in the noise latent itself for each window. Use for workflows \
             where reference content (e.g. a start image) lives directly in the noise latent rather than in \
             separate conditioning channels (e.g. inplace-style I2V like LTXV, AnimateDiff). Independent of \
             cond_retain_index_list.",
        ))
        .input(boolean(
            "causal_window_fix",
            "Whether to add a causal fix frame to non-0-indexed context windows.",
            true,
        ))
        .output(
            OutputDef::new("MODEL").tooltip("The model with context windows applied during sampling."),
        );
    Pure::new(spec, |inputs| {
        let invalid = |message: String| NodeError::of_kind(ErrorKind::InvalidValue, message);
        let count = |name: &str| -> Result<usize, NodeError> {
            usize::try_from(inputs.int(name)?)
                .map_err(|_| invalid(format!("{name} must not be negative")))
        };
        let list = |name: &str| -> Result<Vec<usize>, NodeError> {
            parse_index_list(inputs.string(name)?).map_err(|e| invalid(format!("{name}: {e}")))
        };
        let schedule = inputs.string("context_schedule")?;
        let fuse = inputs.string("fuse_method")?;
        let windows = ContextWindows {
            schedule: Schedule::from_name(schedule)
                .ok_or_else(|| invalid(format!("Unknown context_schedule '{schedule}'.")))?,
            fuse: Fuse::from_name(fuse)
                .ok_or_else(|| invalid(format!("Unknown fuse_method '{fuse}'.")))?,
            length: count("context_length")?.max(1),
            overlap: count("context_overlap")?,
            stride: count("context_stride")?.max(1),
            closed_loop: inputs.bool("closed_loop")?,
            dim: count("dim")?,
            freenoise: inputs.bool("freenoise")?,
            cond_retain: list("cond_retain_index_list")?,
            split_conds: inputs.bool("split_conds_to_windows")?,
            latent_retain: list("latent_retain_index_list")?,
            causal_fix: inputs.bool("causal_window_fix")?,
        };
        let model = inputs.model("model")?;
        let patched =
            DiffusionModel { context_windows: Some(Arc::new(windows)), ..model.as_ref().clone() };
        Ok(vec![Value::Model(Arc::new(patched))])
    })
}
