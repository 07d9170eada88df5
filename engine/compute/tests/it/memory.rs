//! The memory manager end to end on the CPU backend: real safetensors files in a temp dir, loaded by a
//! [`MemoryManager`] over the CPU backend's simulated device, read back layer by layer through
//! [`Model::fetch`], with the device's counters showing which copies happened and from what memory.
//!
//! The simulated device uses 2 MiB VBAR pages and 2 MiB scratch chunks so that small models span several
//! pages; the budget's driver headroom is 0 because the simulated device holds nothing else.

use crate::common::values;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kiln_compute::backend::cpu::Cpu;
use kiln_compute::dtype::{self, round_to};
use kiln_compute::memory::lora::{Adapter, Patch, PatchSet, PatchTensor};
use kiln_compute::memory::pins::PinConfig;
use kiln_compute::memory::vram::{VbarId, VramConfig};
use kiln_compute::memory::{
    DevPtr, HostBufferConfig, LoadOptions, LoadPlan, ManagerConfig, MemoryManager, Model, SlotPlan,
};
use kiln_compute::{Backend, DType, Error, OwnedWeight, Weight};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// A directory under the temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("kiln-mm-{}-{n}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the temp dir");
        TempDir(dir)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tensor written to a file: its stored bytes and the values they hold.
#[derive(Clone)]
struct FileTensor {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    bytes: Vec<u8>,
    values: Vec<f32>,
}

fn tensor(name: &str, dtype: DType, shape: &[usize], seed: u64) -> FileTensor {
    let bytes = dtype::narrow(dtype, &values(shape.iter().product(), seed));
    let values = dtype::widen(dtype, &bytes);
    FileTensor { name: name.to_owned(), dtype, shape: shape.to_vec(), bytes, values }
}

fn st_dtype(d: DType) -> safetensors::Dtype {
    match d {
        DType::F32 => safetensors::Dtype::F32,
        DType::F16 => safetensors::Dtype::F16,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::F8E4M3 => safetensors::Dtype::F8_E4M3,
        DType::F8E5M2 => safetensors::Dtype::F8_E5M2,
        DType::I8 => safetensors::Dtype::I8,
        DType::U8 => safetensors::Dtype::U8,
    }
}

/// Writes `tensors` as a safetensors file with the safetensors crate.
fn write_file(path: &Path, tensors: &[FileTensor]) {
    let views: Vec<(&str, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            let view =
                safetensors::tensor::TensorView::new(st_dtype(t.dtype), t.shape.clone(), &t.bytes)
                    .expect("a tensor view");
            (t.name.as_str(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).expect("write the safetensors file");
}

/// Pinning on with room to spare (`high_ram`: the host's free RAM does not decide what the tests see).
fn pins_on() -> PinConfig {
    PinConfig { cap: 1 << 30, ram_cache_headroom: 0, high_ram: true }
}

/// The manager's settings for the simulated device: 2 MiB pages and scratch chunks, the given headroom.
fn config(headroom: u64, pins: PinConfig) -> ManagerConfig {
    ManagerConfig {
        vram: VramConfig {
            headroom,
            driver_headroom: 0,
            page_size: 2 * MIB,
            scratch_chunk: 2 * MIB,
            scratch_va: 64 * MIB,
            ..VramConfig::default()
        },
        force_cast_max: 16 * KIB,
        small_first: 64 * KIB,
        offload_streams: 2,
        pins,
        host: HostBufferConfig { prewarm: 2 << 20, register_chunk: 1 << 30 },
        load: LoadOptions { mark_cold: false },
    }
}

fn manager(cpu: &Cpu, headroom: u64, pins: PinConfig) -> Arc<MemoryManager> {
    MemoryManager::new(cpu.memory().clone(), config(headroom, pins)).expect("a memory manager")
}

/// The only VBAR on the device (one model loaded).
fn the_vbar(manager: &MemoryManager) -> VbarId {
    let order = manager.arbiter().priority_order();
    assert_eq!(order.len(), 1, "one model, one VBAR");
    order[0]
}

/// Whether `ptr` lies in the model's VBAR (resident) rather than in a scratch buffer or a plain allocation.
fn in_vbar(manager: &MemoryManager, ptr: DevPtr) -> bool {
    let arbiter = manager.arbiter();
    let id = the_vbar(manager);
    let base = arbiter.base(id).expect("vbar base");
    let len = arbiter.page_count(id).expect("page count") as u64 * arbiter.page_size();
    (base.0..base.0 + len).contains(&ptr.0)
}

/// The device bytes of a fetched weight.
fn device_bytes(cpu: &Cpu, w: &Weight<'_>) -> Vec<u8> {
    let mut out = vec![0u8; w.bytes() as usize];
    cpu.sim().read(w.ptr(), &mut out).expect("read the weight back");
    out
}

fn h2d_copies(cpu: &Cpu) -> u64 {
    cpu.sim().counters().h2d_copies
}

/// `count` layers of a 1 MiB bf16 weight `blk.NN.w` [512, 1024] and a 1 KiB bf16 bias `blk.NN.b`.
fn layered_model(count: usize) -> Vec<FileTensor> {
    let mut out = Vec::new();
    for i in 0..count {
        out.push(tensor(&format!("blk.{i:02}.w"), DType::BF16, &[512, 1024], 100 + i as u64));
        out.push(tensor(&format!("blk.{i:02}.b"), DType::BF16, &[512], 200 + i as u64));
    }
    out
}

fn find<'a>(tensors: &'a [FileTensor], name: &str) -> &'a FileTensor {
    tensors.iter().find(|t| t.name == name).expect("a tensor of the test model")
}

#[test]
fn a_loaded_file_fetches_its_exact_bytes_and_computes() {
    let dir = TempDir::new("exact");
    // `l0.empty` starts where `l0.w` does (the file lays out bf16 tensors by name).
    let tensors = vec![
        tensor("l0.empty", DType::BF16, &[0], 8),
        tensor("l0.w", DType::BF16, &[256, 512], 1),
        tensor("l0.b", DType::F32, &[256], 2),
        tensor("l1.w", DType::BF16, &[256, 512], 3),
        tensor("l1.b", DType::F32, &[256], 4),
        tensor("l1.gate", DType::F16, &[64, 300], 5),
        tensor("norm", DType::F32, &[512], 6),
    ];
    let path = dir.file("model.safetensors");
    write_file(&path, &tensors);
    let cpu = Cpu::simulating_gpu(256 * MIB);
    let manager = manager(&cpu, 0, pins_on());

    let mut progress = Vec::new();
    let plan = LoadPlan::whole_file(&path).expect("plan");
    assert_eq!(plan.slots.len(), tensors.len());
    let model = manager.load(&plan, &mut |done, total| progress.push((done, total))).expect("load");

    // Progress: monotone, one total, ending at it; the total is every byte read into pins, i.e. the
    // weights above the force-cast size (the tiny ones are read on their own at load).
    let pinned: u64 = tensors
        .iter()
        .filter(|t| t.bytes.len() as u64 > 16 * KIB)
        .map(|t| t.bytes.len() as u64)
        .sum();
    assert!(!progress.is_empty(), "a load reports progress");
    assert!(progress.windows(2).all(|w| w[0].0 <= w[1].0), "monotone: {progress:?}");
    assert!(progress.iter().all(|&(d, t)| t == pinned && d <= t), "{progress:?}");
    assert_eq!(progress.last().copied(), Some((pinned, pinned)));
    assert_eq!(model.load_stats().bytes, pinned);

    for (name, t) in model.names().zip(&plan.slots) {
        assert_eq!(name, t.name);
    }
    let (dtype, shape) = model.info("l1.gate").expect("info");
    assert_eq!((dtype, shape), (DType::F16, &[64usize, 300][..]));

    for layer in [&["l0.w", "l0.b"][..], &["l1.w", "l1.b", "l1.gate"], &["norm", "l0.empty"]] {
        let fetched = model.fetch(&cpu, layer).expect("fetch");
        assert_eq!(fetched.len(), layer.len());
        for (i, name) in layer.iter().enumerate() {
            let w = fetched.weight(i);
            let t = find(&tensors, name);
            assert_eq!((w.dtype(), w.shape()), (t.dtype, t.shape.as_slice()), "{name}");
            assert!(
                device_bytes(&cpu, &w) == t.bytes,
                "{name}: device bytes differ from the file's"
            );
        }
    }

    // A linear layer with the fetched bf16 weight and f32 bias against the file's values.
    let (n, k, m) = (256, 512, 3);
    let x = values(m * k, 7);
    let layer = model.fetch(&cpu, &["l1.w", "l1.b"]).expect("fetch");
    let xt = cpu.from_f32(&[m, k], &x, DType::F32).expect("x");
    let y = cpu
        .linear(&xt, &layer.get("l1.w").expect("w"), Some(&layer.get("l1.b").expect("b")))
        .expect("linear");
    let y = cpu.to_f32(&y).expect("y");
    let (w, b) = (&find(&tensors, "l1.w").values, &find(&tensors, "l1.b").values);
    for i in 0..m {
        for j in 0..n {
            let want =
                (0..k).map(|p| f64::from(x[i * k + p]) * f64::from(w[j * k + p])).sum::<f64>()
                    + f64::from(b[j]);
            let got = f64::from(y[i * n + j]);
            assert!(
                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "y[{i},{j}] = {got}, want {want}"
            );
        }
    }
    assert!(layer.get("l0.w").is_err(), "a weight not fetched with the layer");
    drop(layer);
    assert!(model.fetch(&cpu, &["nope"]).is_err(), "an unknown weight is an error");
}

#[test]
fn a_budget_smaller_than_the_model_keeps_a_prefix_resident_and_streams_the_rest() {
    let dir = TempDir::new("budget");
    let tensors = layered_model(16);
    let path = dir.file("model.safetensors");
    write_file(&path, &tensors);
    // 16 MiB of weights; the budget holds 12 MiB: the scratch buffers of both lanes and about half the
    // weights.
    let capacity = 64 * MIB;
    let headroom = 52 * MIB;
    let budget = capacity - headroom;
    let cpu = Cpu::simulating_gpu(capacity);
    let manager = manager(&cpu, headroom, pins_on());
    let model =
        manager.load(&LoadPlan::whole_file(&path).expect("plan"), &mut |_, _| {}).expect("load");

    let names: Vec<(String, String)> =
        (0..16).map(|i| (format!("blk.{i:02}.w"), format!("blk.{i:02}.b"))).collect();
    // Pass 1: every weight's bytes are right, wherever it lands.
    for (w, b) in &names {
        let layer = model.fetch(&cpu, &[w, b]).expect("fetch");
        for name in [w, b] {
            let got = device_bytes(&cpu, &layer.get(name).expect("weight"));
            assert!(got == find(&tensors, name).bytes, "{name}: wrong bytes on the first pass");
        }
        assert!(manager.arbiter().usage() <= budget, "usage within the budget");
    }
    // Passes 2 and 3: resident weights are used in place, offloaded ones copied once each.
    let mut resident_sets = Vec::new();
    for pass in 2..=3 {
        let mut resident = Vec::new();
        for (i, (w, b)) in names.iter().enumerate() {
            let before = h2d_copies(&cpu);
            let layer = model.fetch(&cpu, &[w, b]).expect("fetch");
            let weight = layer.get(w).expect("weight");
            let copies = h2d_copies(&cpu) - before;
            let here = in_vbar(&manager, weight.ptr());
            assert_eq!(copies, u64::from(!here), "pass {pass}, {w}: resident = {here}");
            assert!(device_bytes(&cpu, &weight) == find(&tensors, w).bytes, "pass {pass}, {w}");
            if here {
                resident.push(i);
            }
        }
        resident_sets.push(resident);
    }
    let resident = &resident_sets[0];
    assert_eq!(resident, &resident_sets[1], "residency is stable from one pass to the next");
    assert!(
        !resident.is_empty() && resident.len() < 16,
        "some resident, some offloaded: {resident:?}"
    );
    // Equal sizes are laid out in plan order and lower addresses rank higher: a prefix stays.
    assert_eq!(resident, &(0..resident.len()).collect::<Vec<_>>());
    assert!(resident.len() >= 4, "about half the weights fit: {resident:?}");
    assert!(model.resident_bytes() <= budget);
    assert_eq!(model.resident_bytes(), manager.stats().resident_weights);
    assert!(model.resident_bytes() >= resident.len() as u64 * MIB);
    assert!(manager.arbiter().usage() <= budget);
}

#[test]
fn tiny_weights_are_plain_tensors() {
    let dir = TempDir::new("tiny");
    let tensors = vec![
        tensor("at.limit", DType::BF16, &[8192], 1), // exactly 16 KiB: plain
        tensor("small", DType::F32, &[3, 5], 2),     // plain
        tensor("over.limit", DType::BF16, &[8193], 3), // 16 KiB + 2: a VBAR slot
    ];
    let path = dir.file("model.safetensors");
    write_file(&path, &tensors);
    let cpu = Cpu::simulating_gpu(64 * MIB);
    let manager = manager(&cpu, 0, pins_on());
    let model =
        manager.load(&LoadPlan::whole_file(&path).expect("plan"), &mut |_, _| {}).expect("load");

    // The plain ones are on the device already, counted by the budget (the small one as 1 KiB, as any
    // allocation) but not as VBAR residency; only the big one is pinned.
    assert_eq!(cpu.sim().used(), 16 * KIB + 256);
    assert_eq!(manager.arbiter().usage(), 16 * KIB + KIB);
    assert_eq!(model.resident_bytes(), 0);
    assert_eq!(manager.stats().host_bytes, 8193 * 2);

    let counters = cpu.sim().counters();
    let layer = model.fetch(&cpu, &["at.limit", "small"]).expect("fetch");
    for (i, name) in ["at.limit", "small"].iter().enumerate() {
        let w = layer.weight(i);
        assert!(!in_vbar(&manager, w.ptr()), "{name} is a plain tensor");
        assert!(device_bytes(&cpu, &w) == find(&tensors, name).bytes, "{name}");
    }
    drop(layer);
    let after = cpu.sim().counters();
    assert_eq!(after.h2d_copies, counters.h2d_copies, "plain tensors need no copy");
    assert_eq!(after.pageable_copies, counters.pageable_copies);
    assert_eq!(model.resident_bytes(), 0, "no VBAR residency counted for plain tensors");

    let layer = model.fetch(&cpu, &["over.limit"]).expect("fetch");
    assert!(in_vbar(&manager, layer.weight(0).ptr()));
    assert!(device_bytes(&cpu, &layer.weight(0)) == find(&tensors, "over.limit").bytes);
    assert_eq!(model.resident_bytes(), 2 * MIB, "one page");
}

#[test]
fn fused_slots_join_parts_in_plan_order_and_bad_plans_name_the_file() {
    let dir = TempDir::new("fused");
    // File order (by name) is to_k, to_q; the plan asks for q, k, v with v in a second file.
    let a = vec![
        tensor("to_q", DType::BF16, &[64, 128], 1),
        tensor("to_k", DType::BF16, &[32, 128], 2),
        tensor("wide", DType::BF16, &[32, 100], 3),
        tensor("as_f32", DType::F32, &[32, 128], 4),
    ];
    let b = vec![
        tensor("to_v", DType::BF16, &[32, 128], 5),
        tensor("proj", DType::BF16, &[128, 128], 6),
    ];
    let (pa, pb) = (dir.file("a.safetensors"), dir.file("b.safetensors"));
    write_file(&pa, &a);
    write_file(&pb, &b);
    let slot = |name: &str, parts: &[(usize, &str)]| {
        SlotPlan::new(name, parts.iter().map(|&(f, t)| (f, t.to_owned())).collect())
    };
    let plan = LoadPlan {
        files: vec![pa.clone(), pb.clone()],
        slots: vec![
            slot("qkv", &[(0, "to_q"), (0, "to_k"), (1, "to_v")]),
            slot("proj", &[(1, "proj")]),
        ],
    };
    let cpu = Cpu::simulating_gpu(64 * MIB);
    let manager = manager(&cpu, 0, pins_on());
    let mut last = (0, 0);
    let model = manager
        .load(&plan, &mut |done, total| {
            assert!(done >= last.0, "monotone across files");
            last = (done, total);
        })
        .expect("load");
    let total = (128 * 128 * 2 * 2) as u64;
    assert_eq!(last, (total, total), "progress ends at the bytes of both files");
    assert_eq!(
        model.info("qkv").map(|(d, s)| (d, s.to_vec())),
        Some((DType::BF16, vec![128, 128]))
    );
    let layer = model.fetch(&cpu, &["qkv", "proj"]).expect("fetch");
    let qkv = device_bytes(&cpu, &layer.get("qkv").expect("qkv"));
    let want: Vec<u8> = [find(&a, "to_q"), find(&a, "to_k"), find(&b, "to_v")]
        .iter()
        .flat_map(|t| t.bytes.iter().copied())
        .collect();
    assert!(qkv == want, "rows are q, then k, then v");
    let v = layer.get("qkv").expect("qkv").rows(96, 32).expect("v rows");
    assert!(device_bytes(&cpu, &v) == find(&b, "to_v").bytes);
    assert!(device_bytes(&cpu, &layer.get("proj").expect("proj")) == find(&b, "proj").bytes);
    drop(layer);

    let file_error = |plan: &LoadPlan, path: &Path, what: &str| {
        let err = manager.load(plan, &mut |_, _| {}).expect_err("a bad plan");
        match &err {
            Error::File { path: p, msg } => {
                assert_eq!(p, path, "{err}");
                assert!(msg.contains(what), "{err}");
            }
            other => panic!("not a file error: {other}"),
        }
        assert!(err.to_string().contains(&path.display().to_string()), "{err}");
    };
    let with = |slots: Vec<SlotPlan>| LoadPlan { files: vec![pa.clone(), pb.clone()], slots };
    file_error(&with(vec![slot("x", &[(0, "to_q"), (0, "wide")])]), &pa, "wide");
    file_error(&with(vec![slot("x", &[(0, "to_q"), (0, "as_f32")])]), &pa, "as_f32");
    file_error(&with(vec![slot("x", &[(0, "to_q"), (1, "missing")])]), &pb, "missing");
    assert!(manager.load(&with(vec![slot("x", &[(2, "to_q")])]), &mut |_, _| {}).is_err());
    let twice = manager
        .load(&with(vec![slot("x", &[(0, "to_q")]), slot("x", &[(0, "to_k")])]), &mut |_, _| {})
        .expect_err("a name used twice");
    assert!(twice.to_string().contains("x twice"), "{twice}");

    // A truncated file is refused at load, naming it.
    let truncated = dir.file("cut.safetensors");
    std::fs::copy(&pb, &truncated).expect("copy");
    let len = std::fs::metadata(&truncated).expect("metadata").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&truncated)
        .and_then(|f| f.set_len(len - 100))
        .expect("truncate");
    let err = LoadPlan::whole_file(&truncated)
        .and_then(|plan| manager.load(&plan, &mut |_, _| {}))
        .expect_err("a truncated file");
    assert!(err.to_string().contains(&truncated.display().to_string()), "{err}");
    let plan =
        LoadPlan { files: vec![truncated.clone()], slots: vec![slot("proj", &[(0, "proj")])] };
    let err = manager.load(&plan, &mut |_, _| {}).expect_err("a truncated file");
    assert!(err.to_string().contains(&truncated.display().to_string()), "{err}");
    // The failed loads left nothing behind: the one model's VBAR only.
    assert_eq!(manager.arbiter().priority_order().len(), 1);
    assert_eq!(manager.stats().models, 1);
}

/// A LoRA patch of `rank` on a `[rows, cols]` weight, and the ΔW it adds.
fn lora(rows: usize, cols: usize, rank: usize, strength: f32, seed: u64) -> (PatchSet, Vec<f32>) {
    let (up, down) = (values(rows * rank, seed), values(rank * cols, seed + 1));
    let alpha = 2.0;
    let mut delta = vec![0f32; rows * cols];
    for i in 0..rows {
        for j in 0..cols {
            let d: f64 = (0..rank)
                .map(|r| f64::from(up[i * rank + r]) * f64::from(down[r * cols + j]))
                .sum();
            delta[i * cols + j] = (f64::from(strength) * f64::from(alpha) / rank as f64 * d) as f32;
        }
    }
    let set = PatchSet {
        patches: vec![Patch {
            strength,
            strength_model: 1.0,
            adapter: Adapter::Lora {
                up: PatchTensor::from_f32(DType::F32, &[rows, rank], &up),
                down: PatchTensor::from_f32(DType::F32, &[rank, cols], &down),
                alpha: Some(alpha),
                dora_scale: None,
            },
        }],
    };
    (set, delta)
}

/// Each element is one of the two storage neighbours of the exact value (stochastic rounding).
fn assert_patched(got: &[u8], original: &[f32], delta: &[f32], dtype: DType, what: &str) {
    let got = dtype::widen(dtype, got);
    assert_eq!(got.len(), original.len());
    let mut changed = 0;
    for (i, ((g, w), d)) in got.iter().zip(original).zip(delta).enumerate() {
        let want = w + d;
        let ulp = (round_to(dtype, want.abs() * 1.01) - round_to(dtype, want.abs() * 0.99))
            .abs()
            .max(1e-6);
        assert!((g - want).abs() <= ulp + 1e-6, "{what}[{i}]: got {g}, want {want}");
        changed += usize::from(g != w);
    }
    assert!(changed > got.len() / 2, "{what}: the patch changed the weight");
}

#[test]
fn lora_patches_resident_and_offloaded_weights_in_place_and_restores_them() {
    let dir = TempDir::new("lora");
    // Four 512 KiB weights fill the first 2 MiB page; the fifth lies on the second.
    let mut tensors: Vec<FileTensor> =
        (0..5).map(|i| tensor(&format!("l{i}.w"), DType::BF16, &[256, 1024], 10 + i)).collect();
    tensors.push(tensor("bias", DType::F32, &[256], 20));
    let path = dir.file("model.safetensors");
    write_file(&path, &tensors);
    let cpu = Cpu::simulating_gpu(64 * MIB);
    let manager = manager(&cpu, 0, pins_on());
    let model =
        manager.load(&LoadPlan::whole_file(&path).expect("plan"), &mut |_, _| {}).expect("load");
    // Only the first page may be resident: l4 is streamed through scratch.
    manager.arbiter().set_watermark(the_vbar(&manager), 2 * MIB).expect("watermark");

    let names = ["l0.w", "l4.w", "bias"];
    let (orig0, orig4, orig_b) =
        (find(&tensors, "l0.w"), find(&tensors, "l4.w"), find(&tensors, "bias"));
    let diff = values(256, 30);
    let patches = |strength: f32| {
        let (p0, d0) = lora(256, 1024, 4, strength, 40);
        let (p4, d4) = lora(256, 1024, 4, strength, 50);
        let pb = PatchSet {
            patches: vec![Patch {
                strength,
                strength_model: 1.0,
                adapter: Adapter::Diff(PatchTensor::from_f32(DType::F32, &[256], &diff)),
            }],
        };
        let db: Vec<f32> = diff.iter().map(|d| strength * d).collect();
        (
            vec![("l0.w".to_owned(), p0), ("l4.w".to_owned(), p4), ("bias".to_owned(), pb)],
            [d0, d4, db],
        )
    };
    let fetch_bytes = || {
        let layer = model.fetch(&cpu, &names).expect("fetch");
        assert!(in_vbar(&manager, layer.weight(0).ptr()), "l0 is resident");
        assert!(!in_vbar(&manager, layer.weight(1).ptr()), "l4 is offloaded");
        (0..3).map(|i| device_bytes(&cpu, &layer.weight(i))).collect::<Vec<_>>()
    };
    // Unpatched first: l0 becomes resident with its original bytes.
    let plain = fetch_bytes();
    assert!(plain[0] == orig0.bytes && plain[1] == orig4.bytes && plain[2] == orig_b.bytes);

    let (set, deltas) = patches(0.5);
    model.set_patches(set).expect("patches");
    let half = fetch_bytes();
    assert_patched(&half[0], &orig0.values, &deltas[0], DType::BF16, "resident l0 at 0.5");
    assert_patched(&half[1], &orig4.values, &deltas[1], DType::BF16, "offloaded l4 at 0.5");
    assert_patched(&half[2], &orig_b.values, &deltas[2], DType::F32, "plain bias at 0.5");

    // Fetched again: the resident weight stays patched without a copy, nothing is patched twice.
    let before = h2d_copies(&cpu);
    let layer = model.fetch(&cpu, &["l0.w"]).expect("fetch");
    assert_eq!(h2d_copies(&cpu), before, "a resident patched weight is used in place");
    assert!(device_bytes(&cpu, &layer.weight(0)) == half[0]);
    drop(layer);
    assert!(fetch_bytes() == half, "the same patches give the same bytes");

    // A new strength re-patches from the original, not on top of the old patch.
    let (set, deltas) = patches(1.0);
    model.set_patches(set).expect("patches");
    let full = fetch_bytes();
    assert_patched(&full[0], &orig0.values, &deltas[0], DType::BF16, "resident l0 at 1.0");
    assert_patched(&full[1], &orig4.values, &deltas[1], DType::BF16, "offloaded l4 at 1.0");
    assert_patched(&full[2], &orig_b.values, &deltas[2], DType::F32, "plain bias at 1.0");

    // No patches: the originals, exactly.
    model.set_patches(Vec::new()).expect("no patches");
    let restored = fetch_bytes();
    assert!(restored[0] == orig0.bytes, "resident l0 restored");
    assert!(restored[1] == orig4.bytes, "offloaded l4 restored");
    assert!(restored[2] == orig_b.bytes, "plain bias restored");

    assert!(model.set_patches(vec![("nope".to_owned(), PatchSet::default())]).is_err());
}

#[test]
fn the_cpu_reads_weights_where_they_lie_in_their_files() {
    let dir = TempDir::new("in-place");
    let mut tensors: Vec<FileTensor> =
        (0..3).map(|i| tensor(&format!("l{i}.w"), DType::BF16, &[256, 1024], 60 + i)).collect();
    tensors.push(tensor("bias", DType::F32, &[256], 70));
    let path = dir.file("model.safetensors");
    write_file(&path, &tensors);
    // The CPU's device reads files in place: a budget far below the model is no reason to stream.
    let cpu = Cpu::new(8 * MIB);
    let manager = manager(&cpu, 0, pins_on());
    let model =
        manager.load(&LoadPlan::whole_file(&path).expect("plan"), &mut |_, _| {}).expect("load");
    assert_eq!(cpu.sim().counters().file_maps, 1, "the file is mapped once");
    assert_eq!(model.load_stats().bytes, 0, "nothing is read into pins");

    let names = ["l0.w", "l1.w", "l2.w", "bias"];
    let fetch_bytes = || {
        let layer = model.fetch(&cpu, &names).expect("fetch");
        (0..names.len()).map(|i| device_bytes(&cpu, &layer.weight(i))).collect::<Vec<_>>()
    };
    let used = cpu.sim().used();
    for _ in 0..2 {
        assert!(fetch_bytes().iter().zip(&names).all(|(b, n)| *b == find(&tensors, n).bytes));
    }
    assert_eq!(h2d_copies(&cpu), 0, "no weight is copied onto the device");
    assert_eq!(cpu.sim().used(), used, "nor takes device memory");
    // A product reads the weight from the file's memory map, not from a copy of its bytes.
    let layer = model.fetch(&cpu, &["l0.w"]).expect("fetch");
    let x = cpu.from_f32(&[3, 1024], &vec![0.5; 3 * 1024], DType::F32).expect("x");
    let y = cpu.to_f32(&cpu.linear(&x, &layer.weight(0), None).expect("linear")).expect("y");
    let w = find(&tensors, "l0.w");
    let want: f32 = w.values[..1024].iter().map(|v| v * 0.5).sum();
    assert!((y[0] - want).abs() <= 1e-4 * want.abs().max(1.0), "{} vs {want}", y[0]);
    assert_eq!(cpu.sim().counters().copied_reads, 0, "the weight was read where it lies");
    drop(layer);
    assert_eq!(manager.arbiter().loaded_bytes(the_vbar(&manager)).expect("loaded"), 0);

    // The file is read-only: a LoRA patches a copy in scratch at each fetch, and the original comes back.
    let file_before = std::fs::read(&path).expect("the file");
    let (set, delta) = lora(256, 1024, 4, 0.5, 80);
    model.set_patches(vec![("l1.w".to_owned(), set)]).expect("patches");
    for _ in 0..2 {
        let patched = fetch_bytes();
        assert_patched(&patched[1], &find(&tensors, "l1.w").values, &delta, DType::BF16, "l1");
        assert!(patched[0] == find(&tensors, "l0.w").bytes, "l0 unpatched");
    }
    model.set_patches(Vec::new()).expect("no patches");
    assert!(fetch_bytes()[1] == find(&tensors, "l1.w").bytes, "l1 restored");
    assert!(std::fs::read(&path).expect("the file") == file_before, "the file is unchanged");

    // Dropping the model unmaps the file: its addresses no longer read.
    let at = model.fetch(&cpu, &["l0.w"]).expect("fetch").weight(0).ptr();
    drop(model);
    assert!(cpu.sim().read(at, &mut [0u8; 16]).is_err(), "the file is unmapped");
}

#[test]
fn holding_every_lane_is_an_error_not_a_deadlock() {
    let dir = TempDir::new("lanes");
    let tensors = layered_model(3);
    let path = dir.file("model.safetensors");
    write_file(&path, &tensors);
    let cpu = Cpu::simulating_gpu(64 * MIB);
    let manager = manager(&cpu, 0, pins_on());
    let model =
        manager.load(&LoadPlan::whole_file(&path).expect("plan"), &mut |_, _| {}).expect("load");
    assert_eq!(manager.config().offload_streams, 2);

    let first = model.fetch(&cpu, &["blk.00.w"]).expect("first lane");
    let second = model.fetch(&cpu, &["blk.01.w"]).expect("second lane");
    let err = model.fetch(&cpu, &["blk.02.w"]).expect_err("every lane is held");
    assert!(err.to_string().contains("offload lanes"), "{err}");
    drop(first);
    let third = model.fetch(&cpu, &["blk.02.w"]).expect("a lane was freed");
    assert!(device_bytes(&cpu, &third.weight(0)) == find(&tensors, "blk.02.w").bytes);
    assert!(device_bytes(&cpu, &second.weight(0)) == find(&tensors, "blk.01.w").bytes);
    drop((second, third));

    // A fetch that fails part way gives back its lane and the page pins it took.
    let pinned = || {
        let residency = manager.arbiter().residency(the_vbar(&manager)).expect("residency");
        residency.iter().filter(|p| p.pinned).count()
    };
    let held = model.fetch(&cpu, &["blk.00.w"]).expect("fetch");
    assert_eq!(pinned(), 1);
    // blk.02.w lies on the second page.
    let err = model.fetch(&cpu, &["blk.02.w", "nope"]).expect_err("an unknown weight");
    assert!(err.to_string().contains("nope"), "{err}");
    assert_eq!(pinned(), 1, "only the held layer's page stays pinned");
    drop(model.fetch(&cpu, &["blk.01.w"]).expect("the failed fetch's lane is free again"));
    drop(held);
    assert_eq!(pinned(), 0);
}

/// A model with a fused slot, a second VBAR weight on its own page and a plain one, for the pin tests.
fn pin_test_model(dir: &TempDir) -> (PathBuf, Vec<FileTensor>, LoadPlan) {
    let tensors = vec![
        tensor("a.w", DType::BF16, &[1024, 1024], 1),
        tensor("to_q", DType::BF16, &[128, 512], 2),
        tensor("to_k", DType::BF16, &[128, 512], 3),
        tensor("to_v", DType::BF16, &[128, 512], 4),
        tensor("b", DType::F32, &[64], 5),
    ];
    let path = dir.file("model.safetensors");
    write_file(&path, &tensors);
    let parts = |names: &[&str]| names.iter().map(|n| (0, (*n).to_owned())).collect();
    let plan = LoadPlan {
        files: vec![path.clone()],
        slots: vec![
            SlotPlan::new("a.w", parts(&["a.w"])),
            SlotPlan::new("qkv", parts(&["to_q", "to_k", "to_v"])),
            SlotPlan::new("b", parts(&["b"])),
        ],
    };
    (path, tensors, plan)
}

fn qkv_bytes(tensors: &[FileTensor]) -> Vec<u8> {
    ["to_q", "to_k", "to_v"].iter().flat_map(|n| find(tensors, n).bytes.iter().copied()).collect()
}

#[test]
fn without_pins_weights_stream_from_the_file_through_the_staging_ring() {
    let dir = TempDir::new("nopins");
    let (path, tensors, plan) = pin_test_model(&dir);
    let cpu = Cpu::simulating_gpu(64 * MIB);
    let manager = manager(&cpu, 0, PinConfig::disabled());
    let mut reported = 0;
    let model = manager.load(&plan, &mut |_, _| reported += 1).expect("load");
    assert_eq!(reported, 0, "nothing is read at load without pins");
    assert_eq!(model.load_stats().bytes, 0);
    // a.w (2 MiB) lies at the VBAR's start, qkv (384 KiB) on the next page, which may not be resident.
    manager.arbiter().set_watermark(the_vbar(&manager), 2 * MIB).expect("watermark");

    let want = [
        find(&tensors, "a.w").bytes.clone(),
        qkv_bytes(&tensors),
        find(&tensors, "b").bytes.clone(),
    ];
    for pass in 0..2 {
        let before = cpu.sim().counters();
        let layer = model.fetch(&cpu, &["a.w", "qkv", "b"]).expect("fetch");
        for (i, want) in want.iter().enumerate() {
            assert!(device_bytes(&cpu, &layer.weight(i)) == *want, "pass {pass}, weight {i}");
        }
        assert!(in_vbar(&manager, layer.weight(0).ptr()));
        assert!(!in_vbar(&manager, layer.weight(1).ptr()));
        let after = cpu.sim().counters();
        // The ring copies: a.w once (first pass only), qkv's three parts on every pass.
        let expected = if pass == 0 { 4 } else { 3 };
        assert_eq!(after.h2d_copies - before.h2d_copies, expected, "pass {pass}");
        assert_eq!(after.h2d_unregistered, before.h2d_unregistered, "ring slots are registered");
        assert_eq!(after.pageable_copies, before.pageable_copies);
    }
    let stats = manager.stats();
    assert_eq!((stats.host_bytes, stats.registered_bytes, stats.pageable_copies), (0, 0, 0));
    assert!(cpu.sim().registered_bytes() > 0, "the ring's slot is registered");

    // The file is read at each use: cutting it short is an error naming it.
    let len = std::fs::metadata(&path).expect("metadata").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(len - 64 * 1024))
        .expect("truncate");
    let err = model.fetch(&cpu, &["qkv"]).expect_err("the file lost its tail");
    let text = format!("{err}");
    assert!(text.contains(&path.display().to_string()), "{text}");
}

#[test]
fn with_pins_weights_are_copied_from_registered_memory() {
    let dir = TempDir::new("pins");
    let (_path, tensors, plan) = pin_test_model(&dir);
    let cpu = Cpu::simulating_gpu(64 * MIB);
    let manager = manager(&cpu, 0, pins_on());
    let model = manager.load(&plan, &mut |_, _| {}).expect("load");
    manager.arbiter().set_watermark(the_vbar(&manager), 2 * MIB).expect("watermark");
    let vbar_bytes = (2 * MIB) + 3 * 128 * 512 * 2;
    let stats = manager.stats();
    assert_eq!(stats.host_bytes, vbar_bytes, "every VBAR weight is pinned");
    assert_eq!(stats.registered_bytes, vbar_bytes);
    assert_eq!(cpu.sim().registered_bytes(), vbar_bytes, "and registered with the device");

    let want = [find(&tensors, "a.w").bytes.clone(), qkv_bytes(&tensors)];
    for pass in 0..2 {
        let before = cpu.sim().counters();
        let layer = model.fetch(&cpu, &["a.w", "qkv"]).expect("fetch");
        for (i, want) in want.iter().enumerate() {
            assert!(device_bytes(&cpu, &layer.weight(i)) == *want, "pass {pass}, weight {i}");
        }
        let after = cpu.sim().counters();
        // One gathered copy per weight from its pin: a.w on the first pass, qkv on both.
        let expected = if pass == 0 { 2 } else { 1 };
        assert_eq!(after.h2d_copies - before.h2d_copies, expected, "pass {pass}");
        assert_eq!(after.h2d_unregistered, 0, "copies come from registered memory");
        assert_eq!(after.pageable_copies, before.pageable_copies);
    }
    assert_eq!(manager.stats().pageable_copies, 0);
}

#[test]
fn unloading_frees_pages_and_dropping_the_model_gives_the_device_back() {
    let dir = TempDir::new("unload");
    let tensors = layered_model(4);
    let path = dir.file("model.safetensors");
    write_file(&path, &tensors);
    let cpu = Cpu::simulating_gpu(64 * MIB);
    let manager = manager(&cpu, 0, pins_on());
    let model =
        manager.load(&LoadPlan::whole_file(&path).expect("plan"), &mut |_, _| {}).expect("load");
    let weights: Vec<String> = (0..4).map(|i| format!("blk.{i:02}.w")).collect();
    let all: Vec<&str> = weights.iter().map(String::as_str).collect();
    let check = |model: &Model| {
        let layer = model.fetch(&cpu, &all).expect("fetch");
        for (i, name) in all.iter().enumerate() {
            assert!(device_bytes(&cpu, &layer.weight(i)) == find(&tensors, name).bytes, "{name}");
        }
    };
    check(&model);
    assert_eq!(model.resident_bytes(), 4 * MIB);

    let freed = manager.unload_all().expect("unload");
    assert_eq!(freed, 4 * MIB);
    assert_eq!(model.resident_bytes(), 0);
    assert_eq!(manager.stats().resident_weights, 0);
    // Until the model is used again (activated), its weights stream; the bytes are right either way.
    let before = h2d_copies(&cpu);
    check(&model);
    assert_eq!(h2d_copies(&cpu) - before, 4, "every weight is copied again");
    assert_eq!(model.resident_bytes(), 0);
    model.activate().expect("activate");
    let before = h2d_copies(&cpu);
    check(&model);
    assert_eq!(h2d_copies(&cpu) - before, 4, "faulted back in: copied from the pins");
    assert_eq!(model.resident_bytes(), 4 * MIB);

    assert!(cpu.sim().registered_bytes() > 0);
    drop(model);
    // What is left on the device is the scratch buffers, which the arbiter counts; no pins remain.
    assert_eq!(manager.stats().models, 0);
    assert_eq!(manager.stats().resident_weights, 0);
    assert!(manager.arbiter().priority_order().is_empty(), "the VBAR is gone");
    assert_eq!(cpu.sim().used(), manager.arbiter().usage(), "plain tensors and pages are freed");
    assert!(manager.arbiter().usage() <= 2 * 2 * MIB, "only the two lanes' scratch");
    assert_eq!(cpu.sim().registered_bytes(), 0, "pins are unregistered");
    drop(manager);
    assert_eq!(cpu.sim().used(), 0, "the manager gives back its scratch");
}

#[test]
fn after_node_lifts_watermark_limits_and_stats_add_up() {
    let dir = TempDir::new("node");
    let tensors = layered_model(4);
    let path = dir.file("model.safetensors");
    write_file(&path, &tensors);
    let capacity = 64 * MIB;
    let headroom = 8 * MIB;
    let cpu = Cpu::simulating_gpu(capacity);
    let manager = manager(&cpu, headroom, pins_on());
    let model =
        manager.load(&LoadPlan::whole_file(&path).expect("plan"), &mut |_, _| {}).expect("load");
    let id = the_vbar(&manager);
    let (set, delta) = lora(512, 1024, 4, 1.0, 60);
    model.set_patches(vec![("blk.03.w".to_owned(), set)]).expect("patches");
    let patched = {
        let layer = model.fetch(&cpu, &["blk.03.w"]).expect("fetch");
        device_bytes(&cpu, &layer.weight(0))
    };
    assert_patched(&patched, &find(&tensors, "blk.03.w").values, &delta, DType::BF16, "blk.03.w");
    for i in 0..4 {
        drop(
            model
                .fetch(&cpu, &[&format!("blk.{i:02}.w"), &format!("blk.{i:02}.b")])
                .expect("fetch"),
        );
    }

    let stats = manager.stats();
    let weight_bytes = 4 * MIB;
    assert_eq!(stats.capacity, capacity);
    assert_eq!(stats.budget, capacity - headroom);
    assert_eq!(stats.usage, manager.arbiter().usage());
    assert!(stats.usage <= stats.budget);
    assert_eq!(stats.resident_weights, model.resident_bytes());
    assert_eq!(stats.resident_weights, 4 * MIB);
    assert_eq!(stats.models, 1);
    assert!(stats.host_bytes > weight_bytes, "the weights' pins and the patch's");
    assert_eq!(stats.registered_bytes, stats.host_bytes, "all registered");
    assert_eq!(stats.registered_bytes, cpu.sim().registered_bytes());
    assert_eq!(stats.pageable_copies, 0);

    // A watermark limit keeps eviction from freeing the model's pages until the node ends.
    manager.arbiter().set_watermark_limit(id, 4 * MIB).expect("limit");
    assert_eq!(manager.arbiter().evict(4 * MIB).expect("evict"), 0, "the limit holds");
    manager.after_node().expect("after node");
    assert_eq!(manager.arbiter().watermark_limit(id).expect("limit"), 0);
    let stats = manager.stats();
    assert_eq!(stats.host_bytes, weight_bytes, "patch pins do not outlive the node");
    assert_eq!(cpu.sim().registered_bytes(), weight_bytes);
    assert_eq!(manager.arbiter().evict(4 * MIB).expect("evict"), 4 * MIB, "the limit is lifted");
    assert_eq!(model.resident_bytes(), 0);

    // The next node: activated, the weights fault back in with the right (patched) bytes.
    model.activate().expect("activate");
    let layer = model.fetch(&cpu, &["blk.00.w", "blk.03.w"]).expect("fetch");
    assert!(device_bytes(&cpu, &layer.weight(0)) == find(&tensors, "blk.00.w").bytes);
    assert!(device_bytes(&cpu, &layer.weight(1)) == patched, "re-patched from a new patch pin");
    assert!(in_vbar(&manager, layer.weight(0).ptr()) && in_vbar(&manager, layer.weight(1).ptr()));
}

#[test]
fn a_new_lora_within_a_node_patches_with_its_own_tensors() {
    let dir = TempDir::new("relora");
    let tensors: Vec<FileTensor> =
        (0..5).map(|i| tensor(&format!("l{i}.w"), DType::BF16, &[256, 1024], 10 + i)).collect();
    let path = dir.file("model.safetensors");
    write_file(&path, &tensors);
    let cpu = Cpu::simulating_gpu(64 * MIB);
    let manager = manager(&cpu, 0, pins_on());
    let model =
        manager.load(&LoadPlan::whole_file(&path).expect("plan"), &mut |_, _| {}).expect("load");
    manager.arbiter().set_watermark(the_vbar(&manager), 2 * MIB).expect("watermark");
    let (w0, w4) = (find(&tensors, "l0.w"), find(&tensors, "l4.w"));
    let fetch = || {
        let layer = model.fetch(&cpu, &["l0.w", "l4.w"]).expect("fetch");
        assert!(
            in_vbar(&manager, layer.weight(0).ptr()) && !in_vbar(&manager, layer.weight(1).ptr())
        );
        [device_bytes(&cpu, &layer.weight(0)), device_bytes(&cpu, &layer.weight(1))]
    };
    // Three LoRAs in one node: two of the same shape (same image size), then one of a higher rank.
    let mut last = None;
    for (rank, seed) in [(4, 70), (4, 80), (8, 90)] {
        let (p0, d0) = lora(256, 1024, rank, 1.0, seed);
        let (p4, d4) = lora(256, 1024, rank, 1.0, seed + 5);
        model.set_patches(vec![("l0.w".into(), p0), ("l4.w".into(), p4)]).expect("patches");
        let got = fetch();
        let what = format!("rank {rank}, seed {seed}");
        assert_patched(&got[0], &w0.values, &d0, DType::BF16, &format!("resident l0, {what}"));
        assert_patched(&got[1], &w4.values, &d4, DType::BF16, &format!("offloaded l4, {what}"));
        last = Some(got);
    }
    // The next node: the patch pins are gone, the images are pinned again (at their new size: within the
    // node, the rank-8 images could not use the rank-4 pins and were copied pageable), the bytes the same.
    manager.after_node().expect("after node");
    let pageable = manager.stats().pageable_copies;
    assert!(Some(fetch()) == last, "the same patches after the node");
    assert_eq!(cpu.sim().counters().h2d_unregistered, 0, "patch images come from registered pins");
    assert_eq!(manager.stats().pageable_copies, pageable);

    // An empty patch set patches nothing: the originals, with no patch pass and no pageable copy.
    model
        .set_patches(vec![
            ("l0.w".into(), PatchSet::default()),
            ("l4.w".into(), PatchSet::default()),
        ])
        .expect("empty sets");
    let pageable = cpu.sim().counters().pageable_copies;
    let got = fetch();
    assert!(got[0] == w0.bytes && got[1] == w4.bytes, "originals");
    assert_eq!(cpu.sim().counters().pageable_copies, pageable);
}

#[test]
fn a_registration_cap_below_the_model_swaps_registrations_or_streams_from_disk() {
    let dir = TempDir::new("cap");
    let tensors = layered_model(4);
    let path = dir.file("model.safetensors");
    write_file(&path, &tensors);
    for cap in [MIB + MIB / 2, MIB / 2] {
        let cpu = Cpu::simulating_gpu(64 * MIB);
        let pins = PinConfig { cap, ..pins_on() };
        // No headroom for residency beyond one page: most weights are streamed on every use.
        let manager = manager(&cpu, 0, pins);
        let model = manager
            .load(&LoadPlan::whole_file(&path).expect("plan"), &mut |_, _| {})
            .expect("load");
        manager.arbiter().set_watermark(the_vbar(&manager), 2 * MIB).expect("watermark");
        let stats = manager.stats();
        assert!(stats.registered_bytes <= cap, "cap {cap}: {stats:?}");
        for pass in 0..2 {
            for i in 0..4 {
                let name = format!("blk.{i:02}.w");
                let layer = model.fetch(&cpu, &[&name]).expect("fetch");
                assert!(
                    device_bytes(&cpu, &layer.weight(0)) == find(&tensors, &name).bytes,
                    "cap {cap}, pass {pass}, {name}"
                );
                let stats = manager.stats();
                assert!(stats.registered_bytes <= cap, "cap {cap}: {stats:?}");
            }
        }
        let stats = manager.stats();
        if cap > MIB {
            // Every weight has a pin in RAM; registrations move to the pins being copied from.
            assert_eq!(stats.host_bytes, 4 * MIB, "cap {cap}");
            assert_eq!(
                cpu.sim().counters().h2d_unregistered,
                0,
                "cap {cap}: the registration swap"
            );
        } else {
            // No weight fits under the cap: none is pinned and each is read from its file when used.
            assert_eq!(stats.host_bytes, 0, "cap {cap}");
            assert_eq!(model.load_stats().bytes, 0);
        }
    }
}

#[test]
fn two_models_share_the_budget_and_the_active_one_wins() {
    let dir = TempDir::new("two");
    let ta = layered_model(4);
    let tb: Vec<FileTensor> = (0..4)
        .map(|i| tensor(&format!("blk.{i:02}.w"), DType::BF16, &[512, 1024], 300 + i))
        .chain([tensor("bias", DType::F32, &[100], 9)])
        .collect();
    let (pa, pb) = (dir.file("a.safetensors"), dir.file("b.safetensors"));
    write_file(&pa, &ta);
    write_file(&pb, &tb);
    // Room for 8 MiB: one model's weights and the scratch of one lane (one, so that the arithmetic of who
    // gives way is not blurred by a second scratch buffer growing), not both models' weights.
    let cpu = Cpu::simulating_gpu(8 * MIB);
    let manager = MemoryManager::new(
        cpu.memory().clone(),
        ManagerConfig { offload_streams: 1, ..config(0, pins_on()) },
    )
    .expect("a memory manager");
    let names: Vec<String> = (0..4).map(|i| format!("blk.{i:02}.w")).collect();
    let pass = |model: &Model, tensors: &[FileTensor]| {
        for n in &names {
            let layer = model.fetch(&cpu, &[n]).expect("fetch");
            assert!(device_bytes(&cpu, &layer.weight(0)) == find(tensors, n).bytes, "{n}");
            assert!(manager.arbiter().usage() <= 8 * MIB);
        }
    };
    let a =
        manager.load(&LoadPlan::whole_file(&pa).expect("plan"), &mut |_, _| {}).expect("load a");
    pass(&a, &ta);
    assert_eq!(a.resident_bytes(), 4 * MIB);

    // The newer model ranks higher: its weights fault in, evicting the older model's pages.
    let b =
        manager.load(&LoadPlan::whole_file(&pb).expect("plan"), &mut |_, _| {}).expect("load b");
    pass(&b, &tb);
    assert_eq!(b.resident_bytes(), 4 * MIB);
    assert!(a.resident_bytes() < 4 * MIB, "a gave way");
    // The older model still reads right, streamed, without taking b's pages.
    pass(&a, &ta);
    assert_eq!(b.resident_bytes(), 4 * MIB);

    // Activated again (ComfyUI's model load), a takes the device back.
    a.activate().expect("activate");
    pass(&a, &ta);
    pass(&a, &ta);
    assert_eq!(a.resident_bytes(), 4 * MIB);
    assert!(b.resident_bytes() < 4 * MIB, "b gave way");
    assert_eq!(manager.stats().models, 2);
    assert_eq!(manager.stats().resident_weights, a.resident_bytes() + b.resident_bytes());
}

#[test]
fn tiny_weights_make_room_for_themselves() {
    let dir = TempDir::new("room");
    let ta = layered_model(2);
    let tb = vec![tensor("bias", DType::F32, &[100], 9)];
    let (pa, pb) = (dir.file("a.safetensors"), dir.file("b.safetensors"));
    write_file(&pa, &ta);
    write_file(&pb, &tb);
    // Model a's page and two 1 KiB biases fill the device exactly.
    let cpu = Cpu::simulating_gpu(2 * MIB + 2 * KIB);
    let manager = manager(&cpu, 0, pins_on());
    let a =
        manager.load(&LoadPlan::whole_file(&pa).expect("plan"), &mut |_, _| {}).expect("load a");
    drop(a.fetch(&cpu, &["blk.00.w", "blk.01.w"]).expect("fetch"));
    assert_eq!(a.resident_bytes(), 2 * MIB);
    assert_eq!(cpu.sim().used(), 2 * MIB + 2 * KIB, "the device is full");

    // b's bias is an allocation like any other: a's unpinned page gives way to it.
    let b =
        manager.load(&LoadPlan::whole_file(&pb).expect("plan"), &mut |_, _| {}).expect("load b");
    assert_eq!(a.resident_bytes(), 0);
    let layer = b.fetch(&cpu, &["bias"]).expect("fetch");
    assert!(device_bytes(&cpu, &layer.weight(0)) == tb[0].bytes);
    drop(layer);
    drop(b);
    assert_eq!(cpu.sim().used(), 2 * KIB, "b's bias is freed with b, through the budget");
    assert_eq!(manager.arbiter().usage(), 2 * KIB);
}

/// Available RAM that allows the first `n` pins (with the 2 GiB floor) and none after.
fn ram_for_pins(n: u64) -> Arc<dyn kiln_compute::memory::pressure::RamProbe + Send + Sync> {
    let calls = AtomicU64::new(0);
    Arc::new(move || if calls.fetch_add(1, Ordering::Relaxed) < n { 1 << 40 } else { 0 })
}

#[test]
fn a_pin_stolen_while_loading_holds_the_thief_and_the_victim_streams_from_its_file() {
    let dir = TempDir::new("steal");
    // Three weights of one size: the third pin request finds no RAM and steals the first weight's pin (the
    // lowest pin priority, bit_reverse(0)).
    let tensors: Vec<FileTensor> =
        (0..3).map(|i| tensor(&format!("w{i}"), DType::BF16, &[64, 256], 300 + i)).collect();
    let path = dir.file("steal.safetensors");
    write_file(&path, &tensors);
    let cpu = Cpu::simulating_gpu(64 * MIB);
    let pins = PinConfig { cap: 1 << 30, ram_cache_headroom: 0, high_ram: false };
    let manager = MemoryManager::with_ram(cpu.memory().clone(), config(0, pins), ram_for_pins(2))
        .expect("a memory manager");
    let model = manager
        .load(&LoadPlan::whole_file(&path).expect("plan"), &mut |_, _| {})
        .expect("a load where a pin is stolen succeeds");
    assert_eq!(model.load_stats().bytes, 2 * 64 * 256 * 2, "two pins were filled, each once");
    for t in &tensors {
        let layer = model.fetch(&cpu, &[t.name.as_str()]).expect("fetch");
        assert_eq!(device_bytes(&cpu, &layer.weight(0)), t.bytes, "{}", t.name);
    }
}

/// An output cache whose eviction drops the last handle to a model (old model objects are cache entries).
struct CacheHoldingAModel(Option<kiln_compute::memory::Model>);

impl kiln_compute::memory::pressure::OutputCache for CacheHoldingAModel {
    fn release(&mut self, _target: u64, _free_active: bool, _min_entry_size: u64) -> u64 {
        self.0.take().map_or(0, |model| {
            drop(model);
            1
        })
    }
}

#[test]
fn the_ram_arbitration_may_drop_a_model_while_it_runs() {
    let dir = TempDir::new("arbitrate");
    let tensors = layered_model(2);
    let path = dir.file("m.safetensors");
    write_file(&path, &tensors);
    let cpu = Cpu::simulating_gpu(64 * MIB);
    let manager =
        MemoryManager::with_ram(cpu.memory().clone(), config(0, pins_on()), Arc::new(|| 0u64))
            .expect("a memory manager");
    let model =
        manager.load(&LoadPlan::whole_file(&path).expect("plan"), &mut |_, _| {}).expect("load");
    let mut cache = CacheHoldingAModel(Some(model));
    let thresholds =
        kiln_compute::memory::pressure::CacheThresholds { active: 1 << 30, inactive: 1 << 30 };
    // Without the fix this deadlocked: the model's drop takes the pin books' lock the arbitration held.
    manager.arbitrate_ram(&thresholds, &mut cache);
    assert!(cache.0.is_none(), "the cache gave its model up");
    assert_eq!(manager.stats().models, 0, "and the model is gone");
}

/// A weight a model derives on the device at run time (the Wan VAEs' reordered kernel taps) is taken through the
/// arbiter the backend was given, so the budget counts it as it counts activations, and it goes back on drop;
/// before the backend has an arbiter it comes from the device directly.
#[test]
fn weights_derived_on_the_device_count_against_the_budget() {
    let cpu = Cpu::simulating_gpu(64 * MIB);
    let manager = manager(&cpu, 0, PinConfig::disabled());
    let arbiter = manager.arbiter();
    let n = 256 * 1024;
    let x = cpu.from_f32(&[256, 1024], &values(n, 3), DType::F32).expect("upload");
    let want =
        cpu.to_f32(&x).expect("read").iter().map(|&v| round_to(DType::BF16, v)).collect::<Vec<_>>();
    let before = arbiter.usage();

    let uncounted = OwnedWeight::from_tensor(&cpu, &x, DType::BF16).expect("a derived weight");
    assert_eq!(arbiter.usage(), before, "no arbiter yet: straight from the device");

    cpu.set_allocator(arbiter.clone());
    let counted = OwnedWeight::from_tensor(&cpu, &x, DType::BF16).expect("a derived weight");
    assert!(
        arbiter.usage() >= before + (n * 2) as u64,
        "counted: {} then {}",
        before,
        arbiter.usage()
    );
    for w in [&uncounted, &counted] {
        let got =
            cpu.weight_to_tensor(&w.view(), DType::F32).and_then(|t| cpu.to_f32(&t)).expect("read");
        assert_eq!(got, want, "the same values either way");
    }
    drop(counted);
    assert_eq!(arbiter.usage(), before, "given back on drop");
    drop(uncounted);
}
