//! Each op on the CPU backend against a plain reference implementation.
//!
//! The references are written here as naive loops with f64 accumulation, on small random shapes from a tiny
//! deterministic PRNG, plus the edge cases each op's contract names (every weight dtype, GQA with a causal
//! offset, blocks crossed at non-multiples, the exact patchify order, stochastic rounding, shape errors).

use kiln_compute::backend::cpu::Cpu;
use kiln_compute::backend::{
    AttentionMask, BinaryOp, Conv2dParams, ConvTerm, PadMode, RopeLayout, UnaryOp,
};
use kiln_compute::dtype::{self, round_to};
use kiln_compute::{Backend, DType, Error, OwnedWeight, Tensor};

const ALL_DTYPES: [DType; 5] = [DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2];
const COMPUTE_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// xorshift64*: a tiny deterministic generator.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

fn cpu() -> Cpu {
    Cpu::new(512 << 20)
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn tensor(cpu: &Cpu, shape: &[usize], values: &[f32], dtype: DType) -> Tensor<Cpu> {
    cpu.from_f32(shape, values, dtype).expect("from_f32")
}

/// Values as a tensor of `dtype` holds them.
fn rounded(values: &[f32], dtype: DType) -> Vec<f32> {
    values.iter().map(|&v| round_to(dtype, v)).collect()
}

fn weight(cpu: &Cpu, dtype: DType, shape: &[usize], values: &[f32]) -> OwnedWeight {
    OwnedWeight::from_f32(cpu.memory(), dtype, shape, values).expect("upload weight")
}

/// Asserts |got − want| ≤ atol + rtol·|want| everywhere.
#[track_caller]
fn assert_close(got: &[f32], want: &[f64], atol: f64, rtol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (f64::from(g) - w).abs() <= atol + rtol * w.abs() || (g.is_nan() && w.is_nan());
        assert!(ok, "{what}: element {i} is {g}, expected {w}");
    }
}

/// The tolerance of results stored in `dtype` (its rounding) on top of f32 accumulation error.
fn tol(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (1e-5, 1e-5),
        DType::F16 => (1e-3, 1e-3),
        _ => (1e-2, 8e-3),
    }
}

#[track_caller]
fn assert_shape_error<T: std::fmt::Debug>(r: Result<T, Error>, op: &str) {
    match r {
        Err(Error::Shape { op: got, .. }) => assert_eq!(got, op),
        other => panic!("expected a shape error from {op}, got {other:?}"),
    }
}

// --- Data movement -------------------------------------------------------------------------------------------

#[test]
fn tensors_round_to_their_dtype_and_back() {
    let cpu = cpu();
    let values =
        [1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), -0.1, 1e-8, 70000.0, 1.0 + 2f32.powi(-11)];
    for dtype in COMPUTE_DTYPES {
        let t = tensor(&cpu, &[2, 3], &values, dtype);
        assert_eq!((t.shape(), t.dtype()), (&[2usize, 3][..], dtype));
        assert_eq!(cpu.to_f32(&t).expect("to_f32"), rounded(&values, dtype), "{dtype}");
        let back = cpu.cast(&tensor(&cpu, &[6], &values, DType::F32), dtype).expect("cast");
        assert_eq!(cpu.to_f32(&back).expect("to_f32"), rounded(&values, dtype), "cast to {dtype}");
    }
    // Ties go to even: 1 + 2^-8 is halfway between two bf16 values, 1 + 2^-11 between two f16 values.
    let b = cpu.cast(&tensor(&cpu, &[6], &values, DType::F32), DType::BF16).expect("cast");
    assert_eq!(cpu.to_f32(&b).expect("to_f32")[..2], [1.0, 1.0 + 2f32.powi(-6)]);
    let h = cpu.cast(&tensor(&cpu, &[6], &values, DType::F32), DType::F16).expect("cast");
    let hv = cpu.to_f32(&h).expect("to_f32");
    assert_eq!((hv[4], hv[5]), (f32::INFINITY, 1.0));
    // f16 → bf16 goes through the exact f32 value.
    let hb = cpu.cast(&h, DType::BF16).expect("cast");
    assert_eq!(cpu.to_f32(&hb).expect("to_f32"), rounded(&hv, DType::BF16));
    let full = cpu.full(&[3, 2], 0.3, DType::BF16).expect("full");
    assert_eq!(cpu.to_f32(&full).expect("to_f32"), vec![round_to(DType::BF16, 0.3); 6]);
    assert_shape_error(cpu.from_f32(&[2], &[1.0, 2.0], DType::F8E4M3), "from_f32");
    assert_shape_error(cpu.from_f32(&[3], &[1.0, 2.0], DType::F32), "from_f32");
    assert_shape_error(cpu.cast(&b, DType::F8E5M2), "cast");
    assert_eq!(cpu.compute_dtype(), DType::F32);
    assert_eq!(cpu.info().kind, "cpu");
}

#[test]
fn weights_widen_from_every_dtype() {
    let cpu = cpu();
    let mut rng = Rng::new(1);
    let values: Vec<f32> = rng.vec(40).iter().map(|v| v * 8.0).collect();
    for dtype in ALL_DTYPES {
        let w = weight(&cpu, dtype, &[5, 8], &values);
        for out in COMPUTE_DTYPES {
            let t = cpu.weight_to_tensor(&w.view(), out).expect("weight_to_tensor");
            assert_eq!((t.shape(), t.dtype()), (&[5usize, 8][..], out));
            let want = rounded(&rounded(&values, dtype), out);
            assert_eq!(cpu.to_f32(&t).expect("to_f32"), want, "{dtype} as {out}");
        }
    }
}

#[test]
fn store_rounds_to_nearest_even_in_every_dtype() {
    let cpu = cpu();
    let mut rng = Rng::new(2);
    let values: Vec<f32> = rng.vec(1000).iter().map(|v| v * 20.0).collect();
    let x = tensor(&cpu, &[10, 100], &values, DType::F32);
    for dtype in ALL_DTYPES {
        let bytes = 1000 * dtype.size();
        let ptr = cpu.memory().alloc(bytes as u64).expect("alloc");
        cpu.store(&x, ptr, dtype, None).expect("store");
        let mut back = vec![0u8; bytes];
        cpu.sim().read(ptr, &mut back).expect("read");
        assert_eq!(back, dtype::narrow(dtype, &values), "{dtype}");
        cpu.memory().free(ptr).expect("free");
    }
    // A bf16 tensor stores its own values.
    let xb = cpu.cast(&x, DType::BF16).expect("cast");
    let ptr = cpu.memory().alloc(4000).expect("alloc");
    cpu.store(&xb, ptr, DType::F32, None).expect("store");
    let mut back = vec![0u8; 4000];
    cpu.sim().read(ptr, &mut back).expect("read");
    assert_eq!(dtype::widen(DType::F32, &back), rounded(&values, DType::BF16));
    // Unmapped memory is an error, not a crash.
    assert!(cpu.store(&x, kiln_compute::memory::DevPtr(16), DType::F32, None).is_err());
}

#[test]
fn stochastic_store_is_deterministic_and_unbiased() {
    let cpu = cpu();
    let n = 100_000;
    for (dtype, v) in [
        (DType::BF16, 1.0 + 2f32.powi(-9)),
        (DType::F16, 0.1f32),
        (DType::F8E4M3, 0.3f32),
        (DType::F8E5M2, -3.3f32),
    ] {
        let x = cpu.full(&[n], v, DType::F32).expect("full");
        let size = dtype.size();
        let ptr = cpu.memory().alloc((n * size) as u64).expect("alloc");
        let read = |seed: u64| {
            cpu.store(&x, ptr, dtype, Some(seed)).expect("store");
            let mut bytes = vec![0u8; n * size];
            cpu.sim().read(ptr, &mut bytes).expect("read");
            bytes
        };
        let a = read(11);
        assert_eq!(a, read(11), "{dtype}: the same seed stores the same bytes");
        assert_ne!(a, read(12), "{dtype}: another seed stores other bytes");
        let stored = dtype::widen(dtype, &a);
        let nearest = round_to(dtype, v);
        let mut neighbours: Vec<f32> = stored.clone();
        neighbours.sort_by(f32::total_cmp);
        neighbours.dedup();
        assert_eq!(neighbours.len(), 2, "{dtype}: values bracket {v}: {neighbours:?}");
        assert!(neighbours[0] < v && v < neighbours[1] && neighbours.contains(&nearest), "{dtype}");
        // The expected stored value is v; the mean of n draws is within a few standard errors.
        let p = f64::from((v - neighbours[0]) / (neighbours[1] - neighbours[0]));
        let sd = f64::from(neighbours[1] - neighbours[0]) * (p * (1.0 - p) / n as f64).sqrt();
        let mean = stored.iter().map(|&s| f64::from(s)).sum::<f64>() / n as f64;
        assert!((mean - f64::from(v)).abs() < 5.0 * sd, "{dtype}: mean {mean}, value {v}, sd {sd}");
        cpu.memory().free(ptr).expect("free");
    }
    // Values a dtype holds exactly are stored as they are.
    let exact = tensor(&cpu, &[3], &[1.0, -0.5, 0.0], DType::F32);
    let ptr = cpu.memory().alloc(6).expect("alloc");
    cpu.store(&exact, ptr, DType::BF16, Some(5)).expect("store");
    let mut back = vec![0u8; 6];
    cpu.sim().read(ptr, &mut back).expect("read");
    assert_eq!(dtype::widen(DType::BF16, &back), vec![1.0, -0.5, 0.0]);
}

// --- Linear algebra ------------------------------------------------------------------------------------------

fn linear_ref(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k).map(|l| f64::from(x[i * k + l]) * f64::from(w[j * k + l])).sum();
            out[i * n + j] = dot + bias.map_or(0.0, |b| f64::from(b[j]));
        }
    }
    out
}

#[test]
fn linear_matches_the_reference_for_every_weight_dtype() {
    let cpu = cpu();
    let mut rng = Rng::new(3);
    let (k, n) = (37, 19);
    let xv = rng.vec(2 * 3 * k);
    let wv = rng.vec(n * k);
    let bv = rng.vec(n);
    for wdt in ALL_DTYPES {
        let w = weight(&cpu, wdt, &[n, k], &wv);
        let b = weight(&cpu, wdt, &[n], &bv);
        let (wr, br) = (rounded(&wv, wdt), rounded(&bv, wdt));
        for xdt in COMPUTE_DTYPES {
            let x = tensor(&cpu, &[2, 3, k], &xv, xdt);
            let xr = rounded(&xv, xdt);
            for with_bias in [false, true] {
                let y = cpu
                    .linear(&x, &w.view(), with_bias.then(|| b.view()).as_ref())
                    .expect("linear");
                assert_eq!((y.shape(), y.dtype()), (&[2usize, 3, n][..], xdt));
                let want = linear_ref(&xr, &wr, with_bias.then_some(br.as_slice()), 6, n, k);
                let (atol, rtol) = tol(xdt);
                assert_close(
                    &cpu.to_f32(&y).expect("to_f32"),
                    &want,
                    atol,
                    rtol,
                    &format!("{wdt} x {xdt}"),
                );
            }
        }
    }
    // One row and a rank-1 input.
    let w = weight(&cpu, DType::BF16, &[n, k], &wv);
    let y = cpu.linear(&tensor(&cpu, &[k], &xv[..k], DType::F32), &w.view(), None).expect("linear");
    assert_eq!(y.shape(), &[n]);
    let want = linear_ref(&xv[..k], &rounded(&wv, DType::BF16), None, 1, n, k);
    assert_close(&cpu.to_f32(&y).expect("to_f32"), &want, 1e-5, 1e-5, "rank 1");
}

#[test]
fn linear_of_bf16_activations_and_weights_matches_the_reference() {
    // bf16 × bf16 with an even K takes the AVX512-BF16 path where the CPU has it; shapes that are not
    // multiples of its tiles (8 rows, 48 columns) and K over one of its blocks (2048).
    let cpu = cpu();
    let mut rng = Rng::new(20);
    for (m, n, k) in [(11, 50, 64), (3, 97, 2100), (1, 5, 2)] {
        let xv = rng.vec(m * k);
        let wv = rng.vec(n * k);
        let bv = rng.vec(n);
        let w = weight(&cpu, DType::BF16, &[n, k], &wv);
        let b = weight(&cpu, DType::BF16, &[n], &bv);
        let x = tensor(&cpu, &[m, k], &xv, DType::BF16);
        let y = cpu.linear(&x, &w.view(), Some(&b.view())).expect("linear");
        assert_eq!((y.shape(), y.dtype()), (&[m, n][..], DType::BF16));
        let br = rounded(&bv, DType::BF16);
        let want =
            linear_ref(&rounded(&xv, DType::BF16), &rounded(&wv, DType::BF16), Some(&br), m, n, k);
        // Only the output's rounding to bf16 (and f32 summation order) separates the two.
        assert_close(&cpu.to_f32(&y).expect("to_f32"), &want, 1e-4, 4e-3, &format!("{m}x{n}x{k}"));
    }
}

#[test]
fn scaled_weights_are_read_as_their_values_times_the_scale_by_every_op() {
    // A quantized weight (fp8 with a per-tensor scale) is the f32 product of each stored value and the scale,
    // for linear (bf16 and f32 activations, AVX-512 and portable paths), embedding and the ops that widen.
    let cpu = cpu();
    let mut rng = Rng::new(21);
    let (m, n, k) = (4, 40, 64);
    let scale = 0.0125_f32;
    let xv = rng.vec(m * k);
    let wv: Vec<f32> = rng.vec(n * k).iter().map(|v| v * 300.0).collect();
    for wdt in [DType::F8E4M3, DType::F8E5M2] {
        let w = weight(&cpu, wdt, &[n, k], &wv);
        let scaled = w.view().with_scale(Some(scale));
        let dequantized: Vec<f32> = rounded(&wv, wdt).iter().map(|q| q * scale).collect();
        let plain = weight(&cpu, DType::F32, &[n, k], &dequantized);
        for xdt in [DType::F32, DType::BF16] {
            let x = tensor(&cpu, &[m, k], &xv, xdt);
            let got = cpu.linear(&x, &scaled, None).and_then(|y| cpu.to_f32(&y)).expect("linear");
            let want =
                cpu.linear(&x, &plain.view(), None).and_then(|y| cpu.to_f32(&y)).expect("linear");
            assert_eq!(got, want, "{wdt} x {xdt}: as the f32 weight of the dequantized values");
        }
        let rows = cpu.embedding(&[3, 0], &scaled).and_then(|t| cpu.to_f32(&t)).expect("embed");
        assert_eq!(rows[..k], dequantized[3 * k..4 * k], "{wdt} embedding");
        let whole = cpu.weight_to_tensor(&scaled, DType::F32).and_then(|t| cpu.to_f32(&t));
        assert_eq!(whole.expect("weight_to_tensor"), dequantized, "{wdt} weight_to_tensor");
        // Views keep the scale.
        let row = scaled.rows(1, 1).expect("rows");
        assert_eq!(row.scale(), Some(scale));
    }
}

#[test]
fn linear_crosses_weight_blocks() {
    // Enough weight rows (over a million elements) for several widening blocks of the portable path and
    // hundreds of tasks of the AVX-512 one.
    let cpu = cpu();
    let mut rng = Rng::new(4);
    let (m, n, k) = (3, 150_001, 8);
    let xv = rng.vec(m * k);
    let wv = rng.vec(n * k);
    let w = weight(&cpu, DType::BF16, &[n, k], &wv);
    let y = cpu.linear(&tensor(&cpu, &[m, k], &xv, DType::F32), &w.view(), None).expect("linear");
    let want = linear_ref(&xv, &rounded(&wv, DType::BF16), None, m, n, k);
    assert_close(&cpu.to_f32(&y).expect("to_f32"), &want, 1e-5, 1e-5, "blocked linear");
}

#[test]
fn linear_rejects_bad_shapes() {
    let cpu = cpu();
    let w = weight(&cpu, DType::F32, &[4, 3], &[0.0; 12]);
    let x = cpu.full(&[2, 5], 1.0, DType::F32).expect("full");
    assert_shape_error(cpu.linear(&x, &w.view(), None), "linear");
    let x = cpu.full(&[2, 3], 1.0, DType::F32).expect("full");
    let bad_bias = weight(&cpu, DType::F32, &[3], &[0.0; 3]);
    assert_shape_error(cpu.linear(&x, &w.view(), Some(&bad_bias.view())), "linear");
    let w3 = weight(&cpu, DType::F32, &[1, 4, 3], &[0.0; 12]);
    assert_shape_error(cpu.linear(&x, &w3.view(), None), "linear");
    let scalar = cpu.full(&[], 1.0, DType::F32).expect("full");
    assert_shape_error(cpu.linear(&scalar, &w.view(), None), "linear");
}

#[test]
fn matmul_matches_the_reference_with_and_without_transpose() {
    let cpu = cpu();
    let mut rng = Rng::new(5);
    let (m, k, n) = (7, 11, 5);
    for (batch, transpose_b) in
        [(vec![2usize, 3], false), (vec![2, 3], true), (vec![1], true), (vec![], false)]
    {
        let bsz = numel(&batch);
        let av = rng.vec(bsz * m * k);
        let bv = rng.vec(bsz * k * n);
        let mut ash = batch.clone();
        ash.extend([m, k]);
        let mut bsh = batch.clone();
        bsh.extend(if transpose_b { [n, k] } else { [k, n] });
        let a = tensor(&cpu, &ash, &av, DType::F32);
        let b = tensor(&cpu, &bsh, &bv, DType::BF16);
        let bvr = rounded(&bv, DType::BF16);
        let y = cpu.matmul(&a, &b, transpose_b).expect("matmul");
        let mut want = Vec::new();
        for z in 0..bsz {
            for i in 0..m {
                for j in 0..n {
                    let dot: f64 = (0..k)
                        .map(|l| {
                            let bval = if transpose_b {
                                bvr[z * n * k + j * k + l]
                            } else {
                                bvr[z * k * n + l * n + j]
                            };
                            f64::from(av[z * m * k + i * k + l]) * f64::from(bval)
                        })
                        .sum();
                    want.push(dot);
                }
            }
        }
        let mut shape = batch.clone();
        shape.extend([m, n]);
        assert_eq!((y.shape(), y.dtype()), (shape.as_slice(), DType::F32));
        assert_close(
            &cpu.to_f32(&y).expect("to_f32"),
            &want,
            1e-5,
            1e-5,
            &format!("batch {batch:?} t {transpose_b}"),
        );
    }
    let a = cpu.full(&[2, 3, 4], 1.0, DType::F32).expect("full");
    let b = cpu.full(&[3, 4, 5], 1.0, DType::F32).expect("full");
    assert_shape_error(cpu.matmul(&a, &b, false), "matmul");
    let b = cpu.full(&[2, 5, 4], 1.0, DType::F32).expect("full");
    assert_shape_error(cpu.matmul(&a, &b, false), "matmul");
    assert!(cpu.matmul(&a, &b, true).is_ok());
    let v = cpu.full(&[4], 1.0, DType::F32).expect("full");
    assert_shape_error(cpu.matmul(&v, &v, false), "matmul");
}

#[test]
fn embedding_reads_rows_of_every_dtype() {
    let cpu = cpu();
    let mut rng = Rng::new(6);
    let (v, d) = (10, 6);
    let table = rng.vec(v * d);
    let ids = [3u32, 0, 9, 3];
    for dtype in ALL_DTYPES {
        let w = weight(&cpu, dtype, &[v, d], &table);
        let y = cpu.embedding(&ids, &w.view()).expect("embedding");
        assert_eq!((y.shape(), y.dtype()), (&[4usize, d][..], DType::F32));
        let tr = rounded(&table, dtype);
        let want: Vec<f32> =
            ids.iter().flat_map(|&i| tr[i as usize * d..(i as usize + 1) * d].to_vec()).collect();
        assert_eq!(cpu.to_f32(&y).expect("to_f32"), want, "{dtype}");
    }
    let w = weight(&cpu, DType::F32, &[v, d], &table);
    assert_shape_error(cpu.embedding(&[10], &w.view()), "embedding");
    assert_eq!(cpu.embedding(&[], &w.view()).expect("empty").shape(), &[0, d]);
}

// --- Normalisation -------------------------------------------------------------------------------------------

#[test]
fn rms_and_layer_norm_match_the_reference() {
    let cpu = cpu();
    let mut rng = Rng::new(7);
    let d = 24;
    let xv: Vec<f32> = rng.vec(3 * 4 * d).iter().map(|v| v * 3.0 + 0.5).collect();
    let wv = rng.vec(d);
    let bv = rng.vec(d);
    let eps = 1e-6;
    for wdt in ALL_DTYPES {
        let w = weight(&cpu, wdt, &[d], &wv);
        let b = weight(&cpu, wdt, &[d], &bv);
        let (wr, br) = (rounded(&wv, wdt), rounded(&bv, wdt));
        for xdt in [DType::F32, DType::BF16] {
            let x = tensor(&cpu, &[3, 4, d], &xv, xdt);
            let xr = rounded(&xv, xdt);
            let (atol, rtol) = tol(xdt);
            for with_w in [false, true] {
                let y = cpu.rms_norm(&x, with_w.then(|| w.view()).as_ref(), eps).expect("rms_norm");
                assert_eq!((y.shape(), y.dtype()), (&[3usize, 4, d][..], xdt));
                let mut want = Vec::new();
                for row in xr.chunks(d) {
                    let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / d as f64;
                    let inv = 1.0 / (ms + f64::from(eps)).sqrt();
                    for (i, &v) in row.iter().enumerate() {
                        want.push(f64::from(v) * inv * if with_w { f64::from(wr[i]) } else { 1.0 });
                    }
                }
                assert_close(
                    &cpu.to_f32(&y).expect("to_f32"),
                    &want,
                    atol,
                    rtol,
                    &format!("rms {wdt} {xdt}"),
                );
            }
            for (with_w, with_b) in [(false, false), (true, false), (false, true), (true, true)] {
                let y = cpu
                    .layer_norm(
                        &x,
                        with_w.then(|| w.view()).as_ref(),
                        with_b.then(|| b.view()).as_ref(),
                        1e-5,
                    )
                    .expect("layer_norm");
                let mut want = Vec::new();
                for row in xr.chunks(d) {
                    let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64;
                    let var =
                        row.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / d as f64;
                    for (i, &v) in row.iter().enumerate() {
                        let y = (f64::from(v) - mean) / (var + 1e-5).sqrt();
                        let y = if with_w { y * f64::from(wr[i]) } else { y };
                        want.push(if with_b { y + f64::from(br[i]) } else { y });
                    }
                }
                assert_close(
                    &cpu.to_f32(&y).expect("to_f32"),
                    &want,
                    atol,
                    rtol,
                    &format!("layer {wdt} {xdt}"),
                );
            }
        }
    }
    // Per-head RMSNorm: x [tokens, heads, head_dim] with a [head_dim] weight.
    let w = weight(&cpu, DType::F32, &[4], &wv[..4]);
    let x = tensor(&cpu, &[2, 3, 4], &xv[..24], DType::F32);
    let y = cpu.to_f32(&cpu.rms_norm(&x, Some(&w.view()), eps).expect("per-head")).expect("to_f32");
    for (row, yrow) in xv[..24].chunks(4).zip(y.chunks(4)) {
        let inv = 1.0
            / (row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / 4.0 + f64::from(eps))
                .sqrt();
        let want: Vec<f64> =
            row.iter().zip(&wv).map(|(&v, &g)| f64::from(v) * inv * f64::from(g)).collect();
        assert_close(yrow, &want, 1e-5, 1e-5, "per-head rms");
    }
    let wrong = weight(&cpu, DType::F32, &[5], &[1.0; 5]);
    assert_shape_error(cpu.rms_norm(&x, Some(&wrong.view()), eps), "rms_norm");
    assert_shape_error(cpu.layer_norm(&x, None, Some(&wrong.view()), eps), "layer_norm");
}

/// The channel norm gives the values of the transposed path the Wan VAEs took before it (channels last,
/// `rms_norm`, back, then the activation), bit for bit, with and without weights and activation.
#[test]
fn channel_rms_norm_is_the_transposed_rms_norm() {
    let cpu = cpu();
    let mut rng = Rng::new(17);
    let (n, c, h, w) = (2, 5, 3, 4);
    let xv: Vec<f32> = rng.vec(n * c * h * w).iter().map(|v| v * 3.0 + 0.25).collect();
    let gv = rng.vec(c);
    for xdt in [DType::F32, DType::BF16, DType::F16] {
        let x = tensor(&cpu, &[n, c, h, w], &xv, xdt);
        for gdt in [DType::F32, DType::BF16] {
            let g = weight(&cpu, gdt, &[c], &gv);
            for with_g in [false, true] {
                for act in [None, Some(UnaryOp::Silu), Some(UnaryOp::Gelu)] {
                    for eps in [f32::MIN_POSITIVE, 1e-6] {
                        let g = with_g.then(|| g.view());
                        let y =
                            cpu.channel_rms_norm(&x, g.as_ref(), eps, act).expect("channel norm");
                        assert_eq!((y.shape(), y.dtype()), (&[n, c, h, w][..], xdt));
                        let rows = cpu
                            .permute(&x.reshape(&[n, c, h * w]).expect("reshape"), &[0, 2, 1])
                            .expect("permute");
                        let normed = cpu.rms_norm(&rows, g.as_ref(), eps).expect("rms_norm");
                        let back = cpu.permute(&normed, &[0, 2, 1]).expect("permute back");
                        let want = match act {
                            Some(op) => cpu.unary(&back, op).expect("unary"),
                            None => back,
                        };
                        assert_eq!(
                            cpu.to_f32(&y).expect("to_f32"),
                            cpu.to_f32(&want).expect("to_f32"),
                            "{xdt} weight {with_g} {gdt} {act:?} eps {eps}"
                        );
                    }
                }
            }
        }
    }
    // No spatial dims: one position a sample.
    let x = tensor(&cpu, &[3, c], &xv[..3 * c], DType::F32);
    let y =
        cpu.to_f32(&cpu.channel_rms_norm(&x, None, 1e-6, None).expect("[B, C]")).expect("to_f32");
    let want = cpu.to_f32(&cpu.rms_norm(&x, None, 1e-6).expect("rms_norm")).expect("to_f32");
    assert_eq!(y, want);
    let wrong = weight(&cpu, DType::F32, &[c + 1], &[1.0; 6]);
    let x4 = tensor(&cpu, &[n, c, h, w], &xv, DType::F32);
    assert_shape_error(
        cpu.channel_rms_norm(&x4, Some(&wrong.view()), 1e-6, None),
        "channel_rms_norm",
    );
    let flat = tensor(&cpu, &[c], &xv[..c], DType::F32);
    assert_shape_error(cpu.channel_rms_norm(&flat, None, 1e-6, None), "channel_rms_norm");
}

#[test]
fn group_norm_matches_the_reference() {
    let cpu = cpu();
    let mut rng = Rng::new(8);
    let (b, c, h, w, groups) = (2, 6, 3, 5, 3);
    let xv: Vec<f32> = rng.vec(b * c * h * w).iter().map(|v| v * 2.0 - 0.3).collect();
    let wv = rng.vec(c);
    let bv = rng.vec(c);
    for wdt in [DType::F32, DType::BF16, DType::F8E4M3] {
        let wt = weight(&cpu, wdt, &[c], &wv);
        let bt = weight(&cpu, wdt, &[c], &bv);
        let (wr, br) = (rounded(&wv, wdt), rounded(&bv, wdt));
        for affine in [false, true] {
            let x = tensor(&cpu, &[b, c, h, w], &xv, DType::F32);
            let (wo, bo) = (affine.then(|| wt.view()), affine.then(|| bt.view()));
            let y = cpu.group_norm(&x, groups, wo.as_ref(), bo.as_ref(), 1e-5).expect("group_norm");
            let per = c / groups * h * w;
            let mut want = vec![0.0; xv.len()];
            for (gi, grp) in xv.chunks(per).enumerate() {
                let mean = grp.iter().map(|&v| f64::from(v)).sum::<f64>() / per as f64;
                let var =
                    grp.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / per as f64;
                for (j, &v) in grp.iter().enumerate() {
                    let ch = gi % groups * (c / groups) + j / (h * w);
                    let y = (f64::from(v) - mean) / (var + 1e-5).sqrt();
                    want[gi * per + j] =
                        if affine { y * f64::from(wr[ch]) + f64::from(br[ch]) } else { y };
                }
            }
            assert_close(
                &cpu.to_f32(&y).expect("to_f32"),
                &want,
                1e-5,
                1e-5,
                &format!("group {wdt} {affine}"),
            );
        }
    }
    // Over a 1-D spatial dimension and with no spatial dimension at all.
    let x = tensor(&cpu, &[2, 4, 7], &xv[..56], DType::F32);
    assert_eq!(cpu.group_norm(&x, 2, None, None, 1e-5).expect("1-d").shape(), &[2, 4, 7]);
    let x2 = tensor(&cpu, &[3, 4], &xv[..12], DType::F32);
    let y2 = cpu.to_f32(&cpu.group_norm(&x2, 2, None, None, 1e-5).expect("0-d")).expect("to_f32");
    let (a, bb) = (f64::from(xv[0]), f64::from(xv[1]));
    let want0 = (a - (a + bb) / 2.0) / (((a - bb) / 2.0).powi(2) + 1e-5).sqrt();
    assert_close(&y2[..1], &[want0], 1e-5, 1e-5, "two-element group");
    let x = tensor(&cpu, &[b, c, h, w], &xv, DType::F32);
    assert_shape_error(cpu.group_norm(&x, 4, None, None, 1e-5), "group_norm");
    assert_shape_error(cpu.group_norm(&x, 0, None, None, 1e-5), "group_norm");
}

#[test]
fn softmax_matches_the_reference() {
    let cpu = cpu();
    let mut rng = Rng::new(9);
    let d = 37;
    let mut xv: Vec<f32> = rng.vec(5 * d).iter().map(|v| v * 10.0).collect();
    xv[3] = f32::NEG_INFINITY;
    for xdt in [DType::F32, DType::BF16] {
        let x = tensor(&cpu, &[5, d], &xv, xdt);
        let y = cpu.softmax(&x).expect("softmax");
        let mut want = Vec::new();
        for row in rounded(&xv, xdt).chunks(d) {
            let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
            let s: f64 = row.iter().map(|&v| (f64::from(v) - m).exp()).sum();
            want.extend(row.iter().map(|&v| (f64::from(v) - m).exp() / s));
        }
        let (atol, rtol) = tol(xdt);
        assert_close(
            &cpu.to_f32(&y).expect("to_f32"),
            &want,
            atol,
            rtol,
            &format!("softmax {xdt}"),
        );
    }
}

// --- Attention and position ----------------------------------------------------------------------------------

#[allow(clippy::too_many_arguments)]
fn attention_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (b, hq, hkv, nq, nk, d, dv): (usize, usize, usize, usize, usize, usize, usize),
    causal: bool,
    scale: f32,
) -> Vec<f64> {
    let mut out = vec![0.0; b * hq * nq * dv];
    for bi in 0..b {
        for h in 0..hq {
            let kh = h / (hq / hkv);
            for i in 0..nq {
                let visible =
                    |j: usize| !causal || (j as isize) <= i as isize + nk as isize - nq as isize;
                let scores: Vec<f64> = (0..nk)
                    .map(|j| {
                        (0..d)
                            .map(|l| {
                                f64::from(q[((bi * hq + h) * nq + i) * d + l])
                                    * f64::from(k[((bi * hkv + kh) * nk + j) * d + l])
                            })
                            .sum::<f64>()
                            * f64::from(scale)
                    })
                    .collect();
                let m = (0..nk)
                    .filter(|&j| visible(j))
                    .map(|j| scores[j])
                    .fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    continue; // no visible key: zeros
                }
                let p: Vec<f64> =
                    (0..nk).map(|j| if visible(j) { (scores[j] - m).exp() } else { 0.0 }).collect();
                let s: f64 = p.iter().sum();
                for e in 0..dv {
                    out[((bi * hq + h) * nq + i) * dv + e] = (0..nk)
                        .map(|j| p[j] * f64::from(v[((bi * hkv + kh) * nk + j) * dv + e]))
                        .sum::<f64>()
                        / s;
                }
            }
        }
    }
    out
}

fn check_attention(
    cpu: &Cpu,
    rng: &mut Rng,
    dims: (usize, usize, usize, usize, usize, usize, usize),
    dtype: DType,
) {
    let (b, hq, hkv, nq, nk, d, dv) = dims;
    let qv: Vec<f32> = rng.vec(b * hq * nq * d).iter().map(|x| x * 2.0).collect();
    let kv: Vec<f32> = rng.vec(b * hkv * nk * d).iter().map(|x| x * 2.0).collect();
    let vv = rng.vec(b * hkv * nk * dv);
    let q = tensor(cpu, &[b, hq, nq, d], &qv, dtype);
    let k = tensor(cpu, &[b, hkv, nk, d], &kv, dtype);
    let v = tensor(cpu, &[b, hkv, nk, dv], &vv, dtype);
    let scale = 1.0 / (d as f32).sqrt();
    for (mask, causal) in [(AttentionMask::None, false), (AttentionMask::Causal, true)] {
        let y = cpu.attention(&q, &k, &v, mask, scale).expect("attention");
        assert_eq!((y.shape(), y.dtype()), (&[b, hq, nq, dv][..], dtype));
        let want = attention_ref(
            &rounded(&qv, dtype),
            &rounded(&kv, dtype),
            &rounded(&vv, dtype),
            dims,
            causal,
            scale,
        );
        let (atol, rtol) = tol(dtype);
        assert_close(
            &cpu.to_f32(&y).expect("to_f32"),
            &want,
            atol,
            rtol,
            &format!("{dims:?} {mask:?} {dtype}"),
        );
    }
}

#[test]
fn attention_handles_gqa_and_the_causal_offset() {
    let cpu = cpu();
    let mut rng = Rng::new(10);
    // Grouped-query heads with Nq < Nk (a decoder with a cache), Dv ≠ D.
    check_attention(&cpu, &mut rng, (2, 4, 2, 5, 9, 16, 8), DType::F32);
    // Nq > Nk: the first queries see no key under the causal rule.
    check_attention(&cpu, &mut rng, (1, 3, 1, 6, 4, 8, 8), DType::F32);
    check_attention(&cpu, &mut rng, (1, 2, 2, 7, 7, 8, 4), DType::BF16);
}

#[test]
fn attention_crosses_query_and_key_blocks() {
    // More tokens than one query block (512) and two key blocks (256), at non-multiples of both; with
    // Nq < Nk the causal diagonal crosses key blocks partway.
    let cpu = cpu();
    let mut rng = Rng::new(11);
    check_attention(&cpu, &mut rng, (1, 2, 1, 600, 700, 4, 4), DType::F32);
    check_attention(&cpu, &mut rng, (1, 1, 1, 131, 517, 4, 4), DType::F32);
}

#[test]
fn attention_rejects_bad_shapes() {
    let cpu = cpu();
    let q = cpu.full(&[1, 3, 4, 8], 0.0, DType::F32).expect("full");
    let k = cpu.full(&[1, 2, 4, 8], 0.0, DType::F32).expect("full");
    assert_shape_error(cpu.attention(&q, &k, &k, AttentionMask::None, 1.0), "attention");
    let k = cpu.full(&[1, 1, 4, 7], 0.0, DType::F32).expect("full");
    assert_shape_error(cpu.attention(&q, &k, &k, AttentionMask::None, 1.0), "attention");
    let k = cpu.full(&[1, 1, 4, 8], 0.0, DType::F32).expect("full");
    let v = cpu.full(&[1, 1, 5, 8], 0.0, DType::F32).expect("full");
    assert_shape_error(cpu.attention(&q, &k, &v, AttentionMask::None, 1.0), "attention");
    let flat = cpu.full(&[3, 4, 8], 0.0, DType::F32).expect("full");
    assert_shape_error(cpu.attention(&flat, &k, &k, AttentionMask::None, 1.0), "attention");
}

#[test]
fn rope_rotates_pairs_in_both_layouts() {
    let cpu = cpu();
    let mut rng = Rng::new(12);
    let (b, n, h, d) = (2, 5, 3, 8);
    let xv = rng.vec(b * n * h * d);
    let angles: Vec<f32> = rng.vec(n * d / 2).iter().map(|a| a * 3.0).collect();
    let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
    let ct = tensor(&cpu, &[n, d / 2], &cos, DType::F32);
    let st = tensor(&cpu, &[n, d / 2], &sin, DType::F32);
    for layout in [RopeLayout::Interleaved, RopeLayout::Half] {
        let x = tensor(&cpu, &[b, n, h, d], &xv, DType::F32);
        let y = cpu.to_f32(&cpu.rope(&x, &ct, &st, layout).expect("rope")).expect("to_f32");
        let mut want = vec![0.0f64; xv.len()];
        for bi in 0..b {
            for t in 0..n {
                for hh in 0..h {
                    let base = ((bi * n + t) * h + hh) * d;
                    for m in 0..d / 2 {
                        let (i, j) = match layout {
                            RopeLayout::Interleaved => (2 * m, 2 * m + 1),
                            RopeLayout::Half => (m, m + d / 2),
                        };
                        let a = f64::from(angles[t * d / 2 + m]);
                        let (xi, xj) = (f64::from(xv[base + i]), f64::from(xv[base + j]));
                        want[base + i] = xi * a.cos() - xj * a.sin();
                        want[base + j] = xi * a.sin() + xj * a.cos();
                    }
                }
            }
        }
        assert_close(&y, &want, 1e-6, 1e-5, &format!("{layout:?}"));
    }
    let x = tensor(&cpu, &[b, n, h, d], &xv, DType::F32);
    let short = tensor(&cpu, &[n - 1, d / 2], &cos[..(n - 1) * d / 2], DType::F32);
    assert_shape_error(cpu.rope(&x, &short, &st, RopeLayout::Half), "rope");
    let odd = cpu.full(&[1, 1, 1, 3], 0.0, DType::F32).expect("full");
    assert_shape_error(cpu.rope(&odd, &ct, &st, RopeLayout::Half), "rope");
}

// --- Elementwise ---------------------------------------------------------------------------------------------

/// erf by its Taylor series (exact to f64 rounding for |x| ≤ 4; ±1 within 2e-8 beyond).
fn erf64(x: f64) -> f64 {
    if x.abs() > 4.0 {
        return x.signum();
    }
    let (mut term, mut sum, mut n) = (x, x, 0.0f64);
    while term.abs() > 1e-17 {
        n += 1.0;
        term *= -x * x / n;
        sum += term / (2.0 * n + 1.0);
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

fn unary_ref(op: UnaryOp, x: f64) -> f64 {
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    match op {
        UnaryOp::Silu => x * sigmoid(x),
        UnaryOp::Gelu => 0.5 * x * (1.0 + erf64(x / 2f64.sqrt())),
        UnaryOp::GeluTanh => {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        }
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => sigmoid(x),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Neg => -x,
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::NanToNum => x,
    }
}

const UNARY_OPS: [UnaryOp; 9] = [
    UnaryOp::Silu,
    UnaryOp::Gelu,
    UnaryOp::GeluTanh,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Exp,
    UnaryOp::Neg,
    UnaryOp::Relu,
    UnaryOp::NanToNum,
];

#[test]
fn nan_to_num_makes_nan_zero_and_infinities_the_dtypes_largest_finite_values() {
    let cpu = cpu();
    // 1e5 is past f16's range: it is +inf once stored in f16.
    let xv = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.5, -2.25, 1e5];
    for (dt, max) in [(DType::F32, f32::MAX), (DType::F16, 65504.0), (DType::BF16, 3.3895314e38)] {
        let x = tensor(&cpu, &[2, 3], &xv, dt);
        let y = cpu.to_f32(&cpu.unary(&x, UnaryOp::NanToNum).expect("nan_to_num")).expect("to_f32");
        let big = if dt == DType::F16 { max } else { 1e5 };
        let want = [0.0, max, -max, 1.5, -2.25, big];
        let want: Vec<f32> = want.iter().map(|&v| rounded(&[v], dt)[0]).collect();
        assert_eq!(y, want, "{dt}");
    }
}

#[test]
fn unary_ops_match_the_reference() {
    let cpu = cpu();
    let mut rng = Rng::new(13);
    let mut xv: Vec<f32> = rng.vec(997).iter().map(|v| v * 12.0).collect();
    xv.extend([0.0, -30.0, 30.0, 1e-4, -1e-4]);
    for op in UNARY_OPS {
        for xdt in [DType::F32, DType::BF16] {
            let x = tensor(&cpu, &[2, xv.len() / 2], &xv, xdt);
            let y = cpu.unary(&x, op).expect("unary");
            assert_eq!((y.shape(), y.dtype()), (x.shape(), xdt));
            let want: Vec<f64> =
                rounded(&xv, xdt).iter().map(|&v| unary_ref(op, f64::from(v))).collect();
            let (atol, rtol) = if xdt == DType::F32 { (2e-6, 2e-6) } else { tol(xdt) };
            assert_close(
                &cpu.to_f32(&y).expect("to_f32"),
                &want,
                atol,
                rtol,
                &format!("{op:?} {xdt}"),
            );
        }
    }
}

#[test]
fn gated_affine_and_modulate_match_the_reference() {
    let cpu = cpu();
    let mut rng = Rng::new(14);
    let (b, n, d) = (2, 3, 10);
    let gv: Vec<f32> = rng.vec(b * n * d).iter().map(|v| v * 4.0).collect();
    let uv = rng.vec(b * n * d);
    let g = tensor(&cpu, &[b, n, d], &gv, DType::F32);
    let u = tensor(&cpu, &[b, n, d], &uv, DType::F32);
    for act in [UnaryOp::Silu, UnaryOp::Gelu, UnaryOp::GeluTanh] {
        let y = cpu.gated(&g, &u, act).expect("gated");
        let want: Vec<f64> = gv
            .iter()
            .zip(&uv)
            .map(|(&a, &c)| unary_ref(act, f64::from(a)) * f64::from(c))
            .collect();
        assert_close(
            &cpu.to_f32(&y).expect("to_f32"),
            &want,
            2e-6,
            2e-6,
            &format!("gated {act:?}"),
        );
    }
    assert_shape_error(
        cpu.gated(&g, &cpu.full(&[b, n], 1.0, DType::F32).expect("full"), UnaryOp::Silu),
        "gated",
    );

    let y = cpu.affine(&g, -0.5, 2.0).expect("affine");
    let want: Vec<f64> = gv.iter().map(|&v| f64::from(v) * -0.5 + 2.0).collect();
    assert_close(&cpu.to_f32(&y).expect("to_f32"), &want, 1e-6, 1e-6, "affine");

    let sc = rng.vec(b * d);
    let sh = rng.vec(b * d);
    for scale_shape in [vec![b, d], vec![b, 1, d]] {
        let s = tensor(&cpu, &scale_shape, &sc, DType::F32);
        let t = tensor(&cpu, &scale_shape, &sh, DType::F32);
        for with_shift in [false, true] {
            let y = cpu.modulate(&g, &s, with_shift.then_some(&t)).expect("modulate");
            let mut want = Vec::new();
            for (i, &v) in gv.iter().enumerate() {
                let (bi, j) = (i / (n * d), i % d);
                let shift = if with_shift { f64::from(sh[bi * d + j]) } else { 0.0 };
                want.push(f64::from(v) * (1.0 + f64::from(sc[bi * d + j])) + shift);
            }
            assert_close(&cpu.to_f32(&y).expect("to_f32"), &want, 1e-6, 1e-6, "modulate");
        }
    }
    let wrong = cpu.full(&[b, d + 1], 0.0, DType::F32).expect("full");
    assert_shape_error(cpu.modulate(&g, &wrong, None), "modulate");
}

/// The numpy broadcast of `op(a, b)` by index arithmetic.
fn binary_ref(
    a: &[f32],
    ash: &[usize],
    b: &[f32],
    bsh: &[usize],
    op: BinaryOp,
) -> (Vec<usize>, Vec<f64>) {
    let rank = ash.len().max(bsh.len());
    let pad = |s: &[usize]| {
        let mut p = vec![1; rank - s.len()];
        p.extend_from_slice(s);
        p
    };
    let (pa, pb) = (pad(ash), pad(bsh));
    let shape: Vec<usize> = pa.iter().zip(&pb).map(|(&x, &y)| x.max(y)).collect();
    let flat = |s: &[usize], idx: &[usize]| {
        idx.iter().zip(s).fold(0, |acc, (&i, &d)| acc * d + if d == 1 { 0 } else { i })
    };
    let mut out = Vec::new();
    for lin in 0..numel(&shape) {
        let mut idx = vec![0; rank];
        let mut r = lin;
        for dim in (0..rank).rev() {
            idx[dim] = r % shape[dim];
            r /= shape[dim];
        }
        let (x, y) = (f64::from(a[flat(&pa, &idx)]), f64::from(b[flat(&pb, &idx)]));
        out.push(match op {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
            BinaryOp::Div => x / y,
        });
    }
    (shape, out)
}

#[test]
fn binary_ops_broadcast_like_numpy() {
    let cpu = cpu();
    let mut rng = Rng::new(15);
    let cases: [(&[usize], &[usize]); 7] = [
        (&[2, 3, 4], &[2, 3, 4]),
        (&[2, 3, 4], &[4]),
        (&[2, 3, 4], &[3, 1]),
        (&[2, 1, 4], &[1, 3, 1]),
        (&[1], &[2, 3]),
        (&[3, 1, 5, 1], &[1, 4, 1, 2]),
        (&[2, 3, 4], &[]),
    ];
    for (ash, bsh) in cases {
        let av = rng.vec(numel(ash));
        let bv: Vec<f32> = rng.vec(numel(bsh)).iter().map(|v| v + 2.5).collect();
        for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
            for adt in [DType::F32, DType::BF16] {
                let a = tensor(&cpu, ash, &av, adt);
                let b = tensor(&cpu, bsh, &bv, DType::F32);
                let y = cpu.binary(&a, &b, op).expect("binary");
                let (shape, want) = binary_ref(&rounded(&av, adt), ash, &bv, bsh, op);
                assert_eq!((y.shape(), y.dtype()), (shape.as_slice(), adt), "{ash:?} {bsh:?}");
                let (atol, rtol) = tol(adt);
                assert_close(
                    &cpu.to_f32(&y).expect("to_f32"),
                    &want,
                    atol,
                    rtol,
                    &format!("{ash:?} {op:?} {bsh:?}"),
                );
            }
        }
    }
    let a = cpu.full(&[2, 3], 1.0, DType::F32).expect("full");
    let b = cpu.full(&[2], 1.0, DType::F32).expect("full");
    assert_shape_error(cpu.binary(&a, &b, BinaryOp::Add), "binary");
}

// --- Images --------------------------------------------------------------------------------------------------

#[allow(clippy::too_many_arguments)]
fn conv_ref(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    (b, c, h, wd): (usize, usize, usize, usize),
    (o, kh, kw): (usize, usize, usize),
    stride: usize,
    [top, bottom, left, right]: [usize; 4],
) -> (Vec<usize>, Vec<f64>) {
    let oh = (h + top + bottom - kh) / stride + 1;
    let ow = (wd + left + right - kw) / stride + 1;
    let mut out = Vec::new();
    for bi in 0..b {
        for oc in 0..o {
            for y in 0..oh {
                for xx in 0..ow {
                    let mut acc = bias.map_or(0.0, |bb| f64::from(bb[oc]));
                    for ic in 0..c {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (y * stride + ky) as isize - top as isize;
                                let ix = (xx * stride + kx) as isize - left as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                let xv = x[((bi * c + ic) * h + iy as usize) * wd + ix as usize];
                                acc += f64::from(xv)
                                    * f64::from(w[((oc * c + ic) * kh + ky) * kw + kx]);
                            }
                        }
                    }
                    out.push(acc);
                }
            }
        }
    }
    (vec![b, o, oh, ow], out)
}

#[test]
fn conv2d_matches_the_reference() {
    let cpu = cpu();
    let mut rng = Rng::new(16);
    let (b, c, h, w) = (2, 3, 7, 6);
    let xv = rng.vec(b * c * h * w);
    // (out channels, kh, kw, stride, padding)
    let cases = [
        (4, 3, 3, 1, [1, 1, 1, 1]),
        (5, 1, 1, 1, [0, 0, 0, 0]),
        (2, 1, 1, 1, [1, 0, 2, 0]),
        (4, 3, 3, 2, [0, 1, 0, 1]),
        (3, 3, 3, 2, [1, 1, 1, 1]),
        (2, 2, 3, 1, [0, 2, 1, 0]),
        (3, 3, 1, 1, [0, 0, 0, 0]),
        (2, 1, 1, 2, [0, 0, 0, 0]),
    ];
    for (o, kh, kw, stride, padding) in cases {
        let wv = rng.vec(o * c * kh * kw);
        let bv = rng.vec(o);
        for (wdt, with_bias) in [(DType::F32, true), (DType::BF16, false), (DType::F8E4M3, true)] {
            let wt = weight(&cpu, wdt, &[o, c, kh, kw], &wv);
            let bt = weight(&cpu, wdt, &[o], &bv);
            let x = tensor(&cpu, &[b, c, h, w], &xv, DType::F32);
            let params = Conv2dParams { stride, padding };
            let y = cpu
                .conv2d(&x, &wt.view(), with_bias.then(|| bt.view()).as_ref(), params)
                .expect("conv2d");
            let br = rounded(&bv, wdt);
            let (shape, want) = conv_ref(
                &xv,
                &rounded(&wv, wdt),
                with_bias.then_some(br.as_slice()),
                (b, c, h, w),
                (o, kh, kw),
                stride,
                padding,
            );
            assert_eq!(y.shape(), shape.as_slice(), "{kh}×{kw} s{stride} {padding:?}");
            let what = format!("{kh}×{kw} s{stride} {padding:?} {wdt}");
            assert_close(&cpu.to_f32(&y).expect("to_f32"), &want, 1e-5, 1e-5, &what);
        }
    }
    let x = tensor(&cpu, &[b, c, h, w], &xv, DType::F32);
    let wrong = weight(&cpu, DType::F32, &[2, c + 1, 3, 3], &vec![0.0; 2 * (c + 1) * 9]);
    assert_shape_error(cpu.conv2d(&x, &wrong.view(), None, Conv2dParams::same(1)), "conv2d");
    let big = weight(&cpu, DType::F32, &[2, c, 9, 9], &vec![0.0; 2 * c * 81]);
    assert_shape_error(cpu.conv2d(&x, &big.view(), None, Conv2dParams::same(0)), "conv2d");
    let ok = weight(&cpu, DType::F32, &[2, c, 3, 3], &vec![0.0; 2 * c * 9]);
    assert_shape_error(
        cpu.conv2d(&x, &ok.view(), None, Conv2dParams { stride: 0, padding: [1; 4] }),
        "conv2d",
    );
    // No input channels, or rows only of padding: every output is the bias (as torch's conv2d gives).
    for (xs, ws, padding) in
        [([b, 0, h, w], [2, 0, 3, 3], [1; 4]), ([b, c, 0, w], [2, c, 3, 3], [2, 2, 1, 1])]
    {
        let x = tensor(&cpu, &xs, &[], DType::F32);
        let wt = weight(&cpu, DType::F32, &ws, &vec![0.5; ws.iter().product()]);
        let bias = weight(&cpu, DType::F32, &[2], &[0.25, -1.0]);
        let params = Conv2dParams { stride: 1, padding };
        let y = cpu.conv2d(&x, &wt.view(), Some(&bias.view()), params).expect("empty conv2d");
        let plane = y.shape()[2] * y.shape()[3];
        assert!(plane > 0, "{xs:?}: {:?}", y.shape());
        let want: Vec<f32> = (0..b * 2 * plane).map(|i| [0.25, -1.0][i / plane % 2]).collect();
        assert_eq!(cpu.to_f32(&y).expect("to_f32"), want, "{xs:?}");
    }
}

/// A causal 3-D convolution's shape of sum: three temporal taps over 4 output frames, the last tap over every
/// frame, the others over the frames after the zeros they read; the frames no tap reaches hold the bias.
#[test]
fn conv2d_sum_adds_each_term_into_its_frames() {
    let cpu = cpu();
    let mut rng = Rng::new(18);
    let (c, h, w, o) = (3, 5, 4, 2);
    let params = Conv2dParams::same(1);
    let frames =
        |n: usize, rng: &mut Rng| tensor(&cpu, &[n, c, h, w], &rng.vec(n * c * h * w), DType::F32);
    let (x2, x3, x4) = (frames(2, &mut rng), frames(3, &mut rng), frames(4, &mut rng));
    let taps: Vec<OwnedWeight> =
        (0..3).map(|_| weight(&cpu, DType::BF16, &[o, c, 3, 3], &rng.vec(o * c * 9))).collect();
    let biases = rng.vec(o);
    let bias = weight(&cpu, DType::F32, &[o], &biases);
    let bv = bias.view();
    let conv = |x: &Tensor<Cpu>, t: usize| {
        cpu.to_f32(&cpu.conv2d(x, &taps[t].view(), None, params).expect("conv2d")).expect("to_f32")
    };
    let plane = o * h * w;
    let bias_of = |i: usize| biases[i / (h * w) % o];
    let (w0, w1, w2) = (taps[0].view(), taps[1].view(), taps[2].view());
    // Covering: the last tap over the 4 frames, tap 1 from frame 1, tap 0 from frame 2.
    let terms =
        [ConvTerm::whole(&x4, &w2, 0), ConvTerm::whole(&x3, &w1, 1), ConvTerm::whole(&x2, &w0, 2)];
    let got = cpu.to_f32(&cpu.conv2d_sum(&terms, Some(&bv), params, 4).expect("sum")).expect("f32");
    let mut want = conv(&x4, 2);
    for (x, t, at) in [(&x3, 1, 1), (&x2, 0, 2)] {
        for (d, v) in want[at * plane..].iter_mut().zip(conv(x, t)) {
            *d += v;
        }
    }
    let want: Vec<f64> = want.iter().enumerate().map(|(i, &v)| f64::from(v + bias_of(i))).collect();
    assert_close(&got, &want, 1e-5, 1e-5, "three taps");
    // Not covering: frames 0 and 1 are the bias alone.
    let terms = [ConvTerm::whole(&x2, &w0, 2), ConvTerm::whole(&x3, &w1, 1)];
    let got = cpu.to_f32(&cpu.conv2d_sum(&terms, Some(&bv), params, 4).expect("sum")).expect("f32");
    let mut want = vec![0.0f32; 4 * plane];
    for (x, t, at) in [(&x2, 0, 2), (&x3, 1, 1)] {
        for (d, v) in want[at * plane..].iter_mut().zip(conv(x, t)) {
            *d += v;
        }
    }
    let want: Vec<f64> = want.iter().enumerate().map(|(i, &v)| f64::from(v + bias_of(i))).collect();
    assert_close(&got, &want, 1e-5, 1e-5, "two taps after the first frame");
    // Terms reading a run of their input's frames where it lies: frames 1..3 of x4, then frame 0 of x2.
    let terms = [
        ConvTerm { x: &x4, from: 1, n: 2, w: &w2, at: 0 },
        ConvTerm { x: &x2, from: 0, n: 1, w: &w0, at: 1 },
    ];
    let got = cpu.to_f32(&cpu.conv2d_sum(&terms, None, params, 2).expect("sum")).expect("f32");
    let frames = |x: &Tensor<Cpu>, from: usize, n: usize| cpu.slice(x, 0, from, n).expect("slice");
    let mut want = conv(&frames(&x4, 1, 2), 2);
    for (d, v) in want[plane..].iter_mut().zip(conv(&frames(&x2, 0, 1), 0)) {
        *d += v;
    }
    let want: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
    assert_close(&got, &want, 1e-5, 1e-5, "runs of frames");
    // One term over the batch: conv2d itself, bit for bit (an image's causal convolution).
    let xb = tensor(&cpu, &[4, c, h, w], &rng.vec(4 * c * h * w), DType::BF16);
    let one = cpu.conv2d_sum(&[ConvTerm::whole(&xb, &w2, 0)], Some(&bv), params, 4).expect("one");
    let direct = cpu.conv2d(&xb, &w2, Some(&bv), params).expect("conv2d");
    assert_eq!(cpu.to_f32(&one).expect("f32"), cpu.to_f32(&direct).expect("f32"));
    // Bad sums.
    assert_shape_error(cpu.conv2d_sum(&[], None, params, 4), "conv2d_sum");
    let past = [ConvTerm::whole(&x3, &w1, 2)];
    assert_shape_error(cpu.conv2d_sum(&past, None, params, 4), "conv2d_sum");
    let beyond = [ConvTerm { x: &x3, from: 2, n: 2, w: &w1, at: 0 }];
    assert_shape_error(cpu.conv2d_sum(&beyond, None, params, 4), "conv2d_sum");
    let other = weight(&cpu, DType::F32, &[o, c, 1, 1], &rng.vec(o * c));
    let ov = other.view();
    let mixed = [ConvTerm::whole(&x4, &w2, 0), ConvTerm::whole(&x2, &ov, 0)];
    assert_shape_error(cpu.conv2d_sum(&mixed, None, params, 4), "conv2d_sum");
    let narrow = tensor(&cpu, &[2, c, h, w - 1], &rng.vec(2 * c * h * (w - 1)), DType::F32);
    let sides = [ConvTerm::whole(&x4, &w2, 0), ConvTerm::whole(&narrow, &w1, 0)];
    assert_shape_error(cpu.conv2d_sum(&sides, None, params, 4), "conv2d_sum");
}

#[test]
fn upsample_repeats_each_pixel_twice_each_way() {
    let cpu = cpu();
    let (b, c, h, w) = (2, 3, 4, 5);
    let xv: Vec<f32> = (0..b * c * h * w).map(|i| i as f32).collect();
    for dt in [DType::F32, DType::BF16] {
        let y = cpu.upsample_nearest2x(&tensor(&cpu, &[b, c, h, w], &xv, dt)).expect("upsample");
        assert_eq!((y.shape(), y.dtype()), (&[b, c, 2 * h, 2 * w][..], dt));
        let yv = cpu.to_f32(&y).expect("to_f32");
        for p in 0..b * c {
            for yy in 0..2 * h {
                for xx in 0..2 * w {
                    let want = round_to(dt, xv[(p * h + yy / 2) * w + xx / 2]);
                    assert_eq!(yv[(p * 2 * h + yy) * 2 * w + xx], want);
                }
            }
        }
    }
    assert_shape_error(
        cpu.upsample_nearest2x(&cpu.full(&[2, 3], 0.0, DType::F32).expect("full")),
        "upsample_nearest2x",
    );
}

#[test]
fn patchify_uses_nextdit_order_and_unpatchify_inverts_it() {
    let cpu = cpu();
    let (b, c, h, w, p) = (2, 3, 4, 6, 2);
    // Each value encodes its (batch, channel, y, x).
    let code =
        |bi: usize, ch: usize, y: usize, x: usize| (bi * 1000 + ch * 100 + y * 10 + x) as f32;
    let mut xv = Vec::new();
    for bi in 0..b {
        for ch in 0..c {
            for y in 0..h {
                for x in 0..w {
                    xv.push(code(bi, ch, y, x));
                }
            }
        }
    }
    let x = tensor(&cpu, &[b, c, h, w], &xv, DType::F32);
    let t = cpu.patchify(&x, p).expect("patchify");
    let (gh, gw) = (h / p, w / p);
    assert_eq!(t.shape(), &[b, gh * gw, p * p * c]);
    let tv = cpu.to_f32(&t).expect("to_f32");
    for bi in 0..b {
        for r in 0..gh {
            for s in 0..gw {
                for py in 0..p {
                    for px in 0..p {
                        for ch in 0..c {
                            let at =
                                (bi * gh * gw + r * gw + s) * p * p * c + (py * p + px) * c + ch;
                            assert_eq!(tv[at], code(bi, ch, p * r + py, p * s + px));
                        }
                    }
                }
            }
        }
    }
    let back = cpu.unpatchify(&t, p, c, h, w).expect("unpatchify");
    assert_eq!(back.shape(), &[b, c, h, w]);
    assert_eq!(cpu.to_f32(&back).expect("to_f32"), xv);
    let tb = cpu.patchify(&cpu.cast(&x, DType::BF16).expect("cast"), p).expect("bf16");
    assert_eq!(tb.dtype(), DType::BF16);
    assert_shape_error(
        cpu.patchify(&tensor(&cpu, &[1, 1, 3, 4], &[0.0; 12], DType::F32), 2),
        "patchify",
    );
    assert_shape_error(cpu.unpatchify(&t, p, c, h, w + 2), "unpatchify");
    assert_shape_error(cpu.unpatchify(&t, p, c + 1, h, w), "unpatchify");
}

// --- Layout --------------------------------------------------------------------------------------------------

/// Element `idx` of a row-major tensor of `shape`.
fn at(v: &[f32], shape: &[usize], idx: &[usize]) -> f32 {
    v[idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)]
}

/// Every index of `shape`, row-major.
fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    (0..numel(shape))
        .map(|mut lin| {
            let mut idx = vec![0; shape.len()];
            for d in (0..shape.len()).rev() {
                idx[d] = lin % shape[d];
                lin /= shape[d];
            }
            idx
        })
        .collect()
}

#[test]
fn concat_and_slice_move_the_right_elements() {
    let cpu = cpu();
    let mut rng = Rng::new(17);
    let (a, b, c) = (rng.vec(2 * 3 * 4), rng.vec(2 * 4), rng.vec(2 * 2 * 4));
    let ta = tensor(&cpu, &[2, 3, 4], &a, DType::BF16);
    let tb = tensor(&cpu, &[2, 1, 4], &b, DType::BF16);
    let tc = tensor(&cpu, &[2, 2, 4], &c, DType::F32);
    let y = cpu.concat(&[&ta, &tb, &tc], -2).expect("concat");
    // The output takes the first input's dtype; later inputs are cast to it.
    assert_eq!((y.shape(), y.dtype()), (&[2usize, 6, 4][..], DType::BF16));
    let yv = cpu.to_f32(&y).expect("to_f32");
    for idx in indices(&[2, 6, 4]) {
        let want = match idx[1] {
            0..3 => at(&a, &[2, 3, 4], &idx),
            3 => at(&b, &[2, 1, 4], &[idx[0], 0, idx[2]]),
            j => at(&c, &[2, 2, 4], &[idx[0], j - 4, idx[2]]),
        };
        assert_eq!(at(&yv, &[2, 6, 4], &idx), round_to(DType::BF16, want), "{idx:?}");
    }
    for (dim, start, len) in [(0isize, 1usize, 1usize), (1, 1, 2), (-1, 0, 4), (2, 3, 1), (1, 3, 0)]
    {
        let s = cpu.slice(&ta, dim, start, len).expect("slice");
        let d = dim.rem_euclid(3) as usize;
        let mut shape = vec![2, 3, 4];
        shape[d] = len;
        assert_eq!((s.shape(), s.dtype()), (shape.as_slice(), DType::BF16));
        let sv = cpu.to_f32(&s).expect("to_f32");
        for idx in indices(&shape) {
            let mut src = idx.clone();
            src[d] += start;
            assert_eq!(at(&sv, &shape, &idx), round_to(DType::BF16, at(&a, &[2, 3, 4], &src)));
        }
    }
    assert_shape_error(cpu.concat(&[&ta, &tc], 2), "concat");
    assert_shape_error(cpu.concat(&[], 0), "concat");
    assert_shape_error(cpu.concat(&[&ta], 3), "concat");
    assert_shape_error(cpu.slice(&ta, 1, 2, 2), "slice");
    assert_shape_error(cpu.slice(&ta, -4, 0, 1), "slice");
}

#[test]
fn pad_fills_in_every_mode() {
    let cpu = cpu();
    let mut rng = Rng::new(18);
    let shape = [2, 3, 4];
    let xv = rng.vec(numel(&shape));
    let x = tensor(&cpu, &shape, &xv, DType::F32);
    for (dim, before, after) in [(2isize, 2usize, 5usize), (1, 1, 0), (0, 0, 2), (-1, 6, 1)] {
        for mode in
            [PadMode::Constant(0.0), PadMode::Constant(-1.5), PadMode::Circular, PadMode::Replicate]
        {
            let y = cpu.pad(&x, dim, before, after, mode).expect("pad");
            let d = dim.rem_euclid(3) as usize;
            let mut out_shape = shape.to_vec();
            out_shape[d] += before + after;
            assert_eq!(y.shape(), out_shape.as_slice());
            let yv = cpu.to_f32(&y).expect("to_f32");
            let size = shape[d] as isize;
            for idx in indices(&out_shape) {
                let i = idx[d] as isize - before as isize;
                let src = match mode {
                    _ if (0..size).contains(&i) => Some(i),
                    PadMode::Constant(_) => None,
                    PadMode::Circular => Some(i.rem_euclid(size)),
                    PadMode::Replicate => Some(i.clamp(0, size - 1)),
                };
                let want = match (src, mode) {
                    (Some(s), _) => {
                        let mut from = idx.clone();
                        from[d] = s as usize;
                        at(&xv, &shape, &from)
                    }
                    (None, PadMode::Constant(v)) => v,
                    (None, _) => unreachable!(),
                };
                assert_eq!(at(&yv, &out_shape, &idx), want, "{mode:?} dim {dim} {idx:?}");
            }
        }
    }
    // The constant is rounded to the tensor's dtype.
    let xb = cpu.cast(&x, DType::BF16).expect("cast");
    let y = cpu.pad(&xb, 0, 1, 0, PadMode::Constant(0.1)).expect("pad");
    assert_eq!(cpu.to_f32(&y).expect("to_f32")[0], round_to(DType::BF16, 0.1));
    let empty = cpu.full(&[2, 0], 0.0, DType::F32).expect("full");
    assert_shape_error(cpu.pad(&empty, 1, 1, 1, PadMode::Replicate), "pad");
    assert_eq!(cpu.pad(&empty, 1, 1, 1, PadMode::Constant(2.0)).expect("pad").shape(), &[2, 2]);
    assert_shape_error(cpu.pad(&x, 3, 1, 1, PadMode::Circular), "pad");
}

#[test]
fn permute_reorders_dimensions() {
    let cpu = cpu();
    let mut rng = Rng::new(19);
    let shape = [2, 3, 4, 5];
    let xv = rng.vec(numel(&shape));
    let x = tensor(&cpu, &shape, &xv, DType::F16);
    for perm in [[0usize, 2, 1, 3], [3, 2, 1, 0], [0, 1, 2, 3], [1, 3, 0, 2]] {
        let y = cpu.permute(&x, &perm).expect("permute");
        let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        assert_eq!((y.shape(), y.dtype()), (out_shape.as_slice(), DType::F16));
        let yv = cpu.to_f32(&y).expect("to_f32");
        for idx in indices(&out_shape) {
            let mut src = [0; 4];
            for (i, &p) in perm.iter().enumerate() {
                src[p] = idx[i];
            }
            assert_eq!(at(&yv, &out_shape, &idx), round_to(DType::F16, at(&xv, &shape, &src)));
        }
    }
    assert_shape_error(cpu.permute(&x, &[0, 1, 2]), "permute");
    assert_shape_error(cpu.permute(&x, &[0, 1, 1, 2]), "permute");
    assert_shape_error(cpu.permute(&x, &[0, 1, 2, 4]), "permute");
}

#[test]
fn reshaped_tensors_share_storage_and_bad_buffers_are_refused() {
    let cpu = cpu();
    let x = tensor(&cpu, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], DType::F32);
    let r = x.reshape(&[3, 2]).expect("reshape");
    let y = cpu
        .linear(&r, &weight(&cpu, DType::F32, &[1, 2], &[1.0, 1.0]).view(), None)
        .expect("linear");
    assert_eq!(cpu.to_f32(&y).expect("to_f32"), vec![3.0, 7.0, 11.0]);
    // A buffer wrapped with the wrong dtype or element count is a shape error, not a misread.
    let lie = Tensor::<Cpu>::from_parts(x.buf().clone(), vec![2, 3], DType::BF16);
    assert_shape_error(cpu.to_f32(&lie), "to_f32");
    let short = Tensor::<Cpu>::from_parts(x.buf().clone(), vec![7], DType::F32);
    assert_shape_error(cpu.unary(&short, UnaryOp::Neg), "unary");
}

#[test]
fn causal_taps_are_the_weights_taps_reordered_from_any_first_tap() {
    let cpu = cpu();
    let mut rng = Rng::new(41);
    // 1030 (output, input) rows: more than one block of the CPU's reorder, the last one partial. fp8 taps take
    // the generic reorder; 16-bit taps into their own dtype move their bits.
    let shape = [5, 206, 3, 3, 2];
    let values = rng.vec(numel(&shape));
    for source in [DType::F32, DType::F16, DType::BF16, DType::F8E4M3] {
        let w = weight(&cpu, source, &shape, &values);
        let stored = rounded(&values, source);
        for first in 0..3 {
            for dtype in [DType::F32, DType::F16, DType::BF16, DType::F8E4M3] {
                let taps = cpu.causal_taps(&w.view(), first, dtype).expect("causal_taps");
                let view = taps.view();
                assert_eq!((view.shape(), view.dtype()), (&[3 - first, 5, 206, 3, 2][..], dtype));
                let got = cpu.weight_to_tensor(&view, DType::F32).and_then(|t| cpu.to_f32(&t));
                // want[j, o, i, :, :] = w[o, i, first + j, :, :]
                let mut want = Vec::new();
                for j in first..3 {
                    for row in stored.chunks(3 * 6) {
                        want.extend(rounded(&row[j * 6..(j + 1) * 6], dtype));
                    }
                }
                assert_eq!(got.expect("read back"), want, "{source} from tap {first} as {dtype}");
            }
        }
    }
    let w = weight(&cpu, DType::F32, &[2, 2, 3, 3], &values[..36]);
    assert_shape_error(
        cpu.causal_taps(&w.view(), 0, DType::F32).map(|t| t.view().shape().to_vec()),
        "causal_taps",
    );
    let w = weight(&cpu, DType::F32, &shape, &values);
    assert_shape_error(
        cpu.causal_taps(&w.view(), 3, DType::F32).map(|t| t.view().shape().to_vec()),
        "causal_taps",
    );
}
