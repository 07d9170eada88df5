//! Qwen-Image's ControlNets against `scripts/reference/qwen_image_controlnet.py`'s fixtures: ComfyUI's own
//! InstantX (cross-checked there with diffusers') and VideoX-Fun ControlNets on the tiny MMDiT of
//! `qwen_image.py`, their own outputs and the base model's output with each applied.

use std::sync::Arc;

use kiln_compute::Backend as _;
use kiln_compute::DType;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::{MemoryManager, SafetensorsFile};
use kiln_models::family::{
    ControlInput, ControlNetDetected, ControlNetNet, DiffusionInput, DiffusionNet,
};
use kiln_models::qwen_image::{ControlKind, Text};
use kiln_models::{Error, Header};

use crate::common::{assert_close, cpu, fixture, read_tensors};
use crate::qwen_image::tiny_model;

const STRENGTH: f32 = 0.75;

fn load_control(manager: &Arc<MemoryManager>, name: &str) -> ControlNetNet {
    let file = SafetensorsFile::open(fixture(&format!("qwen_image_controlnet/{name}.safetensors")))
        .unwrap();
    let header = Header::new(&file, "");
    let detected = ControlNetDetected::detect(&header).unwrap().expect("a ControlNet");
    let weights = manager.load(&detected.load_plan(&header), &mut |_, _| {}).unwrap();
    detected.build(weights)
}

fn tensor(b: &Cpu, (shape, values): &(Vec<usize>, Vec<f32>)) -> kiln_compute::Tensor<Cpu> {
    b.from_f32(shape, values, DType::F32).unwrap()
}

#[test]
fn controlnets_match_comfyui() {
    let (b, manager) = cpu(64 << 20);
    let base = tiny_model(&manager);
    let io = read_tensors("qwen_image_controlnet/io.safetensors");
    let (x, context) = (tensor(&b, &io["x"]), tensor(&b, &io["context"]));
    let sigmas = &io["sigma"].1;
    let cases = [
        ("instantx", "hint", ControlKind::InstantX { hint_channels: 16 }, 1),
        ("inpaint", "hint.inpaint", ControlKind::InstantX { hint_channels: 17 }, 2),
        ("fun", "hint", ControlKind::Fun { in_features: 132 }, 5),
    ];
    let base_net = DiffusionNet::QwenImage(base);
    let DiffusionNet::QwenImage(base) = &base_net else { unreachable!() };
    for (name, hint, kind, outputs) in cases {
        let control = load_control(&manager, name);
        let ControlNetNet::QwenImage(net) = &control else { panic!("not a Qwen-Image ControlNet") };
        assert_eq!(net.config.kind, kind, "{name}");
        assert_eq!(net.config.body.layers, outputs, "{name}");
        assert_eq!(control.concat_mask(), name == "inpaint");
        let hint = tensor(&b, &io[hint]);

        // Its own outputs, at strength 1 (where the Fun curve is 1 too).
        let residuals =
            net.residuals(&*b, base, &x, sigmas, Text::uniform(&context), &hint, 1.0).unwrap();
        assert_eq!(residuals.outputs.len(), outputs, "{name}");
        for (k, output) in residuals.outputs.iter().enumerate() {
            let what = format!("{name}.{k}");
            assert_close(&what, &b.to_f32(output).unwrap(), &io[&what].1, 1e-4);
        }
        // ComfyUI spreads InstantX's outputs over 60 blocks, each ⌈60 / N⌉ times; Fun's after 0, 12, ..., 48.
        let at: Vec<Option<usize>> = (0..60)
            .map(|i| match kind {
                ControlKind::InstantX { .. } => Some(i / 60usize.div_ceil(outputs)),
                ControlKind::Fun { .. } => (i % 12 == 0).then_some(i / 12),
            })
            .collect();
        assert_eq!(residuals.at_block, at, "{name}");

        // The base model with it applied, through the family's entry point.
        let controls = [ControlInput { net: &control, hint: &hint, strength: STRENGTH }];
        let input =
            DiffusionInput { controls: &controls, ..DiffusionInput::new(&x, sigmas, &context) };
        let out = base_net.forward(&*b, input).unwrap();
        assert_close(name, &b.to_f32(&out).unwrap(), &io[&format!("out.{name}")].1, 1e-4);
    }

    // A hint of the wrong size or channels is refused, naming both shapes.
    let control = load_control(&manager, "inpaint");
    let ControlNetNet::QwenImage(net) = &control else { panic!("not a Qwen-Image ControlNet") };
    let hint = tensor(&b, &io["hint"]);
    let err =
        net.residuals(&*b, base, &x, sigmas, Text::uniform(&context), &hint, 1.0).err().unwrap();
    assert!(matches!(&err, Error::Invalid(m) if m.contains("17 channels")), "{err}");
}

#[test]
fn strength_zero_changes_nothing_and_fun_takes_its_square_root() {
    let (b, manager) = cpu(64 << 20);
    let control = load_control(&manager, "fun");
    let ControlNetNet::QwenImage(net) = &control else { panic!("not a Qwen-Image ControlNet") };
    assert_eq!(net.output_scale(4.0), 2.0);
    assert_eq!(net.output_scale(-1.0), 0.0);
    let base_net = DiffusionNet::QwenImage(tiny_model(&manager));
    let io = read_tensors("qwen_image_controlnet/io.safetensors");
    let (x, context, hint) =
        (tensor(&b, &io["x"]), tensor(&b, &io["context"]), tensor(&b, &io["hint"]));
    let controls = [ControlInput { net: &control, hint: &hint, strength: 0.0 }];
    let input =
        DiffusionInput { controls: &controls, ..DiffusionInput::new(&x, &io["sigma"].1, &context) };
    let out = base_net.forward(&*b, input).unwrap();
    assert_close("strength 0", &b.to_f32(&out).unwrap(), &io["out.none"].1, 1e-4);
}

/// Prompts of different lengths in one call with a ControlNet of each kind (its blocks read the text too):
/// each sample's output is the one its own call gives, up to the GEMM kernels' rounding.
#[test]
fn prompts_of_different_lengths_share_one_call_under_a_controlnet() {
    let (b, manager) = cpu(64 << 20);
    let base_net = DiffusionNet::QwenImage(tiny_model(&manager));
    let io = read_tensors("qwen_image_controlnet/io.safetensors");
    let (x, context) = (tensor(&b, &io["x"]), tensor(&b, &io["context"]));
    let sigmas = &io["sigma"].1;
    // Sample 0 reads its prompt's 5 rows, sample 1 the first 3 of its own.
    let texts = [b.slice(&context, 0, 0, 1).unwrap(), b.slice(&context, 0, 1, 1).unwrap()];
    let texts = [texts[0].clone(), b.slice(&texts[1], 1, 0, 3).unwrap()];
    let lens = [5, 3];
    let joined = b.concat(&[&texts[0], &texts[1]], 1).unwrap();
    for (name, hint) in [("instantx", "hint"), ("inpaint", "hint.inpaint"), ("fun", "hint")] {
        let control = load_control(&manager, name);
        let hint = tensor(&b, &io[hint]);
        let controls = [ControlInput { net: &control, hint: &hint, strength: STRENGTH }];
        let input = DiffusionInput {
            controls: &controls,
            text_lens: Some(&lens),
            ..DiffusionInput::new(&x, sigmas, &joined)
        };
        let out = b.to_f32(&base_net.forward(&*b, input).unwrap()).unwrap();
        let per_sample = out.len() / 2;
        for (i, text) in texts.iter().enumerate() {
            let (xi, hi) = (b.slice(&x, 0, i, 1).unwrap(), b.slice(&hint, 0, i, 1).unwrap());
            let controls = [ControlInput { net: &control, hint: &hi, strength: STRENGTH }];
            let input = DiffusionInput {
                controls: &controls,
                ..DiffusionInput::new(&xi, &sigmas[i..=i], text)
            };
            let alone = b.to_f32(&base_net.forward(&*b, input).unwrap()).unwrap();
            let what = format!("{name}, sample {i}");
            assert_close(&what, &out[i * per_sample..(i + 1) * per_sample], &alone, 1e-6);
        }
    }
}
