//! Z-Image LoRA files → in-place patches: key formats (kohya, ComfyUI, diffusers with split q/k/v), adapter
//! kinds, the refusals, and end to end the patched tiny DiT against one whose weights were patched by hand.
//! The LoRA files are written by the tests (small random tensors) against the tiny Z-Image fixture's shapes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kiln_compute::Backend as _;
use kiln_compute::DType;
use kiln_compute::memory::SafetensorsFile;
use kiln_compute::memory::lora::{Adapter, Factor, Patch, PatchSet, PatchTensor};
use kiln_models::lora::LoraPatches;
use kiln_models::zimage::ZImage;
use kiln_models::zimage_lora::patches;
use kiln_models::{Error, Header};

use crate::common::{assert_close, cpu, fixture, read_tensors};

/// The tiny model's width (rows of each of q, k, v).
const D: usize = 64;

/// A deterministic source of values in [-1, 1).
struct Rng(u64);

impl Rng {
    fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 = self
                    .0
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }
}

/// A safetensors file's tensors, f32 unless said otherwise.
#[derive(Default, Clone)]
struct File {
    tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<f32>)>,
}

impl File {
    fn add(&mut self, name: impl Into<String>, shape: &[usize], values: Vec<f32>) -> &mut Self {
        assert_eq!(shape.iter().product::<usize>(), values.len());
        self.tensors.push((name.into(), safetensors::Dtype::F32, shape.to_vec(), values));
        self
    }

    fn add_bf16(
        &mut self,
        name: impl Into<String>,
        shape: &[usize],
        values: Vec<f32>,
    ) -> &mut Self {
        let rounded = values.iter().map(|v| f32::from_bits(v.to_bits() & 0xffff_0000)).collect();
        self.tensors.push((name.into(), safetensors::Dtype::BF16, shape.to_vec(), rounded));
        self
    }

    /// Writes the file under the test binary's temporary folder.
    fn write(&self, name: &str) -> PathBuf {
        let bytes: Vec<Vec<u8>> = self
            .tensors
            .iter()
            .map(|(_, dtype, _, v)| match dtype {
                safetensors::Dtype::BF16 => {
                    v.iter().flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes()).collect()
                }
                _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            })
            .collect();
        let views = self.tensors.iter().zip(&bytes).map(|((n, dtype, shape, _), b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), b).expect("view"),
            )
        });
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("zimage_lora_{name}.safetensors"));
        safetensors::serialize_to_file(views, None, &path).expect("writes");
        path
    }
}

/// One low-rank factor pair: up `[out, r]`, down `[r, in]`, and ΔW = scale · up · down.
struct LowRank {
    up: Vec<f32>,
    down: Vec<f32>,
    out: usize,
    rank: usize,
    cols: usize,
}

impl LowRank {
    fn new(rng: &mut Rng, out: usize, rank: usize, cols: usize) -> LowRank {
        LowRank {
            up: rng.values(out * rank, 0.3),
            down: rng.values(rank * cols, 0.3),
            out,
            rank,
            cols,
        }
    }

    fn delta(&self, scale: f32) -> Vec<f32> {
        matmul(&self.up, &self.down, self.out, self.rank, self.cols)
            .into_iter()
            .map(|v| v * scale)
            .collect()
    }
}

fn matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    out
}

fn kron(a: &[f32], (a0, a1): (usize, usize), c: &[f32], (c0, c1): (usize, usize)) -> Vec<f32> {
    let cols = a1 * c1;
    let mut out = vec![0f32; a0 * c0 * cols];
    for i in 0..a0 {
        for j in 0..a1 {
            for k in 0..c0 {
                for l in 0..c1 {
                    out[(i * c0 + k) * cols + j * c1 + l] = a[i * a1 + j] * c[k * c1 + l];
                }
            }
        }
    }
    out
}

fn f32s(t: &PatchTensor) -> Vec<f32> {
    kiln_compute::dtype::widen(t.dtype, &t.bytes)
}

fn rows_cols(t: &PatchTensor) -> (usize, usize) {
    (t.shape[0], t.shape.iter().skip(1).product())
}

/// A patch's `strength · scale · ΔW`, computed here independently of the code under test.
fn delta(p: &Patch<PatchTensor>) -> Vec<f32> {
    assert_eq!(p.strength_model, 1.0);
    let scale = |alpha: Option<f32>, rank: usize| alpha.map_or(1.0, |a| a / rank as f32);
    let product = |a: &PatchTensor, b: &PatchTensor| {
        let ((m, k), (_, n)) = (rows_cols(a), rows_cols(b));
        matmul(&f32s(a), &f32s(b), m, k, n)
    };
    let (d, s) = match &p.adapter {
        Adapter::Lora { up, down, alpha, dora_scale: None } => {
            (product(up, down), scale(*alpha, down.shape[0]))
        }
        Adapter::LoHa { w1a, w1b, w2a, w2b, alpha, dora_scale: None } => {
            let d =
                product(w1a, w1b).into_iter().zip(product(w2a, w2b)).map(|(x, y)| x * y).collect();
            (d, scale(*alpha, w1b.shape[0]))
        }
        Adapter::LoKr { w1, w2, alpha, dora_scale: None } => {
            let mut rank = None;
            let mut factor = |f: &Factor<PatchTensor>| match f {
                Factor::Full(t) => (f32s(t), rows_cols(t)),
                Factor::Product(a, b) => {
                    rank = Some(b.shape[0]);
                    (product(a, b), (a.shape[0], rows_cols(b).1))
                }
            };
            let ((a, sa), (c, sc)) = (factor(w1), factor(w2));
            (kron(&a, sa, &c, sc), rank.map_or(1.0, |r| scale(*alpha, r)))
        }
        Adapter::Diff(t) => (f32s(t), 1.0),
        other => panic!("unexpected adapter {other:?}"),
    };
    d.into_iter().map(|v| v * s * p.strength).collect()
}

/// The sum of a patch set's ΔWs (no set, no DoRA).
fn total_delta(set: &PatchSet) -> Vec<f32> {
    let mut out: Vec<f32> = Vec::new();
    for p in &set.patches {
        let d = delta(p);
        if out.is_empty() {
            out = d;
        } else {
            out.iter_mut().zip(d).for_each(|(o, v)| *o += v);
        }
    }
    out
}

/// The tiny Z-Image fixture's weights: name → shape, in file order.
fn fixture_slots() -> Vec<(String, Vec<usize>)> {
    let file = SafetensorsFile::open(fixture("zimage/comfy.safetensors")).expect("fixture opens");
    file.tensors().map(|(n, t)| (n.to_owned(), t.shape.clone())).collect()
}

fn run(path: &PathBuf, strength: f32) -> kiln_models::Result<LoraPatches> {
    let slots = fixture_slots();
    let view: Vec<(&str, &[usize])> =
        slots.iter().map(|(n, s)| (n.as_str(), s.as_slice())).collect();
    let file = SafetensorsFile::open(path).expect("lora opens");
    patches(&file, &view, strength)
}

fn by_name(p: &LoraPatches) -> BTreeMap<&str, &PatchSet> {
    p.patches.iter().map(|(n, s)| (n.as_str(), s)).collect()
}

/// The ΔWs of the shared LoRA of [`kohya_and_diffusers_names_give_the_same_patches`]: weight → (low rank,
/// alpha) per ComfyUI weight, and the split qkv parts of `context_refiner.1`.
struct Shared {
    plain: Vec<(&'static str, &'static str, &'static str, LowRank, Option<f32>)>,
    q: LowRank,
    v: LowRank,
}

fn shared() -> Shared {
    let mut rng = Rng(7);
    // (ComfyUI stem, kohya stem, diffusers stem, factors, alpha)
    let plain = vec![
        (
            "layers.0.feed_forward.w1",
            "lora_unet_layers_0_feed_forward_w1",
            "transformer.layers.0.feed_forward.w1",
            LowRank::new(&mut rng, 170, 4, D),
            Some(2.0),
        ),
        (
            "layers.1.attention.out",
            "lora_unet_layers_1_attention_out",
            "transformer.layers.1.attention.to_out.0",
            LowRank::new(&mut rng, D, 3, D),
            None,
        ),
        (
            "noise_refiner.0.adaLN_modulation.0",
            "lora_unet_noise_refiner_0_adaLN_modulation_0",
            "diffusion_model.noise_refiner.0.adaLN_modulation.0",
            LowRank::new(&mut rng, 4 * D, 2, D),
            Some(4.0),
        ),
        (
            "final_layer.linear",
            "lora_unet_final_layer_linear",
            "all_final_layer.2-1.linear",
            LowRank::new(&mut rng, D, 2, D),
            Some(1.0),
        ),
        (
            "x_embedder",
            "lora_unet_x_embedder",
            "lycoris_all_x_embedder_2-1",
            LowRank::new(&mut rng, D, 2, D),
            None,
        ),
    ];
    Shared { plain, q: LowRank::new(&mut rng, D, 2, D), v: LowRank::new(&mut rng, D, 4, D) }
}

const Q_ALPHA: f32 = 1.0;
const V_ALPHA: f32 = 8.0;

/// The hand ΔW of `context_refiner.1.attention.qkv.weight` (k rows zero).
fn qkv_delta(s: &Shared) -> Vec<f32> {
    let mut out = s.q.delta(Q_ALPHA / 2.0);
    out.extend(vec![0.0; D * D]);
    out.extend(s.v.delta(V_ALPHA / 4.0));
    out
}

#[test]
fn kohya_and_diffusers_names_give_the_same_patches() {
    let s = shared();
    let mut kohya = File::default();
    let mut diffusers = File::default();
    for (_, k, d, lr, alpha) in &s.plain {
        kohya.add(format!("{k}.lora_up.weight"), &[lr.out, lr.rank], lr.up.clone());
        kohya.add(format!("{k}.lora_down.weight"), &[lr.rank, lr.cols], lr.down.clone());
        diffusers.add(format!("{d}.lora_B.weight"), &[lr.out, lr.rank], lr.up.clone());
        diffusers.add(format!("{d}.lora_A.weight"), &[lr.rank, lr.cols], lr.down.clone());
        if let Some(a) = alpha {
            kohya.add(format!("{k}.alpha"), &[], vec![*a]);
            diffusers.add(format!("{d}.alpha"), &[], vec![*a]);
        }
    }
    // diffusers: to_q and to_v LoRAs of their own ranks and alphas, no to_k.
    let p = "transformer.context_refiner.1.attention";
    diffusers.add(format!("{p}.to_q.lora_B.weight"), &[D, 2], s.q.up.clone());
    diffusers.add(format!("{p}.to_q.lora_A.weight"), &[2, D], s.q.down.clone());
    diffusers.add(format!("{p}.to_q.alpha"), &[], vec![Q_ALPHA]);
    diffusers.add(format!("{p}.to_v.lora_B.weight"), &[D, 4], s.v.up.clone());
    diffusers.add(format!("{p}.to_v.lora_A.weight"), &[4, D], s.v.down.clone());
    diffusers.add(format!("{p}.to_v.alpha"), &[], vec![V_ALPHA]);
    // kohya: the same ΔW as one fused qkv LoRA (rank 6, alpha 6: scale 1).
    let mut up = vec![0f32; 3 * D * 6];
    for r in 0..D {
        for c in 0..2 {
            up[r * 6 + c] = s.q.up[r * 2 + c] * Q_ALPHA / 2.0;
        }
        for c in 0..4 {
            up[(2 * D + r) * 6 + 2 + c] = s.v.up[r * 4 + c] * V_ALPHA / 4.0;
        }
    }
    let mut down = s.q.down.clone();
    down.extend(&s.v.down);
    kohya.add("lora_unet_context_refiner_1_attention_qkv.lora_up.weight", &[3 * D, 6], up);
    kohya.add("lora_unet_context_refiner_1_attention_qkv.lora_down.weight", &[6, D], down);
    kohya.add("lora_unet_context_refiner_1_attention_qkv.alpha", &[], vec![6.0]);

    let k = run(&kohya.write("kohya"), 0.8).expect("kohya LoRA");
    let d = run(&diffusers.write("diffusers"), 0.8).expect("diffusers LoRA");
    assert!(k.unmatched.is_empty(), "{:?}", k.unmatched);
    assert!(d.unmatched.is_empty(), "{:?}", d.unmatched);
    let (k, d) = (by_name(&k), by_name(&d));
    assert_eq!(k.keys().collect::<Vec<_>>(), d.keys().collect::<Vec<_>>());
    assert_eq!(k.len(), s.plain.len() + 1);

    for (stem, _, _, lr, alpha) in &s.plain {
        let name = format!("{stem}.weight");
        let want: Vec<f32> =
            lr.delta(alpha.map_or(1.0, |a| a / lr.rank as f32)).iter().map(|v| v * 0.8).collect();
        for (what, set) in [("kohya", k[name.as_str()]), ("diffusers", d[name.as_str()])] {
            assert_eq!(set.patches.len(), 1);
            let p = &set.patches[0];
            assert_eq!((p.strength, p.strength_model), (0.8, 1.0));
            // Plain LoRAs pass through as stored.
            let Adapter::Lora { up, down, alpha: a, dora_scale: None } = &p.adapter else {
                panic!("{what} {name}: {:?}", p.adapter)
            };
            assert_eq!(
                (up.shape.as_slice(), down.shape.as_slice()),
                (&[lr.out, lr.rank][..], &[lr.rank, lr.cols][..])
            );
            assert_eq!(a, alpha);
            assert_close(&format!("{what} {name}"), &delta(p), &want, 1e-6);
        }
    }

    let qkv = "context_refiner.1.attention.qkv.weight";
    let fused = d[qkv];
    assert_eq!(fused.patches.len(), 1);
    let Adapter::Lora { up, down, alpha: None, dora_scale: None } = &fused.patches[0].adapter
    else {
        panic!("fused qkv: {:?}", fused.patches[0].adapter)
    };
    assert_eq!((up.shape.as_slice(), down.shape.as_slice()), (&[3 * D, 6][..], &[6, D][..]));
    // Block-diagonal: q's columns only in q's rows, none in k's rows, v's only in v's rows.
    let u = f32s(up);
    for r in 0..3 * D {
        for c in 0..6 {
            let inside = (r < D && c < 2) || (r >= 2 * D && c >= 2);
            assert!(inside || u[r * 6 + c] == 0.0, "up[{r}, {c}] = {}", u[r * 6 + c]);
        }
    }
    let want: Vec<f32> = qkv_delta(&s).iter().map(|v| v * 0.8).collect();
    assert_close("fused qkv = the separate ΔWs", &total_delta(fused), &want, 1e-6);
    assert_close("kohya qkv = diffusers qkv", &total_delta(k[qkv]), &total_delta(fused), 1e-6);
}

#[test]
fn other_adapters_bias_diffs_and_split_qkv_kinds() {
    let mut rng = Rng(11);
    let mut f = File::default();
    // LoHa on feed_forward.w2 [64, 170] (ComfyUI name with prefix), stored bf16.
    let (w1a, w1b, w2a, w2b) = (
        rng.values(D * 2, 0.5),
        rng.values(2 * 170, 0.5),
        rng.values(D * 3, 0.5),
        rng.values(3 * 170, 0.5),
    );
    let s = "diffusion_model.layers.0.feed_forward.w2";
    f.add_bf16(format!("{s}.hada_w1_a"), &[D, 2], w1a.clone());
    f.add_bf16(format!("{s}.hada_w1_b"), &[2, 170], w1b.clone());
    f.add_bf16(format!("{s}.hada_w2_a"), &[D, 3], w2a.clone());
    f.add_bf16(format!("{s}.hada_w2_b"), &[3, 170], w2b.clone());
    f.add_bf16(format!("{s}.alpha"), &[], vec![1.0]);
    // LoKr on feed_forward.w3 [170, 64] = kron([2, 4], [85, 16]), w2 as a product of rank 2.
    let (k1, k2a, k2b) = (rng.values(8, 0.5), rng.values(85 * 2, 0.5), rng.values(2 * 16, 0.5));
    let s = "lycoris_layers_1_feed_forward_w3";
    f.add(format!("{s}.lokr_w1"), &[2, 4], k1.clone());
    f.add(format!("{s}.lokr_w2_a"), &[85, 2], k2a.clone());
    f.add(format!("{s}.lokr_w2_b"), &[2, 16], k2b.clone());
    f.add(format!("{s}.alpha"), &[], vec![4.0]);
    // A diff on a norm weight, a bias diff on the x embedder, a set on the caption norm.
    let norm_diff = rng.values(D, 0.1);
    f.add("layers.0.attention_norm1.diff", &[D], norm_diff.clone());
    let bias_diff = rng.values(D, 0.1);
    f.add("diffusion_model.x_embedder.diff_b", &[D], bias_diff.clone());
    let set = rng.values(32, 1.0);
    f.add("cap_embedder.0.set_weight", &[32], set.clone());
    // Split qkv of layers.1: LoHa on to_q, LoKr on to_k, a diff on to_v.
    let p = "diffusion_model.layers.1.attention";
    let (qa, qb, qc, qd) = (
        rng.values(D * 2, 0.5),
        rng.values(2 * D, 0.5),
        rng.values(D * 2, 0.5),
        rng.values(2 * D, 0.5),
    );
    f.add(format!("{p}.to_q.hada_w1_a"), &[D, 2], qa.clone());
    f.add(format!("{p}.to_q.hada_w1_b"), &[2, D], qb.clone());
    f.add(format!("{p}.to_q.hada_w2_a"), &[D, 2], qc.clone());
    f.add(format!("{p}.to_q.hada_w2_b"), &[2, D], qd.clone());
    f.add(format!("{p}.to_q.alpha"), &[], vec![3.0]);
    let (kw1, kw2) = (rng.values(4 * 8, 0.5), rng.values(16 * 8, 0.5));
    f.add(format!("{p}.to_k.lokr_w1"), &[4, 8], kw1.clone());
    f.add(format!("{p}.to_k.lokr_w2"), &[16, 8], kw2.clone());
    let vdiff = rng.values(D * D, 0.1);
    f.add(format!("{p}.to_v.diff"), &[D, D], vdiff.clone());

    let out = run(&f.write("kinds"), 0.5).expect("patches");
    assert!(out.unmatched.is_empty(), "{:?}", out.unmatched);
    let got = by_name(&out);
    let half = |v: Vec<f32>| -> Vec<f32> { v.into_iter().map(|x| x * 0.5).collect() };
    let bf = |v: &[f32]| -> Vec<f32> {
        v.iter().map(|x| f32::from_bits(x.to_bits() & 0xffff_0000)).collect()
    };

    let loha = got["layers.0.feed_forward.w2.weight"];
    let Adapter::LoHa { w1a: a, alpha: Some(1.0), .. } = &loha.patches[0].adapter else {
        panic!("{loha:?}")
    };
    assert_eq!(a.dtype, DType::BF16, "stored as in the file");
    let want: Vec<f32> = matmul(&bf(&w1a), &bf(&w1b), D, 2, 170)
        .into_iter()
        .zip(matmul(&bf(&w2a), &bf(&w2b), D, 3, 170))
        .map(|(x, y)| x * y * 0.5 * 0.5)
        .collect();
    assert_close("LoHa", &delta(&loha.patches[0]), &want, 1e-6);

    let lokr = got["layers.1.feed_forward.w3.weight"];
    let Adapter::LoKr { w1: Factor::Full(_), w2: Factor::Product(..), alpha: Some(4.0), .. } =
        &lokr.patches[0].adapter
    else {
        panic!("{lokr:?}")
    };
    let want = half(
        kron(&k1, (2, 4), &matmul(&k2a, &k2b, 85, 2, 16), (85, 16))
            .into_iter()
            .map(|v| v * 2.0)
            .collect(),
    );
    assert_close("LoKr", &delta(&lokr.patches[0]), &want, 1e-6);

    assert_close(
        "diff",
        &total_delta(got["layers.0.attention_norm1.weight"]),
        &half(norm_diff),
        1e-6,
    );
    assert_close("diff_b", &total_delta(got["x_embedder.bias"]), &half(bias_diff), 1e-6);
    assert!(!got.contains_key("x_embedder.weight"));
    let Adapter::Set(t) = &got["cap_embedder.0.weight"].patches[0].adapter else { panic!("set") };
    assert_eq!(f32s(t), set);

    // The split qkv: one fused LoHa (q rows) and one full-size diff (k, v rows).
    let qkv = got["layers.1.attention.qkv.weight"];
    let kinds: Vec<&str> = qkv
        .patches
        .iter()
        .map(|p| match p.adapter {
            Adapter::LoHa { alpha: None, .. } => "loha",
            Adapter::Diff(_) => "diff",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["loha", "diff"]);
    let mut want: Vec<f32> = matmul(&qa, &qb, D, 2, D)
        .into_iter()
        .zip(matmul(&qc, &qd, D, 2, D))
        .map(|(x, y)| x * y * 1.5)
        .collect();
    want.extend(kron(&kw1, (4, 8), &kw2, (16, 8)));
    want.extend(vdiff);
    assert_close("split qkv", &total_delta(qkv), &half(want), 1e-6);
}

#[test]
fn unknown_keys_are_unmatched() {
    let mut rng = Rng(3);
    let mut f = File::default();
    let keys = [
        "lora_te_text_model_encoder_layers_0_mlp_fc1", // a text encoder's
        "transformer.single_transformer_blocks.0.attn.to_q", // Flux's
        "t_embedder.mlp.0", // bare: ComfyUI renames it to TwinFlow's t_embedder_2
    ];
    for k in keys {
        f.add(format!("{k}.lora_up.weight"), &[128, 2], rng.values(256, 0.1));
        f.add(format!("{k}.lora_down.weight"), &[2, 256], rng.values(512, 0.1));
    }
    // With a prefix the time embedder is Z-Image's own.
    f.add("diffusion_model.t_embedder.mlp.0.lora_up.weight", &[128, 2], rng.values(256, 0.1));
    f.add("diffusion_model.t_embedder.mlp.0.lora_down.weight", &[2, 256], rng.values(512, 0.1));
    // A bias diff for a weight without bias, and a down without its up.
    f.add("layers.0.feed_forward.w1.diff_b", &[170], rng.values(170, 0.1));
    f.add("layers.0.feed_forward.w3.lora_down.weight", &[2, D], rng.values(2 * D, 0.1));
    let out = run(&f.write("unmatched"), 1.0).expect("patches");
    let mut want: Vec<String> = keys
        .iter()
        .flat_map(|k| [format!("{k}.lora_down.weight"), format!("{k}.lora_up.weight")])
        .chain([
            "layers.0.feed_forward.w1.diff_b".into(),
            "layers.0.feed_forward.w3.lora_down.weight".into(),
        ])
        .collect();
    want.sort();
    assert_eq!(out.unmatched, want);
    let names: Vec<&str> = out.patches.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["t_embedder.mlp.0.weight"]);
}

#[test]
fn refuses_what_the_patches_cannot_express() {
    let mut rng = Rng(5);
    let lora = |f: &mut File, stem: &str, out: usize, cols: usize, rng: &mut Rng| {
        f.add(format!("{stem}.lora_up.weight"), &[out, 2], rng.values(out * 2, 0.1));
        f.add(format!("{stem}.lora_down.weight"), &[2, cols], rng.values(2 * cols, 0.1));
    };
    let cases: Vec<(&str, File, &str)> = vec![
        (
            "mid",
            {
                let mut f = File::default();
                lora(&mut f, "lora_unet_layers_0_feed_forward_w1", 170, D, &mut rng);
                f.add(
                    "lora_unet_layers_0_feed_forward_w1.lora_mid.weight",
                    &[2, 2, 1, 1],
                    rng.values(4, 0.1),
                );
                f
            },
            "lora_unet_layers_0_feed_forward_w1.lora_mid.weight",
        ),
        (
            "loha tucker",
            {
                let mut f = File::default();
                for n in ["hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "hada_t1", "hada_t2"]
                {
                    f.add(format!("layers.0.feed_forward.w1.{n}"), &[2, 2], rng.values(4, 0.1));
                }
                f
            },
            "layers.0.feed_forward.w1.hada_t",
        ),
        (
            "lokr tucker",
            {
                let mut f = File::default();
                for n in ["lokr_w1", "lokr_w2_a", "lokr_w2_b", "lokr_t2"] {
                    f.add(format!("layers.0.feed_forward.w1.{n}"), &[2, 2], rng.values(4, 0.1));
                }
                f
            },
            "layers.0.feed_forward.w1.lokr_t2",
        ),
        (
            "oft",
            {
                let mut f = File::default();
                f.add(
                    "lycoris_layers_0_feed_forward_w1.oft_blocks",
                    &[2, 4, 4],
                    rng.values(32, 0.1),
                );
                f
            },
            "lycoris_layers_0_feed_forward_w1.oft_blocks",
        ),
        (
            "glora",
            {
                let mut f = File::default();
                for n in ["a1", "a2", "b1", "b2"] {
                    f.add(
                        format!("layers.0.feed_forward.w1.{n}.weight"),
                        &[2, 2],
                        rng.values(4, 0.1),
                    );
                }
                f
            },
            "layers.0.feed_forward.w1.",
        ),
        (
            "dora on to_q",
            {
                let mut f = File::default();
                lora(&mut f, "transformer.layers.0.attention.to_q", D, D, &mut rng);
                f.add(
                    "transformer.layers.0.attention.to_q.dora_scale",
                    &[D, 1],
                    rng.values(D, 1.0),
                );
                f
            },
            "transformer.layers.0.attention.to_q.lora_up.weight",
        ),
        (
            "set on to_k",
            {
                let mut f = File::default();
                f.add(
                    "transformer.layers.0.attention.to_k.set_weight",
                    &[D, D],
                    rng.values(D * D, 1.0),
                );
                f
            },
            "transformer.layers.0.attention.to_k.set_weight",
        ),
        (
            "wrong shape",
            {
                let mut f = File::default();
                lora(&mut f, "transformer.layers.0.feed_forward.w1", 2 * D, D, &mut rng);
                f
            },
            "transformer.layers.0.feed_forward.w1.lora_up.weight",
        ),
        (
            "wrong qkv part shape",
            {
                let mut f = File::default();
                lora(&mut f, "transformer.layers.0.attention.to_v", 3 * D, D, &mut rng);
                f
            },
            "transformer.layers.0.attention.to_v.lora_up.weight",
        ),
        (
            "incomplete",
            {
                let mut f = File::default();
                f.add("layers.0.feed_forward.w1.lora_B.weight", &[170, 2], rng.values(340, 0.1));
                f
            },
            "layers.0.feed_forward.w1.lora_B.weight",
        ),
    ];
    for (what, file, key) in cases {
        let path = file.write(&format!("refuse_{}", what.replace(' ', "_")));
        match run(&path, 1.0) {
            Err(Error::Unsupported { path: p, msg }) => {
                assert_eq!(p, path, "{what}");
                assert!(msg.contains(key), "{what}: {msg}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
}

/// The fixture's weights widened to f32 (so patching writes back exactly), with `deltas` added.
fn model_file(deltas: &BTreeMap<String, Vec<f32>>, name: &str) -> PathBuf {
    let mut f = File::default();
    for (n, (shape, mut values)) in read_tensors("zimage/comfy.safetensors") {
        if let Some(d) = deltas.get(&n) {
            values.iter_mut().zip(d).for_each(|(v, d)| *v += d);
        }
        f.add(n, &shape, values);
    }
    f.write(name)
}

#[test]
fn patched_forward_matches_hand_patched_weights() {
    let strength = 0.7;
    let mut rng = Rng(23);
    let mut f = File::default();
    let mut deltas: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    let mut add_delta = |name: &str, d: Vec<f32>| {
        let e = deltas.entry(name.to_owned()).or_insert_with(|| vec![0.0; d.len()]);
        e.iter_mut().zip(d).for_each(|(e, d)| *e += d * strength);
    };
    // Split q/k/v LoRAs in every block of the main layers and the noise refiner (diffusers names).
    for block in ["layers.0", "layers.1", "noise_refiner.0", "context_refiner.1"] {
        let mut qkv = Vec::new();
        for (i, part) in ["to_q", "to_k", "to_v"].into_iter().enumerate() {
            let rank = 2 + i;
            let lr = LowRank::new(&mut rng, D, rank, D);
            let s = format!("transformer.{block}.attention.{part}");
            f.add(format!("{s}.lora_B.weight"), &[D, rank], lr.up.clone());
            f.add(format!("{s}.lora_A.weight"), &[rank, D], lr.down.clone());
            f.add(format!("{s}.alpha"), &[], vec![1.0 + i as f32]);
            qkv.extend(lr.delta((1.0 + i as f32) / rank as f32));
        }
        add_delta(&format!("{block}.attention.qkv.weight"), qkv);
        let lr = LowRank::new(&mut rng, D, 3, D);
        let s = format!("lora_unet_{}_attention_out", block.replace('.', "_"));
        f.add(format!("{s}.lora_up.weight"), &[D, 3], lr.up.clone());
        f.add(format!("{s}.lora_down.weight"), &[3, D], lr.down.clone());
        add_delta(&format!("{block}.attention.out.weight"), lr.delta(1.0));
        let lr = LowRank::new(&mut rng, 170, 4, D);
        let s = format!("diffusion_model.{block}.feed_forward.w1");
        f.add(format!("{s}.lora_up.weight"), &[170, 4], lr.up.clone());
        f.add(format!("{s}.lora_down.weight"), &[4, D], lr.down.clone());
        f.add(format!("{s}.alpha"), &[], vec![8.0]);
        add_delta(&format!("{block}.feed_forward.w1.weight"), lr.delta(2.0));
    }
    // A LoHa on an adaLN weight, a LoKr on the final layer, a bias diff on the x embedder.
    let (a, b, c, d) = (
        rng.values(4 * D * 2, 0.5),
        rng.values(2 * D, 0.5),
        rng.values(4 * D * 2, 0.5),
        rng.values(2 * D, 0.5),
    );
    let s = "layers.1.adaLN_modulation.0";
    f.add(format!("{s}.hada_w1_a"), &[4 * D, 2], a.clone());
    f.add(format!("{s}.hada_w1_b"), &[2, D], b.clone());
    f.add(format!("{s}.hada_w2_a"), &[4 * D, 2], c.clone());
    f.add(format!("{s}.hada_w2_b"), &[2, D], d.clone());
    add_delta(
        &format!("{s}.weight"),
        matmul(&a, &b, 4 * D, 2, D)
            .into_iter()
            .zip(matmul(&c, &d, 4 * D, 2, D))
            .map(|(x, y)| x * y)
            .collect(),
    );
    let (w1, w2) = (rng.values(8 * 4, 0.5), rng.values(8 * 16, 0.5));
    f.add("all_final_layer.2-1.linear.lokr_w1", &[8, 4], w1.clone());
    f.add("all_final_layer.2-1.linear.lokr_w2", &[8, 16], w2.clone());
    add_delta("final_layer.linear.weight", kron(&w1, (8, 4), &w2, (8, 16)));
    let bias = rng.values(D, 0.2);
    f.add("all_x_embedder.2-1.diff_b", &[D], bias.clone());
    add_delta("x_embedder.bias", bias);

    let lora = run(&f.write("e2e"), strength).expect("patches");
    assert!(lora.unmatched.is_empty(), "{:?}", lora.unmatched);
    assert_eq!(lora.patches.len(), deltas.len());

    let (b, manager) = cpu(1 << 30);
    let load = |path: PathBuf| {
        let file = SafetensorsFile::open(path).expect("model opens");
        ZImage::load(&manager, &Header::new(&file, ""), &mut |_, _| {}).expect("loads")
    };
    let model = load(model_file(&BTreeMap::new(), "e2e_base"));
    let hand = load(model_file(&deltas, "e2e_hand"));
    // The loaded model's own slots give the same patches.
    let slots: Vec<(&str, &[usize])> =
        model.weights.names().map(|n| (n, model.weights.info(n).expect("slot").1)).collect();
    let again = patches(&SafetensorsFile::open(f.write("e2e")).expect("opens"), &slots, strength)
        .expect("patches");
    assert_eq!(by_name(&again), by_name(&lora));

    let cases = read_tensors("zimage/cases.safetensors");
    let forward = |m: &ZImage| {
        let (xs, x) = &cases["b2.x"];
        let (cs, c) = &cases["b2.context"];
        let x = b.from_f32(xs, x, DType::F32).expect("x");
        let c = b.from_f32(cs, c, DType::F32).expect("context");
        b.to_f32(&m.forward(&*b, &x, &cases["b2.sigmas"].1, &c).expect("forward")).expect("read")
    };
    let plain = forward(&model);
    model.weights.set_patches(lora.patches.clone()).expect("set patches");
    let patched = forward(&model);
    let want = forward(&hand);
    assert_close("patched vs hand-patched", &patched, &want, 1e-4);
    // The LoRA changed the output well beyond the tolerance.
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let moved = plain.iter().zip(&want).fold(0f32, |m, (p, w)| m.max((p - w).abs()));
    assert!(moved > 0.05 * scale, "the LoRA moved the output by {moved} (scale {scale})");
    // Clearing the patches restores the original weights.
    model.weights.set_patches(Vec::new()).expect("clear");
    assert_close("restored", &forward(&model), &plain, 1e-6);
}
