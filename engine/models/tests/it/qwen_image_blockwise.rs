//! DiffSynth's block-wise ControlNet for Qwen-Image against `scripts/reference/qwen_image_blockwise.py`'s
//! fixtures: ComfyUI's own `QwenImageBlockWiseControlNet` run by its `DiffSynthCnetPatch` after each block of
//! the tiny MMDiT of `qwen_image.py`, with and without a mask channel.

use kiln_compute::Backend as _;
use kiln_compute::DType;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::Header;
use kiln_models::family::{
    DiffusionInput, DiffusionNet, ModelPatchDetected, ModelPatchNet, PatchInput,
};

use crate::common::{assert_close, cpu, fixture, read_tensors};
use crate::qwen_image::tiny_model;

#[test]
fn blockwise_controlnets_match_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let base = DiffusionNet::QwenImage(tiny_model(&manager));
    let io = read_tensors("qwen_image_blockwise/io.safetensors");
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).unwrap();
    let (x, context, latent) = (tensor("x"), tensor("context"), &io["latent.model"]);
    for (name, mask_channels) in [("blockwise", 0), ("inpaint", 1)] {
        let file =
            SafetensorsFile::open(fixture(&format!("qwen_image_blockwise/{name}.safetensors")))
                .unwrap();
        let header = Header::new(&file, "");
        let detected = ModelPatchDetected::detect(&header).unwrap().expect("a model patch");
        let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).unwrap();
        let patch = detected.build(weights);
        assert_eq!(patch.mask_channels(), mask_channels, "{name}");
        // The hint: the latent in model space, then a channel of ones for the mask (none given).
        let (shape, mut values) = (latent.0.clone(), latent.1.clone());
        let plane = shape[2] * shape[3];
        values.extend(std::iter::repeat_n(1.0, mask_channels * plane));
        let hint =
            b.from_f32(&[1, 16 + mask_channels, shape[2], shape[3]], &values, DType::F32).unwrap();
        let ModelPatchNet::QwenImageBlockwise(net) = &patch else {
            panic!("a block-wise ControlNet")
        };
        let condition = net.condition(&*b, &hint, 2).unwrap();
        assert_close(name, &b.to_f32(&condition).unwrap(), &io[&format!("cond.{name}")].1, 1e-4);

        let patches = [PatchInput { net: &patch, hint: &hint, strength: 0.8 }];
        let input = DiffusionInput {
            patches: &patches,
            ..DiffusionInput::new(&x, &io["sigma"].1, &context)
        };
        let out = base.forward(&*b, input).unwrap();
        assert_close(name, &b.to_f32(&out).unwrap(), &io[&format!("out.{name}")].1, 1e-4);
    }
}
