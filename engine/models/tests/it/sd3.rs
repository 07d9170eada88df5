//! SD3's MMDiT against ComfyUI 0f1fa67a's `OpenAISignatureMMDITWrapper` (`scripts/reference/sd3.py`, fixtures in
//! `fixtures/sd3/`; diffusers' `SD3Transformer2DModel` agrees with it there): a tiny MMDiT of SD3.5 Large's
//! structure (per-head q/k RMS norms, the last context block pre-only) on an even, a batched non-square and an
//! odd-sided latent.

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend, DType};
use kiln_models::family::{DiffusionDetected, DiffusionFamily};
use kiln_models::header::Header;
use kiln_models::sd3::{Sd3, Sd3Input};

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
