//! The latent operation nodes of `comfy_extras.nodes_latent`: `LatentOperationTonemapReinhard` and
//! `LatentOperationSharpen` make a `LATENT_OPERATION`; `LatentApplyOperation` applies one to a latent and
//! `LatentApplyOperationCFG` to the guidance of every step before CFG (a pre-CFG hook on the model).

use std::sync::Arc;

use kiln_models::sampling::guidance::PreCfg;
use kiln_models::sampling::latent_operation::LatentOperation;

use super::pure::Pure;
use crate::nodes::{ErrorKind, InputDef, Inputs, NodeError, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// The spec of one of these nodes (V3, experimental, no display name).
fn spec(name: &str) -> NodeSpec {
    NodeSpec::new(name, "", "model/latent/advanced/operations")
        .python_module("comfy_extras.nodes_latent")
        .v3()
        .experimental()
}

/// The `operation` input.
fn operation(inputs: &Inputs) -> Result<&LatentOperation, NodeError> {
    match inputs.get("operation") {
        Some(Value::LatentOperation(op)) => Ok(op),
        Some(other) => Err(NodeError::of_kind(
            ErrorKind::WrongType,
            format!("input `operation` should be LATENT_OPERATION, got {}", other.type_name()),
        )),
        None => Err(NodeError::of_kind(ErrorKind::WrongType, "input `operation` is missing")),
    }
}

/// `LatentOperationTonemapReinhard`.
pub(super) fn tonemap_reinhard() -> Pure {
    let spec = spec("LatentOperationTonemapReinhard")
        .input(InputDef::float("multiplier", 1.0, 0.0, 100.0).option("step", 0.01))
        .output(OutputDef::new("LATENT_OPERATION"))
        .aliases(&["hdr latent"]);
    Pure::new(spec, |inputs| {
        let multiplier = inputs.float("multiplier")? as f32;
        Ok(vec![Value::LatentOperation(LatentOperation::TonemapReinhard { multiplier })])
    })
}

/// `LatentOperationSharpen`.
pub(super) fn sharpen() -> Pure {
    // ComfyUI declares these `advanced`, which its object_info writes first.
    let advanced = |name: &str, ty: &str| InputDef::bare(name, ty).option("advanced", true);
    let spec = spec("LatentOperationSharpen")
        .input(
            advanced("sharpen_radius", "INT")
                .option("default", 9)
                .option("min", 1)
                .option("max", 31)
                .option("step", 1),
        )
        .input(
            advanced("sigma", "FLOAT")
                .option("default", 1.0)
                .option("min", 0.1)
                .option("max", 10.0)
                .option("step", 0.1),
        )
        .input(
            advanced("alpha", "FLOAT")
                .option("default", 0.1)
                .option("min", 0.0)
                .option("max", 5.0)
                .option("step", 0.01),
        )
        .output(OutputDef::new("LATENT_OPERATION"));
    Pure::new(spec, |inputs| {
        let radius =
            usize::try_from(inputs.int("sharpen_radius")?).ok().filter(|&r| r >= 1).ok_or_else(
                || NodeError::of_kind(ErrorKind::InvalidValue, "sharpen_radius must be at least 1"),
            )?;
        let (sigma, alpha) = (inputs.float("sigma")?, inputs.float("alpha")?);
        Ok(vec![Value::LatentOperation(LatentOperation::Sharpen { radius, sigma, alpha })])
    })
}

/// `LatentApplyOperation`: the latent's samples through the operation; what rides along is kept.
pub(super) fn apply() -> Pure {
    let spec = spec("LatentApplyOperation")
        .input(InputDef::typed("samples", "LATENT").with_options())
        .input(InputDef::typed("operation", "LATENT_OPERATION").with_options())
        .output(OutputDef::new("LATENT"))
        .aliases(&["transform latent"]);
    Pure::new(spec, |inputs| {
        let latent = inputs.latent("samples")?;
        let samples = &latent.samples;
        let out = operation(inputs)?
            .apply(samples.data(), samples.shape())
            .map_err(|e| NodeError::of_kind(ErrorKind::InvalidValue, e.to_string()))?;
        let samples = Tensor::new(samples.shape().to_vec(), out)
            .map_err(|e| NodeError::new(e.to_string()))?;
        Ok(vec![Value::Latent(Latent { samples, ..latent.clone() })])
    })
}

/// `LatentApplyOperationCFG`: the model with the operation applied to each step's guidance before CFG.
pub(super) fn apply_cfg() -> Pure {
    let spec = spec("LatentApplyOperationCFG")
        .input(InputDef::typed("model", "MODEL").with_options())
        .input(InputDef::typed("operation", "LATENT_OPERATION").with_options())
        .output(OutputDef::new("MODEL"));
    Pure::new(spec, |inputs| {
        let model = inputs.model("model")?;
        let mut guidance = model.guidance.clone();
        guidance.pre_cfg.push(PreCfg::LatentOperation(operation(inputs)?.clone()));
        Ok(vec![Value::Model(Arc::new(model.with_guidance(guidance)))])
    })
}

#[cfg(test)]
mod tests {
    use kiln_models::sampling::guidance::{Guidance, Predictions};

    use super::*;

    /// `got` within 1e-5 of `want`'s largest magnitude, element by element.
    fn assert_close(got: &[f32], want: &Tensor, what: &str) {
        assert_eq!(got.len(), want.data().len(), "{what}");
        let peak = want.data().iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = got.iter().zip(want.data()).fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        assert!(worst <= 1e-5 * peak, "{what}: off by {worst} (peak {peak})");
    }

    #[test]
    fn tonemap_and_sharpen_match_comfyui() {
        let io = crate::fixtures::tensors("latent_operations/io.safetensors");
        let (x, video) = (&io["x"], &io["video"]);
        for (op, input, want) in [
            (LatentOperation::TonemapReinhard { multiplier: 1.0 }, x, "tonemap.1"),
            (LatentOperation::TonemapReinhard { multiplier: 0.4 }, x, "tonemap.0_4"),
            (LatentOperation::TonemapReinhard { multiplier: 1.0 }, video, "tonemap.video"),
            (LatentOperation::Sharpen { radius: 4, sigma: 1.0, alpha: 0.1 }, x, "sharpen.default"),
            (LatentOperation::Sharpen { radius: 3, sigma: 1.5, alpha: 0.8 }, x, "sharpen.strong"),
        ] {
            let got = op.apply(input.data(), input.shape()).expect("applies");
            assert_close(&got, &io[want], want);
        }
        // Sharpening needs an image latent larger than the radius, as torch's reflect padding does.
        let sharpen = LatentOperation::Sharpen { radius: 10, sigma: 1.0, alpha: 0.1 };
        assert!(sharpen.apply(x.data(), x.shape()).is_err());
        assert!(sharpen.apply(video.data(), video.shape()).is_err());
    }

    #[test]
    fn the_cfg_hook_operates_on_the_guidance_as_comfyui() {
        let io = crate::fixtures::tensors("latent_operations/io.safetensors");
        let (cond, uncond) = (&io["cond"], &io["uncond"]);
        let mut guidance = Guidance::default();
        guidance
            .pre_cfg
            .push(PreCfg::LatentOperation(LatentOperation::TonemapReinhard { multiplier: 0.4 }));
        let shape = cond.shape();
        let x = vec![0.0; cond.data().len()];
        let both = Predictions {
            x: &x,
            cond: cond.data(),
            uncond: Some(uncond.data()),
            cfg: 4.0,
            sigma: 0.5,
            shape,
        };
        let (got, kept) = guidance.before_cfg(&both, 2).expect("runs").expect("a hook");
        assert_close(&got, &io["cfg.cond"], "cfg.cond");
        assert_eq!(kept.as_deref(), Some(uncond.data()), "the unconditional prediction is kept");
        let alone =
            Predictions { x: &x, cond: cond.data(), uncond: None, cfg: 1.0, sigma: 0.5, shape };
        let (got, kept) = guidance.before_cfg(&alone, 2).expect("runs").expect("a hook");
        assert_close(&got, &io["cfg.alone"], "cfg.alone");
        assert!(kept.is_none());
        // Under PerpNegGuider ComfyUI's hooks see three predictions, and the operation takes the positive alone.
        let (got, _) = guidance.before_cfg(&both, 3).expect("runs").expect("a hook");
        assert_close(&got, &io["cfg.alone"], "cfg under PerpNeg");
    }
}
