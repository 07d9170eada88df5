//! CPU op benchmarks at Z-Image shapes: `linear` with bf16 weights, attention and a VAE conv; `linear` with fp8
//! weights at Qwen-Image's shapes for few rows, and with f16 weights at Wan 2.2 5B's. Each case runs
//! once to warm up, then several times; the median (and the fastest run) is reported. Prints one JSON object (seconds per case)
//! on stdout; `bench/cpu/run.sh` compares it with torch's figures for the same cases.
//!
//! Usage: `cargo bench -p kiln-compute --bench cpu_ops [-- FILTER]` (cases whose name contains FILTER).

use std::io::Write;
use std::time::Instant;

use kiln_compute::backend::cpu::Cpu;
use kiln_compute::backend::{AttentionMask, Conv2dParams};
use kiln_compute::{Backend, DType, OwnedWeight, Result, Tensor};

/// Deterministic values in [-1, 1) (xorshift64*).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Median and fastest seconds of `runs` calls of `f` after one warm-up call (`KILN_BENCH_RUNS` overrides
/// `runs`).
fn time(runs: usize, f: &mut dyn FnMut() -> Result<Tensor<Cpu>>) -> Result<Secs> {
    let runs =
        std::env::var("KILN_BENCH_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(runs).max(1);
    std::hint::black_box(f()?);
    let mut secs = Vec::with_capacity(runs);
    let cpu0 = cpu_seconds();
    for _ in 0..runs {
        let t = Instant::now();
        std::hint::black_box(f()?);
        secs.push(t.elapsed().as_secs_f64());
    }
    secs.sort_by(f64::total_cmp);
    let cpu = (cpu_seconds() - cpu0) / runs as f64;
    Ok(Secs { median: secs[runs / 2], min: secs[0], cpu })
}

/// A case's timing.
#[derive(Clone, Copy)]
struct Secs {
    median: f64,
    min: f64,
    /// CPU seconds (all threads) per run: steadier than wall time on a shared machine.
    cpu: f64,
}

/// CPU seconds this process has used so far (user + system, from /proc; 0 where it cannot be read).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name: utime and stime are the 12th and 13th.
    let rest = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

impl std::fmt::Display for Secs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.4} s (min {:.4}, cpu {:.3})", self.median, self.min, self.cpu)
    }
}

/// `linear` cases of one weight dtype: weights `[n, k]` of `shapes` times each count of `rows`.
struct FewRows {
    dtype: DType,
    label: &'static str,
    shapes: &'static [(usize, usize)],
    rows: &'static [usize],
    runs: usize,
}

fn main() -> Result<()> {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-')).unwrap_or_default();
    let cpu = Cpu::new(1 << 30);
    // Case name → median and fastest seconds, as JSON (a number, or an object of variants).
    let mut results: Vec<(String, String, String)> = Vec::new();
    let wanted = |name: &str| name.contains(&filter);

    for (n, k) in [(3840, 3840), (10240, 3840), (3840, 10240)] {
        let w = OwnedWeight::from_f32(cpu.memory(), DType::BF16, &[n, k], &values(n * k, 1))?;
        for m in [256, 4096] {
            let name = format!("linear_bf16_w{n}x{k}_m{m}");
            if !wanted(&name) {
                continue;
            }
            let runs = if m >= 4096 { 3 } else { 5 };
            // f32 activations (the CPU's compute type) and bf16 activations (bf16 × bf16 products).
            let x = cpu.from_f32(&[m, k], &values(m * k, 2), DType::F32)?;
            let xb = cpu.cast(&x, DType::BF16)?;
            let f32_secs = time(runs, &mut || cpu.linear(&x, &w.view(), None))?;
            let bf16_secs = time(runs, &mut || cpu.linear(&xb, &w.view(), None))?;
            eprintln!("{name}: x f32 {f32_secs}, x bf16 {bf16_secs}");
            let pair = |a: f64, b: f64| format!("{{\"x_f32\": {a:.6}, \"x_bf16\": {b:.6}}}");
            results.push((
                name,
                pair(f32_secs.median, bf16_secs.median),
                pair(f32_secs.min, bf16_secs.min),
            ));
        }
    }
    // fp8 weights at Qwen-Image's MMDiT shapes (hidden 3072, MLP 12288) times the few rows of a 64² image
    // (16 tokens) or a short prompt: the rows where packing the weight costs as much as the product (#23).
    // f16 weights at Wan 2.2 TI2V 5B's shapes (hidden 3072, MLP 14336): a 64² clip's 16 image tokens, and the
    // 1024 text tokens (512 a prompt, positive and negative) its cross-attention keys and values project (#24).
    let few_rows = [
        FewRows {
            dtype: DType::F8E4M3,
            label: "fp8",
            shapes: &[(3072, 3072), (12288, 3072), (3072, 12288)],
            rows: &[1, 4, 8, 16],
            runs: 9,
        },
        FewRows {
            dtype: DType::F16,
            label: "f16",
            shapes: &[(3072, 3072), (14336, 3072)],
            rows: &[16, 1024],
            runs: 5,
        },
    ];
    for (seed, FewRows { dtype, label, shapes, rows, runs }) in (3..).step_by(2).zip(few_rows) {
        for &(n, k) in shapes {
            let w = OwnedWeight::from_f32(cpu.memory(), dtype, &[n, k], &values(n * k, seed))?;
            for &m in rows {
                let name = format!("linear_{label}_w{n}x{k}_m{m}");
                if !wanted(&name) {
                    continue;
                }
                let x = cpu.from_f32(&[m, k], &values(m * k, seed + 1), DType::F32)?;
                let secs = time(runs, &mut || cpu.linear(&x, &w.view(), None))?;
                eprintln!("{name}: {secs}");
                results.push((name, format!("{:.6}", secs.median), format!("{:.6}", secs.min)));
            }
        }
    }
    let mut run =
        |name: String, runs: usize, f: &mut dyn FnMut() -> Result<Tensor<Cpu>>| -> Result<()> {
            if wanted(&name) {
                let secs = time(runs, f)?;
                eprintln!("{name}: {secs}");
                results.push((name, format!("{:.6}", secs.median), format!("{:.6}", secs.min)));
            }
            Ok(())
        };

    let (heads, d, n) = (30, 128, 4096);
    let qkv: Vec<Tensor<Cpu>> = (0..3)
        .map(|i| cpu.from_f32(&[1, heads, n, d], &values(heads * n * d, 10 + i), DType::F32))
        .collect::<Result<_>>()?;
    let scale = 1.0 / (d as f32).sqrt();
    run(format!("attention_h{heads}_d{d}_n{n}"), 3, &mut || {
        cpu.attention(&qkv[0], &qkv[1], &qkv[2], AttentionMask::None, scale)
    })?;

    let (c, hw) = (512, 128);
    let w = OwnedWeight::from_f32(cpu.memory(), DType::F32, &[c, c, 3, 3], &values(c * c * 9, 20))?;
    let b = OwnedWeight::from_f32(cpu.memory(), DType::F32, &[c], &values(c, 21))?;
    let x = cpu.from_f32(&[1, c, hw, hw], &values(c * hw * hw, 22), DType::F32)?;
    run(format!("conv2d_3x3_c{c}_{hw}x{hw}"), 3, &mut || {
        cpu.conv2d(&x, &w.view(), Some(&b.view()), Conv2dParams::same(1))
    })?;
    // The planes of a video VAE's decode of a small clip (a 64² Wan 2.2 decode runs 1024 channels at 4² and 8²,
    // then fewer as it grows): few columns against a large kernel, where packing the kernel costs the most.
    for (c, hw, runs) in [(1024, 4, 9), (1024, 8, 9), (512, 16, 5), (256, 32, 5), (128, 64, 5)] {
        let w =
            OwnedWeight::from_f32(cpu.memory(), DType::F32, &[c, c, 3, 3], &values(c * c * 9, 23))?;
        let x = cpu.from_f32(&[1, c, hw, hw], &values(c * hw * hw, 24), DType::F32)?;
        run(format!("conv2d_3x3_c{c}_{hw}x{hw}"), runs, &mut || {
            cpu.conv2d(&x, &w.view(), None, Conv2dParams::same(1))
        })?;
    }

    let object = |pick: fn(&(String, String, String)) -> &String| {
        let cases: Vec<String> =
            results.iter().map(|r| format!("\"{}\": {}", r.0, pick(r))).collect();
        format!("{{{}}}", cases.join(", "))
    };
    let json = format!(
        "{{\"tool\": \"kiln\", \"threads\": {}, \"seconds\": {}, \"min_seconds\": {}}}",
        rayon::current_num_threads(),
        object(|r| &r.1),
        object(|r| &r.2)
    );
    writeln!(std::io::stdout(), "{json}").map_err(|e| kiln_compute::Error::Host(e.to_string()))?;
    Ok(())
}
