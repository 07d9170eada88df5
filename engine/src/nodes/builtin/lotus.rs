//! `LotusConditioning` (`comfy_extras.nodes_lotus`): Lotus depth's fixed prompt.
//!
//! Lotus conditions its UNet on its frozen text encoder's states for an empty prompt, which never change, so
//! ComfyUI ships them inline rather than the encoder: `[1, 2, 1024]`. `lotus_null_prompt.f32` holds those 2048
//! values as little-endian f32 (each exact in f16), as `comfy_extras/nodes_lotus.py` at 0f1fa67a lists them:
//! measured outputs of the Lotus release's encoder, data rather than code.

use std::sync::Arc;

use crate::models::{Cond, Conditioning};
use crate::nodes::{Context, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::Value;

/// The null prompt's states, `[1, TOKENS, WIDTH]` little-endian f32.
const NULL_PROMPT: &[u8] = include_bytes!("lotus_null_prompt.f32");
/// Tokens of the null prompt.
const TOKENS: usize = 2;
/// Width of Lotus's context (SD 2's OpenCLIP-H text states).
const WIDTH: usize = 1024;

/// `LotusConditioning`: the conditioning `[[states, {}]]` of Lotus's null prompt.
pub(super) struct LotusConditioning(Arc<NodeSpec>);

impl LotusConditioning {
    pub(super) fn new() -> LotusConditioning {
        let spec = NodeSpec::new("LotusConditioning", "", "model/conditioning/lotus")
            .v3()
            .python_module("comfy_extras.nodes_lotus")
            .output(OutputDef::new("CONDITIONING").named("conditioning"));
        LotusConditioning(Arc::new(spec))
    }
}

/// The null prompt's states as a tensor.
fn null_prompt() -> Tensor {
    let values =
        NULL_PROMPT.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Tensor::new(vec![1, TOKENS, WIDTH], values).expect("the null prompt holds 1·2·1024 values")
}

impl Node for LotusConditioning {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, _: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let entries = vec![Cond::new(null_prompt(), None)];
        Ok(NodeResult::values([Value::Conditioning(Arc::new(Conditioning { entries }))]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{Noise, load};
    use crate::value::Latent;
    use kiln_models::sampling::Sampler;

    /// `scripts/reference/lotus_sampling.py`'s run of ComfyUI's own nodes on the tiny Lotus UNet.
    fn fixture() -> std::collections::BTreeMap<String, Tensor> {
        crate::fixtures::tensors("lotus/sampling.safetensors")
    }

    /// The templates' Lotus run (LotusConditioning → BasicGuider, euler, normal 1 step with SetFirstSigma 999 and
    /// DisableNoise) and 2 normal steps from random noise, through the engine's sampler on the tiny Lotus UNet
    /// loaded by detection: ComfyUI's latents, within 1e-4. Checks the discrete model sampling end to end (the
    /// IMG_TO_IMG input and output, EPS noise scaling with max_denoise, the normal schedule, SD's latent scale).
    #[test]
    fn lotus_sampling_follows_comfyui() {
        let io = fixture();
        let dir = std::env::temp_dir().join(format!("kiln-lotus-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/lotus/unet.safetensors");
        let env = crate::models::ModelEnv::cpu(&dir);
        let model = load::load_diffusion_model(&env, &path, None, &mut |_, _| {}).unwrap();
        let positive = Conditioning { entries: vec![Cond::new(null_prompt(), None)] };
        let latent = Latent::new(io["latent"].clone());
        let ctx = crate::fixtures::quiet_context(&dir);
        let seed = io["seed"].data()[0] as u64;
        let template = [999.0, 0.0];
        let cases: [(&str, &[f32], Noise); 2] = [
            ("template", &template, Noise::Disabled(0)),
            ("two_steps", io["sigmas.two_steps"].data(), Noise::Random(seed)),
        ];
        for (case, sigmas, noise) in cases {
            let job = super::super::sampler::Sampling {
                model: &model,
                positive: &positive,
                negative: None,
                cfg: 1.0,
                dual: None,
                perp_neg: None,
                sampler: Sampler::Euler.into(),
                sigmas,
                noise,
                latent: &latent,
            };
            let got = super::super::sampler::sample(&env.compute, job, &ctx).unwrap().samples;
            let want = &io[&format!("out.{case}")];
            assert_eq!(got.shape(), want.shape(), "{case}");
            crate::fixtures::assert_relative(case, got.data(), want.data(), 1e-4);
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn null_prompt_is_comfyuis() {
        let t = null_prompt();
        assert_eq!(t.shape(), [1, TOKENS, WIDTH]);
        // `nodes_lotus.py`'s first value, its largest and its last.
        assert_eq!(t.data()[0], -0.313_476_56);
        assert_eq!(t.data().iter().copied().fold(f32::MIN, f32::max), 13.023_437_5);
        assert_eq!(t.data()[2047], 1.500_976_6);
    }
}
