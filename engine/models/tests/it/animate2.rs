//! Wan Animate 2 against `scripts/reference/wan_animate2.py`'s fixture, recorded from ComfyUI's own
//! `model_animate2.py` on the tiny Wan's I2V weights marked `animate2`: the pose branch with and without its own
//! prompt and CLIP states, the strengths, a batch, ragged sides, and the pose-branch cache (int8, int4).

use kiln_compute::Backend as _;
use kiln_compute::backend::cpu::Cpu;
use kiln_models::family::{DiffusionInput, DiffusionNet};
use kiln_models::wan::animate2::{Animate2Input, CacheCall};
use kiln_models::wan::{CacheDtype, CacheSettings, PoseCache, animate2_metadata, pose_key};

use crate::common::{TempTensors, assert_close, cpu, read_tensors};
use crate::wan::{Tensors, Variant, io_tensor, load_on};

fn fixture_tensors() -> Tensors {
    read_tensors("wan/animate2.safetensors")
}

/// The tiny I2V weights with the Animate 2 mark, loaded; detected as ComfyUI's `WAN_Animate2`, whose model
/// sampling has shift 5.
fn animate2_net(manager: &std::sync::Arc<kiln_compute::memory::MemoryManager>) -> DiffusionNet {
    let (key, value) = animate2_metadata();
    let file = TempTensors::with_metadata("animate2", Variant::I2v.tensors(), &[(&key, &value)]);
    let (detected, net) = load_on(manager, &file.0);
    assert_eq!(detected.sampling(), kiln_models::sampling::FlowSampling::new(5.0, 1000.0).into());
    net
}

/// The pose inputs of a case.
struct Pose<'a> {
    pose: Option<&'a kiln_compute::Tensor<Cpu>>,
    context: Option<&'a kiln_compute::Tensor<Cpu>>,
    clip: Option<&'a kiln_compute::Tensor<Cpu>>,
    strengths: (f32, f32),
}

fn input<'a>(p: &Pose<'a>, cache: Option<CacheCall<'a, Cpu>>) -> Animate2Input<'a, Cpu> {
    Animate2Input {
        pose: p.pose,
        context: p.context,
        clip: p.clip,
        pose_strength: p.strengths.0,
        reference_strength: p.strengths.1,
        cache,
    }
}

#[test]
fn the_pose_branch_drives_each_frame_as_comfyuis_does() {
    let f = fixture_tensors();
    let (b, manager) = cpu(256 << 20);
    let net = animate2_net(&manager);
    let io = |name: &str| io_tensor(&b, &f, name);
    let (x, context, clip, pose) = (io("x"), io("context"), io("clip"), io("pose"));
    let (context_pose, clip_pose) = (io("context_pose"), io("clip_pose"));
    let t = &f["t"].1;
    let run = |x: &kiln_compute::Tensor<Cpu>, t: &[f32], context, animate| {
        let input = DiffusionInput {
            clip_vision: Some(&clip),
            animate: Some(animate),
            ..DiffusionInput::new(x, t, context)
        };
        b.to_f32(&net.forward(&*b, input).unwrap()).unwrap()
    };
    let none = Pose { pose: None, context: None, clip: None, strengths: (1.0, 1.0) };
    let pose_only = Pose { pose: Some(&pose), ..none };
    let own = Pose { context: Some(&context_pose), clip: Some(&clip_pose), ..pose_only };
    let cases = [
        ("plain", &none),
        ("pose", &pose_only),
        ("pose_own", &own),
        ("strengths", &Pose { strengths: (0.6, 1.4), ..pose_only }),
        ("plain_ref", &Pose { strengths: (1.0, 1.4), ..none }),
    ];
    for (case, p) in cases {
        let got = run(&x, t, &context, input(p, None));
        assert_close(case, &got, &f[&format!("out.{case}")].1, 1e-4);
    }
    let (x2, context2) = (io("x2"), io("context2"));
    let got = run(&x2, &f["t2"].1, &context2, input(&own, None));
    assert_close("batch2", &got, &f["out.batch2"].1, 1e-4);
    let (x_odd, pose_odd) = (io("x_odd"), io("pose_odd"));
    let got = run(&x_odd, t, &context, input(&Pose { pose: Some(&pose_odd), ..none }, None));
    assert_close("odd", &got, &f["out.odd"].1, 1e-4);

    // A pose video of another length is refused by name.
    let input_short = DiffusionInput {
        animate: Some(input(&Pose { pose: Some(&pose_odd), ..none }, None)),
        ..DiffusionInput::new(&x, t, &context)
    };
    let Err(err) = net.forward(&*b, input_short) else { panic!("a pose of other sides") };
    assert!(err.to_string().contains("pose branch"), "{err}");
}

#[test]
fn the_pose_cache_reads_its_quantized_block_inputs_as_comfyuis_does() {
    let f = fixture_tensors();
    let (b, manager) = cpu(256 << 20);
    let net = animate2_net(&manager);
    let io = |name: &str| io_tensor(&b, &f, name);
    let (x, context, clip, pose) = (io("x"), io("context"), io("clip"), io("pose"));
    let (context_pose, clip_pose) = (io("context_pose"), io("clip_pose"));
    let own = Pose {
        pose: Some(&pose),
        context: Some(&context_pose),
        clip: Some(&clip_pose),
        strengths: (1.0, 1.0),
    };
    let key = pose_key(&f["pose"].0, &f["pose"].1);
    for (dtype, case) in [(CacheDtype::Int8, "int8"), (CacheDtype::Int4, "int4")] {
        let cache = PoseCache::<Cpu>::new(CacheSettings { dtype, on_device: false });
        let run = |t: &[f32]| {
            let call = CacheCall { cache: &cache, key: &key, windowed: false };
            let input = DiffusionInput {
                clip_vision: Some(&clip),
                animate: Some(input(&own, Some(call))),
                ..DiffusionInput::new(&x, t, &context)
            };
            b.to_f32(&net.forward(&*b, input).unwrap()).unwrap()
        };
        // The first call fills the cache from the exact branch; the next reads it.
        assert_close("fill", &run(&f["t"].1), &f["out.cache_fill"].1, 1e-4);
        let got = run(&f["t300"].1);
        assert_close(case, &got, &f[&format!("out.cache_{case}_t300")].1, 1e-4);
    }
}

#[test]
fn cache_entries_round_trip_through_comfy_kitchens_quantization() {
    let f = fixture_tensors();
    let (b, _) = cpu(16 << 20);
    let cases = [
        ("cache.x", CacheDtype::Int8, "cache.int8"),
        ("cache.x", CacheDtype::Int4, "cache.int4"),
        ("cache.x128", CacheDtype::Int8, "cache.x128.int8"),
    ];
    for (input, dtype, want) in cases {
        let cache = PoseCache::<Cpu>::new(CacheSettings { dtype, on_device: false });
        let key = (vec![1], vec![0.0]);
        cache.put(&*b, &key, 0, &io_tensor(&b, &f, input)).unwrap();
        let got = b.to_f32(&cache.take(&*b, &key, 0).unwrap()).unwrap();
        assert_close(want, &got, &f[want].1, 1e-5);
    }
}
