//! `ContextWindowsManual` and `WanContextWindowsManual` (`comfy_extras.nodes_context_windows`): the model with
//! context windows, which the sampler reads (`crate::models::context_windows`).

use std::sync::Arc;

use super::pure::Pure;
use crate::models::DiffusionModel;
use crate::models::context_windows::{ContextWindows, Fuse, Schedule, parse_index_list};
use crate::nodes::{ErrorKind, InputDef, Inputs, NodeError, NodeSpec, OutputDef};
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
        let list = |name: &str| -> Result<Vec<usize>, NodeError> {
            parse_index_list(inputs.string(name)?).map_err(|e| invalid(format!("{name}: {e}")))
        };
        let windows = ContextWindows {
            length: count(inputs, "context_length")?.max(1),
            overlap: count(inputs, "context_overlap")?,
            dim: count(inputs, "dim")?,
            cond_retain: list("cond_retain_index_list")?,
            latent_retain: list("latent_retain_index_list")?,
            causal_fix: inputs.bool("causal_window_fix")?,
            ..shared_settings(inputs)?
        };
        with_windows(inputs, windows)
    })
}

/// `WanContextWindowsManual`: `ContextWindowsManual` in a Wan video's pixel frames (a window of `4n + 1` frames
/// is n + 1 latent frames, an overlap of k frames ⌊k / 4⌋), on the latent's frames (dimension 2), the first
/// frame's conditioning retained in every window when asked.
pub(super) fn wan_context_windows_manual() -> Pure {
    let advanced_int = |name: &str, tooltip: &str| {
        InputDef::bare(name, "INT").tooltip(tooltip).option("advanced", true)
    };
    let boolean = |name: &str, tooltip: &str, default: bool| {
        InputDef::bare(name, "BOOLEAN").tooltip(tooltip).option("default", default)
    };
    let spec = NodeSpec::new("WanContextWindowsManual", "Wan Context Windows", "model/patch/wan")
        .python_module("comfy_extras.nodes_context_windows")
        .v3()
        .experimental()
        .description("Set context windows for Wan-like models.")
        .input(
            InputDef::typed("model", "MODEL")
                .tooltip("The model to apply context windows to during sampling."),
        )
        .input(
            InputDef::bare("context_length", "INT")
                .tooltip("The length of the context window in real frames. Must be 4*n + 1.")
                .option("default", 81)
                .option("min", 1)
                .option("max", 16384)
                .option("step", 4),
        )
        .input(
            InputDef::bare("context_overlap", "INT")
                .tooltip("The overlap of the context window in real frames.")
                .option("default", 30)
                .option("min", 0),
        )
        .input(InputDef::v3_combo_described(
            "context_schedule",
            &SCHEDULES,
            "Step-dependent scheduling algorithm for context windows.",
            "standard_uniform",
        ))
        .input(
            advanced_int(
                "context_stride",
                "The stride of the context window; only applicable to uniform schedules.",
            )
            .option("default", 1)
            .option("min", 1),
        )
        .input(
            InputDef::bare("closed_loop", "BOOLEAN")
                .tooltip(
                    "Whether to close the context window loop; only applicable to looped schedules.",
                )
                .option("advanced", true)
                .option("default", false),
        )
        .input(InputDef::v3_combo_described(
            "fuse_method",
            &FUSES,
            "The method to use to fuse the context windows.",
            "pyramid",
        ))
        .input(
            InputDef::bare("freenoise", "BOOLEAN")
                .tooltip("Whether to apply FreeNoise noise shuffling, improves window blending.")
                .option("advanced", true)
                .option("default", true),
        )
        .input(boolean(
            "retain_first_frame",
            "Retain the first I2V frame in every context window (may help retain initial reference).",
            false,
        ))
        .input(
            InputDef::bare("split_conds_to_windows", "BOOLEAN")
                .tooltip(
                    "Whether to split multiple conditionings (created by ConditionCombine) to each window \
                     based on region index.",
                )
                .option("advanced", true)
                .option("default", false),
        )
        .output(
            OutputDef::new("MODEL").tooltip("The model with context windows applied during sampling."),
        );
    Pure::new(spec, |inputs| {
        let frames = count(inputs, "context_length")?;
        let windows = ContextWindows {
            length: (frames.saturating_sub(1) / 4 + 1).max(1),
            overlap: count(inputs, "context_overlap")? / 4,
            dim: 2,
            cond_retain: if inputs.bool("retain_first_frame")? { vec![0] } else { Vec::new() },
            latent_retain: Vec::new(),
            causal_fix: true,
            ..shared_settings(inputs)?
        };
        with_windows(inputs, windows)
    })
}

fn invalid(message: String) -> NodeError {
    NodeError::of_kind(ErrorKind::InvalidValue, message)
}

/// The non-negative integer input `name`.
fn count(inputs: &Inputs, name: &str) -> Result<usize, NodeError> {
    usize::try_from(inputs.int(name)?).map_err(|_| invalid(format!("{name} must not be negative")))
}

/// The settings both nodes read alike: the schedule, its stride and loop, the fuse method, FreeNoise and the
/// prompts' split (the rest left to each node).
fn shared_settings(inputs: &Inputs) -> Result<ContextWindows, NodeError> {
    let schedule = inputs.string("context_schedule")?;
    let fuse = inputs.string("fuse_method")?;
    Ok(ContextWindows {
        schedule: Schedule::from_name(schedule)
            .ok_or_else(|| invalid(format!("Unknown context_schedule '{schedule}'.")))?,
        fuse: Fuse::from_name(fuse)
            .ok_or_else(|| invalid(format!("Unknown fuse_method '{fuse}'.")))?,
        length: 1,
        overlap: 0,
        stride: count(inputs, "context_stride")?.max(1),
        closed_loop: inputs.bool("closed_loop")?,
        dim: 0,
        freenoise: inputs.bool("freenoise")?,
        cond_retain: Vec::new(),
        split_conds: inputs.bool("split_conds_to_windows")?,
        latent_retain: Vec::new(),
        causal_fix: true,
    })
}

/// The node's `MODEL` with `windows`.
fn with_windows(inputs: &Inputs, windows: ContextWindows) -> Result<Vec<Value>, NodeError> {
    let model = inputs.model("model")?;
    let patched =
        DiffusionModel { context_windows: Some(Arc::new(windows)), ..model.as_ref().clone() };
    Ok(vec![Value::Model(Arc::new(patched))])
}
