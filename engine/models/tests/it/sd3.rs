//! SD3's MMDiT against ComfyUI 0f1fa67a's `OpenAISignatureMMDITWrapper` (`scripts/reference/sd3.py`, fixtures in
//! `fixtures/sd3/`; diffusers' `SD3Transformer2DModel` agrees with it there): a tiny MMDiT of SD3.5 Large's
//! structure (per-head q/k RMS norms, the last context block pre-only) on an even, a batched non-square and an
//! odd-sided latent.

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend, DType};
use kiln_models::family::{ControlNetDetected, ControlNetNet, DiffusionDetected, DiffusionFamily};
use kiln_models::header::Header;
use kiln_models::sd3::{ControlType, Sd3, Sd3Input};

use crate::common::{assert_close, cpu, fixture, read_tensors};

#[test]
fn mmdit_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture("sd3/weights.safetensors")).expect("open");
    let header = Header::new(&file, "");
    let detected = DiffusionDetected::detect(&header).expect("detect").expect("an MMDiT");
    assert_eq!(detected.family(), DiffusionFamily::Sd3);
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).expect("load");
    let DiffusionDetected::Sd3(config) = detected else { panic!("not an MMDiT") };
    assert_eq!((config.dim, config.heads, config.blocks, config.pos_embed_max), (128, 2, 2, 8));
    assert_eq!((config.adm_width, config.context_width, config.qk_norm), (80, 96, true));
    let net = Sd3::new(config, weights);
    let io = read_tensors("sd3/io.safetensors");
    for case in ["a", "b", "c"] {
        let t = |name: &str| &io[&format!("{case}.{name}")];
        let upload = |name: &str| b.from_f32(&t(name).0, &t(name).1, DType::F32).expect(name);
        let (x, context, y) = (upload("x"), upload("context"), upload("y"));
        let input = Sd3Input {
            x: &x,
            timesteps: &t("t").1,
            context: &context,
            pooled: Some(&y),
            controls: &[],
        };
        let out = net.forward(b.as_ref(), &input).expect("forward");
        assert_eq!(out.shape(), t("out").0.as_slice(), "{case}");
        assert_close(&format!("MMDiT {case}"), &b.to_f32(&out).expect("read"), &t("out").1, 1e-4);
    }
}

#[test]
fn controlnet_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let file = SafetensorsFile::open(fixture("sd3/weights.safetensors")).expect("open");
    let header = Header::new(&file, "");
    let detected = DiffusionDetected::detect(&header).expect("detect").expect("an MMDiT");
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).expect("load");
    let DiffusionDetected::Sd3(config) = detected else { panic!("not an MMDiT") };
    let net = Sd3::new(config, weights);

    let file = SafetensorsFile::open(fixture("sd3/controlnet.safetensors")).expect("open");
    let header = Header::new(&file, "");
    let found = ControlNetDetected::detect(&header).expect("detect").expect("a ControlNet");
    assert_eq!(found.family(), DiffusionFamily::Sd3);
    let ControlNetDetected::Sd3(cn_config) = &found else { panic!("not an SD3 ControlNet") };
    assert_eq!((cn_config.blocks, cn_config.control_type), (1, ControlType::Depth));
    let weights = manager.load(&found.load_plan(&header), &mut |_, _| {}).expect("load");
    let ControlNetNet::Sd3(control) = found.build(weights) else { panic!("not an SD3 ControlNet") };

    let io = read_tensors("sd3/io.safetensors");
    let t = |name: &str| &io[&format!("cn.{name}")];
    let upload = |name: &str| b.from_f32(&t(name).0, &t(name).1, DType::F32).expect(name);
    let (x, context, y, hint) = (upload("x"), upload("context"), upload("y"), upload("hint"));
    let timesteps = &t("t").1;
    let plain = Sd3Input { x: &x, timesteps, context: &context, pooled: Some(&y), controls: &[] };
    let outputs = control.residuals(b.as_ref(), &net, &plain, &hint, 0.75).expect("residuals");
    assert_eq!(outputs.len(), 2, "one block's output repeated over the model's two");
    let block = b.to_f32(&outputs[0]).expect("read");
    let want: Vec<f32> = t("block.0").1.iter().map(|v| v * 0.75).collect();
    assert_close("ControlNet block 0", &block, &want, 1e-4);
    let controls: Vec<Option<_>> = outputs.into_iter().map(Some).collect();
    let input =
        Sd3Input { x: &x, timesteps, context: &context, pooled: Some(&y), controls: &controls };
    let out = net.forward(b.as_ref(), &input).expect("forward");
    assert_close("MMDiT with the ControlNet", &b.to_f32(&out).expect("read"), &t("out").1, 1e-4);
    // Depth's control image is inverted before the VAE; canny's rescaled.
    assert_eq!(ControlType::Depth.preprocess(0.25), 0.75);
    assert_eq!(ControlType::Canny.preprocess(1.0), 128.0);
}
