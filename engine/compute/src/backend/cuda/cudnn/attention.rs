//! Attention on cuDNN's fused flash-attention kernels (what PyTorch's SDPA runs on a Hopper GPU where cuDNN is its
//! choice), built through the library's backend graph API: the scores stay on chip, as in the tensor-core kernel of
//! `attention_mma.cu`, but on kernels NVIDIA tunes for each architecture.
//!
//! cuDNN has no "attention" call before 9.13: its runtime-fusion engine recognises a graph of generic operations
//! and compiles one kernel for it. The graph is the one NVIDIA's cudnn-frontend (v1.x) lowers its `sdpa` node to on
//! every cuDNN 9 release, so that the engine knows it: `S = q·kᵀ` (k described transposed through its strides,
//! never moved), `S·scale`, with a causal mask the four operations that put −∞ above the diagonal, the row
//! softmax as max, subtract, exp, sum, divide (and the log-sum-exp statistics the frontend always builds, left
//! virtual), then `P·v`. Every intermediate is virtual (never written): the scores and the softmax's terms in f32,
//! `P` in the data's 16-bit type (as the engine requires of the second product's input), the mask's indices in
//! int32 and the mask itself boolean.
//!
//! Building a plan (the heuristic's engine configurations, tried in order until one finalizes) compiles a kernel,
//! so plans are kept per problem shape; a shape cuDNN declines is remembered and runs on the GEMM path from then on.
//! Why cuDNN declined (its own last error message) is kept for [`Attention::stats`].

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cudnn::result as dnn;
use cudarc::cudnn::sys;
use cudarc::driver::CudaStream;

use super::Handle;
use super::graph::{Data, Desc, Descriptor, Graph, Kind, Name, Pointwise, Role, check, contiguous};
use crate::backend::cuda::buf::Allocation;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The unique ids of the tensors a call passes (the variant pack); virtual tensors are numbered from
/// [`FIRST_VIRTUAL`].
const Q: i64 = 1;
const K: i64 = 2;
const V: i64 = 3;
const O: i64 = 4;
const SCALE: i64 = 5;
const NEG_INF: i64 = 6;
const FIRST_VIRTUAL: i64 = 100;

/// The largest head cuDNN 9's fused attention takes (features, a multiple of 8).
const MAX_HEAD_DIM: usize = 256;

/// The fewest queries and keys cuDNN is asked for: a plan compiles a kernel for its exact shape (about half a
/// second of NVRTC on the host), which a DiT's joint attention over thousands of tokens repays within a step,
/// and a text encoder's prompt of a few hundred tokens (cheap on the GEMM path, a new length for each prompt)
/// would not.
const MIN_TOKENS: usize = 1024;

/// One fused attention problem: q `[batch, heads, q_tokens, head_dim]`, k and v `[batch, kv_heads, kv_tokens,
/// head_dim]` and the output like q, contiguous, all of one 16-bit `dtype`; with `causal`, query i sees keys 0..=i.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct AttentionShape {
    pub(crate) dtype: DType,
    pub(crate) batch: usize,
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) q_tokens: usize,
    pub(crate) kv_tokens: usize,
    pub(crate) head_dim: usize,
    pub(crate) causal: bool,
}

impl AttentionShape {
    /// Why cuDNN is not asked for this problem, if it is not: what its fused attention does not take.
    fn refusal(&self) -> Option<String> {
        let s = self;
        if s.q_tokens < MIN_TOKENS || s.kv_tokens < MIN_TOKENS {
            return Some(format!("{} queries over {} keys", s.q_tokens, s.kv_tokens));
        }
        if !matches!(s.dtype, DType::F16 | DType::BF16) {
            return Some(format!("attention in {}", s.dtype));
        }
        if !s.head_dim.is_multiple_of(8) || s.head_dim > MAX_HEAD_DIM {
            return Some(format!("heads of {} features", s.head_dim));
        }
        if s.kv_heads == 0 || !s.heads.is_multiple_of(s.kv_heads) {
            return Some(format!("{} query heads over {} key heads", s.heads, s.kv_heads));
        }
        if s.causal && s.q_tokens != s.kv_tokens {
            return Some("a causal mask over a different number of queries and keys".into());
        }
        let [b, h, hk, nq, nk, d] =
            [s.batch, s.heads, s.kv_heads, s.q_tokens, s.kv_tokens, s.head_dim];
        let elements = |dims: [usize; 4]| {
            dims.iter()
                .try_fold(1usize, |n, &v| n.checked_mul(v))
                .filter(|&n| n <= i64::MAX as usize / 4)
        };
        match [[b, h, nq, d], [b, hk, nk, d], [b, h, nq, nk]].map(elements) {
            [Some(_), Some(_), Some(scores)] if scores > 0 => None,
            _ => Some("an empty or too large problem".into()),
        }
    }
}

/// What cuDNN's fused attention has done on a device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CudnnAttentionStats {
    /// Calls it ran.
    pub ran: u64,
    /// Why it last declined a problem (cuDNN's own message where it gave one), if it has.
    pub declined: Option<String>,
}

/// cuDNN's handle on the compute stream, the plan built for each shape (`None`: declined) and the stats.
pub(crate) struct Attention {
    /// Before the handle, so the plans built on it are destroyed first (fields drop in order).
    plans: Mutex<Plans>,
    handle: Mutex<Handle>,
    /// cuDNN's version (`major·10000 + minor·100 + patch`).
    version: usize,
    stats: Mutex<CudnnAttentionStats>,
}

/// The plan of each shape asked for (`None`: cuDNN declined it), and the plans that failed to run, kept until the
/// end (calls of theirs queued before may still be running).
#[derive(Default)]
struct Plans {
    by_shape: HashMap<AttentionShape, Option<Plan>>,
    failed: Vec<Plan>,
}

impl Attention {
    /// cuDNN on `stream`, or `None` when the library is not installed, does not start (the reason is logged) or
    /// is a release whose fused attention NVIDIA's frontend refuses for known bugs (9.10.0 and 9.10.1).
    pub(crate) fn open(stream: &CudaStream) -> Option<Attention> {
        let handle = Handle::open(stream, "attention runs as GEMMs")?;
        let version = dnn::get_version();
        if (91000..91002).contains(&version) {
            tracing::info!(
                version,
                "cuDNN 9.10.0 and 9.10.1 have known attention bugs: attention runs as GEMMs"
            );
            return None;
        }
        Some(Attention {
            plans: Mutex::default(),
            handle: Mutex::new(handle),
            version,
            stats: Mutex::default(),
        })
    }

    /// What it has done so far.
    pub(crate) fn stats(&self) -> CudnnAttentionStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Queues `o = softmax(q·kᵀ·scale [masked])·v` for the tensors at `[q, k, v, o]` (device addresses) on the
    /// handle's stream; `scratch` allocates the plan's workspace. An error means nothing was queued (the caller
    /// runs its own path); a shape cuDNN declined once is not asked again.
    pub(crate) fn forward(
        &self,
        s: &AttentionShape,
        [q, k, v, o]: [u64; 4],
        scale: f32,
        scratch: impl FnOnce(u64) -> Result<Allocation>,
    ) -> Result<()> {
        let declined = |why: String| {
            self.stats.lock().unwrap_or_else(|p| p.into_inner()).declined = Some(why.clone());
            Error::Unsupported(format!("cuDNN attention: {why}"))
        };
        // What cuDNN does not take is not asked of it (and not recorded: the stats keep cuDNN's own refusals).
        if let Some(why) = s.refusal() {
            return Err(Error::Unsupported(format!("cuDNN attention: {why}")));
        }
        if [q, k, v, o].iter().any(|p| p % 16 != 0) {
            return Err(Error::Unsupported("cuDNN attention: tensors not 16-byte aligned".into()));
        }
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        if !plans.by_shape.contains_key(s) {
            match Plan::build(&handle, s, self.version) {
                Ok(plan) => {
                    plans.by_shape.insert(*s, Some(plan));
                }
                Err(e) => {
                    tracing::info!(error = %e, shape = ?s, "cuDNN declined attention: it runs as GEMMs");
                    plans.by_shape.insert(*s, None);
                    return Err(declined(e.to_string()));
                }
            }
        }
        let Some(Some(plan)) = plans.by_shape.get(s) else {
            return Err(Error::Unsupported(format!("cuDNN attention declined {s:?} before")));
        };
        // The workspace first: running out of memory is not cuDNN declining the shape.
        let workspace =
            if plan.workspace > 0 { Some(scratch(plan.workspace as u64)?) } else { None };
        let neg_inf = if self.version >= 91000 { f32::NEG_INFINITY } else { f32::MIN };
        match plan.execute(&handle, [q, k, v, o], scale, neg_inf, workspace.as_ref()) {
            Ok(()) => {
                self.stats.lock().unwrap_or_else(|p| p.into_inner()).ran += 1;
                Ok(())
            }
            Err(e) => {
                // Not again for this shape; the plan itself lives on (earlier calls may be queued).
                if let Some(Some(plan)) = plans.by_shape.insert(*s, None) {
                    plans.failed.push(plan);
                }
                tracing::warn!(error = %e, shape = ?s, "cuDNN attention failed: it runs as GEMMs");
                Err(declined(e.to_string()))
            }
        }
    }
}

/// A finalized execution plan for one shape, with every descriptor it was built from.
struct Plan {
    plan: Descriptor,
    workspace: usize,
    causal: bool,
    /// The descriptors the plan was built from, destroyed after it (fields drop in order).
    _graph: Vec<Descriptor>,
}

impl Plan {
    /// The graph of the module docs for `s`, and the first of the heuristic's engine configurations that
    /// finalizes as a plan.
    fn build(handle: &Handle, s: &AttentionShape, version: usize) -> Result<Plan> {
        let mut g = Plan::graph(s)?;
        let graph = g.operation_graph(Some(handle))?;
        let configs = g.configs(graph, None)?;
        let mut last = Error::Unsupported(format!(
            "cuDNN {version} has no engine for this attention graph (the heuristic returned none)"
        ));
        for config in configs {
            let plan = Descriptor::new(Desc::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
            let built = plan
                .set_descriptors(Name::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[config])
                .and_then(|()| plan.set_handle(Name::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle))
                .and_then(|()| plan.finalize());
            match built {
                Ok(()) => {
                    let workspace = Plan::workspace(&plan)?;
                    return Ok(Plan { plan, workspace, causal: s.causal, _graph: g.keep });
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The workspace bytes a finalized plan needs.
    fn workspace(plan: &Descriptor) -> Result<usize> {
        let (mut workspace, mut n) = (0i64, 0i64);
        // SAFETY: one int64 is written into `workspace`, its count into `n`.
        check("cudnnBackendGetAttribute", unsafe {
            sys::cudnnBackendGetAttribute(
                plan.0,
                Name::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                Kind::CUDNN_TYPE_INT64,
                1,
                &mut n,
                (&mut workspace as *mut i64).cast::<c_void>(),
            )
        })?;
        usize::try_from(workspace)
            .map_err(|_| Error::Unsupported(format!("a cuDNN plan of {workspace} workspace bytes")))
    }

    /// The operations of the module docs' graph for `s`, each finalized (which needs no device).
    fn graph(s: &AttentionShape) -> Result<Graph> {
        let io =
            if s.dtype == DType::F16 { Data::CUDNN_DATA_HALF } else { Data::CUDNN_DATA_BFLOAT16 };
        let [b, h, hk, nq, nk, d] =
            [s.batch, s.heads, s.kv_heads, s.q_tokens, s.kv_tokens, s.head_dim];
        let mut g = Graph::new(FIRST_VIRTUAL);
        let q = g.tensor(io, [b, h, nq, d], contiguous([b, h, nq, d]), Role::Passed, Q)?;
        // k `[b, hk, nk, d]` described as kᵀ `[b, hk, d, nk]`: the last two dimensions and strides swapped.
        let kt = g.tensor(io, [b, hk, d, nk], [hk * nk * d, nk * d, 1, d], Role::Passed, K)?;
        let v = g.tensor(io, [b, hk, nk, d], contiguous([b, hk, nk, d]), Role::Passed, V)?;
        let o = g.tensor(io, [b, h, nq, d], contiguous([b, h, nq, d]), Role::Passed, O)?;
        let one = [1; 4];
        let scale = g.tensor(Data::CUDNN_DATA_FLOAT, one, one, Role::ByValue, SCALE)?;
        let scores = [b, h, nq, nk];
        let rows = [b, h, nq, 1];

        let s0 = g.virtual_f32(scores)?;
        g.matmul(q, kt, s0)?;
        let s1 = g.virtual_f32(scores)?;
        g.binary(Pointwise::CUDNN_POINTWISE_MUL, s0, scale, s1)?;
        let masked = if s.causal {
            let index = |g: &mut Graph| {
                g.tensor(Data::CUDNN_DATA_INT32, scores, contiguous(scores), Role::Virtual, 0)
            };
            let (row, col) = (index(&mut g)?, index(&mut g)?);
            let float = Data::CUDNN_DATA_FLOAT;
            g.pointwise(Pointwise::CUDNN_POINTWISE_GEN_INDEX, float, Some(2), s1, None, None, row)?;
            g.pointwise(Pointwise::CUDNN_POINTWISE_GEN_INDEX, float, Some(3), s1, None, None, col)?;
            let keep =
                g.tensor(Data::CUDNN_DATA_BOOLEAN, scores, contiguous(scores), Role::Virtual, 0)?;
            let boolean = Data::CUDNN_DATA_BOOLEAN;
            g.pointwise(
                Pointwise::CUDNN_POINTWISE_CMP_GE,
                boolean,
                None,
                row,
                Some(col),
                None,
                keep,
            )?;
            let neg_inf = g.tensor(Data::CUDNN_DATA_FLOAT, one, one, Role::ByValue, NEG_INF)?;
            let s2 = g.virtual_f32(scores)?;
            let select = Pointwise::CUDNN_POINTWISE_BINARY_SELECT;
            g.pointwise(select, float, None, s1, Some(neg_inf), Some(keep), s2)?;
            s2
        } else {
            s1
        };
        use sys::cudnnReduceTensorOp_t as Reduce;
        let max = g.virtual_f32(rows)?;
        g.reduction(Reduce::CUDNN_REDUCE_TENSOR_MAX, masked, max)?;
        let shifted = g.virtual_f32(scores)?;
        g.binary(Pointwise::CUDNN_POINTWISE_SUB, masked, max, shifted)?;
        let exp = g.virtual_f32(scores)?;
        g.unary(Pointwise::CUDNN_POINTWISE_EXP, shifted, exp)?;
        let sum = g.virtual_f32(rows)?;
        g.reduction(Reduce::CUDNN_REDUCE_TENSOR_ADD, exp, sum)?;
        // The log-sum-exp statistics: unused here, but part of the pattern the engine recognises.
        let log = g.virtual_f32(rows)?;
        g.unary(Pointwise::CUDNN_POINTWISE_LOG, sum, log)?;
        let stats = g.virtual_f32(rows)?;
        g.binary(Pointwise::CUDNN_POINTWISE_ADD, max, log, stats)?;
        let p = g.tensor(io, scores, contiguous(scores), Role::Virtual, 0)?;
        g.binary(Pointwise::CUDNN_POINTWISE_DIV, exp, sum, p)?;
        g.matmul(p, v, o)?;
        Ok(g)
    }

    /// The variant pack of one call: the device tensors at `[q, k, v, o]`, the host scalars `scale` and (with a
    /// causal mask) `neg_inf` by address (they must live until the call is queued), and the workspace.
    fn variant_pack(
        causal: bool,
        [q, k, v, o]: [u64; 4],
        scale: &f32,
        neg_inf: &f32,
        workspace: *mut c_void,
    ) -> Result<Descriptor> {
        let host = |x: &f32| (x as *const f32).cast_mut().cast::<c_void>();
        let mut uids = vec![Q, K, V, O, SCALE];
        let mut pointers: Vec<*mut c_void> = vec![
            q as *mut c_void,
            k as *mut c_void,
            v as *mut c_void,
            o as *mut c_void,
            host(scale),
        ];
        if causal {
            uids.push(NEG_INF);
            pointers.push(host(neg_inf));
        }
        let pack = Descriptor::new(Desc::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
        pack.set(Name::CUDNN_ATTR_VARIANT_PACK_WORKSPACE, Kind::CUDNN_TYPE_VOID_PTR, &[workspace])?;
        pack.set(
            Name::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            Kind::CUDNN_TYPE_VOID_PTR,
            &pointers,
        )?;
        pack.set_i64s(Name::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, &uids)?;
        pack.finalize()?;
        Ok(pack)
    }

    /// Queues the plan on the handle's stream for the tensors at `[q, k, v, o]`, with `workspace` (at least
    /// the plan's `workspace` bytes) where it needs one.
    fn execute(
        &self,
        handle: &Handle,
        [q, k, v, o]: [u64; 4],
        scale: f32,
        neg_inf: f32,
        workspace: Option<&Allocation>,
    ) -> Result<()> {
        let ws: *mut c_void = workspace.map_or(std::ptr::null_mut(), |a| a.ptr().0 as *mut c_void);
        let pack = Plan::variant_pack(self.causal, [q, k, v, o], &scale, &neg_inf, ws)?;
        // SAFETY: the plan was finalized on this handle; the variant pack names every tensor the graph passes: the
        // device buffers (which the caller keeps alive until the stream has run the call; they and the workspace
        // are freed stream-ordered) and the host scalars, which live until this call returns (cuDNN reads
        // by-value tensors when it launches).
        check("cudnnBackendExecute", unsafe {
            sys::cudnnBackendExecute(handle.0, self.plan.0, pack.0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{AttentionShape, Data, Desc, Descriptor, Kind, Name, Plan};
    use crate::dtype::DType;

    fn shape(
        dtype: DType,
        heads: (usize, usize),
        n: (usize, usize),
        d: usize,
        causal: bool,
    ) -> AttentionShape {
        AttentionShape {
            dtype,
            batch: 2,
            heads: heads.0,
            kv_heads: heads.1,
            q_tokens: n.0,
            kv_tokens: n.1,
            head_dim: d,
            causal,
        }
    }

    /// Whether cuDNN (with the sublibraries a graph needs: its runtime-compiled engines link libcuda) and NVRTC
    /// (which compiles them) are there.
    fn cudnn_loads() -> Result<(), String> {
        // SAFETY: these only try to dlopen the libraries and report whether they loaded.
        if !unsafe { cudarc::cudnn::sys::is_culib_present() } {
            return Err("libcudnn is not on the library path".into());
        }
        // SAFETY: as above.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err("libnvrtc is not on the library path".into());
        }
        match Descriptor::new(Desc::CUDNN_BACKEND_TENSOR_DESCRIPTOR).and_then(|t| {
            t.set_data(Name::CUDNN_ATTR_TENSOR_DATA_TYPE, Data::CUDNN_DATA_FLOAT)?;
            t.finalize()
        }) {
            Err(e) if e.to_string().contains("SUBLIBRARY") => {
                Err(format!("cuDNN's sublibraries: {e}"))
            }
            _ => Ok(()),
        }
    }

    /// cuDNN recognises the graph: every tensor and operation finalizes (what cuDNN checks of each attribute and
    /// of the operations' shapes), and from cuDNN 9.8, which compiles for a device it is only told about (with no
    /// handle and no GPU), the heuristic offers engine configurations for an H200 and each compiles its kernel as
    /// a plan (finalizing ends at loading the kernel where there is no GPU). Skipped where libcudnn (with
    /// libcublasLt and NVRTC) is not on the library path: the test command does not install it (a gigabyte of
    /// wheels); the device run's op test builds and runs the same plans on a GPU. `h200.json` describes an H200
    /// in cuDNN's `CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION` (the keys cuDNN 9.19 asks for, the values from
    /// NVIDIA's H200 specifications and the device run's nvidia-smi: 132 SMs, 227 KiB of shared memory a block at
    /// most, 50 MiB of L2, 143 771 MiB of memory, sm_90).
    /// A graph with `P` in f32 instead of the data's type gets no configuration.
    #[test]
    fn cudnn_recognises_the_attention_graph_and_compiles_it_for_an_h200() {
        if let Err(why) = cudnn_loads() {
            eprintln!("skipped: {why}");
            return;
        }
        let version = cudarc::cudnn::result::get_version();
        // Qwen-Image's joint attention at 1328², Wan 2.2 5B's self-attention at 1280×704×33 (in f16, as Wan
        // computes), Z-Image's at 1024² (30 heads), and a causal grouped-query problem.
        for s in [
            shape(DType::BF16, (24, 24), (6903, 6903), 128, false),
            shape(DType::F16, (24, 24), (7920, 7920), 128, false),
            shape(DType::BF16, (30, 30), (4128, 4128), 128, false),
            shape(DType::F16, (8, 2), (1100, 1100), 64, true),
        ] {
            let mut g = Plan::graph(&s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
            assert_eq!(g.ops.len(), if s.causal { 14 } else { 10 });
            if version < 90800 {
                continue;
            }
            let graph = (g.operation_graph(None))
                .unwrap_or_else(|e| panic!("{s:?}: the operation graph: {e}"));
            let device = Descriptor::new(Desc::CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR).unwrap();
            let json = include_str!("h200.json").trim().as_bytes();
            device
                .set(Name::CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, Kind::CUDNN_TYPE_CHAR, json)
                .unwrap();
            device.finalize().unwrap_or_else(|e| panic!("the H200's description: {e}"));
            let configs = g.configs(graph, Some(&device)).unwrap();
            assert!(!configs.is_empty(), "{s:?}: cuDNN {version} offers no engine for the graph");
            let mut compiled = 0;
            for config in configs {
                let plan = Descriptor::new(Desc::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR).unwrap();
                plan.set_descriptors(Name::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[config])
                    .unwrap();
                plan.set_descriptors(Name::CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, &[device.0])
                    .unwrap();
                match plan.finalize() {
                    Ok(()) => compiled += 1,
                    // Compiled; loading the kernel needs a GPU.
                    Err(e) if e.to_string().contains("EXECUTION_FAILED_CUDA_DRIVER") => {
                        compiled += 1
                    }
                    Err(e) => eprintln!("{s:?}: a configuration did not compile: {e}"),
                }
            }
            assert!(compiled > 0, "{s:?}: no configuration compiled");
            // The call's variant pack (addresses 256-byte aligned, as allocations are).
            let (scale, neg_inf) = (0.125f32, f32::NEG_INFINITY);
            let tensors = [1u64 << 20, 2 << 20, 3 << 20, 4 << 20];
            Plan::variant_pack(s.causal, tensors, &scale, &neg_inf, std::ptr::null_mut())
                .unwrap_or_else(|e| panic!("{s:?}: the variant pack: {e}"));
        }
    }

    #[test]
    fn only_what_cudnns_fused_attention_takes_is_asked_of_it() {
        let ok = [
            shape(DType::BF16, (24, 24), (6903, 6903), 128, false),
            shape(DType::F16, (8, 2), (1100, 1100), 64, true),
            shape(DType::BF16, (4, 4), (1024, 4096), 256, false),
        ];
        for s in ok {
            assert_eq!(s.refusal(), None, "{s:?}");
        }
        let refused = [
            (shape(DType::BF16, (4, 4), (1023, 4096), 64, false), "1023 queries over 4096 keys"),
            (shape(DType::BF16, (4, 4), (4096, 512), 64, false), "4096 queries over 512 keys"),
            (shape(DType::F32, (4, 4), (1024, 1024), 64, false), "attention in F32"),
            (shape(DType::BF16, (4, 4), (1024, 1024), 84, false), "heads of 84 features"),
            (shape(DType::BF16, (4, 4), (1024, 1024), 384, false), "heads of 384 features"),
            (shape(DType::BF16, (6, 4), (1024, 1024), 64, false), "6 query heads over 4 key heads"),
            (
                shape(DType::BF16, (4, 4), (1024, 2048), 64, true),
                "a causal mask over a different number of queries and keys",
            ),
            (
                shape(DType::BF16, (4, 4), (1 << 40, 1 << 40), 64, false),
                "an empty or too large problem",
            ),
        ];
        for (s, why) in refused {
            assert_eq!(s.refusal().as_deref(), Some(why), "{s:?}");
        }
    }
}
