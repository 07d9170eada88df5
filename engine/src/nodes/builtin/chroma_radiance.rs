//! `ChromaRadianceOptions` (`comfy_extras.nodes_chroma_radiance`): the model with Chroma Radiance's call options
//! (the NeRF head's tile size, sequential text positions) set while σ is within a window.

use std::sync::Arc;

use kiln_models::chroma_radiance::RadianceOptions;

use super::pure::Pure;
use crate::models::{DiffusionModel, RadianceWindow};
use crate::nodes::{InputDef, NodeError, NodeSpec, OutputDef};
use crate::value::Value;

/// `ChromaRadianceOptions`: with no option set (tile size -1, sequential text ids off) the model as it is, as
/// ComfyUI returns it; otherwise the model with one more [`RadianceWindow`].
pub(super) fn options_node() -> Pure {
    // Options in the order ComfyUI writes them: the tooltip, `advanced`, then the default and range.
    let advanced = |name: &str, ty: &str, tooltip: &str| {
        InputDef::bare(name, ty).option("tooltip", tooltip).option("advanced", true)
    };
    Pure::new(
        NodeSpec::new("ChromaRadianceOptions", "", "model/patch/chroma radiance")
            .python_module("comfy_extras.nodes_chroma_radiance")
            .v3()
            .description("Allows setting advanced options for the Chroma Radiance model.")
            .input(InputDef::typed("model", "MODEL"))
            .input(
                InputDef::bare("preserve_wrapper", "BOOLEAN")
                    .option(
                        "tooltip",
                        "When enabled, will delegate to an existing model function wrapper if it exists. \
                         Generally should be left enabled.",
                    )
                    .option("default", true),
            )
            .input(
                advanced("start_sigma", "FLOAT", "First sigma that these options will be in effect.")
                    .option("default", 1.0)
                    .option("min", 0.0)
                    .option("max", 1.0),
            )
            .input(
                advanced("end_sigma", "FLOAT", "Last sigma that these options will be in effect.")
                    .option("default", 0.0)
                    .option("min", 0.0)
                    .option("max", 1.0),
            )
            .input(
                advanced(
                    "nerf_tile_size",
                    "INT",
                    "Allows overriding the default NeRF tile size. -1 means use the default (32). 0 means use \
                     non-tiling mode (may require a lot of VRAM).",
                )
                .option("default", -1)
                .option("min", -1),
            )
            .input(
                advanced(
                    "force_sequential_txt_ids",
                    "BOOLEAN",
                    "Force usage of sequential text token IDs instead of zeroes. Should be used for \
                     checkpoints from 2026-05-22 to 2026-06-01 that are trained in this way but do not contain \
                     the __sequential__ key in the state dict.",
                )
                .option("default", false),
            )
            .output(OutputDef::new("MODEL")),
        |inputs| {
            let model = inputs.model("model")?;
            let tile = inputs.int("nerf_tile_size")?;
            let options = RadianceOptions {
                nerf_tile_size: if tile >= 0 { Some(tile as usize) } else { None },
                sequential_txt_ids: inputs.bool("force_sequential_txt_ids")?.then_some(true),
            };
            if options == RadianceOptions::default() {
                return Ok(vec![Value::Model(model.clone())]);
            }
            let window = RadianceWindow {
                options,
                start: inputs.float("start_sigma")?,
                end: inputs.float("end_sigma")?,
                preserve: inputs.bool("preserve_wrapper")?,
            };
            let mut patched: DiffusionModel = model.as_ref().clone();
            patched.chroma_radiance.push(window);
            Ok::<_, NodeError>(vec![Value::Model(Arc::new(patched))])
        },
    )
}

#[cfg(test)]
mod tests {
    use kiln_models::chroma_radiance::RadianceOptions;

    use crate::models::RadianceWindow;

    fn window(tile: usize, (start, end): (f64, f64), preserve: bool) -> RadianceWindow {
        let options = RadianceOptions { nerf_tile_size: Some(tile), sequential_txt_ids: None };
        RadianceWindow { options, start, end, preserve }
    }

    fn tile_at(windows: &[RadianceWindow], sigma: f32) -> Option<usize> {
        RadianceWindow::options_at(windows, sigma).and_then(|o| o.nerf_tile_size)
    }

    #[test]
    fn options_hold_within_their_sigma_window() {
        let one = [window(8, (0.75, 0.25), true)];
        assert_eq!(tile_at(&one, 0.9), None);
        assert_eq!(tile_at(&one, 0.75), Some(8));
        assert_eq!(tile_at(&one, 0.5), Some(8));
        assert_eq!(tile_at(&one, 0.25), Some(8));
        assert_eq!(tile_at(&one, 0.1), None);
        // σ is compared as the f32 it is (ComfyUI's `.item()` of the f32 timestep): 0.8f32 is above 0.8.
        let edge = [window(8, (0.8, 0.0), true)];
        assert_eq!(tile_at(&edge, 0.8), None);
    }

    #[test]
    fn a_preserving_node_hands_on_to_the_earlier_one_whose_options_win_in_its_window() {
        // Applied first: 16 over [0.5, 0]; then 4 over [1, 0], preserving the first.
        let chain = [window(16, (0.5, 0.0), true), window(4, (1.0, 0.0), true)];
        assert_eq!(tile_at(&chain, 0.9), Some(4));
        assert_eq!(tile_at(&chain, 0.3), Some(16));
        // Without preserving, the earlier wrapper no longer runs.
        let replaced = [window(16, (0.5, 0.0), true), window(4, (1.0, 0.0), false)];
        assert_eq!(tile_at(&replaced, 0.3), Some(4));
    }
}
