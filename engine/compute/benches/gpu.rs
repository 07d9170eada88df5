//! Kiln's GPU benchmark: the memory manager's transfer paths and the weight-streaming workload of
//! performance-anchors.md §1.2, run through the real executor (Model::fetch + the CUDA backend), with the same
//! JSON keys as the PyTorch baseline (`bench/gpu/torch_streaming_baseline.py`) so one run compares both.
//!
//! Usage: `gpu [OUT.json]` (build with `--features cuda`; `bench/gpu.sh` runs it beside the baseline). Without
//! a usable GPU it writes `{"skipped": "<why>"}` and exits 0. `gpu --attention [OUT.json]` measures long
//! attention alone instead (below).
//!
//! Measured:
//! - `h2d_pool_{64MB,1024MB}_GBps`: copies from a registered `HostBuffer` (the pinned pool).
//! - `make_pinnable_4GiB`: growing a host buffer to 4 GiB (commit + prefault) and registering it, apart.
//! - `load_{cold,warm}_GBps`: the threaded loader reading a 4.3 GB safetensors file into pins.
//! - `M256`, `M4096`: 32 bf16 8192×8192 layers, GEMM with M rows: resident, copy-only (the bound), streamed
//!   with nothing resident, and partially resident at budgets holding 25/50/75 % of the weights; ratios to
//!   the bound (and, for the partial passes, to the copy time of the non-resident bytes); `rel_err` against the
//!   resident pass; resident TFLOP/s.
//!
//! With `--attention`: long attention at the shapes of the real-size runs (Qwen-Image at 1328², Wan 2.2 5B at
//! 1280×704×33, Z-Image at 1024²; bf16, heads of 128) on each long-attention path (GEMMs, the tensor-core kernel's
//! one- and two-m-tile forms, cuDNN's fused kernels with whether they ran and why not): seconds, TFLOP/s, and the
//! largest difference of another path's output from the GEMM path's.

#[cfg(feature = "cuda")]
fn main() {
    let attention = std::env::args().any(|a| a == "--attention");
    let out = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .unwrap_or_else(|| "kiln-gpu.json".to_owned());
    let report = match if attention { bench::attention() } else { bench::run() } {
        Ok(report) => report,
        Err(e) => format!("{{\"skipped\": {:?}}}", e.to_string()),
    };
    if let Err(e) = std::fs::write(&out, &report) {
        eprintln!("cannot write {out}: {e}");
        std::process::exit(1);
    }
    eprintln!("{report}");
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("the gpu benchmark needs the `cuda` feature");
}

#[cfg(feature = "cuda")]
mod bench {
    use std::fmt::Write as _;
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Instant;

    use kiln_compute::backend::cuda::{Cuda, missing_library};
    use kiln_compute::memory::pins::PinConfig;
    use kiln_compute::memory::{
        DeviceMemory, HostBuffer, HostBufferConfig, LoadPlan, ManagerConfig, MemoryManager, Model,
        StreamId, drop_page_cache,
    };
    use kiln_compute::{Backend, DType, Result, Tensor};

    const H: usize = 8192;
    const LAYERS: usize = 32;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// Runs everything and returns the JSON report.
    pub(super) fn run() -> Result<String> {
        if let Some(lib) = missing_library() {
            return Err(kiln_compute::Error::Unsupported(format!("{lib} not found")));
        }
        let cuda = Cuda::new(0)?;
        let memory = cuda.memory().clone();
        let mut json = String::from("{\n");
        let info = cuda.info();
        let _ = writeln!(json, " \"gpu\": {:?},", info.name);
        let _ = writeln!(json, " \"total_memory\": {},", info.total_memory);
        for mib in [64u64, 1024] {
            let gbps = h2d_from_pool(&memory, mib * MIB)?;
            let _ = writeln!(json, " \"h2d_pool_{mib}MB_GBps\": {gbps:.3},");
        }
        let (grow_s, register_s) = make_pinnable(&memory, 4 * GIB)?;
        let _ = writeln!(
            json,
            " \"make_pinnable_4GiB\": {{\"grow_prefault_s\": {grow_s:.4}, \"register_s\": {register_s:.4}, \"total_s\": {:.4}}},",
            grow_s + register_s
        );
        let dir = std::env::var("KILN_BENCH_DIR")
            .unwrap_or_else(|_| std::env::temp_dir().display().to_string());
        let path = Path::new(&dir).join("kiln_bench_weights.safetensors");
        write_weights(&path)?;
        let manager = MemoryManager::new(memory.clone(), config(0))?;
        let mut load = String::new();
        for label in ["cold", "warm"] {
            if label == "cold" && drop_page_cache(&path).is_err() {
                continue;
            }
            let t = Instant::now();
            let model = manager.load(&LoadPlan::whole_file(&path)?, &mut |_, _| {})?;
            let s = t.elapsed().as_secs_f64();
            let stats = model.load_stats();
            let _ = write!(
                load,
                "\"{label}\": {{\"load_s\": {s:.3}, \"load_GBps\": {:.3}, \"readers_GBps\": {:.3}}}, ",
                stats.bytes as f64 / 1e9 / s,
                stats.gb_per_s()
            );
            drop(model);
        }
        let _ =
            writeln!(json, " \"load\": {{{}\"file_GB\": {:.3}}},", load, file_bytes() as f64 / 1e9);
        drop(manager);
        for m in [256usize, 4096] {
            let entry = streaming(&cuda, &memory, &path, m)?;
            let _ = writeln!(json, " \"M{m}\": {entry},");
        }
        let _ = std::fs::remove_file(&path);
        json.push_str(" \"done\": true\n}\n");
        Ok(json)
    }

    fn config(headroom: u64) -> ManagerConfig {
        let mut config = ManagerConfig::for_this_machine(true);
        if headroom > 0 {
            config.vram.headroom = headroom;
        }
        if !config.pins.enabled() {
            config.pins = PinConfig { cap: 64 * GIB, ..config.pins };
        }
        config
    }

    fn file_bytes() -> u64 {
        (LAYERS * H * H * 2) as u64
    }

    /// Copies `bytes` from a registered host buffer to the device, 5 times after 2 warm-ups; median GB/s.
    fn h2d_from_pool(memory: &Arc<dyn DeviceMemory>, bytes: u64) -> Result<f64> {
        let len = bytes as usize;
        let buf = HostBuffer::new(len, HostBufferConfig::weights());
        buf.grow(len)?;
        buf.register(memory, 0, len)?;
        let dst = memory.alloc(bytes)?;
        let mut times = Vec::new();
        for i in 0..7 {
            memory.synchronize()?;
            let t = Instant::now();
            buf.copy_h2d(memory.as_ref(), 0, len, dst, StreamId::COMPUTE)?;
            memory.synchronize()?;
            if i >= 2 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        memory.free(dst)?;
        buf.unregister(0)?;
        Ok(bytes as f64 / 1e9 / median(&mut times))
    }

    /// Seconds to commit + prefault `bytes` of a fresh host buffer, and to register it.
    fn make_pinnable(memory: &Arc<dyn DeviceMemory>, bytes: u64) -> Result<(f64, f64)> {
        let len = bytes as usize;
        let buf = HostBuffer::new(len, HostBufferConfig::weights());
        let t = Instant::now();
        buf.grow(len)?;
        let grow = t.elapsed().as_secs_f64();
        let t = Instant::now();
        buf.register(memory, 0, len)?;
        let register = t.elapsed().as_secs_f64();
        buf.unregister(0)?;
        Ok((grow, register))
    }

    /// The baseline's weights: 32 bf16 layers of 8192×8192 with values ~0.01·N(0,1)-sized (deterministic).
    fn write_weights(path: &Path) -> Result<()> {
        use std::io::Write as _;
        let layer_bytes = H * H * 2;
        let mut header = String::from("{");
        for i in 0..LAYERS {
            let start = i * layer_bytes;
            let _ = write!(
                header,
                "{}\"layer{i}.weight\":{{\"dtype\":\"BF16\",\"shape\":[{H},{H}],\"data_offsets\":[{start},{}]}}",
                if i > 0 { "," } else { "" },
                start + layer_bytes
            );
        }
        header.push('}');
        while (8 + header.len()) % 8 != 0 {
            header.push(' ');
        }
        let io =
            |e: std::io::Error| kiln_compute::Error::Io { path: path.to_path_buf(), source: e };
        let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        file.write_all(&(header.len() as u64).to_le_bytes()).map_err(io)?;
        file.write_all(header.as_bytes()).map_err(io)?;
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut row = vec![0u8; H * 2];
        for _ in 0..LAYERS * H {
            for pair in row.chunks_exact_mut(2) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let v = ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02;
                pair.copy_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes());
            }
            file.write_all(&row).map_err(io)?;
        }
        file.flush().map_err(io)?;
        Ok(())
    }

    /// The `--attention` report (see the module docs).
    pub(super) fn attention() -> Result<String> {
        use kiln_compute::backend::AttentionMask;
        use kiln_compute::backend::cuda::LongAttention;
        if let Some(lib) = missing_library() {
            return Err(kiln_compute::Error::Unsupported(format!("{lib} not found")));
        }
        let mut json = String::from("{\n");
        // (name, batch, heads, tokens): every one with heads of 128 features.
        let cases = [
            ("qwen_image_1328", 1, 24, 6903),
            ("wan22_5b_1280x704x33", 1, 24, 7920),
            ("zimage_1024", 1, 30, 4128),
        ];
        for (i, (name, b, h, n)) in cases.into_iter().enumerate() {
            let d = 128;
            let len = b * h * n * d;
            let values = |seed: usize| -> Vec<f32> {
                (0..len)
                    .map(|i| ((i * 7919 + seed * 104_729) % 2000) as f32 / 1000.0 - 1.0)
                    .collect()
            };
            let flops = 4.0 * (b * h * n * n * d) as f64;
            let mut outputs = Vec::new();
            let mut parts = Vec::new();
            let paths = [
                ("gemm", LongAttention::Gemm),
                ("mma", LongAttention::Mma),
                ("mma2", LongAttention::Mma2),
                ("cudnn", LongAttention::Cudnn),
            ];
            for (path, long) in paths {
                let cuda = Cuda::new(0)?.with_long_attention(long);
                let up = |seed| cuda.from_f32(&[b, h, n, d], &values(seed), DType::BF16);
                let (q, k, v) = (up(1)?, up(2)?, up(3)?);
                let scale = 1.0 / (d as f32).sqrt();
                let s = timed(&cuda, 5, || {
                    cuda.attention(&q, &k, &v, AttentionMask::None, scale).map(|_| ())
                })?;
                let out = cuda.attention(&q, &k, &v, AttentionMask::None, scale)?;
                outputs.push(cuda.to_f32(&out)?);
                // Whether cuDNN's kernels ran (else its time is the GEMM path's), and why not.
                let cudnn = match long {
                    LongAttention::Cudnn => {
                        let stats = cuda.cudnn_attention_stats();
                        // A JSON string: no quotes, backslashes or control characters (cuDNN's
                        // messages span lines).
                        let why: String = (stats.declined.unwrap_or_default().chars())
                            .map(|c| match c {
                                '"' | '\\' => '\'',
                                c if c.is_control() => ' ',
                                c => c,
                            })
                            .collect();
                        format!(", \"ran\": {}, \"declined\": \"{why}\"", stats.ran > 0)
                    }
                    _ => String::new(),
                };
                parts.push(format!(
                    "\"{path}\": {{\"seconds\": {s:.6}, \"tflops\": {:.1}{cudnn}}}",
                    flops / s / 1e12
                ));
            }
            // The largest difference of any other path from the GEMM path.
            let diff = outputs[1..]
                .iter()
                .flat_map(|o| o.iter().zip(&outputs[0]).map(|(a, b)| (a - b).abs()))
                .fold(0.0f32, f32::max);
            let comma = if i + 1 < cases.len() { "," } else { "" };
            let _ = writeln!(
                json,
                " \"{name}\": {{\"shape\": [{b}, {h}, {n}, {d}], {}, \"max_abs_diff\": {diff:e}}}{comma}",
                parts.join(", ")
            );
        }
        json.push('}');
        Ok(json)
    }

    fn names() -> Vec<String> {
        (0..LAYERS).map(|i| format!("layer{i}.weight")).collect()
    }

    /// One pass: y = x·W₀ᵀ·W₁ᵀ… through `model`, fetching each layer as model code does.
    fn pass(cuda: &Cuda, model: &Model, x: &Tensor<Cuda>) -> Result<Tensor<Cuda>> {
        let mut y = x.clone();
        for name in names() {
            let layer = model.fetch(cuda, &[name.as_str()])?;
            y = cuda.linear(&y, &layer.weight(0), None)?;
        }
        Ok(y)
    }

    fn timed(cuda: &Cuda, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        f()?;
        cuda.synchronize()?;
        let mut times = Vec::new();
        for _ in 0..reps {
            let t = Instant::now();
            f()?;
            cuda.synchronize()?;
            times.push(t.elapsed().as_secs_f64());
        }
        Ok(median(&mut times))
    }

    fn median(times: &mut [f64]) -> f64 {
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    }

    fn streaming(
        cuda: &Cuda,
        memory: &Arc<dyn DeviceMemory>,
        path: &Path,
        m: usize,
    ) -> Result<String> {
        let total = memory.mem_info()?.total;
        let weights = file_bytes();
        let values: Vec<f32> =
            (0..m * H).map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 0.1).collect();
        let x = cuda.from_f32(&[m, H], &values, DType::BF16)?;
        // Resident: the whole model fits the default budget.
        let manager = MemoryManager::new(memory.clone(), config(0))?;
        cuda.set_allocator(manager.arbiter().clone());
        let model = manager.load(&LoadPlan::whole_file(path)?, &mut |_, _| {})?;
        model.activate()?;
        let resident_out = pass(cuda, &model, &x)?;
        let reference = cuda.to_f32(&resident_out)?;
        let resident = timed(cuda, 5, || pass(cuda, &model, &x).map(drop))?;
        // Copy-only: every layer from its pin into one device buffer (the bound).
        let dst = memory.alloc((H * H * 2) as u64)?;
        let host = HostBuffer::new(H * H * 2, HostBufferConfig::weights());
        host.grow(H * H * 2)?;
        host.register(memory, 0, H * H * 2)?;
        let copy_only = timed(cuda, 5, || {
            for _ in 0..LAYERS {
                host.copy_h2d(memory.as_ref(), 0, H * H * 2, dst, StreamId::COMPUTE)?;
            }
            Ok(())
        })?;
        memory.free(dst)?;
        host.unregister(0)?;
        drop(model);
        drop(manager);
        let bound = resident.max(copy_only);
        let mut entry = format!(
            "{{\"resident_s\": {resident:.6}, \"copy_only_pinned_s\": {copy_only:.6}, \"bound_s\": {bound:.6}, \"weights_GB\": {:.3}, \"tflops_resident\": {:.1}",
            weights as f64 / 1e9,
            2.0 * (m * H * H * LAYERS) as f64 / resident / 1e12
        );
        // Streamed (nothing resident) and partially resident passes: the budget holds `fraction` of the weights
        // plus room for two lanes' scratch and the activations.
        let working = 2 * 160 * MIB + 4 * (m * H * 2) as u64 + 512 * MIB;
        for fraction in [0.0f64, 0.25, 0.5, 0.75] {
            let budget = (weights as f64 * fraction) as u64 + working;
            let manager = MemoryManager::new(memory.clone(), config(total.saturating_sub(budget)))?;
            cuda.set_allocator(manager.arbiter().clone());
            let model = manager.load(&LoadPlan::whole_file(path)?, &mut |_, _| {})?;
            model.activate()?;
            let out = pass(cuda, &model, &x)?;
            let got = cuda.to_f32(&out)?;
            let t = timed(cuda, 5, || pass(cuda, &model, &x).map(drop))?;
            let resident_bytes = model.resident_bytes();
            let offloaded = weights.saturating_sub(resident_bytes.min(weights));
            let copy_time = copy_only * offloaded as f64 / weights as f64;
            let key = if fraction == 0.0 {
                "streamed".to_owned()
            } else {
                format!("partial_{}", (fraction * 100.0) as u32)
            };
            let _ = write!(
                entry,
                ", \"{key}\": {{\"s\": {t:.6}, \"over_bound\": {:.4}, \"resident_GB\": {:.3}, \"over_nonresident_copy\": {:.4}, \"rel_err\": {:.3e}, \"pageable_copies\": {}}}",
                t / bound,
                resident_bytes as f64 / 1e9,
                t / resident.max(copy_time),
                rel_err(&got, &reference),
                manager.stats().pageable_copies
            );
            if fraction == 0.0 {
                let _ = write!(entry, ", \"streamed_over_bound\": {:.4}", t / bound);
            }
        }
        entry.push('}');
        Ok(entry)
    }

    fn rel_err(got: &[f32], want: &[f32]) -> f64 {
        let num: f64 = got.iter().zip(want).map(|(g, w)| f64::from(g - w).powi(2)).sum();
        let den: f64 = want.iter().map(|w| f64::from(*w).powi(2)).sum();
        (num / den.max(f64::MIN_POSITIVE)).sqrt()
    }
}
