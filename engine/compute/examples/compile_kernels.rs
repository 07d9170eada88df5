//! Compiles every CUDA C kernel (`src/backend/cuda/kernels/*.cu`) with NVRTC for the GPU architectures Kiln
//! targets, with no GPU and no toolkit: only `libnvrtc`, which the test command takes from NVIDIA's pinned PyPI
//! wheel. So a kernel that does not compile fails CI instead of the first GPU session.
//!
//! Usage: `compile_kernels [--from-cache] [ARCH...]`, each a compute capability written as `90` or `9.0` (default:
//! every architecture Kiln targets, [`TARGETS`]). Exits non-zero naming the file, the architecture and NVRTC's
//! log. With `KILN_CUDA_KERNEL_CACHE=DIR` the PTX is kept in DIR as the backend keeps it; `--from-cache` then
//! fails unless every file's PTX was read back from there (a second process after one that wrote it).

#![expect(clippy::print_stdout, reason = "a command-line check that reports what it compiled")]

use std::process::ExitCode;

use kiln_compute::backend::cuda::compile_kernels;

/// The architectures Kiln targets: Ampere (A100, RTX 30), Ada (L40, RTX 40), Hopper (H100, H200), Blackwell
/// (B200, RTX 50).
const TARGETS: [(i32, i32); 6] = [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)];

fn parse(arch: &str) -> Option<(i32, i32)> {
    match arch.split_once('.') {
        Some((major, minor)) => Some((major.parse().ok()?, minor.parse().ok()?)),
        None if arch.len() >= 2 => {
            let (major, minor) = arch.split_at(arch.len() - 1);
            Some((major.parse().ok()?, minor.parse().ok()?))
        }
        None => None,
    }
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let from_cache = args.first().is_some_and(|a| a == "--from-cache");
    if from_cache {
        args.remove(0);
    }
    let archs: Vec<(i32, i32)> = if args.is_empty() {
        TARGETS.to_vec()
    } else {
        match args.iter().map(|a| parse(a).ok_or(a)).collect::<Result<_, _>>() {
            Ok(archs) => archs,
            Err(bad) => {
                println!("`{bad}` is not a compute capability (e.g. 90 or 9.0)");
                return ExitCode::from(2);
            }
        }
    };
    for (major, minor) in archs {
        let started = std::time::Instant::now();
        match compile_kernels((major, minor)) {
            Ok(kernels) => {
                let files: Vec<String> = kernels
                    .iter()
                    .map(|k| {
                        format!(
                            "{} ({} KB PTX, {} KB CUBIN)",
                            k.file,
                            k.ptx_bytes / 1024,
                            k.cubin_bytes / 1024
                        )
                    })
                    .collect();
                let kept = kernels.iter().filter(|k| k.from_disk).count();
                println!(
                    "sm_{major}{minor}: {} kernel files compile in {:.1} s ({kept} PTX from the kernel cache): {}",
                    kernels.len(),
                    started.elapsed().as_secs_f32(),
                    files.join(", ")
                );
                if from_cache && kept < kernels.len() {
                    println!(
                        "sm_{major}{minor}: --from-cache, but NVRTC compiled {} files",
                        kernels.len() - kept
                    );
                    return ExitCode::FAILURE;
                }
            }
            Err(error) => {
                println!("sm_{major}{minor}: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
