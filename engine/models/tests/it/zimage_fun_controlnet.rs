//! The Z-Image Fun ControlNet against `scripts/reference/zimage_fun_controlnet.py`'s fixtures: ComfyUI's own
//! `ZImage_Control` run by its `ZImageControlPatch` around ComfyUI's NextDiT, on tiny random weights in the
//! release's key layout.

use kiln_compute::Backend as _;
use kiln_compute::DType;
use kiln_compute::memory::SafetensorsFile;
use kiln_models::family::{
    DiffusionDetected, DiffusionInput, ModelPatchDetected, ModelPatchNet, PatchInput,
};
use kiln_models::zimage::Layout;
use kiln_models::{Error, Header};

use crate::common::{assert_close, cpu, fixture, read_tensors};

#[test]
fn fun_controlnet_matches_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let base = {
        let file =
            SafetensorsFile::open(fixture("zimage_fun_controlnet/base.safetensors")).unwrap();
        let header = Header::new(&file, "");
        let detected = DiffusionDetected::detect(&header).unwrap().expect("a Z-Image model");
        let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).unwrap();
        detected.build(weights)
    };
    let patch = {
        let file =
            SafetensorsFile::open(fixture("zimage_fun_controlnet/control.safetensors")).unwrap();
        let header = Header::new(&file, "");
        let detected = ModelPatchDetected::detect(&header).unwrap().expect("a model patch");
        let ModelPatchDetected::ZImageFun(config) = &detected else { panic!("{detected:?}") };
        assert_eq!((config.layout, config.layers, config.refiners), (Layout::Diffusers, 6, 2));
        assert_eq!((0..3).map(|k| config.main_layer(k)).collect::<Vec<_>>(), [0, 5, 10]);
        let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).unwrap();
        detected.build(weights)
    };
    assert!(matches!(patch, ModelPatchNet::ZImageFun(_)));
    assert_eq!(patch.hint_size(5, 7), (6, 8));
    let io = read_tensors("zimage_fun_controlnet/io.safetensors");
    let tensor = |name: &str| b.from_f32(&io[name].0, &io[name].1, DType::F32).unwrap();
    let (x, context, hint) = (tensor("x"), tensor("context"), tensor("latent.model"));
    let run = |x: &_, patches: &[PatchInput<'_, _>]| {
        let input = DiffusionInput { patches, ..DiffusionInput::new(x, &io["sigma"].1, &context) };
        base.forward(&*b, input)
    };
    let controlled = [PatchInput { net: &patch, hint: &hint, strength: 0.75 }];
    let out = run(&x, &controlled).unwrap();
    assert_close("control", &b.to_f32(&out).unwrap(), &io["out.control"].1, 1e-4);
    let out = run(&x, &[]).unwrap();
    assert_close("none", &b.to_f32(&out).unwrap(), &io["out.none"].1, 1e-4);

    // An odd latent (7 × 11): padded to 8 × 12 by the model, the size its control latent has.
    let out = run(&tensor("x.odd"), &controlled).unwrap();
    assert_close("odd", &b.to_f32(&out).unwrap(), &io["out.odd"].1, 1e-4);

    // A control latent of another size than the latents' is refused, naming both.
    let small = b.from_f32(&[1, 16, 4, 4], &[0.0; 256], DType::F32).unwrap();
    let err = run(&x, &[PatchInput { net: &patch, hint: &small, strength: 1.0 }]).err().unwrap();
    assert!(matches!(&err, Error::Invalid(m) if m.contains("[1, 16, 4, 4]")), "{err}");
}
