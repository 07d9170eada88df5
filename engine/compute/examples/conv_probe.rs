//! One 3×3 convolution (same padding, f32) on the CPU backend, repeated, for profiling it alone
//! (`perf record target/release/examples/conv_probe C HW RUNS`): prints the mean seconds per call and the rate.

use std::io::Write;
use std::time::Instant;

use kiln_compute::backend::Conv2dParams;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::{Backend, DType, OwnedWeight};

fn main() -> kiln_compute::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let [c, hw, runs] = args[..] else {
        let _ = writeln!(std::io::stderr(), "usage: conv_probe CHANNELS SIZE RUNS");
        std::process::exit(2);
    };
    let cpu = Cpu::new(1 << 30);
    let values =
        |n: usize| (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 70.0).collect::<Vec<_>>();
    let w = OwnedWeight::from_f32(cpu.memory(), DType::F32, &[c, c, 3, 3], &values(c * c * 9))?;
    let x = cpu.from_f32(&[1, c, hw, hw], &values(c * hw * hw), DType::F32)?;
    let start = Instant::now();
    for _ in 0..runs {
        std::hint::black_box(cpu.conv2d(&x, &w.view(), None, Conv2dParams::same(1))?);
    }
    let seconds = start.elapsed().as_secs_f64() / runs.max(1) as f64;
    let flop = 2.0 * (c * c * 9 * hw * hw) as f64;
    let _ = writeln!(std::io::stdout(), "{seconds:.5} s, {:.1} GFLOP/s", flop / seconds / 1e9);
    Ok(())
}
