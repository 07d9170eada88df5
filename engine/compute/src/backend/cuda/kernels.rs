//! The CUDA C kernels: one `.cu` file per op family, compiled by NVRTC at first use for the device's compute
//! capability, and launched on the compute stream.
//!
//! Each file is compiled as `common.cu` followed by the file (there are no toolkit headers and no `#include`).
//! The PTX is cached per process and architecture, so a second backend on the same kind of device does not
//! compile again, and on disk where a folder is set (`kernel_cache.rs`), so the next process does not either;
//! each backend loads the modules it uses into its context once.
//!
//! Kernels take element types as runtime codes ([`dtype_code`]) and device addresses as 64-bit integers.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::{CompileOptions, Ptx};

use super::kernel_cache::Entry;
use super::memory::drv;
use crate::dtype::DType;
use crate::error::{Error, Result};

const COMMON: &str = include_str!("kernels/common.cu");

/// The kernel files, one per op family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum KernelFile {
    /// Casts, fills, the stochastic-rounding store.
    Cast,
    /// Unary, binary, affine, gated, modulate, bias add.
    Elementwise,
    /// RMS (by row and by channel), layer and group norm, softmax.
    Norm,
    /// Flash attention on CUDA cores, the GEMM path's softmax.
    Attention,
    /// Flash attention on tensor cores (sm_80 and later).
    AttentionMma,
    /// Rotary position embedding.
    Rope,
    /// Concat, slice, pad, permute, upsampling, patchify, embedding.
    Layout,
    /// im2col for conv2d.
    Conv,
    /// The fallback GEMM.
    Gemm,
    /// Quantized weights: dequantizing the row and block formats, int8 activations and products.
    Quant,
}

impl KernelFile {
    /// Every kernel file.
    const ALL: [KernelFile; 10] = [
        KernelFile::Cast,
        KernelFile::Elementwise,
        KernelFile::Norm,
        KernelFile::Attention,
        KernelFile::AttentionMma,
        KernelFile::Rope,
        KernelFile::Layout,
        KernelFile::Conv,
        KernelFile::Gemm,
        KernelFile::Quant,
    ];

    fn name(self) -> &'static str {
        match self {
            KernelFile::Cast => "cast.cu",
            KernelFile::Elementwise => "elementwise.cu",
            KernelFile::Norm => "norm.cu",
            KernelFile::Attention => "attention.cu",
            KernelFile::AttentionMma => "attention_mma.cu",
            KernelFile::Rope => "rope.cu",
            KernelFile::Layout => "layout.cu",
            KernelFile::Conv => "conv.cu",
            KernelFile::Gemm => "gemm.cu",
            KernelFile::Quant => "quant.cu",
        }
    }

    /// What NVRTC compiles for this file: `common.cu` followed by the file.
    fn program(self) -> String {
        format!("{COMMON}\n{}", self.source())
    }

    fn source(self) -> &'static str {
        match self {
            KernelFile::Cast => include_str!("kernels/cast.cu"),
            KernelFile::Elementwise => include_str!("kernels/elementwise.cu"),
            KernelFile::Norm => include_str!("kernels/norm.cu"),
            KernelFile::Attention => include_str!("kernels/attention.cu"),
            KernelFile::AttentionMma => include_str!("kernels/attention_mma.cu"),
            KernelFile::Rope => include_str!("kernels/rope.cu"),
            KernelFile::Layout => include_str!("kernels/layout.cu"),
            KernelFile::Conv => include_str!("kernels/conv.cu"),
            KernelFile::Gemm => include_str!("kernels/gemm.cu"),
            KernelFile::Quant => include_str!("kernels/quant.cu"),
        }
    }
}

/// The element type code kernels take (`DT_*` in `common.cu`).
pub(crate) fn dtype_code(dtype: DType) -> i32 {
    match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::F8E4M3 => 3,
        DType::F8E5M2 => 4,
        DType::I8 => 5,
        DType::U8 => 6,
    }
}

/// One kernel argument.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg {
    /// A device address (0 for a null pointer).
    Ptr(u64),
    /// A 64-bit signed integer (`i64`).
    I64(i64),
    /// A 32-bit signed integer (`int`).
    I32(i32),
    /// A 64-bit unsigned integer (`u64`).
    U64(u64),
    /// A float.
    F32(f32),
    /// Eight 64-bit values (`Dims8`).
    Dims([u64; 8]),
}

impl Arg {
    /// A size or index as `i64`.
    pub(crate) fn n(v: usize) -> Arg {
        Arg::I64(v as i64)
    }

    fn as_param(&self) -> *mut c_void {
        match self {
            Arg::Ptr(v) | Arg::U64(v) => v as *const u64 as *mut c_void,
            Arg::I64(v) => v as *const i64 as *mut c_void,
            Arg::I32(v) => v as *const i32 as *mut c_void,
            Arg::F32(v) => v as *const f32 as *mut c_void,
            Arg::Dims(v) => v.as_ptr() as *mut c_void,
        }
    }
}

/// Up to 8 values as a `Dims8`, zero-filled.
pub(crate) fn dims8(values: &[usize]) -> Arg {
    let mut out = [0u64; 8];
    for (o, &v) in out.iter_mut().zip(values) {
        *o = v as u64;
    }
    Arg::Dims(out)
}

/// Launch geometry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grid {
    /// Blocks.
    pub(crate) grid: (u32, u32, u32),
    /// Threads per block.
    pub(crate) block: (u32, u32, u32),
    /// Dynamic shared memory in bytes.
    pub(crate) shared: u32,
}

impl Grid {
    /// A grid-stride launch over `n` elements: 256 threads per block, at most 65 535 blocks.
    pub(crate) fn linear(n: usize) -> Grid {
        let blocks = n.div_ceil(256).clamp(1, 65_535) as u32;
        Grid { grid: (blocks, 1, 1), block: (256, 1, 1), shared: 0 }
    }

    /// One block of `threads` per row, for `rows` rows (the kernels loop when rows exceed the grid).
    pub(crate) fn rows(rows: usize, threads: u32) -> Grid {
        let blocks = rows.clamp(1, 65_535) as u32;
        Grid { grid: (blocks, 1, 1), block: (threads, 1, 1), shared: 0 }
    }
}

/// PTX per (file, compute capability), compiled once per process.
type PtxCache = Mutex<HashMap<(KernelFile, i32, i32), Ptx>>;

fn ptx_cache() -> &'static PtxCache {
    static CACHE: OnceLock<PtxCache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// NVRTC's options for `arch`: `compute_XY` (PTX, which the driver compiles for the device at load, as the
/// backend does) or `sm_XY` (a CUBIN for that GPU).
fn compile_options(arch: (i32, i32), real: bool) -> Vec<String> {
    let kind = if real { "sm" } else { "compute" };
    vec![format!("--gpu-architecture={kind}_{}{}", arch.0, arch.1), "--std=c++17".to_owned()]
}

/// `file`'s PTX for `arch`: from this process's cache, the disk's ([`super::kernel_cache`]) or NVRTC; and the
/// disk's entry when it was read from there.
fn compile(file: KernelFile, arch: (i32, i32)) -> Result<(Ptx, Option<Entry>)> {
    let key = (file, arch.0, arch.1);
    let mut cache = ptx_cache().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(ptx) = cache.get(&key) {
        return Ok((ptx.clone(), None));
    }
    let src = file.program();
    let options = compile_options(arch, false);
    let kept = Entry::of(file.name(), arch, &src, &options);
    if let Some(text) = kept.as_ref().and_then(Entry::read) {
        let ptx = Ptx::from_src(text);
        cache.insert(key, ptx.clone());
        return Ok((ptx, kept));
    }
    let opts =
        CompileOptions { name: Some(file.name().to_owned()), options, ..CompileOptions::default() };
    let started = std::time::Instant::now();
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => Error::driver(
            "nvrtcCompileProgram",
            format!("{}: {}", file.name(), log.to_string_lossy()),
        ),
        other => Error::driver("nvrtc", format!("{}: {other}", file.name())),
    })?;
    tracing::debug!(
        file = file.name(),
        ms = started.elapsed().as_millis() as u64,
        "compiled CUDA kernels"
    );
    if let Some(entry) = kept {
        entry.write(&ptx.to_src());
    }
    cache.insert(key, ptx.clone());
    Ok((ptx, None))
}

/// What NVRTC made of one kernel file for one architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledKernel {
    /// The file, e.g. `attention.cu`.
    pub file: &'static str,
    /// The size of its PTX for `compute_XY`, as the backend loads it.
    pub ptx_bytes: usize,
    /// The size of its CUBIN for `sm_XY` (ptxas ran, so registers and shared memory fit that GPU).
    pub cubin_bytes: usize,
    /// Whether the PTX was read from the kernel cache on disk ([`super::set_kernel_cache`]) instead of compiled.
    pub from_disk: bool,
}

/// Compiles every kernel file with NVRTC for compute capability `arch` (e.g. `(9, 0)`), with no GPU: as the
/// backend does at first use (PTX for `compute_XY`), and to machine code for `sm_XY`. Needs only `libnvrtc`
/// (and its builtins library) where the loader finds it; its absence is an [`Error`], never a panic.
pub fn compile_all(arch: (i32, i32)) -> Result<Vec<CompiledKernel>> {
    // SAFETY: this only tries to dlopen the library and reports whether it loaded.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::driver("nvrtc", "libnvrtc cannot be loaded".to_owned()));
    }
    KernelFile::ALL
        .iter()
        .map(|&file| {
            let (ptx, kept) = compile(file, arch)?;
            Ok(CompiledKernel {
                file: file.name(),
                ptx_bytes: ptx.to_src().len(),
                cubin_bytes: cubin(file, arch)?.len(),
                from_disk: kept.is_some(),
            })
        })
        .collect()
}

/// An NVRTC program, destroyed when dropped; holds the strings NVRTC may point into.
struct Program {
    prog: cudarc::nvrtc::sys::nvrtcProgram,
    _src: std::ffi::CString,
    _name: std::ffi::CString,
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `prog` was created by `create_program` and is destroyed only here, once.
        let _ = unsafe { cudarc::nvrtc::result::destroy_program(self.prog) };
    }
}

/// `file` compiled for the real architecture `sm_XY`: its CUBIN.
fn cubin(file: KernelFile, arch: (i32, i32)) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        Error::driver("nvrtc", format!("{} for sm_{}{}: {what}: {e}", file.name(), arch.0, arch.1))
    };
    let src = std::ffi::CString::new(file.program()).map_err(|e| failed("source", &e))?;
    let name = std::ffi::CString::new(file.name()).map_err(|e| failed("name", &e))?;
    let prog = result::create_program(&src, Some(&name)).map_err(|e| failed("create", &e))?;
    let program = Program { prog, _src: src, _name: name };
    // SAFETY: `program.prog` is a live program (destroyed only when `program` drops, after these calls).
    if let Err(e) = unsafe { result::compile_program(program.prog, &compile_options(arch, true)) } {
        // SAFETY: as above; the log exists once compilation has run.
        let log = unsafe { result::get_program_log(program.prog) }
            .map(|raw| {
                String::from_utf8_lossy(&raw.iter().map(|&c| c as u8).collect::<Vec<u8>>())
                    .into_owned()
            })
            .unwrap_or_default();
        return Err(failed("nvrtcCompileProgram", &format!("{e}: {}", log.trim_end_matches('\0'))));
    }
    let mut size = 0usize;
    // SAFETY: as above; `size` is a valid place for the size.
    unsafe { sys::nvrtcGetCUBINSize(program.prog, &mut size) }
        .result()
        .map_err(|e| failed("nvrtcGetCUBINSize", &e))?;
    if size == 0 {
        return Err(failed("nvrtcGetCUBINSize", &"an empty CUBIN"));
    }
    let mut bytes = vec![0u8; size];
    // SAFETY: as above; `bytes` holds the `size` bytes NVRTC writes.
    unsafe { sys::nvrtcGetCUBIN(program.prog, bytes.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| failed("nvrtcGetCUBIN", &e))?;
    Ok(bytes)
}

/// The kernels loaded into one context.
pub(crate) struct Kernels {
    ctx: Arc<CudaContext>,
    arch: (i32, i32),
    max_shared_optin: u32,
    modules: Mutex<HashMap<KernelFile, Arc<CudaModule>>>,
    functions: Mutex<HashMap<&'static str, (CudaFunction, u32)>>,
}

impl Kernels {
    /// Kernels for `ctx`'s device.
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Result<Kernels> {
        let arch = ctx.compute_capability().map_err(|e| drv("cuDeviceGetAttribute", e))?;
        let optin = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(|e| drv("cuDeviceGetAttribute", e))?;
        Ok(Kernels {
            ctx,
            arch,
            max_shared_optin: optin.max(48 * 1024) as u32,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// The device's compute capability (major, minor).
    pub(crate) fn arch(&self) -> (i32, i32) {
        self.arch
    }

    /// The most dynamic shared memory a block may ask for.
    pub(crate) fn max_shared(&self) -> u32 {
        self.max_shared_optin
    }

    fn module(&self, file: KernelFile) -> Result<Arc<CudaModule>> {
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = modules.get(&file) {
            return Ok(m.clone());
        }
        let (ptx, kept) = compile(file, self.arch)?;
        let module = match (self.ctx.load_module(ptx), kept) {
            (Ok(module), _) => module,
            (Err(e), Some(entry)) => {
                // A kept PTX the driver refuses (damaged on disk): dropped here and on disk, and compiled again.
                tracing::warn!(error = %e, file = file.name(), "a kept kernel did not load; compiling it again");
                ptx_cache().lock().unwrap_or_else(|p| p.into_inner()).remove(&(
                    file,
                    self.arch.0,
                    self.arch.1,
                ));
                entry.remove();
                let (ptx, _) = compile(file, self.arch)?;
                self.ctx.load_module(ptx).map_err(|e| drv("cuModuleLoadData", e))?
            }
            (Err(e), None) => return Err(drv("cuModuleLoadData", e)),
        };
        modules.insert(file, module.clone());
        Ok(module)
    }

    /// Kernel `name` of `file`, with the dynamic shared memory limit it has been raised to.
    fn function(&self, file: KernelFile, name: &'static str, shared: u32) -> Result<CudaFunction> {
        let mut functions = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        let entry = match functions.get(name) {
            Some(e) => e.clone(),
            None => {
                let f = self
                    .module(file)?
                    .load_function(name)
                    .map_err(|e| drv("cuModuleGetFunction", e))?;
                functions.insert(name, (f.clone(), 48 * 1024));
                (f, 48 * 1024)
            }
        };
        if shared > entry.1 {
            if shared > self.max_shared_optin {
                return Err(Error::Unsupported(format!(
                    "{name} needs {shared} bytes of shared memory; the device allows {}",
                    self.max_shared_optin
                )));
            }
            entry
                .0
                .set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared as i32,
                )
                .map_err(|e| drv("cuFuncSetAttribute", e))?;
            functions.insert(name, (entry.0.clone(), shared));
        }
        Ok(entry.0)
    }

    /// Queues kernel `name` of `file` on `stream`. A grid with no blocks or threads launches nothing.
    ///
    /// The caller promises that `args` match the kernel's parameters in number, order and type, and that every
    /// address in them stays valid until the kernel has run (buffers are freed stream-ordered after it).
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        file: KernelFile,
        name: &'static str,
        grid: Grid,
        args: &[Arg],
    ) -> Result<()> {
        let (g, b) = (grid.grid, grid.block);
        if g.0 == 0 || g.1 == 0 || g.2 == 0 || b.0 == 0 || b.1 == 0 || b.2 == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(|e| drv("cuCtxSetCurrent", e))?;
        let f = self.function(file, name, grid.shared)?;
        let mut params: Vec<*mut c_void> = args.iter().map(Arg::as_param).collect();
        // SAFETY: `f` is a kernel of a module loaded into this context (kept alive by the function's module
        // handle); each parameter pointer points into `args`, which outlives this call (cuLaunchKernel copies the
        // values before returning); the caller promises the arguments match the kernel's signature and that the
        // addresses stay valid while the kernel runs on `stream`.
        unsafe {
            cudarc::driver::result::launch_kernel(
                f.cu_function(),
                g,
                b,
                grid.shared,
                stream.cu_stream(),
                &mut params,
            )
        }
        .map_err(|e| Error::driver("cuLaunchKernel", format!("{name}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_file_is_embedded_and_names_its_kernels() {
        let files = [
            (KernelFile::Cast, &["cast", "cast_scaled", "cast_f8x4", "fill", "store"][..]),
            (
                KernelFile::Elementwise,
                &["unary", "binary", "affine", "gated", "modulate", "bias_add"],
            ),
            (
                KernelFile::Norm,
                &[
                    "rms_norm",
                    "layer_norm",
                    "rms_norm_rows",
                    "layer_norm_rows",
                    "group_norm",
                    "softmax",
                    "channel_rms_norm",
                ],
            ),
            (KernelFile::Attention, &["attention", "attention_softmax"]),
            (
                KernelFile::AttentionMma,
                &[
                    "attention_mma_64",
                    "attention_mma_128",
                    "attention_mma2_64",
                    "attention_mma2_128",
                ],
            ),
            (KernelFile::Rope, &["rope"]),
            (
                KernelFile::Layout,
                &[
                    "copy_dim",
                    "pad",
                    "permute",
                    "transpose",
                    "upsample2x",
                    "patchify",
                    "unpatchify",
                    "embedding",
                ],
            ),
            (KernelFile::Conv, &["im2col"]),
            (KernelFile::Gemm, &["gemm_fallback"]),
            (
                KernelFile::Quant,
                &["dequant_mxfp8", "dequant_nvfp4", "dequant_int8", "quantize_rows_i8", "gemm_i8"],
            ),
        ];
        for (file, kernels) in files {
            let src = file.source();
            assert!(!src.contains("#include"), "{} includes a header", file.name());
            for k in kernels {
                assert!(
                    src.contains(&format!("__global__ void {k}(")),
                    "{} lacks kernel {k}",
                    file.name()
                );
            }
        }
        assert!(!COMMON.contains("#include"));
    }

    #[test]
    fn dtype_codes_match_common_cu() {
        for (dtype, name) in [
            (DType::F32, "DT_F32"),
            (DType::F16, "DT_F16"),
            (DType::BF16, "DT_BF16"),
            (DType::F8E4M3, "DT_E4M3"),
            (DType::F8E5M2, "DT_E5M2"),
            (DType::I8, "DT_I8"),
            (DType::U8, "DT_U8"),
        ] {
            let line = format!("#define {name} {}", dtype_code(dtype));
            assert!(COMMON.contains(&line), "common.cu lacks `{line}`");
        }
    }

    #[test]
    fn host_constants_match_the_kernels() {
        use crate::backend::UnaryOp;
        use crate::backend::cuda::elementwise::unary_code;
        for (op, name) in [
            (UnaryOp::Silu, "OP_SILU"),
            (UnaryOp::Gelu, "OP_GELU"),
            (UnaryOp::GeluTanh, "OP_GELU_TANH"),
            (UnaryOp::Tanh, "OP_TANH"),
            (UnaryOp::Sigmoid, "OP_SIGMOID"),
            (UnaryOp::Exp, "OP_EXP"),
            (UnaryOp::Neg, "OP_NEG"),
            (UnaryOp::Relu, "OP_RELU"),
            (UnaryOp::NanToNum, "OP_NAN_TO_NUM"),
        ] {
            let line = format!("#define {name} {}", unary_code(op));
            assert!(COMMON.contains(&line), "common.cu lacks `{line}`");
        }
        let lanes = format!("#define CN_LANES {}", crate::backend::cuda::norm::CHANNEL_LANES);
        assert!(KernelFile::Norm.source().contains(&lanes), "norm.cu lacks `{lanes}`");
    }
}
