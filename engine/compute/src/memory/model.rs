//! [`Model`]: a model's weights under the memory manager, and [`Model::fetch`], the per-layer protocol
//! (memory-manager.md §5) — the one way a forward pass reads a weight.
//!
//! **Load** (§5.1). A [`LoadPlan`] names each weight (a *slot*) and the file tensors it is made of (several
//! parts are joined along the first dimension: a diffusers file's `to_q`, `to_k`, `to_v` become one fused
//! `qkv`). Slots of at most `force_cast_max` bytes (16 KiB) become plain device tensors at once. The others
//! get VBAR slots, small ones (< 64 KiB) first and then by decreasing size — lower addresses rank higher for
//! residency — and a pin each in the model's pinned host buffer, filled by the threaded loader. A slot the
//! pin budgets refuse stays on disk and is streamed through the staging ring when used.
//!
//! **Fetch** (§5.2). For each weight of a layer: fault its VBAR range. Resident with a matching signature:
//! use it in place, no copy. Resident but stale (or never copied): copy it from its pin (DMA when
//! registered; after re-registering it if it lost its registration), from the file through the staging ring
//! if it has no pin, into the VBAR. Offloaded: copy it into the lane's scratch. Copies go on the lane's
//! offload stream; one event, and the compute stream waits on it (the CPU never does). Patched weights
//! (LoRA, §6) get their patch image in one copy and are patched in place on the device; a resident weight is
//! patched once and stays patched until the patch set changes. A per-tensor scaled fp8 weight is re-quantized
//! with a new scale when patched, as ComfyUI does, and read with that scale. Dropping the [`Layer`] unpins the
//! VBAR ranges and makes the offload stream wait for the compute stream, so the next copies cannot overwrite
//! bytes still being read. On CUDA every step is asynchronous, so fetching layer i+1 while layer i computes
//! overlaps the copy with the compute (the prefetch); the CPU backend's device completes each step at once.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use indexmap::IndexMap;

use super::device::{DevPtr, DeviceMemory, StreamId};
use super::loader::{LoadStats, SafetensorsFile};
use super::lora::{
    PatchLayout, PatchSet, apply, apply_requantized, apply_requantized_int8, seed_for_key,
};
use super::manager::{Lane, MemoryManager};
use super::pins::{ModelId, ModuleId, PinOutcome, Subset};
use super::vram::{Fault, Signature, VbarId};
use crate::backend::Backend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quant::Quant;
use crate::tensor::{OwnedWeight, Weight, numel};

/// Alignment of slots inside a VBAR (ComfyUI sizes slots with 1024-byte alignment).
const SLOT_ALIGN: u64 = 1024;

/// One weight of a [`LoadPlan`]: its name in the model and the file tensors it is made of.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotPlan {
    /// The name model code fetches it by.
    pub name: String,
    /// `(file index in the plan, tensor name in that file)`, joined along dimension 0 in this order.
    pub parts: Vec<(usize, String)>,
    /// How the stored values stand for the weight's values (a quantized weight, as ComfyUI's quantized files
    /// keep them); the weights model code fetches carry it.
    pub quant: Quant,
    /// The file tensors of the format's scale table ([`Quant::has_table`]), stored in the slot right after the
    /// values, byte for byte, in this order.
    pub table: Vec<(usize, String)>,
}

impl SlotPlan {
    /// A weight named `name` made of `parts`, unquantized.
    pub fn new(name: impl Into<String>, parts: Vec<(usize, String)>) -> SlotPlan {
        SlotPlan { name: name.into(), parts, quant: Quant::None, table: Vec::new() }
    }
}

/// What to load: the files and the weights made from their tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadPlan {
    /// The safetensors files.
    pub files: Vec<PathBuf>,
    /// The weights.
    pub slots: Vec<SlotPlan>,
}

impl LoadPlan {
    /// Every tensor of one file under its own name.
    pub fn whole_file(path: impl AsRef<Path>) -> Result<LoadPlan> {
        let file = SafetensorsFile::open(path.as_ref())?;
        let slots = file
            .tensors()
            .map(|(name, _)| SlotPlan::new(name, vec![(0, name.to_owned())]))
            .collect();
        Ok(LoadPlan { files: vec![path.as_ref().to_path_buf()], slots })
    }
}

/// One file tensor of a slot.
#[derive(Debug)]
struct Part {
    /// Index of its file in the plan.
    file: usize,
    /// Its name in that file (what the loader reads by: an offset alone does not name a tensor, since an
    /// empty tensor starts where the next one does).
    tensor: String,
    /// Offset of its first byte in the file.
    offset: u64,
    /// Length in bytes.
    len: u64,
}

/// Where a slot's bytes come from when they are not pinned.
#[derive(Debug)]
enum Source {
    /// Parts of files, joined in order.
    File(Vec<Part>),
    /// Bytes given in memory ([`MemoryManager::load_tensors`]).
    Memory(Vec<u8>),
}

/// Where a slot lives on the device.
enum Place {
    /// Where it lies in its file, mapped in place by a device that reads host memory itself (the CPU:
    /// [`DeviceMemory::map_file`]); nothing is copied, faulted or pinned. A patched weight is copied from
    /// there into the lane's scratch and patched there at each fetch.
    InFile { at: DevPtr },
    /// A range of the model's VBAR.
    Vbar {
        offset: u64,
        /// The signature of the range when its bytes were last copied (and patched).
        stored: Mutex<Option<Signature>>,
    },
    /// A plain allocation (force-cast tiny weights) through the arbiter, which counts it against the budget and
    /// evicts lower-priority pages to make room for it; with the original bytes to restore it from.
    Plain { weight: OwnedWeight, original: Vec<u8>, patched: AtomicBool },
}

struct Slot {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    /// The format of a quantized weight (see [`SlotPlan::quant`]).
    quant: Quant,
    /// Bytes of the values; the scale table (if any) follows them.
    values: u64,
    bytes: u64,
    module: ModuleId,
    source: Source,
    place: Place,
    patches: Mutex<Option<Arc<PackedPatches>>>,
}

/// A slot's patches, packed (§6.2).
struct PackedPatches {
    image: Vec<u8>,
    layout: PatchLayout,
    /// Names this image (unique in the process): the manager rewrites a patch pin that holds another one.
    generation: u64,
    /// The scale a per-tensor scaled fp8 weight was re-quantized with when first patched with this image
    /// ([`apply_requantized`]); its readers use it instead of the file's.
    scale: OnceLock<f32>,
}

/// The next [`PackedPatches::generation`].
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// The state shared by a [`Model`] and the manager's list of loaded models.
pub(crate) struct ModelState {
    manager: Arc<MemoryManager>,
    id: ModelId,
    vbar: VbarId,
    /// The VBAR's base address (fixed for its life): a slot at `offset` lives at `base + offset`.
    base: DevPtr,
    slots: IndexMap<String, Slot>,
    files: Vec<SafetensorsFile>,
    /// The files the device mapped in place (held for its drop, which unmaps them after the model's last use).
    _file_maps: FileMaps,
    load_stats: LoadStats,
}

/// A model's weights under the memory manager. Dropping it frees its device memory and its pins.
pub struct Model {
    state: Arc<ModelState>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Model({} weights, {})", self.state.slots.len(), self.state.vbar)
    }
}

/// The files of a model that its device mapped in place ([`DeviceMemory::map_file`]), by file index;
/// unmapped when dropped.
struct FileMaps {
    memory: Arc<dyn DeviceMemory>,
    at: Vec<Option<DevPtr>>,
}

impl FileMaps {
    /// Asks the device to map each file (a device that copies weights in maps none).
    fn new(memory: Arc<dyn DeviceMemory>, files: &[SafetensorsFile]) -> Result<FileMaps> {
        let mut maps = FileMaps { memory, at: Vec::with_capacity(files.len()) };
        for file in files {
            let at = maps.memory.map_file(file.source())?;
            maps.at.push(at);
        }
        Ok(maps)
    }
}

impl Drop for FileMaps {
    fn drop(&mut self) {
        for at in self.at.iter().flatten() {
            if let Err(e) = self.memory.unmap_file(*at) {
                tracing::warn!(error = %e, "unmapping a weight file failed");
            }
        }
    }
}

/// A slot being built: name, dtype, shape, quantization, source.
struct NewSlot {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    quant: Quant,
    /// Bytes of the scale table after the values.
    table: u64,
    source: Source,
}

impl NewSlot {
    /// Bytes of the values.
    fn values(&self) -> u64 {
        (numel(&self.shape) * self.dtype.size()) as u64
    }

    /// The slot's address in a file the device mapped in place, when its bytes (values, then table) are one
    /// run of that file.
    fn in_file(&self, file_maps: &[Option<DevPtr>]) -> Option<DevPtr> {
        let Source::File(parts) = &self.source else { return None };
        let first = parts.first()?;
        let contiguous = parts
            .windows(2)
            .all(|w| w[1].file == w[0].file && w[1].offset == w[0].offset + w[0].len);
        let len: u64 = parts.iter().map(|p| p.len).sum();
        let base = (*file_maps.get(first.file)?)?;
        (contiguous && len == self.values() + self.table).then(|| base.offset(first.offset))
    }
}

impl MemoryManager {
    /// Loads the weights `plan` names: reads the headers, checks every part (a missing tensor, an unsupported
    /// dtype, parts that cannot be joined are errors naming the file and tensor), then loads as the module
    /// docs say. `progress(done, total)` reports bytes read.
    pub fn load(
        self: &Arc<Self>,
        plan: &LoadPlan,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model> {
        let files = plan
            .files
            .iter()
            .map(SafetensorsFile::open)
            .collect::<Result<Vec<SafetensorsFile>>>()?;
        let mut slots = Vec::with_capacity(plan.slots.len());
        for slot in &plan.slots {
            slots.push(plan_slot(&files, slot)?);
        }
        build(self, files, slots, progress)
    }

    /// Loads weights given in memory: `(name, dtype, shape, little-endian bytes)` (tests and benchmarks).
    pub fn load_tensors(
        self: &Arc<Self>,
        tensors: Vec<(String, DType, Vec<usize>, Vec<u8>)>,
    ) -> Result<Model> {
        let mut slots = Vec::with_capacity(tensors.len());
        for (name, dtype, shape, bytes) in tensors {
            if bytes.len() != numel(&shape) * dtype.size() {
                return Err(Error::shape(
                    "load",
                    format!("{name}: {shape:?} of {dtype} is not {} bytes", bytes.len()),
                ));
            }
            let (quant, table) = (Quant::None, 0);
            slots.push(NewSlot { name, dtype, shape, quant, table, source: Source::Memory(bytes) });
        }
        build(self, Vec::new(), slots, &mut |_, _| {})
    }
}

fn plan_slot(files: &[SafetensorsFile], slot: &SlotPlan) -> Result<NewSlot> {
    let mut parts = Vec::with_capacity(slot.parts.len());
    let mut dtype = None;
    let mut shape: Option<Vec<usize>> = None;
    for (file_index, tensor) in &slot.parts {
        let file = files.get(*file_index).ok_or_else(|| {
            Error::Unsupported(format!("weight {}: the plan has no file #{file_index}", slot.name))
        })?;
        let info = file.tensor(tensor)?;
        let joinable =
            |s: &Vec<usize>| s.len() == info.shape.len() && s.get(1..) == info.shape.get(1..);
        match (&dtype, &mut shape) {
            (None, _) => {
                dtype = Some(info.dtype);
                shape = Some(info.shape.clone());
            }
            (Some(d), Some(s)) if *d == info.dtype && !s.is_empty() && joinable(s) => {
                s[0] += info.shape[0]
            }
            _ => {
                return Err(Error::File {
                    path: file.path().to_path_buf(),
                    msg: format!(
                        "{tensor} ({} {:?}) cannot be joined to the other parts of {}",
                        info.dtype, info.shape, slot.name
                    ),
                });
            }
        }
        parts.push(Part {
            file: *file_index,
            tensor: tensor.clone(),
            offset: info.offset,
            len: info.len,
        });
    }
    let mut table = 0;
    for (file_index, tensor) in &slot.table {
        let file = files.get(*file_index).ok_or_else(|| {
            Error::Unsupported(format!("weight {}: the plan has no file #{file_index}", slot.name))
        })?;
        let (offset, len) = file.raw_range(tensor)?;
        table += len;
        parts.push(Part { file: *file_index, tensor: tensor.clone(), offset, len });
    }
    match (dtype, shape) {
        (Some(dtype), Some(shape)) => Ok(NewSlot {
            name: slot.name.clone(),
            dtype,
            shape,
            quant: slot.quant,
            table,
            source: Source::File(parts),
        }),
        _ => Err(Error::Unsupported(format!("weight {} is made of no tensor", slot.name))),
    }
}

fn build(
    manager: &Arc<MemoryManager>,
    files: Vec<SafetensorsFile>,
    new_slots: Vec<NewSlot>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Model> {
    let mut names = std::collections::HashSet::with_capacity(new_slots.len());
    if let Some(twice) = new_slots.iter().find(|s| !names.insert(s.name.as_str())) {
        return Err(Error::Unsupported(format!("the plan names weight {} twice", twice.name)));
    }
    let config = manager.config();
    let id = manager.next_model_id();
    let file_maps = FileMaps::new(manager.memory().clone(), &files)?;
    // Slots above the force-cast size that the device reads where they lie in their files.
    let in_file: Vec<Option<DevPtr>> = new_slots
        .iter()
        .map(|s| s.in_file(&file_maps.at).filter(|_| s.values() + s.table > config.force_cast_max))
        .collect();
    // Residency order: small slots first, then by decreasing size (§5.1).
    let mut order: Vec<usize> = (0..new_slots.len()).collect();
    let size_of = |s: &NewSlot| s.values() + s.table;
    order.sort_by_key(|&i| {
        let b = size_of(&new_slots[i]);
        (b >= config.small_first, std::cmp::Reverse(b))
    });
    let mut vbar_size = 0u64;
    let mut vbar_offsets = vec![None; new_slots.len()];
    for &i in &order {
        let b = size_of(&new_slots[i]);
        if b > config.force_cast_max && in_file[i].is_none() {
            vbar_offsets[i] = Some(vbar_size);
            vbar_size = (vbar_size + b).next_multiple_of(SLOT_ALIGN);
        }
    }
    let vbar = manager.arbiter().create_vbar(vbar_size.max(1))?;
    let base = manager.arbiter().base(vbar)?;
    manager.with_pins(|pins, _| pins.load_model(id));
    let mut state = ModelState {
        manager: manager.clone(),
        id,
        vbar,
        base,
        slots: IndexMap::with_capacity(new_slots.len()),
        files,
        _file_maps: file_maps,
        load_stats: LoadStats { bytes: 0, seconds: 0.0 },
    };
    // Pin every VBAR slot in residency order, then read the pinned ones from their files in one threaded load.
    let mut reads: Vec<(usize, String, usize)> = Vec::new();
    // Where each slot's bytes go in its pin; a slot whose pin another slot steals loses its entry (the thief's
    // bytes are read there instead; the victim streams from its file when used).
    let mut staged: Vec<Option<(u64, u64)>> = vec![None; new_slots.len()];
    for (i, slot) in new_slots.into_iter().enumerate() {
        let bytes = size_of(&slot);
        let module = ModuleId(i as u64);
        let place = match (in_file[i], vbar_offsets[i]) {
            (Some(at), _) => Place::InFile { at },
            (None, Some(offset)) => {
                let outcome = manager.pin_weight(id, module, bytes, vbar_size)?;
                if let PinOutcome::Stolen { victim, .. } = outcome
                    && let Some(entry) = staged.get_mut(victim.0 as usize)
                {
                    *entry = None;
                }
                staged[i] = outcome.pin().map(|pin| (pin.offset, pin.size));
                Place::Vbar { offset, stored: Mutex::new(None) }
            }
            (None, None) => {
                let original = read_source(&state.files, &slot.source, bytes)?;
                let weight = OwnedWeight::upload_counted(
                    manager.arbiter().clone(),
                    manager.memory().as_ref(),
                    (slot.dtype, &slot.shape, slot.table as usize),
                    &original,
                )?;
                Place::Plain { weight, original, patched: AtomicBool::new(false) }
            }
        };
        let name = slot.name.clone();
        let values = slot.values();
        state.slots.insert(
            name.clone(),
            Slot {
                name,
                dtype: slot.dtype,
                shape: slot.shape,
                quant: slot.quant,
                values,
                bytes,
                module,
                source: slot.source,
                place,
                patches: Mutex::new(None),
            },
        );
    }
    // Host bytes pinned at load (for the log line).
    let mut pinned = 0;
    for (i, (pin_offset, pin_size)) in
        staged.into_iter().enumerate().filter_map(|(i, p)| Some((i, p?)))
    {
        pinned += pin_size;
        let slot = &state.slots[i];
        match &slot.source {
            Source::Memory(bytes) => manager.write_pin(id, pin_offset, bytes)?,
            Source::File(parts) => {
                let mut at = pin_offset as usize;
                for part in parts.iter().filter(|p| p.len > 0) {
                    reads.push((part.file, part.tensor.clone(), at));
                    at += part.len as usize;
                }
            }
        }
    }
    state.load_stats = manager.read_into_pins(id, &state.files, &reads, progress)?;
    manager.arbiter().prioritize(vbar)?;
    let state = Arc::new(state);
    manager.register_model(&state);
    tracing::info!(
        weights = state.slots.len(),
        bytes = state.slots.values().map(|s| s.bytes).sum::<u64>(),
        pinned,
        gb_per_s = format!("{:.2}", state.load_stats.gb_per_s()),
        "model loaded"
    );
    Ok(Model { state })
}

/// Reads a slot's bytes from its source into a new vector (force-cast slots and patch restores).
fn read_source(files: &[SafetensorsFile], source: &Source, bytes: u64) -> Result<Vec<u8>> {
    match source {
        Source::Memory(b) => Ok(b.clone()),
        Source::File(parts) => {
            let mut out = Vec::with_capacity(bytes as usize);
            for part in parts {
                out.extend_from_slice(&files[part.file].source().read_vec(part.offset, part.len)?);
            }
            Ok(out)
        }
    }
}

impl Model {
    /// The weights' names, in plan order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.state.slots.keys().map(String::as_str)
    }

    /// A weight's stored dtype and shape.
    pub fn info(&self, name: &str) -> Option<(DType, &[usize])> {
        self.state.slots.get(name).map(|s| (s.dtype, s.shape.as_slice()))
    }

    /// How the load read its files.
    pub fn load_stats(&self) -> LoadStats {
        self.state.load_stats
    }

    /// Weight bytes resident in device memory now.
    pub fn resident_bytes(&self) -> u64 {
        self.state.resident_bytes()
    }

    /// Marks the model as about to be used (ComfyUI's model load): top residency priority, watermark reset,
    /// its pins active until the end of the node.
    pub fn activate(&self) -> Result<()> {
        self.state.manager.arbiter().prioritize(self.state.vbar)?;
        self.state.manager.with_pins(|pins, _| pins.set_active(self.state.id, true));
        Ok(())
    }

    /// Replaces the model's patch set: `(weight name, patches)`. Weights whose patches change (gain, lose or
    /// change them) are restored from their pinned original and re-patched at their next fetch.
    pub fn set_patches(&self, patches: Vec<(String, PatchSet)>) -> Result<()> {
        let mut wanted: IndexMap<String, PatchSet> = IndexMap::new();
        for (name, set) in patches {
            match self.state.slots.get(&name) {
                None => {
                    return Err(Error::Unsupported(format!(
                        "a patch for {name}, which the model does not have"
                    )));
                }
                Some(slot)
                    if !matches!(
                        slot.quant,
                        Quant::None | Quant::Tensor(_) | Quant::Int8 { .. }
                    ) && !set.patches.is_empty() =>
                {
                    // Per-tensor scaled fp8 and int8 are re-quantized with new scales, as ComfyUI does; the
                    // block formats would need their own re-quantization.
                    return Err(Error::Unsupported(format!(
                        "a LoRA on {name}, a quantized ({} {}) weight: patching {} weights is not supported \
                         yet; use a bf16, fp8 or scaled fp8 model file",
                        slot.quant.name(),
                        slot.dtype,
                        slot.quant.name()
                    )));
                }
                Some(_) => {}
            }
            wanted.entry(name).or_default().patches.extend(set.patches);
        }
        let mut synchronised = false;
        for slot in self.state.slots.values() {
            // An empty set patches nothing: the weight keeps its original bytes.
            let new = match wanted.get(&slot.name).filter(|set| !set.patches.is_empty()) {
                Some(set) => {
                    let (image, layout) = set.pack()?;
                    let generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
                    Some(Arc::new(PackedPatches {
                        image,
                        layout,
                        generation,
                        scale: OnceLock::new(),
                    }))
                }
                None => None,
            };
            let mut current = slot.patches.lock().unwrap_or_else(|p| p.into_inner());
            let same = match (&*current, &new) {
                (None, None) => true,
                (Some(a), Some(b)) => a.image == b.image && a.layout == b.layout,
                _ => false,
            };
            if !same {
                if !synchronised {
                    // Kernels queued earlier may still read the bytes the restore is about to rewrite.
                    self.state.manager.memory().synchronize()?;
                    synchronised = true;
                }
                *current = new;
                slot.invalidate(self.state.manager.memory().as_ref());
            }
        }
        Ok(())
    }

    /// The per-layer protocol: gets `names` on the device, resident, streamed or patched. `b` computes the
    /// patches (it must be the backend of the manager's device).
    pub fn fetch<'m, B: Backend>(&'m self, b: &B, names: &[&str]) -> Result<Layer<'m>> {
        let state = &*self.state;
        let mut lane = state.manager.lane()?;
        lane.scratch.reset();
        let mut layer = Layer {
            state,
            lane: Some(lane),
            weights: Vec::with_capacity(names.len()),
            pinned: Vec::new(),
            complete: false,
        };
        // On an error the layer is dropped incomplete: its drop orders the streams and unpins what it pinned.
        layer.fill(b, names)?;
        layer.complete = true;
        Ok(layer)
    }
}

impl<'m> Layer<'m> {
    /// The body of [`Model::fetch`]: faults, copies, patches. A weight's device copy is recorded as valid
    /// (its signature stored, a plain weight marked patched) only once everything succeeded.
    fn fill<B: Backend>(&mut self, b: &B, names: &[&str]) -> Result<()> {
        let state = self.state;
        let manager = &*state.manager;
        let memory = manager.memory().clone();
        let base = state.base;
        let Some(lane) = self.lane.as_mut() else {
            return Err(Error::Unsupported("a layer without its offload lane".into()));
        };
        let stream = lane.stream;
        let mut to_patch = Vec::new();
        let mut valid_after = Vec::new();
        let mut fetched = Vec::with_capacity(names.len());
        for name in names {
            let (index, _, slot) = state
                .slots
                .get_full(*name)
                .ok_or_else(|| Error::Unsupported(format!("the model has no weight {name}")))?;
            let patches = slot.patches.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let ptr = match &slot.place {
                Place::InFile { at } => match &patches {
                    None => *at,
                    Some(p) => {
                        let dst = lane.scratch.take(slot.bytes)?;
                        state.copy_slot(slot, dst, stream)?;
                        to_patch.push((index, dst, p.clone()));
                        dst
                    }
                },
                Place::Plain { weight, original, patched } => {
                    let ptr = weight.view().ptr();
                    if let Some(p) = &patches
                        && !patched.load(Ordering::Acquire)
                    {
                        memory.copy_h2d_pageable(ptr, original)?;
                        to_patch.push((index, ptr, p.clone()));
                        valid_after.push((index, None));
                    }
                    ptr
                }
                Place::Vbar { offset, stored } => {
                    match manager.arbiter().fault(state.vbar, *offset, slot.bytes)? {
                        Fault::Resident(signature) => {
                            self.pinned.push((*offset, slot.bytes));
                            let dst = base.offset(*offset);
                            let valid = signature
                                .matches(stored.lock().unwrap_or_else(|p| p.into_inner()).as_ref());
                            if !valid {
                                state.copy_slot(slot, dst, stream)?;
                                if let Some(p) = &patches {
                                    to_patch.push((index, dst, p.clone()));
                                }
                                valid_after.push((index, Some(signature)));
                            }
                            dst
                        }
                        Fault::Offloaded => {
                            let dst = lane.scratch.take(slot.bytes)?;
                            state.copy_slot(slot, dst, stream)?;
                            if let Some(p) = &patches {
                                to_patch.push((index, dst, p.clone()));
                            }
                            dst
                        }
                    }
                }
            };
            fetched.push((index, ptr, patches));
        }
        // Patch images: one copy each, into the lane's scratch.
        let mut patch_views = Vec::with_capacity(to_patch.len());
        for (index, dst, packed) in to_patch {
            let at = lane.scratch.take(packed.layout.measure() as u64)?;
            manager.copy_patch_image(
                state.id,
                state.slots[index].module,
                &packed.image,
                packed.generation,
                at,
                stream,
            )?;
            patch_views.push((index, dst, packed, at));
        }
        let copied = memory.record(stream)?;
        memory.wait_event(StreamId::COMPUTE, copied.as_ref())?;
        for (index, dst, packed, at) in patch_views {
            let slot = &state.slots[index];
            let (views, seed) = (packed.layout.views(at), seed_for_key(&slot.name));
            if let Quant::Tensor(_) = slot.quant {
                let target = Weight::new(dst, slot.dtype, slot.shape.clone())
                    .with_quant(slot.quant, dst.offset(slot.values));
                let known = packed.scale.get().copied();
                let scale = apply_requantized(b, &target, &views, seed, known)?;
                let _ = packed.scale.set(scale);
            } else if let Quant::Int8 { .. } = slot.quant {
                let target = Weight::new(dst, slot.dtype, slot.shape.clone())
                    .with_quant(slot.quant, dst.offset(slot.values));
                apply_requantized_int8(b, &target, &views, seed)?;
            } else {
                apply(b, &Weight::new(dst, slot.dtype, slot.shape.clone()), &views, seed)?;
            }
        }
        for (index, ptr, patches) in fetched {
            self.weights.push((index, ptr, state.slots[index].quant_read(patches.as_deref())?));
        }
        for (index, signature) in valid_after {
            match (&state.slots[index].place, signature) {
                (Place::Vbar { stored, .. }, Some(signature)) => {
                    *stored.lock().unwrap_or_else(|p| p.into_inner()) = Some(signature);
                }
                (Place::Plain { patched, .. }, None) => patched.store(true, Ordering::Release),
                _ => {}
            }
        }
        Ok(())
    }
}

impl Slot {
    /// The quantization its readers see: a per-tensor scaled weight patched with `patches` has the scale it
    /// was re-quantized with.
    fn quant_read(&self, patches: Option<&PackedPatches>) -> Result<Quant> {
        match (self.quant, patches) {
            (Quant::Tensor(_), Some(p)) => {
                p.scale.get().map(|&s| Quant::Tensor(s)).ok_or_else(|| {
                    Error::Unsupported(format!(
                        "{}: a patched scaled weight without its new scale",
                        self.name
                    ))
                })
            }
            (quant, _) => Ok(quant),
        }
    }

    /// Forgets that the device copy is valid (the patch set changed): the next fetch copies the original
    /// again and re-applies the patches — the restore.
    fn invalidate(&self, memory: &dyn DeviceMemory) {
        match &self.place {
            // Patched in scratch at each fetch: the file is never written.
            Place::InFile { .. } => {}
            Place::Vbar { stored, .. } => *stored.lock().unwrap_or_else(|p| p.into_inner()) = None,
            Place::Plain { patched, weight, original } => {
                patched.store(false, Ordering::Release);
                // A plain weight is restored now, so one without patches reads its original again.
                if let Err(e) = memory.copy_h2d_pageable(weight.view().ptr(), original) {
                    tracing::warn!(weight = %self.name, error = %e, "restoring a weight failed");
                }
            }
        }
    }
}

impl ModelState {
    /// Queues the copy of a slot's original bytes to `dst` on `stream`: from its pin when it has one, else
    /// from its file through the staging ring, else (bytes given in memory) from pageable memory.
    fn copy_slot(&self, slot: &Slot, dst: DevPtr, stream: StreamId) -> Result<()> {
        let manager = &*self.manager;
        if manager.copy_from_pin(self.id, slot.module, slot.bytes, dst, stream)? {
            return Ok(());
        }
        match &slot.source {
            Source::File(parts) => {
                let mut at = dst;
                for part in parts {
                    let source = self.files[part.file].source();
                    manager.copy_file(source, part.offset, part.len, at, stream)?;
                    at = at.offset(part.len);
                }
                Ok(())
            }
            Source::Memory(bytes) => {
                manager.note_pageable(&slot.name, slot.bytes);
                manager.memory().copy_h2d_pageable(dst, bytes)
            }
        }
    }

    pub(crate) fn resident_bytes(&self) -> u64 {
        self.manager.arbiter().loaded_bytes(self.vbar).unwrap_or(0)
    }

    pub(crate) fn host_bytes(&self) -> u64 {
        self.manager.with_pins(|pins, _| pins.pinned_bytes(self.id))
    }

    pub(crate) fn registered_bytes(&self) -> u64 {
        self.manager.with_pins(|pins, _| {
            [Subset::Weights, Subset::Patches]
                .iter()
                .filter_map(|s| pins.stats(self.id, *s))
                .map(|s| s.registered_bytes)
                .sum()
        })
    }

    /// Frees the model's device pages (its pins stay, so the next use needs no disk read). Returns the bytes.
    pub(crate) fn unload(&self) -> Result<u64> {
        let freed = self.manager.arbiter().free_memory(self.vbar, u64::MAX)?;
        self.manager.arbiter().deprioritize(self.vbar)?;
        for slot in self.slots.values() {
            if let Place::Vbar { stored, .. } = &slot.place {
                *stored.lock().unwrap_or_else(|p| p.into_inner()) = None;
            }
        }
        Ok(freed)
    }
}

impl Drop for ModelState {
    fn drop(&mut self) {
        if let Err(e) = self.manager.memory().synchronize() {
            tracing::warn!(error = %e, "synchronising before freeing a model failed");
        }
        self.manager.forget_model(self.id);
        if let Err(e) = self.manager.arbiter().destroy(self.vbar) {
            tracing::warn!(error = %e, "freeing a model's device memory failed");
        }
    }
}

/// A layer's weights on the device, from [`Model::fetch`]. Dropping it ends their use.
pub struct Layer<'m> {
    state: &'m ModelState,
    lane: Option<MutexGuard<'m, Lane>>,
    /// `(slot index, address, quantization as read)`.
    weights: Vec<(usize, DevPtr, Quant)>,
    /// VBAR ranges faulted resident (unpinned on drop).
    pinned: Vec<(u64, u64)>,
    /// Whether the fetch finished (else the compute stream has not waited for the lane's copies yet).
    complete: bool,
}

impl std::fmt::Debug for Layer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> =
            self.weights.iter().map(|&(index, ..)| self.state.slots[index].name.as_str()).collect();
        write!(f, "Layer({names:?})")
    }
}

impl Layer<'_> {
    /// The i-th weight asked for.
    pub fn weight(&self, i: usize) -> Weight<'_> {
        let (index, ptr, quant) = self.weights[i];
        let slot = &self.state.slots[index];
        Weight::new(ptr, slot.dtype, slot.shape.clone()).with_quant(quant, ptr.offset(slot.values))
    }

    /// A weight by name (one of the names fetched).
    pub fn get(&self, name: &str) -> Result<Weight<'_>> {
        let i = self
            .weights
            .iter()
            .position(|&(index, ..)| self.state.slots[index].name == name)
            .ok_or_else(|| {
            Error::Unsupported(format!("{name} was not fetched with this layer"))
        })?;
        Ok(self.weight(i))
    }

    /// Number of weights.
    pub fn len(&self) -> usize {
        self.weights.len()
    }

    /// Whether it holds no weight.
    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }
}

impl Drop for Layer<'_> {
    fn drop(&mut self) {
        let manager = &*self.state.manager;
        for &(offset, size) in &self.pinned {
            if let Err(e) = manager.arbiter().unpin(self.state.vbar, offset, size) {
                tracing::warn!(error = %e, "unpinning a layer's weights failed");
            }
        }
        if let Some(lane) = &self.lane {
            let memory = manager.memory();
            // An incomplete fetch may have queued copies the compute stream never waited for: order them first,
            // so nothing later reads a range before its copy lands.
            let copies = if self.complete {
                Ok(())
            } else {
                memory
                    .record(lane.stream)
                    .and_then(|e| memory.wait_event(StreamId::COMPUTE, e.as_ref()))
            };
            let done = copies
                .and_then(|()| memory.record(StreamId::COMPUTE))
                .and_then(|e| memory.wait_event(lane.stream, e.as_ref()));
            if let Err(e) = done {
                tracing::warn!(error = %e, "ordering the offload stream after the compute stream failed");
            }
        }
    }
}
