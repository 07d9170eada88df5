//! Each op on the CUDA backend against the CPU backend, with tolerances; skips with a message without a GPU.
//!
//! Without the `cuda` feature, a CUDA library or a device, every CUDA test prints one line
//! ("skipping CUDA tests: <why>") and passes. The backend selection test runs everywhere.

use kiln_compute::select::{Selection, select};

#[test]
fn select_without_cuda_falls_back_to_the_cpu_naming_what_is_missing() {
    let selection = Selection { force_cpu: false, cuda_device: 0, cpu_memory: 64 << 20 };
    let (device, reason) = select(&selection);
    #[cfg(not(feature = "cuda"))]
    {
        assert_eq!(device.kind(), "cpu");
        let reason = reason.expect("a reason for the CPU");
        assert!(reason.contains("no CUDA support"), "{reason}");
    }
    #[cfg(feature = "cuda")]
    match kiln_compute::backend::cuda::missing_library() {
        Some(lib) => {
            assert_eq!(device.kind(), "cpu");
            let reason = reason.expect("a reason for the CPU");
            assert!(reason.contains(lib), "{reason} should name {lib}");
        }
        None if device.kind() == "cuda" => assert!(reason.is_none()),
        None => {
            let reason = reason.expect("a reason for the CPU");
            assert!(reason.contains("not usable"), "{reason}");
        }
    }
    let forced = select(&Selection { force_cpu: true, ..selection });
    assert_eq!(forced.0.kind(), "cpu");
    assert_eq!(forced.1.as_deref(), Some("--cpu was given"));
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_ops_match_the_cpu() {
    eprintln!("skipping CUDA tests: built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::{Arc, OnceLock};

    use kiln_compute::backend::cpu::Cpu;
    use kiln_compute::backend::cuda::{Cuda, LongAttention, missing_library};
    use kiln_compute::backend::{
        AttentionMask, BinaryOp, Conv2dParams, ConvTerm, PadMode, RopeLayout, UnaryOp,
    };
    use kiln_compute::dtype::{self, DType};
    use kiln_compute::memory::{DevPtr, DeviceMemory, HostMemory, HostSlice, StreamId};
    use kiln_compute::{Backend, OwnedWeight, Tensor};

    struct Env {
        /// bf16 compute (the default), long attention as GEMMs.
        gpu: Cuda,
        /// f32 compute.
        gpu32: Cuda,
        /// bf16 compute with long attention on the tensor-core flash kernel.
        gpu_mma: Cuda,
        /// The same with the kernel's two-m-tile form.
        gpu_mma2: Cuda,
        /// bf16 compute with long attention on cuDNN's fused kernels.
        gpu_cudnn: Cuda,
        cpu: Cpu,
    }

    /// The backends, or `None` after printing why the CUDA tests are skipped.
    fn env() -> Option<&'static Env> {
        static ENV: OnceLock<Result<Env, String>> = OnceLock::new();
        let env = ENV.get_or_init(|| {
            if let Some(lib) = missing_library() {
                return Err(format!("the CUDA library {lib} was not found"));
            }
            let gpu = Cuda::new(0)
                .map_err(|e| format!("no usable CUDA device: {e}"))?
                .with_long_attention(LongAttention::Gemm);
            let gpu32 = Cuda::with_dtype(0, DType::F32)
                .map_err(|e| format!("no usable CUDA device: {e}"))?;
            let gpu_mma = Cuda::new(0)
                .map_err(|e| format!("no usable CUDA device: {e}"))?
                .with_long_attention(LongAttention::Mma);
            let gpu_mma2 = Cuda::new(0)
                .map_err(|e| format!("no usable CUDA device: {e}"))?
                .with_long_attention(LongAttention::Mma2);
            let gpu_cudnn = Cuda::new(0)
                .map_err(|e| format!("no usable CUDA device: {e}"))?
                .with_long_attention(LongAttention::Cudnn);
            Ok(Env { gpu, gpu32, gpu_mma, gpu_mma2, gpu_cudnn, cpu: Cpu::new(4 << 30) })
        });
        match env {
            Ok(env) => Some(env),
            Err(why) => {
                eprintln!("skipping CUDA tests: {why}");
                None
            }
        }
    }

    use crate::common::values_scaled as values;

    fn up<B: Backend>(b: &B, shape: &[usize], v: &[f32], dtype: DType) -> Tensor<B> {
        b.from_f32(shape, v, dtype).expect("upload")
    }

    fn weight<B: Backend>(b: &B, dtype: DType, shape: &[usize], v: &[f32]) -> OwnedWeight {
        OwnedWeight::from_f32(b.memory(), dtype, shape, v).expect("weight upload")
    }

    fn get<B: Backend>(b: &B, t: &Tensor<B>) -> Vec<f32> {
        b.to_f32(t).expect("download")
    }

    /// Tolerance for outputs of `dtype`: about two roundings of a bf16/f16 value, tight for f32.
    fn tol(dtype: DType) -> (f32, f32) {
        match dtype {
            DType::F32 => (1e-4, 1e-4),
            DType::F16 => (5e-3, 5e-3),
            _ => (2e-2, 2e-2),
        }
    }

    #[track_caller]
    fn assert_close(what: &str, got: &[f32], want: &[f32], (atol, rtol): (f32, f32)) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        let mut worst = (0.0f32, 0usize);
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let err = (g - w).abs() - rtol * w.abs();
            assert!(!g.is_nan() || w.is_nan(), "{what}: NaN at {i} (want {w})");
            if err > worst.0 {
                worst = (err, i);
            }
        }
        let i = worst.1;
        assert!(
            worst.0 <= atol,
            "{what}: at {i} got {} want {} (atol {atol}, rtol {rtol})",
            got[i],
            want[i]
        );
    }

    const COMPUTE: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
    const STORED: [DType; 5] = [DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2];

    #[test]
    fn casts_uploads_and_weights_are_exact() {
        let Some(e) = env() else { return };
        let v = values(1000, 1, 500.0);
        for dt in COMPUTE {
            let want: Vec<f32> = v.iter().map(|&x| dtype::round_to(dt, x)).collect();
            assert_eq!(get(&e.gpu, &up(&e.gpu, &[10, 100], &v, dt)), want, "from_f32 {dt}");
            for to in COMPUTE {
                let x = up(&e.gpu, &[1000], &v, dt);
                let c = e.gpu.cast(&x, to).expect("cast");
                let want: Vec<f32> =
                    v.iter().map(|&x| dtype::round_to(to, dtype::round_to(dt, x))).collect();
                assert_eq!(get(&e.gpu, &c), want, "cast {dt} -> {to}");
            }
        }
        // 15 values: fp8 widens one value a thread (the four-a-thread kernel takes multiples of 4).
        for (wdt, shape) in STORED.into_iter().flat_map(|d| [(d, [10, 100]), (d, [3, 5])]) {
            let v = &v[..shape[0] * shape[1]];
            let w = weight(&e.gpu, wdt, &shape, v);
            for to in COMPUTE {
                let t = e.gpu.weight_to_tensor(&w.view(), to).expect("weight_to_tensor");
                let want: Vec<f32> =
                    v.iter().map(|&x| dtype::round_to(to, dtype::round_to(wdt, x))).collect();
                assert_eq!(get(&e.gpu, &t), want, "weight {wdt} {shape:?} as {to}");
            }
        }
        let f = e.gpu.full(&[3, 7], 1.1, DType::BF16).expect("full");
        assert_eq!(get(&e.gpu, &f), vec![dtype::round_to(DType::BF16, 1.1); 21]);
    }

    #[test]
    fn causal_taps_match_the_cpu() {
        let Some(e) = env() else { return };
        let shape = [5, 206, 3, 3, 2];
        let v = values(5 * 206 * 18, 7, 2.0);
        for wdt in [DType::BF16, DType::F16, DType::F8E4M3] {
            let (wg, wc) = (weight(&e.gpu, wdt, &shape, &v), weight(&e.cpu, wdt, &shape, &v));
            for first in 0..3 {
                for to in [DType::F32, DType::BF16] {
                    let g = e.gpu.causal_taps(&wg.view(), first, to).expect("causal_taps");
                    let c = e.cpu.causal_taps(&wc.view(), first, to).expect("causal_taps");
                    assert_eq!(g.view().shape(), c.view().shape(), "{wdt} from {first} as {to}");
                    let got = e.gpu.weight_to_tensor(&g.view(), DType::F32).expect("read");
                    let want = e.cpu.weight_to_tensor(&c.view(), DType::F32).expect("read");
                    let (got, want) = (get(&e.gpu, &got), get(&e.cpu, &want));
                    assert_eq!(got, want, "causal taps of {wdt} from tap {first} as {to}");
                }
            }
        }
    }

    #[test]
    fn scaled_weights_dequantize_as_comfyui_and_linear_matches_the_cpu() {
        let Some(e) = env() else { return };
        let (n, k, scale) = (24, 64, 0.003_7_f32);
        let v = values(n * k, 11, 400.0);
        let x = values(5 * k, 12, 1.0);
        for wdt in [DType::F8E4M3, DType::F8E5M2] {
            let (gw, cw) = (weight(&e.gpu, wdt, &[n, k], &v), weight(&e.cpu, wdt, &[n, k], &v));
            for to in COMPUTE {
                // ComfyUI's dequantization in `to`: the stored value (exact) times the scale rounded to `to`,
                // the product rounded once.
                let t = e.gpu.weight_to_tensor(&gw.view().with_scale(Some(scale)), to).expect("w");
                let s = dtype::round_to(to, scale);
                let want: Vec<f32> =
                    v.iter().map(|&q| dtype::round_to(to, dtype::round_to(wdt, q) * s)).collect();
                assert_eq!(get(&e.gpu, &t), want, "scaled {wdt} as {to}");
                // An odd count: one value a thread.
                let odd = weight(&e.gpu, wdt, &[3, 5], &v[..15]);
                let t =
                    e.gpu.weight_to_tensor(&odd.view().with_scale(Some(scale)), to).expect("odd w");
                assert_eq!(get(&e.gpu, &t), want[..15], "scaled {wdt} [3, 5] as {to}");
            }
            for (gpu, dt) in [(&e.gpu32, DType::F32), (&e.gpu, DType::BF16)] {
                let got = gpu
                    .linear(&up(gpu, &[5, k], &x, dt), &gw.view().with_scale(Some(scale)), None)
                    .expect("linear");
                let want = e
                    .cpu
                    .linear(&up(&e.cpu, &[5, k], &x, dt), &cw.view().with_scale(Some(scale)), None)
                    .expect("cpu linear");
                assert_close(
                    &format!("scaled {wdt} linear in {dt}"),
                    &get(gpu, &got),
                    &get(&e.cpu, &want),
                    tol(dt),
                );
            }
            // Ops that read weights as stored refuse a scaled one rather than ignore its scale.
            let norm = weight(&e.gpu, wdt, &[k], &v[..k]);
            let err = e
                .gpu
                .rms_norm(
                    &up(&e.gpu, &[5, k], &x, DType::BF16),
                    Some(&norm.view().with_scale(Some(scale))),
                    1e-6,
                )
                .expect_err("a scaled norm weight");
            assert!(err.to_string().contains("scaled"), "{err}");
        }
    }

    #[test]
    fn store_rounds_to_nearest_or_stochastically() {
        let Some(e) = env() else { return };
        let v = values(4096, 2, 100.0);
        let x = up(&e.gpu, &[4096], &v, DType::F32);
        for dt in STORED {
            let dst = e.gpu.memory().alloc(4096 * dt.size() as u64).expect("alloc");
            e.gpu.store(&x, dst, dt, None).expect("store");
            let mut bytes = vec![0u8; 4096 * dt.size()];
            e.gpu.memory().copy_d2h(&mut bytes, dst).expect("read back");
            assert_eq!(bytes, dtype::narrow(dt, &v), "nearest-even store as {dt}");
            if dt != DType::F32 {
                e.gpu.store(&x, dst, dt, Some(7)).expect("stochastic store");
                e.gpu.memory().copy_d2h(&mut bytes, dst).expect("read back");
                let mut again = vec![0u8; bytes.len()];
                e.gpu.store(&x, dst, dt, Some(7)).expect("stochastic store");
                e.gpu.memory().copy_d2h(&mut again, dst).expect("read back");
                assert_eq!(bytes, again, "the same seed gives the same bytes ({dt})");
                let got = dtype::widen(dt, &bytes);
                let nearest = dtype::widen(dt, &dtype::narrow(dt, &v));
                let mut moved = 0;
                for ((&g, &n), &x) in got.iter().zip(&nearest).zip(&v) {
                    // Either the nearest value or the neighbour on the other side of x.
                    assert!(
                        g == n || (g - x).signum() != (n - x).signum(),
                        "{dt}: {x} stored as {g} (nearest {n})"
                    );
                    moved += usize::from(g != n);
                }
                assert!(
                    moved > 0,
                    "{dt}: stochastic rounding never rounded away from the nearest value"
                );
            }
            e.gpu.memory().free(dst).expect("free");
        }
        // The mean of many stochastic roundings of one value is the value.
        let third = vec![1.0 + 1.0 / 384.0; 1 << 16];
        let x = up(&e.gpu, &[third.len()], &third, DType::F32);
        let dst = e.gpu.memory().alloc((third.len() * 2) as u64).expect("alloc");
        e.gpu.store(&x, dst, DType::BF16, Some(3)).expect("store");
        let mut bytes = vec![0u8; third.len() * 2];
        e.gpu.memory().copy_d2h(&mut bytes, dst).expect("read back");
        let mean = dtype::widen(DType::BF16, &bytes).iter().map(|&v| f64::from(v)).sum::<f64>()
            / third.len() as f64;
        assert!((mean - f64::from(third[0])).abs() < 1e-4, "mean {mean}");
        e.gpu.memory().free(dst).expect("free");
    }

    fn linear_case<B: Backend>(b: &B, xdt: DType, wdt: DType, k: usize, bias: bool) -> Vec<f32> {
        let x = up(b, &[3, 5, k], &values(15 * k, 3, 1.0), xdt);
        let w = weight(b, wdt, &[48, k], &values(48 * k, 4, 0.5));
        let bw = weight(b, wdt, &[48], &values(48, 5, 1.0));
        let y = b.linear(&x, &w.view(), bias.then(|| bw.view()).as_ref()).expect("linear");
        assert_eq!(y.shape(), [3, 5, 48]);
        assert_eq!(y.dtype(), xdt);
        get(b, &y)
    }

    #[test]
    fn linear_matches_the_cpu_for_every_weight_dtype() {
        let Some(e) = env() else { return };
        for xdt in COMPUTE {
            for wdt in STORED {
                for (k, bias) in [(64, true), (3, false), (130, true)] {
                    let what = format!("linear x {xdt} w {wdt} k {k}");
                    let (atol, rtol) = tol(xdt);
                    let scale = (k as f32).sqrt() / 4.0;
                    assert_close(
                        &what,
                        &linear_case(&e.gpu, xdt, wdt, k, bias),
                        &linear_case(&e.cpu, xdt, wdt, k, bias),
                        (atol * scale, rtol),
                    );
                }
            }
        }
    }

    fn matmul_case<B: Backend>(b: &B, dt: DType, tb: bool) -> Vec<f32> {
        let a = up(b, &[2, 3, 17, 40], &values(6 * 17 * 40, 6, 1.0), dt);
        let bshape: &[usize] = if tb { &[2, 3, 23, 40] } else { &[2, 3, 40, 23] };
        let bm = up(b, bshape, &values(6 * 40 * 23, 7, 1.0), dt);
        let c = b.matmul(&a, &bm, tb).expect("matmul");
        assert_eq!(c.shape(), [2, 3, 17, 23]);
        get(b, &c)
    }

    #[test]
    fn matmul_matches_the_cpu() {
        let Some(e) = env() else { return };
        for dt in COMPUTE {
            for tb in [false, true] {
                let (atol, rtol) = tol(dt);
                assert_close(
                    &format!("matmul {dt} tb {tb}"),
                    &matmul_case(&e.gpu, dt, tb),
                    &matmul_case(&e.cpu, dt, tb),
                    (atol * 2.0, rtol),
                );
            }
        }
    }

    #[test]
    fn embedding_gathers_rows_in_the_compute_type() {
        let Some(e) = env() else { return };
        let table = values(50 * 16, 8, 2.0);
        let ids = [3u32, 0, 49, 3, 17];
        for wdt in STORED {
            for gpu in [&e.gpu, &e.gpu32] {
                let w = weight(gpu, wdt, &[50, 16], &table);
                let y = gpu.embedding(&ids, &w.view()).expect("embedding");
                assert_eq!(y.dtype(), gpu.compute_dtype());
                let cw = weight(&e.cpu, wdt, &[50, 16], &table);
                let want = get(&e.cpu, &e.cpu.embedding(&ids, &cw.view()).expect("cpu embedding"));
                let want: Vec<f32> =
                    want.iter().map(|&v| dtype::round_to(gpu.compute_dtype(), v)).collect();
                assert_eq!(get(gpu, &y), want, "embedding of a {wdt} table");
                assert!(
                    gpu.embedding(&[50], &w.view()).is_err(),
                    "an id past the table is an error"
                );
            }
        }
    }

    fn norm_case<B: Backend>(b: &B, dt: DType, which: usize) -> Vec<f32> {
        let x = up(b, &[2, 8, 6, 5], &values(480, 9, 3.0), dt);
        let w = weight(b, DType::BF16, &[5], &values(5, 10, 1.0));
        let bb = weight(b, DType::F32, &[5], &values(5, 11, 1.0));
        let gw = weight(b, DType::F16, &[8], &values(8, 12, 1.0));
        let gb = weight(b, DType::F8E4M3, &[8], &values(8, 13, 1.0));
        let y = match which {
            0 => b.rms_norm(&x, Some(&w.view()), 1e-6),
            1 => b.rms_norm(&x, None, 1e-6),
            2 => b.layer_norm(&x, Some(&w.view()), Some(&bb.view()), 1e-5),
            3 => b.layer_norm(&x, None, None, 1e-5),
            4 => b.group_norm(&x, 4, Some(&gw.view()), Some(&gb.view()), 1e-5),
            5 => b.group_norm(&x, 2, None, None, 1e-6),
            // Rows past the one-warp kernels' limit: a block per row.
            7 | 8 => {
                let long = up(b, &[3, 5000], &values(15_000, 31, 3.0), dt);
                let lw = weight(b, DType::BF16, &[5000], &values(5000, 32, 1.0));
                if which == 7 {
                    b.rms_norm(&long, Some(&lw.view()), 1e-6)
                } else {
                    b.layer_norm(&long, Some(&lw.view()), None, 1e-5)
                }
            }
            // Rows of a head's width: four values a lane.
            9 => b.rms_norm(&up(b, &[70, 128], &values(8960, 33, 3.0), dt), None, 1e-6),
            // Over the channels (the Wan VAEs' norm), with the SiLU after it and without.
            10 => b.channel_rms_norm(&x, Some(&gw.view()), f32::MIN_POSITIVE, Some(UnaryOp::Silu)),
            11 => b.channel_rms_norm(&x, None, 1e-6, None),
            // 20 channels over the kernel's 8 lanes (uneven), 77 positions: three tiles a sample, the last partial.
            12 | 13 => {
                let wide = up(b, &[2, 20, 7, 11], &values(3080, 34, 3.0), dt);
                let cw = weight(b, DType::BF16, &[20], &values(20, 35, 1.0));
                if which == 12 {
                    b.channel_rms_norm(&wide, Some(&cw.view()), 1e-6, Some(UnaryOp::Silu))
                } else {
                    b.channel_rms_norm(&wide, None, 1e-6, None)
                }
            }
            _ => b.softmax(&x),
        };
        get(b, &y.expect("norm"))
    }

    #[test]
    fn norms_and_softmax_match_the_cpu() {
        let Some(e) = env() else { return };
        for dt in COMPUTE {
            for which in 0..15 {
                assert_close(
                    &format!("norm {which} {dt}"),
                    &norm_case(&e.gpu, dt, which),
                    &norm_case(&e.cpu, dt, which),
                    tol(dt),
                );
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn attention_case<B: Backend>(
        b: &B,
        dt: DType,
        batch: usize,
        (hq, hkv): (usize, usize),
        (nq, nk): (usize, usize),
        (d, dv): (usize, usize),
        mask: AttentionMask,
    ) -> Vec<f32> {
        // Queries four times the keys' scale, so the softmax is far from uniform and a wrong temperature or a
        // misplaced probability shows (with logits of unit scale every output is near the mean of v).
        let q = up(b, &[batch, hq, nq, d], &values(batch * hq * nq * d, 14, 4.0), dt);
        let k = up(b, &[batch, hkv, nk, d], &values(batch * hkv * nk * d, 15, 1.0), dt);
        let v = up(b, &[batch, hkv, nk, dv], &values(batch * hkv * nk * dv, 16, 1.0), dt);
        let o = b.attention(&q, &k, &v, mask, 1.0 / (d as f32).sqrt()).expect("attention");
        assert_eq!(o.shape(), [batch, hq, nq, dv]);
        get(b, &o)
    }

    /// Attention on `gpu` against the CPU. Long sequences and heads over 256 features run as GEMMs (4 200 queries:
    /// two chunks of at most 4 096 rows; the first 1 200 causal rows see no key; 401 keys: rows padded to 408), or
    /// with `gpu_mma` and `gpu_mma2` on the tensor-core kernel's two forms where they fit (16-bit, heads of 64 or
    /// 128); the short ones on the flash kernel. One test a path, so that bench/device.sh can take a kernel whose
    /// test passed even when another's failed.
    fn attention_matches_the_cpu(e: &Env, path: &str, gpu: &Cuda) {
        let cases = [
            (DType::BF16, 1, (8, 2), (4200, 3000), (64, 64), AttentionMask::Causal),
            (DType::BF16, 1, (4, 4), (2048, 2048), (128, 128), AttentionMask::None),
            (DType::F32, 1, (4, 1), (333, 1000), (80, 80), AttentionMask::Causal),
            (DType::F16, 1, (2, 1), (500, 200), (256, 256), AttentionMask::Causal),
            (DType::F32, 1, (3, 3), (70, 90), (32, 48), AttentionMask::None),
            (DType::BF16, 2, (6, 3), (300, 400), (64, 64), AttentionMask::Causal),
            (DType::BF16, 3, (1, 1), (1024, 1024), (384, 384), AttentionMask::None),
            (DType::F32, 1, (2, 2), (40, 300), (512, 512), AttentionMask::None),
            (DType::BF16, 2, (6, 3), (40, 50), (64, 64), AttentionMask::Causal),
            (DType::F16, 1, (2, 1), (20, 500), (128, 128), AttentionMask::None),
            (DType::BF16, 2, (6, 3), (300, 401), (64, 64), AttentionMask::Causal),
            (DType::F16, 1, (2, 1), (60, 40), (256, 256), AttentionMask::Causal),
            (DType::F32, 1, (3, 3), (50, 60), (32, 48), AttentionMask::None),
            (DType::F16, 2, (4, 2), (1000, 777), (128, 128), AttentionMask::Causal),
            (DType::BF16, 1, (24, 24), (700, 700), (128, 128), AttentionMask::None),
            (DType::F16, 1, (4, 1), (300, 300), (64, 64), AttentionMask::None),
            (DType::BF16, 1, (8, 1), (333, 333), (128, 128), AttentionMask::Causal),
            (DType::F16, 1, (8, 2), (1024, 1024), (64, 64), AttentionMask::None),
            (DType::BF16, 1, (4, 2), (1100, 1100), (128, 128), AttentionMask::Causal),
            (DType::F16, 2, (4, 4), (1030, 1030), (128, 128), AttentionMask::None),
        ];
        for (dt, batch, heads, n, dims, mask) in cases {
            let want = attention_case(&e.cpu, dt, batch, heads, n, dims, mask);
            let what = format!(
                "attention ({path}) {dt} batch {batch} heads {heads:?} n {n:?} dims {dims:?} {mask:?}"
            );
            let got = attention_case(gpu, dt, batch, heads, n, dims, mask);
            assert_close(&what, &got, &want, tol(dt));
        }
    }

    #[test]
    fn attention_on_gemms_matches_the_cpu_with_gqa_and_causal_masks() {
        let Some(e) = env() else { return };
        attention_matches_the_cpu(e, "gemm", &e.gpu);
    }

    #[test]
    fn attention_on_the_mma_kernel_matches_the_cpu_with_gqa_and_causal_masks() {
        let Some(e) = env() else { return };
        attention_matches_the_cpu(e, "mma", &e.gpu_mma);
    }

    #[test]
    fn attention_on_the_mma2_kernel_matches_the_cpu_with_gqa_and_causal_masks() {
        let Some(e) = env() else { return };
        attention_matches_the_cpu(e, "mma2", &e.gpu_mma2);
    }

    /// On cuDNN the problems it is asked for (16-bit, at least 1 024 queries and keys, as many of each where
    /// causal: the unmasked 2048², grouped-query 1024² and f16 batch-of-two 1030² (Wan's type), the causal
    /// grouped-query 1100²) run on its fused kernels, the rest as GEMMs; the test fails unless all four ran there,
    /// with cuDNN's reason. Without cuDNN on the machine it is skipped.
    #[test]
    fn attention_on_cudnn_matches_the_cpu_with_gqa_and_causal_masks() {
        let Some(e) = env() else { return };
        attention_matches_the_cpu(e, "cudnn", &e.gpu_cudnn);
        let stats = e.gpu_cudnn.cudnn_attention_stats();
        if stats.ran == 0
            && stats.declined.as_deref() == Some("cuDNN 9 did not open on this device")
        {
            eprintln!(
                "skipping the cuDNN attention test: libcudnn (9.x) was not found or did not start"
            );
            return;
        }
        assert!(
            stats.ran >= 4,
            "cuDNN ran {} attention calls; it declined: {:?}",
            stats.ran,
            stats.declined
        );
    }

    fn rope_case<B: Backend>(b: &B, dt: DType, layout: RopeLayout) -> Vec<f32> {
        let x = up(b, &[2, 5, 3, 16], &values(480, 17, 1.0), dt);
        let ang: Vec<f32> = (0..40).map(|i| i as f32 * 0.37).collect();
        let cos = up(b, &[5, 8], &ang.iter().map(|a| a.cos()).collect::<Vec<_>>(), DType::F32);
        let sin = up(b, &[5, 8], &ang.iter().map(|a| a.sin()).collect::<Vec<_>>(), DType::F32);
        get(b, &b.rope(&x, &cos, &sin, layout).expect("rope"))
    }

    #[test]
    fn rope_matches_the_cpu_in_both_layouts() {
        let Some(e) = env() else { return };
        for dt in COMPUTE {
            for layout in [RopeLayout::Interleaved, RopeLayout::Half] {
                assert_close(
                    &format!("rope {dt} {layout:?}"),
                    &rope_case(&e.gpu, dt, layout),
                    &rope_case(&e.cpu, dt, layout),
                    tol(dt),
                );
            }
        }
    }

    fn elementwise_case<B: Backend>(b: &B, dt: DType, which: usize) -> Vec<f32> {
        let x = up(b, &[2, 3, 4, 5], &values(120, 18, 3.0), dt);
        let y = match which {
            0..=6 => {
                let ops = [
                    UnaryOp::Silu,
                    UnaryOp::Gelu,
                    UnaryOp::GeluTanh,
                    UnaryOp::Tanh,
                    UnaryOp::Sigmoid,
                    UnaryOp::Exp,
                    UnaryOp::Neg,
                ];
                b.unary(&x, ops[which])
            }
            7..=10 => {
                let ops = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div];
                let other = up(
                    b,
                    &[3, 1, 5],
                    &values(15, 19, 2.0).iter().map(|v| v + 2.5).collect::<Vec<_>>(),
                    DType::F32,
                );
                b.binary(&x, &other, ops[which - 7])
            }
            11 => {
                let other = up(b, &[2, 1, 4, 1], &values(8, 20, 1.0), dt);
                b.binary(&other, &x, BinaryOp::Sub)
            }
            12 => b.affine(&x, 0.5, -1.25),
            13 => b.gated(&x, &up(b, &[2, 3, 4, 5], &values(120, 21, 1.0), dt), UnaryOp::Silu),
            14 => b.gated(&x, &up(b, &[2, 3, 4, 5], &values(120, 22, 1.0), dt), UnaryOp::GeluTanh),
            16 => b.unary(&x, UnaryOp::Relu),
            17 => {
                // x / 0: ±inf, and NaN where x is 0.
                let zeros = b.affine(&x, 0.0, 0.0).expect("affine");
                let x = b.binary(&x, &zeros, BinaryOp::Div).expect("binary");
                b.unary(&x, UnaryOp::NanToNum)
            }
            _ => {
                let x = x.reshape(&[2, 12, 5]).expect("view");
                let scale = up(b, &[2, 5], &values(10, 23, 1.0), dt);
                let shift = up(b, &[2, 5], &values(10, 24, 1.0), dt);
                let with = get(b, &b.modulate(&x, &scale, Some(&shift)).expect("modulate"));
                let without = get(b, &b.modulate(&x, &scale, None).expect("modulate"));
                return [with, without].concat();
            }
        };
        get(b, &y.expect("elementwise"))
    }

    #[test]
    fn elementwise_ops_match_the_cpu_with_broadcasting() {
        let Some(e) = env() else { return };
        for dt in COMPUTE {
            for which in 0..18 {
                let (atol, rtol) = tol(dt);
                assert_close(
                    &format!("elementwise {which} {dt}"),
                    &elementwise_case(&e.gpu, dt, which),
                    &elementwise_case(&e.cpu, dt, which),
                    (atol * 4.0, rtol),
                );
            }
        }
    }

    fn conv_case<B: Backend>(
        b: &B,
        dt: DType,
        wdt: DType,
        params: Conv2dParams,
        k: usize,
    ) -> Vec<f32> {
        let x = up(b, &[2, 6, 11, 9], &values(2 * 6 * 99, 25, 1.0), dt);
        let w = weight(b, wdt, &[7, 6, k, k], &values(7 * 6 * k * k, 26, 0.3));
        let bias = weight(b, wdt, &[7], &values(7, 27, 1.0));
        get(b, &b.conv2d(&x, &w.view(), Some(&bias.view()), params).expect("conv2d"))
    }

    #[test]
    fn conv2d_matches_the_cpu() {
        let Some(e) = env() else { return };
        let geometries = [
            (Conv2dParams::same(1), 3),
            (Conv2dParams { stride: 2, padding: [0, 1, 0, 1] }, 3),
            (Conv2dParams { stride: 1, padding: [0; 4] }, 1),
            (Conv2dParams { stride: 2, padding: [2, 0, 1, 0] }, 4),
        ];
        for dt in COMPUTE {
            for wdt in [DType::BF16, DType::F8E4M3, DType::F32] {
                for (params, k) in geometries {
                    let (atol, rtol) = tol(dt);
                    assert_close(
                        &format!("conv2d {dt} w {wdt} {params:?} k {k}"),
                        &conv_case(&e.gpu, dt, wdt, params, k),
                        &conv_case(&e.cpu, dt, wdt, params, k),
                        (atol * 3.0, rtol),
                    );
                }
            }
        }
    }

    /// A causal 3-D convolution's taps summed into 4 frames `[C, H, W]` → `[O, H', W']` (`sizes`: C, O, H, W):
    /// `covering`, the last tap over every frame first (it writes them), tap 1 into frames 1.. and tap 0 into
    /// frames 2..; otherwise those two alone, the output zeroed first and frame 0 the bias alone.
    fn conv_sum_case<B: Backend>(
        b: &B,
        dt: DType,
        (params, k): (Conv2dParams, usize),
        [c, o, h, w]: [usize; 4],
        covering: bool,
    ) -> Vec<f32> {
        let frames =
            |n: usize, seed: u64| up(b, &[n, c, h, w], &values(n * c * h * w, seed, 1.0), dt);
        let (x2, x4) = (frames(2, 40), frames(4, 42));
        let taps: Vec<OwnedWeight> = (0..3)
            .map(|t| weight(b, DType::BF16, &[o, c, k, k], &values(o * c * k * k, 43 + t, 0.3)))
            .collect();
        let bias = weight(b, DType::F32, &[o], &values(o, 46, 1.0));
        let [w0, w1, w2] = [0, 1, 2].map(|t| taps[t].view());
        // Tap 1 reads frames 1..4 of x4 where they lie (a view at an offset, as a chunk's frames after the
        // history are read).
        let mut terms =
            vec![ConvTerm { x: &x4, from: 1, n: 3, w: &w1, at: 1 }, ConvTerm::whole(&x2, &w0, 2)];
        if covering {
            terms.insert(0, ConvTerm::whole(&x4, &w2, 0));
        }
        get(b, &b.conv2d_sum(&terms, Some(&bias.view()), params, 4).expect("conv2d_sum"))
    }

    #[test]
    fn conv2d_sum_matches_the_cpu() {
        let Some(e) = env() else { return };
        // cuDNN (or im2col) with its beta = 1, the 1×1 GEMMs, and strided im2col, each accumulating.
        let geometries = [
            (Conv2dParams::same(1), 3),
            (Conv2dParams { stride: 1, padding: [0; 4] }, 1),
            (Conv2dParams { stride: 2, padding: [0, 1, 0, 1] }, 3),
        ];
        // Frames whose bytes are multiples of 16 (every term's view and output frame aligned: cuDNN takes the
        // accumulating terms, as it does the Wan VAE's) and frames whose offsets are not (cuDNN declines them:
        // im2col accumulates).
        let sizes = [[8, 8, 8, 8], [6, 7, 11, 9]];
        for dt in COMPUTE {
            for (geometry, size, covering) in geometries
                .into_iter()
                .flat_map(|g| sizes.map(|s| (g, s)))
                .flat_map(|(g, s)| [(g, s, true), (g, s, false)])
            {
                let (atol, rtol) = tol(dt);
                assert_close(
                    &format!("conv2d_sum {dt} {geometry:?} {size:?} covering {covering}"),
                    &conv_sum_case(&e.gpu, dt, geometry, size, covering),
                    &conv_sum_case(&e.cpu, dt, geometry, size, covering),
                    (atol * 4.0, rtol),
                );
            }
        }
    }

    /// Where cuDNN opens, the aligned causal sum runs on it, its later taps with beta = 1 (the Wan VAE's path).
    /// Apart from `conv2d_sum_matches_the_cpu` (which bench/device.sh reads to keep cuDNN or not): a decline here
    /// is slow, not wrong, and this test names its reason.
    #[test]
    fn cudnn_runs_the_accumulating_taps_of_an_aligned_causal_sum() {
        let Some(_) = env() else { return };
        let gpu = Cuda::new(0).expect("a CUDA backend");
        for dt in [DType::BF16, DType::F16] {
            conv_sum_case(&gpu, dt, (Conv2dParams::same(1), 3), [8, 8, 8, 8], true);
        }
        let stats = gpu.cudnn_conv_stats();
        if stats.declined.as_deref().is_some_and(|why| why.contains("did not open")) {
            eprintln!("cuDNN did not open: the im2col path ran ({stats:?})");
            return;
        }
        // Three taps a call, the two after the first accumulating, in two dtypes.
        assert_eq!((stats.ran, stats.accumulated), (6, 4), "{stats:?}");
    }

    fn layout_case<B: Backend>(b: &B, dt: DType, which: usize) -> Vec<f32> {
        let x = up(b, &[2, 3, 4, 6], &values(144, 28, 5.0), dt);
        let y = match which {
            0 => b.upsample_nearest2x(&x),
            1 => b.patchify(&x, 2),
            2 => b.patchify(&x, 2).and_then(|t| b.unpatchify(&t, 2, 3, 4, 6)),
            3 => b.concat(&[&x, &up(b, &[2, 1, 4, 6], &values(48, 29, 1.0), DType::F32), &x], 1),
            4 => b.concat(&[&x, &x], -1),
            5 => b.slice(&x, 2, 1, 2),
            6 => b.slice(&x, -1, 5, 1),
            7 => b.pad(&x, 3, 2, 1, PadMode::Constant(-3.5)),
            8 => b.pad(&x, 2, 3, 2, PadMode::Circular),
            9 => b.pad(&x, 3, 1, 4, PadMode::Replicate),
            10 => b.permute(&x, &[0, 2, 3, 1]),
            // A batched transpose over several 32 × 32 tiles, the last ones partial.
            11 => b.permute(&up(b, &[3, 37, 70], &values(3 * 37 * 70, 30, 2.0), dt), &[0, 2, 1]),
            _ => b.permute(&x, &[3, 1, 0, 2]),
        };
        let y = y.expect("layout op");
        let mut out = get(b, &y);
        out.extend(y.shape().iter().map(|&d| d as f32));
        out
    }

    #[test]
    fn layout_ops_match_the_cpu_exactly() {
        let Some(e) = env() else { return };
        for dt in COMPUTE {
            for which in 0..13 {
                assert_eq!(
                    layout_case(&e.gpu, dt, which),
                    layout_case(&e.cpu, dt, which),
                    "layout op {which} on {dt}"
                );
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let Some(e) = env() else { return };
        let g = &e.gpu;
        let x = up(g, &[2, 3], &values(6, 30, 1.0), DType::BF16);
        let w = weight(g, DType::BF16, &[4, 5], &values(20, 31, 1.0));
        assert!(g.linear(&x, &w.view(), None).is_err());
        assert!(g.matmul(&x, &x, false).is_err());
        assert!(g.binary(&x, &up(g, &[4], &[0.0; 4], DType::BF16), BinaryOp::Add).is_err());
        assert!(g.permute(&x, &[0, 0]).is_err());
        assert!(g.slice(&x, 1, 2, 2).is_err());
        let q = up(g, &[1, 3, 4, 8], &values(96, 32, 1.0), DType::BF16);
        let kv = up(g, &[1, 2, 4, 8], &values(64, 33, 1.0), DType::BF16);
        assert!(
            g.attention(&q, &kv, &kv, AttentionMask::None, 1.0).is_err(),
            "3 query heads on 2 kv heads"
        );
    }

    /// Host memory for the copy tests: a boxed byte buffer.
    struct HostBuf(Box<[u8]>);

    // SAFETY: the boxed slice is `len()` bytes at `as_ptr()`, freed only when the value drops.
    #[allow(unsafe_code, reason = "test host memory for the device copies")]
    unsafe impl HostMemory for HostBuf {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn as_ptr(&self) -> *const u8 {
            self.0.as_ptr()
        }
        fn read(&self, offset: usize, out: &mut [u8]) {
            out.copy_from_slice(&self.0[offset..offset + out.len()]);
        }
    }

    #[test]
    fn cuda_memory_maps_registers_and_copies() {
        let Some(e) = env() else { return };
        let mem = e.gpu.memory();
        let g = mem.granularity();
        assert!(g.is_power_of_two() && g >= 64 << 10, "granularity {g}");
        let before = mem.mem_info().expect("mem_info");
        assert!(before.free <= before.total && before.total > 0);

        // Reserve four pages, map two, write across their boundary through a registered host buffer.
        let base = mem.reserve(4 * g).expect("reserve");
        assert!(mem.map(base.offset(g / 2), g).is_err(), "unaligned map");
        mem.map(base, g).expect("map");
        mem.map(base.offset(g), g).expect("map");
        assert!(mem.map(base, g).is_err(), "double map");
        assert!(mem.unreserve(base, 4 * g).is_err(), "unreserve with mappings");

        let data: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 7 % 251) as u8).collect();
        let host: Arc<dyn HostMemory> = Arc::new(HostBuf(data.clone().into_boxed_slice()));
        mem.register(&host, 0, data.len()).expect("register");
        assert!(mem.register(&host, 4096, 4096).is_err(), "overlapping registration");
        let offload = mem.new_stream().expect("stream");
        let at = base.offset(g - 1000);
        mem.copy_h2d(at, &HostSlice { mem: host.clone(), offset: 0, len: data.len() }, offload)
            .expect("copy");
        let event = mem.record(offload).expect("record");
        mem.wait_event(StreamId::COMPUTE, event.as_ref()).expect("wait_event");
        event.wait().expect("event wait");
        assert!(event.is_done().expect("query"));
        let mut back = vec![0u8; data.len()];
        mem.copy_d2h(&mut back, at).expect("d2h");
        assert_eq!(back, data);

        // Device-to-device into a plain allocation, then read it back.
        let plain = mem.alloc(4096).expect("alloc");
        mem.copy_d2d(plain, at.offset(100), 4096, StreamId::COMPUTE).expect("d2d");
        let mut small = vec![0u8; 4096];
        mem.copy_d2h(&mut small, plain).expect("d2h");
        assert_eq!(small, data[100..4196]);
        mem.free(plain).expect("free");
        assert!(mem.free(plain).is_err(), "double free");

        mem.synchronize().expect("synchronize");
        mem.unregister(&host, 0).expect("unregister");
        assert!(mem.unregister(&host, 0).is_err());
        mem.unmap(base, g).expect("unmap");
        assert!(mem.unmap(base, g).is_err(), "double unmap");
        mem.unmap(base.offset(g), g).expect("unmap");
        mem.unreserve(base, 4 * g).expect("unreserve");

        // An event from another device type is refused.
        let sim = kiln_compute::memory::SimDevice::new(1 << 20);
        let foreign = sim.record(StreamId::COMPUTE).expect("sim event");
        assert!(mem.wait_event(StreamId::COMPUTE, foreign.as_ref()).is_err());
    }

    /// Asserts `r` is the refusal of an address the device did not hand out, by `call`, before any driver call.
    #[track_caller]
    fn refused(r: kiln_compute::Result<()>, call: &str) {
        match r {
            Err(kiln_compute::Error::Driver { call: c, msg }) => {
                assert_eq!(c, call, "{msg}");
                assert!(
                    msg.contains("not memory this device mapped or allocated"),
                    "{call}: {msg}"
                );
            }
            other => panic!("{call}: expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn cuda_memory_refuses_addresses_it_did_not_hand_out() {
        let Some(e) = env() else { return };
        // A backend of its own, so that no other test allocates through its memory while this one checks
        // that freed addresses are refused.
        let gpu = Cuda::with_dtype(0, DType::F32).expect("a second backend on the device");
        let mem = gpu.memory();
        let g = mem.granularity();
        let theirs = e.gpu.memory().alloc(4096).expect("alloc on the shared backend");
        let host: Arc<dyn HostMemory> = Arc::new(HostBuf(vec![7u8; 4096].into_boxed_slice()));
        let slice = |len| HostSlice { mem: host.clone(), offset: 0, len };
        let mut back = vec![0u8; 4096];

        // A reservation with its first page mapped and its second only reserved; a 4 KiB plain allocation.
        let base = mem.reserve(2 * g).expect("reserve");
        mem.map(base, g).expect("map");
        let plain = mem.alloc(4096).expect("alloc");
        let foreign = [
            (DevPtr(0x1000), "an address the device never handed out"),
            (base.offset(g), "a reserved page that is not mapped"),
            (base.offset(g - 100), "a range that runs off the mapping"),
            (plain.offset(4000), "a range that runs off the plain allocation"),
            (theirs, "another backend's allocation on the same device"),
        ];
        for (at, what) in foreign {
            eprintln!("refusing {what} at {:#x}", at.0);
            refused(mem.copy_h2d(at, &slice(200), StreamId::COMPUTE), "copy_h2d");
            refused(mem.copy_h2d_pageable(at, &[1u8; 200]), "copy_h2d_pageable");
            refused(mem.copy_d2d(at, plain, 200, StreamId::COMPUTE), "copy_d2d");
            refused(mem.copy_d2d(plain, at, 200, StreamId::COMPUTE), "copy_d2d");
            refused(mem.copy_d2h(&mut back[..200], at), "copy_d2h");
            let x = up(&gpu, &[100], &values(100, 40, 1.0), DType::F32);
            refused(gpu.store(&x, at, DType::BF16, None), "store");
        }
        assert!(mem.free(DevPtr(0x1000)).is_err(), "free of a foreign address");
        assert!(mem.free(plain.offset(256)).is_err(), "free inside an allocation");
        assert!(mem.free(base).is_err(), "free of a mapping");
        assert!(mem.unmap(base.offset(g), g).is_err(), "unmap of a page never mapped");
        assert!(mem.unmap(plain, 4096).is_err(), "unmap of a plain allocation");

        // The device is still healthy, and the same calls on live memory work.
        mem.copy_h2d(base.offset(g - 4096), &slice(4096), StreamId::COMPUTE).expect("copy_h2d");
        mem.copy_d2d(plain, base.offset(g - 4096), 4096, StreamId::COMPUTE).expect("copy_d2d");
        mem.copy_d2h(&mut back, plain).expect("copy_d2h");
        assert_eq!(back, vec![7u8; 4096]);
        let x = up(&gpu, &[2048], &[1.5; 2048], DType::F32);
        gpu.store(&x, plain, DType::BF16, None).expect("store into the allocation");
        mem.copy_d2h(&mut back, plain).expect("copy_d2h");
        assert_eq!(back, dtype::narrow(DType::BF16, &[1.5; 2048]));

        // Memory given back is refused too.
        mem.synchronize().expect("synchronize");
        mem.free(plain).expect("free");
        refused(mem.copy_d2h(&mut back, plain), "copy_d2h");
        refused(gpu.store(&x, plain, DType::BF16, None), "store");
        mem.unmap(base, g).expect("unmap");
        refused(mem.copy_h2d_pageable(base, &[1u8; 16]), "copy_h2d_pageable");
        mem.unreserve(base, 2 * g).expect("unreserve");
        e.gpu.memory().free(theirs).expect("free on the shared backend");
    }

    /// Loads `layer.weight` of a quantized fixture (`engine/models/tests/fixtures/quant`, written by
    /// `scripts/reference/quant.py`) in `quant` on `b`'s device through a memory manager.
    fn quantized<B: Backend>(
        b: &B,
        name: &str,
        quant: kiln_compute::quant::Quant,
    ) -> kiln_compute::memory::Model {
        use kiln_compute::memory::{LoadPlan, ManagerConfig, MemoryManager, SlotPlan};
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../models/tests/fixtures/quant/{name}.safetensors"));
        let mut slot = SlotPlan::new("layer.weight", vec![(0, "layer.weight".into())]);
        slot.quant = quant;
        slot.table = vec![(0, "layer.weight_scale".into())];
        let plan = LoadPlan { files: vec![path], slots: vec![slot] };
        let manager =
            MemoryManager::new(b.memory().clone(), ManagerConfig::for_this_machine(false))
                .expect("a memory manager");
        manager.load(&plan, &mut |_, _| {}).expect("loads")
    }

    #[test]
    fn quantized_formats_dequantize_and_multiply_as_the_cpu() {
        use kiln_compute::quant::Quant;
        let Some(e) = env() else { return };
        let int8 = |per_row, convrot| Quant::Int8 { per_row, convrot, activations: true };
        for (name, quant, k) in [
            ("int8_tensorwise", int8(false, None), 64),
            ("int8_rowwise", int8(true, None), 64),
            ("int8_convrot64", int8(true, Some(64)), 128),
            ("int8_convrot256", int8(true, Some(256)), 256),
            ("mxfp8", Quant::Mxfp8, 160),
            // The global scale the fixture's `weight_scale_2` holds does not matter here: both backends read it.
            ("nvfp4", Quant::Nvfp4 { global: 0.012_5 }, 80),
        ] {
            let (gm, cm) = (quantized(&e.gpu32, name, quant), quantized(&e.cpu, name, quant));
            let (gl, cl) = (
                gm.fetch(&e.gpu32, &["layer.weight"]).expect("gpu fetch"),
                cm.fetch(&e.cpu, &["layer.weight"]).expect("cpu fetch"),
            );
            let (gw, cw) = (gl.weight(0), cl.weight(0));
            // Dequantized in f32: the same values (int8 with ConvRot: up to the rotation's sums).
            let want = get(&e.cpu, &e.cpu.weight_to_tensor(&cw, DType::F32).expect("cpu values"));
            let got =
                get(&e.gpu32, &e.gpu32.weight_to_tensor(&gw, DType::F32).expect("gpu values"));
            assert_close(&format!("{name} values"), &got, &want, (1e-6, 1e-5));
            // The linear layer: int8 quantizes x on both (one rounding flip moves a value by one step).
            let x = values(6 * k, 21, 2.0);
            let want = get(
                &e.cpu,
                &e.cpu.linear(&up(&e.cpu, &[6, k], &x, DType::F32), &cw, None).expect("cpu"),
            );
            let got = get(
                &e.gpu32,
                &e.gpu32.linear(&up(&e.gpu32, &[6, k], &x, DType::F32), &gw, None).expect("gpu"),
            );
            assert_close(&format!("{name} linear"), &got, &want, (1e-3, 1e-3));
            // Rows of a view keep their scales (a fused qkv split by rows).
            let rows = 3;
            let (gr, cr) = (gw.rows(2, rows).expect("rows"), cw.rows(2, rows).expect("rows"));
            let want = get(
                &e.cpu,
                &e.cpu.linear(&up(&e.cpu, &[6, k], &x, DType::F32), &cr, None).expect("cpu"),
            );
            let got = get(
                &e.gpu32,
                &e.gpu32.linear(&up(&e.gpu32, &[6, k], &x, DType::F32), &gr, None).expect("gpu"),
            );
            assert_close(&format!("{name} rows"), &got, &want, (1e-3, 1e-3));
        }
    }
}
