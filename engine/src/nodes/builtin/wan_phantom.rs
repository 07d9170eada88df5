//! `WanPhantomSubjectToVideo` (`comfy_extras.nodes_wan`): Phantom's subject-to-video conditioning for a Wan 2.1
//! text-to-video model. Each subject image, fitted to the clip, is encoded on its own into one latent frame; the
//! frames ride with the prompts as `time_dim_concat`, which the model runs after the video's frames
//! ([`kiln_models::wan::phantom`]). Three prompts come out: the positive and the negative with the subjects
//! (`negative_text`), and the negative with blank subjects (`negative_img_text`: zeros in the model's space).

use std::sync::Arc;

use super::latent::cat;
use super::vae::encode_video;
use super::wan::{
    VideoRequest, WAN21_CHANNELS, fit_frames, frame_range, latent_frames, video_inputs,
};
use crate::compute::Compute;
use crate::models::{Conditioning, LatentFormat};
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// `WanPhantomSubjectToVideo`.
pub(super) struct WanPhantomSubjectToVideo {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl WanPhantomSubjectToVideo {
    pub(super) fn new(compute: Arc<Compute>) -> WanPhantomSubjectToVideo {
        let spec =
            NodeSpec::new("WanPhantomSubjectToVideo", "", "model/conditioning/wan/phantom subject")
                .python_module("comfy_extras.nodes_wan")
                .v3()
                .input(InputDef::typed("positive", "CONDITIONING"))
                .input(InputDef::typed("negative", "CONDITIONING"))
                .input(InputDef::typed("vae", "VAE"));
        let spec = video_inputs(spec, (832, 480), (16, 16), 81)
            .optional(InputDef::typed("images", "IMAGE"))
            .output(OutputDef::new("CONDITIONING").named("positive"))
            .output(OutputDef::new("CONDITIONING").named("negative_text"))
            .output(OutputDef::new("CONDITIONING").named("negative_img_text"))
            .output(OutputDef::new("LATENT").named("latent"));
        WanPhantomSubjectToVideo { spec: Arc::new(spec), compute }
    }
}

impl Node for WanPhantomSubjectToVideo {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let VideoRequest { vae, width, height, length, batch } = VideoRequest::read(inputs)?;
        let latent = Tensor::full(
            vec![batch, WAN21_CHANNELS, latent_frames(length), height / 8, width / 8],
            0.0,
        );
        let positive = inputs.conditioning("positive")?;
        let negative = inputs.conditioning("negative")?;
        let [positive, negative_text, negative_img_text] = match inputs.get("images") {
            None => [positive.clone(), negative.clone(), negative.clone()],
            Some(_) => {
                let images = fit_frames(inputs.image("images")?, ..length, width, height)?;
                let subjects = self.encode_each(vae, &images, ctx)?;
                // Blank subjects: what the VAE space holds for zeros of the model's (ComfyUI's
                // `Wan21().process_out(zeros)`), so the model reads zeros.
                let blank = LatentFormat::WAN21
                    .process_out(&vec![0.0; subjects.data().len()], subjects.shape());
                let blank = Tensor::new(subjects.shape().to_vec(), blank)
                    .map_err(|e| NodeError::new(e.to_string()))?;
                let with = |c: &Conditioning, frames: &Tensor| {
                    Arc::new(c.with_extras(|e| e.time_dim_concat = Some(frames.clone())))
                };
                [with(positive, &subjects), with(negative, &subjects), with(negative, &blank)]
            }
        };
        Ok(NodeResult::values([
            Value::Conditioning(positive),
            Value::Conditioning(negative_text),
            Value::Conditioning(negative_img_text),
            Value::Latent(Latent::new(latent)),
        ]))
    }
}

impl WanPhantomSubjectToVideo {
    /// Each of `images` `[N, H, W, C]` encoded on its own (one latent frame each), joined along time:
    /// `[1, C, N, h, w]`.
    fn encode_each(
        &self,
        vae: &crate::models::Vae,
        images: &Tensor,
        ctx: &Context,
    ) -> Result<Tensor, NodeError> {
        let mut joined: Option<Tensor> = None;
        for i in 0..images.shape().first().copied().unwrap_or(0) {
            let frame = encode_video(&self.compute, vae, &frame_range(images, i..i + 1)?, ctx)?;
            joined = Some(match joined {
                Some(before) => cat(&before, &frame, 2)?,
                None => frame,
            });
        }
        joined.ok_or_else(|| NodeError::new("WanPhantomSubjectToVideo was given no subject image"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{Cond, CondExtras};

    /// ComfyUI's node on the tiny Wan 2.1 VAE with two RGBA subjects of another aspect, then CFGGuider (cfg 2,
    /// euler, 3 steps) on the tiny t2v model with its positive and negative_img_text, plain and in context windows
    /// (`scripts/reference/wan_windows.py phantom`): the same subject latents, blank subjects that the model
    /// reads as zeros, and ComfyUI's sampled latents.
    #[test]
    fn subjects_are_encoded_one_by_one_and_sampled_after_the_video_as_comfyuis() {
        let io = crate::fixtures::tensors("context_windows/phantom.safetensors");
        let dir = std::env::temp_dir().join(format!("kiln-phantom-{}", std::process::id()));
        let (env, vae) = crate::fixtures::tiny_wan_vae(&dir);
        let prompt = |name: &str| {
            let cond = Conditioning { entries: vec![Cond::new(io[name].clone(), None)] };
            Value::Conditioning(Arc::new(cond))
        };
        let int = Value::Int;
        let inputs = Inputs::from_values([
            ("positive".to_owned(), prompt("context.positive")),
            ("negative".to_owned(), prompt("context.negative")),
            ("vae".to_owned(), Value::Vae(Arc::new(vae))),
            ("width".to_owned(), int(48)),
            ("height".to_owned(), int(32)),
            ("length".to_owned(), int(17)),
            ("batch_size".to_owned(), int(1)),
            ("images".to_owned(), Value::Image(io["images"].clone())),
        ]);
        let node = WanPhantomSubjectToVideo::new(env.compute.clone());
        let ctx = crate::fixtures::quiet_context(&dir);
        let result = node.execute(&inputs, &ctx).expect("the node runs");
        let out: Vec<Value> = (result.outputs.into_iter())
            .map(|o| match o {
                crate::nodes::Output::One(v) => v,
                other => panic!("one value, not {other:?}"),
            })
            .collect();
        let subjects = |v: &Value| match v {
            Value::Conditioning(c) => {
                c.entries[0].extras.time_dim_concat.clone().expect("subjects")
            }
            other => panic!("a conditioning, not {other:?}"),
        };
        let (positive, negative_text, blank) = (&out[0], &out[1], &out[2]);
        let want = &io["subjects"];
        assert_eq!(subjects(positive).shape(), want.shape());
        crate::fixtures::assert_relative("subjects", subjects(positive).data(), want.data(), 1e-4);
        assert_eq!(subjects(negative_text), subjects(positive));
        assert_eq!(subjects(blank), io["blank"]);
        let Value::Latent(latent) = &out[3] else { panic!("a latent") };
        assert_eq!(latent.samples.shape(), [1, 16, 5, 4, 6]);

        // Sampling with the positive and negative_img_text: ComfyUI's latents, plain and in windows (which
        // leave the two subject frames whole).
        let model_path = dir.join("t2v.safetensors");
        crate::fixtures::write_f32(&model_path, &crate::fixtures::tiny_wan_t2v());
        let with = |frames: &Tensor| CondExtras {
            time_dim_concat: Some(frames.clone()),
            ..CondExtras::default()
        };
        super::super::windowed::check_wan_windows_apart(
            &model_path,
            &io,
            &with(&io["subjects"]),
            &with(&io["blank"]),
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
