//! [`MemoryManager`]: one per device. It owns the VRAM [`Arbiter`], the offload lanes (an offload stream and
//! its scratch buffer each) and the list of loaded models, and runs the per-node reset.
//!
//! Models are loaded through it ([`MemoryManager::load`], [`MemoryManager::load_tensors`]) and read layer by
//! layer through [`super::Model::fetch`], the one way model code gets its weights.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::device::{DevPtr, DeviceMemory, StreamId};
use super::host::{HostBuffer, HostBufferConfig};
use super::loader::{FileSource, LoadOptions, LoadStats, SafetensorsFile};
use super::model::ModelState;
use super::pins::{ModelId, ModuleId, PinBacking, PinConfig, PinEnv, PinOutcome, Pins, Subset};
use super::pressure::{
    Arbitration, CacheThresholds, OutputCache, PinReleaser, RamProbe, SystemRam,
    arbitrate_after_node,
};
use super::ring::{RingConfig, StagingRing};
use super::vram::{Arbiter, Scratch, VramConfig};
use crate::error::{Error, Result};

/// The manager's settings (memory-manager.md §10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagerConfig {
    /// The VRAM side: headroom (`--reserve-vram`), page size, scratch sizes, …
    pub vram: VramConfig,
    /// Weights of at most this many bytes are loaded as plain device tensors, not VBAR slots (16 KiB).
    pub force_cast_max: u64,
    /// Weights under this many bytes take the lowest VBAR addresses, i.e. the highest residency priority
    /// (64 KiB).
    pub small_first: u64,
    /// Offload streams, used round-robin by [`super::Model::fetch`] (2).
    pub offload_streams: usize,
    /// The pin budgets: the registration cap (0: `--disable-pinned-memory`) and the RAM floor.
    pub pins: PinConfig,
    /// How the weights' host buffers grow.
    pub host: HostBufferConfig,
    /// How files are read.
    pub load: LoadOptions,
}

impl ManagerConfig {
    /// ComfyUI's defaults for this machine: the registration cap and the RAM floor follow its RAM (cgroup
    /// limits included) and the RAM-pressure cache's active threshold; `pinned: false` turns pinning off.
    pub fn for_this_machine(pinned: bool) -> ManagerConfig {
        let pins = match (pinned, SystemRam::new().snapshot()) {
            (true, Some(ram)) => {
                PinConfig::linux(&ram, CacheThresholds::defaults(ram.total).active)
            }
            _ => PinConfig::disabled(),
        };
        ManagerConfig {
            vram: VramConfig::default(),
            pins,
            force_cast_max: 16 << 10,
            small_first: 64 << 10,
            offload_streams: 2,
            host: HostBufferConfig::weights(),
            load: LoadOptions::default(),
        }
    }
}

/// An offload stream and the scratch buffer weights that are not resident are copied into.
pub(crate) struct Lane {
    pub(crate) stream: StreamId,
    pub(crate) scratch: Scratch,
}

/// What the manager holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManagerStats {
    /// Device bytes the budget counts (weights, scratch, activations).
    pub usage: u64,
    /// Device memory.
    pub capacity: u64,
    /// The budget: device memory minus the headroom.
    pub budget: u64,
    /// Weight bytes resident in VBARs.
    pub resident_weights: u64,
    /// Models loaded.
    pub models: usize,
    /// Host bytes holding weights.
    pub host_bytes: u64,
    /// Of those, registered (page-locked).
    pub registered_bytes: u64,
    /// Copies that could not use registered memory (each one logged).
    pub pageable_copies: u64,
    /// Models built since the manager started (every load of a file counts, a reload too).
    pub loads: u64,
}

/// The memory manager of one device.
pub struct MemoryManager {
    memory: Arc<dyn DeviceMemory>,
    arbiter: Arc<Arbiter>,
    config: ManagerConfig,
    lanes: Vec<Mutex<Lane>>,
    next_lane: AtomicUsize,
    models: Mutex<Vec<Weak<ModelState>>>,
    next_model: AtomicU64,
    pins: Mutex<PinState>,
    ram: Arc<dyn RamProbe + Send + Sync>,
    ring: Mutex<Option<StagingRing>>,
    pageable_copies: AtomicU64,
}

/// Frees inactive models' pins for the RAM arbitration, locking the books for each request only.
struct ManagerPins<'a>(&'a MemoryManager);

impl PinReleaser for ManagerPins<'_> {
    fn free_inactive_pins(&mut self, bytes: u64) -> u64 {
        self.0.with_pins(|pins, backing| pins.free_pins(backing, bytes, false, false))
    }
}

/// The pin books and the host buffers behind them.
struct PinState {
    pins: Pins,
    backing: HostPins,
    /// The generation of the patch image each module's `patches` pin holds: a pin that is still the
    /// module's is rewritten when its weight's patches changed since (within a node).
    images: HashMap<(ModelId, ModuleId), u64>,
}

/// [`PinBacking`] over one [`HostBuffer`] per (model, subset).
struct HostPins {
    memory: Arc<dyn DeviceMemory>,
    config: HostBufferConfig,
    buffers: HashMap<(ModelId, Subset), Arc<HostBuffer>>,
    /// Largest size of each model's buffers (its weights' bytes).
    sizes: HashMap<ModelId, usize>,
}

impl HostPins {
    fn buffer(&mut self, model: ModelId, subset: Subset) -> Arc<HostBuffer> {
        let max = self.sizes.get(&model).copied().unwrap_or(1 << 30);
        let config = if subset.is_patches() { HostBufferConfig::patches() } else { self.config };
        self.buffers.entry((model, subset)).or_insert_with(|| HostBuffer::new(max, config)).clone()
    }

    fn existing(&self, model: ModelId, subset: Subset) -> Result<Arc<HostBuffer>> {
        self.buffers.get(&(model, subset)).cloned().ok_or_else(|| {
            Error::Host(format!("model {} has no {} buffer", model.0, subset.name()))
        })
    }
}

impl PinBacking for HostPins {
    fn extend(&mut self, model: ModelId, subset: Subset, size: u64) -> Result<u64> {
        let len = usize::try_from(size).map_err(|_| Error::Host(format!("a {size}-byte pin")))?;
        Ok(self.buffer(model, subset).extend(len, false)? as u64)
    }

    fn register(&mut self, model: ModelId, subset: Subset, offset: u64, size: u64) -> Result<()> {
        self.existing(model, subset)?.register(&self.memory, offset as usize, size as usize)
    }

    fn unregister(&mut self, model: ModelId, subset: Subset, offset: u64) -> Result<()> {
        // Copies queued from the range must finish first.
        self.memory.synchronize()?;
        self.existing(model, subset)?.unregister(offset as usize)
    }

    fn truncate(&mut self, model: ModelId, subset: Subset, offset: u64) -> Result<()> {
        self.memory.synchronize()?;
        self.existing(model, subset)?.truncate(offset as usize)
    }
}

impl std::fmt::Debug for MemoryManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemoryManager({} lanes)", self.lanes.len())
    }
}

impl MemoryManager {
    /// A manager for `memory` (the backend's device memory).
    pub fn new(memory: Arc<dyn DeviceMemory>, config: ManagerConfig) -> Result<Arc<MemoryManager>> {
        MemoryManager::with_ram(memory, config, Arc::new(SystemRam::new()))
    }

    /// A manager that reads available RAM through `ram` (tests and embedders with their own accounting).
    pub fn with_ram(
        memory: Arc<dyn DeviceMemory>,
        config: ManagerConfig,
        ram: Arc<dyn RamProbe + Send + Sync>,
    ) -> Result<Arc<MemoryManager>> {
        if config.offload_streams == 0 {
            return Err(Error::Unsupported(
                "the memory manager needs at least one offload stream".into(),
            ));
        }
        let arbiter = Arc::new(Arbiter::new(memory.clone(), config.vram.clone())?);
        let mut lanes = Vec::with_capacity(config.offload_streams);
        for _ in 0..config.offload_streams {
            let stream = memory.new_stream()?;
            lanes
                .push(Mutex::new(Lane { stream, scratch: Scratch::new(arbiter.clone(), stream)? }));
        }
        Ok(Arc::new(MemoryManager {
            models: Mutex::new(Vec::new()),
            next_model: AtomicU64::new(1),
            pins: Mutex::new(PinState {
                pins: Pins::new(config.pins),
                backing: HostPins {
                    memory: memory.clone(),
                    config: config.host,
                    buffers: HashMap::new(),
                    sizes: HashMap::new(),
                },
                images: HashMap::new(),
            }),
            ram,
            ring: Mutex::new(None),
            memory,
            arbiter,
            config,
            lanes,
            next_lane: AtomicUsize::new(0),
            pageable_copies: AtomicU64::new(0),
        }))
    }

    /// The device memory.
    pub fn memory(&self) -> &Arc<dyn DeviceMemory> {
        &self.memory
    }

    /// The VRAM arbiter.
    pub fn arbiter(&self) -> &Arc<Arbiter> {
        &self.arbiter
    }

    /// The settings.
    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }

    /// A free offload lane, round-robin. Every lane held (by layers not yet dropped) is an error rather than
    /// a deadlock: a forward pass holds at most one layer per lane at a time.
    pub(crate) fn lane(&self) -> Result<MutexGuard<'_, Lane>> {
        let n = self.lanes.len();
        let start = self.next_lane.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            match self.lanes[(start + i) % n].try_lock() {
                Ok(lane) => return Ok(lane),
                Err(std::sync::TryLockError::Poisoned(p)) => return Ok(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
        }
        Err(Error::Unsupported(format!(
            "all {n} offload lanes are in use: drop a fetched layer before fetching another"
        )))
    }

    pub(crate) fn register_model(&self, model: &Arc<ModelState>) {
        let mut models = self.models.lock().unwrap_or_else(|p| p.into_inner());
        models.retain(|m| m.strong_count() > 0);
        models.push(Arc::downgrade(model));
    }

    fn live_models(&self) -> Vec<Arc<ModelState>> {
        let mut models = self.models.lock().unwrap_or_else(|p| p.into_inner());
        models.retain(|m| m.strong_count() > 0);
        models.iter().filter_map(Weak::upgrade).collect()
    }

    pub(crate) fn next_model_id(&self) -> ModelId {
        ModelId(self.next_model.fetch_add(1, Ordering::Relaxed))
    }

    /// The pin books, their host buffers and the patch images they hold, locked.
    fn pin_state(&self) -> MutexGuard<'_, PinState> {
        self.pins.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the pin books and their host buffers.
    pub(crate) fn with_pins<T>(&self, f: impl FnOnce(&mut Pins, &mut dyn PinBacking) -> T) -> T {
        let mut state = self.pin_state();
        let PinState { pins, backing, .. } = &mut *state;
        f(pins, backing)
    }

    /// Pins `bytes` for a weight of `model` (§7.2); the model's weights buffer may grow to `model_bytes`.
    pub(crate) fn pin_weight(
        &self,
        model: ModelId,
        module: ModuleId,
        bytes: u64,
        model_bytes: u64,
    ) -> Result<PinOutcome> {
        let mut state = self.pin_state();
        let PinState { pins, backing, .. } = &mut *state;
        backing.sizes.entry(model).or_insert(usize::try_from(model_bytes).unwrap_or(usize::MAX));
        let mut env = PinEnv { backing, ram: self.ram.as_ref(), outputs: None };
        pins.pin(&mut env, model, Subset::Weights, module, bytes)
    }

    /// Writes bytes into a weight's pin.
    pub(crate) fn write_pin(&self, model: ModelId, offset: u64, bytes: &[u8]) -> Result<()> {
        let buf = self.pin_state().backing.existing(model, Subset::Weights)?;
        buf.write_at(offset as usize, bytes)
    }

    /// Reads `(file, tensor, offset in the weights buffer)` items into `model`'s pins on the reader threads,
    /// reporting progress over all files.
    pub(crate) fn read_into_pins(
        &self,
        model: ModelId,
        files: &[SafetensorsFile],
        reads: &[(usize, String, usize)],
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<LoadStats> {
        let mut stats = LoadStats { bytes: 0, seconds: 0.0 };
        if reads.is_empty() {
            return Ok(stats);
        }
        let buf = self.pin_state().backing.existing(model, Subset::Weights)?;
        let total: u64 = reads
            .iter()
            .map(|(f, name, _)| files[*f].tensor(name).map(|t| t.len))
            .sum::<Result<u64>>()?;
        let mut before = 0;
        for (index, file) in files.iter().enumerate() {
            let plan: Vec<(&str, usize)> = reads
                .iter()
                .filter(|(f, ..)| *f == index)
                .map(|(_, name, at)| (name.as_str(), *at))
                .collect();
            if plan.is_empty() {
                continue;
            }
            let s = file.load(&buf, &plan, &self.config.load, &mut |done, _| {
                progress(before + done, total)
            })?;
            before += s.bytes;
            stats.bytes += s.bytes;
            stats.seconds += s.seconds;
        }
        Ok(stats)
    }

    /// Queues the copy of a weight's pinned bytes to `dst`; `false` when it has no pin. A pin that lost its
    /// registration is re-registered when room can be made (the registration swap), else copied pageable.
    pub(crate) fn copy_from_pin(
        &self,
        model: ModelId,
        module: ModuleId,
        bytes: u64,
        dst: DevPtr,
        stream: StreamId,
    ) -> Result<bool> {
        let mut state = self.pin_state();
        let PinState { pins, backing, .. } = &mut *state;
        let Some(pin) = pins.get_pin(backing, model, Subset::Weights, module) else {
            return Ok(false);
        };
        let buf = backing.existing(model, Subset::Weights)?;
        if !pin.registered {
            self.note_pageable("weight", bytes);
        }
        // Queued while the books are locked, so no eviction can free or reuse the pin before the copy holds
        // the buffer (queuing does not block).
        buf.copy_h2d(self.memory.as_ref(), pin.offset as usize, bytes as usize, dst, stream)?;
        drop(state);
        Ok(true)
    }

    /// Queues the copy of `len` file bytes at `offset` to `dst` through the staging ring (a weight without a
    /// pin).
    pub(crate) fn copy_file(
        &self,
        source: &FileSource,
        offset: u64,
        len: u64,
        dst: DevPtr,
        stream: StreamId,
    ) -> Result<()> {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if ring.is_none() {
            *ring = Some(StagingRing::new(self.memory.clone(), RingConfig::default())?);
        }
        match ring.as_ref() {
            Some(ring) => ring.copy_file(source, offset, len, dst, stream),
            None => Err(Error::Host("the staging ring could not be made".into())),
        }
    }

    /// Queues one copy of a weight's packed patch image to `dst`, from a `patches` pin, or pageable when no
    /// pin can be had. `generation` names the image: a pin is (re)written when it is new, stolen, or holds an
    /// older generation (the weight's patches changed within the node); a pin of another size is not used.
    pub(crate) fn copy_patch_image(
        &self,
        model: ModelId,
        module: ModuleId,
        image: &[u8],
        generation: u64,
        dst: DevPtr,
        stream: StreamId,
    ) -> Result<()> {
        let len = image.len() as u64;
        let mut state = self.pin_state();
        let PinState { pins, backing, images } = &mut *state;
        let outcome = {
            let mut env = PinEnv { backing: &mut *backing, ram: self.ram.as_ref(), outputs: None };
            pins.pin(&mut env, model, Subset::Patches, module, len)?
        };
        let pin = match outcome.pin() {
            Some(pin) if pin.size == len => pin,
            _ => {
                drop(state);
                self.note_pageable("patches", len);
                return self.memory.copy_h2d_pageable(dst, image);
            }
        };
        let buf = backing.existing(model, Subset::Patches)?;
        // `Some(sync)`: the pin must be written, after a device sync when copies may still read it.
        let write = match outcome {
            PinOutcome::Created(_) => Some(false),
            // The victim's copies may still read the pin.
            PinOutcome::Stolen { .. } => Some(true),
            // The pin holds an older image when the weight's patches changed since it was written; copies of
            // that image may still read it.
            PinOutcome::Existing(_) | PinOutcome::NotPinned => {
                (images.get(&(model, module)) != Some(&generation)).then_some(true)
            }
        };
        if let Some(sync) = write {
            // A failed write leaves no record, so the next use writes again.
            images.remove(&(model, module));
            if sync {
                self.memory.synchronize()?;
            }
            buf.write_at(pin.offset as usize, image)?;
            images.insert((model, module), generation);
        }
        if !pin.registered {
            self.note_pageable("patches", len);
        }
        // Queued under the books' lock, as in `copy_from_pin`.
        buf.copy_h2d(self.memory.as_ref(), pin.offset as usize, image.len(), dst, stream)
    }

    /// Forgets a dropped model's pins and host buffers.
    pub(crate) fn forget_model(&self, model: ModelId) {
        let mut state = self.pin_state();
        let PinState { pins, backing, images } = &mut *state;
        pins.remove_model(backing, model);
        backing.buffers.retain(|(m, _), _| *m != model);
        images.retain(|(m, _), _| *m != model);
        backing.sizes.remove(&model);
    }

    /// Counts and logs a copy that could not come from registered memory.
    pub(crate) fn note_pageable(&self, what: &str, bytes: u64) {
        let n = self.pageable_copies.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::debug!(what, bytes, total = n, "pageable copy (host memory not registered)");
        if n == 1 {
            tracing::warn!(
                "weights are copied from pageable host memory (pinned memory is off or unavailable): \
                 transfers run at a fraction of the link's speed"
            );
        }
    }

    /// The reset after every node (§4.4): waits for the offload streams, empties the scratch buffers'
    /// bump pointers, lifts every VBAR's watermark limit, drops the LoRA patch pins and marks every model
    /// inactive.
    pub fn after_node(&self) -> Result<()> {
        self.memory.synchronize()?;
        for lane in &self.lanes {
            match lane.try_lock() {
                Ok(mut lane) => lane.scratch.reset(),
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().scratch.reset(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    return Err(Error::Unsupported(
                        "a node ended while one of its layers was still held: drop every fetched layer first".into(),
                    ));
                }
            }
        }
        self.arbiter.reset_limits();
        let mut state = self.pin_state();
        let PinState { pins, backing, images } = &mut *state;
        pins.reset_node(backing);
        images.clear();
        Ok(())
    }

    /// The RAM arbitration after a node in RAM-pressure cache mode (§7.6): older prompts' cached outputs, then
    /// large current ones, then inactive models' pins give way until `thresholds.active` bytes of RAM are
    /// available.
    pub fn arbitrate_ram(
        &self,
        thresholds: &CacheThresholds,
        outputs: &mut dyn OutputCache,
    ) -> Arbitration {
        // The pin books are locked only while pins are freed: evicting cached outputs may drop the last handle
        // to a model, whose drop takes the books' lock itself.
        let mut releaser = ManagerPins(self);
        arbitrate_after_node(
            thresholds,
            self.ram.as_ref(),
            outputs,
            &mut releaser,
            &mut std::thread::sleep,
        )
    }

    /// Unloads every model from the device: their VBAR pages are freed and their host memory unregistered
    /// (it stays in RAM, so the next use faults the weights back in without reading the disk). Returns the
    /// device bytes freed.
    pub fn unload_all(&self) -> Result<u64> {
        self.memory.synchronize()?;
        let mut freed = 0;
        for model in self.live_models() {
            freed += model.unload()?;
        }
        Ok(freed)
    }

    /// What the manager holds now.
    pub fn stats(&self) -> ManagerStats {
        let models = self.live_models();
        let capacity = self.arbiter.capacity();
        ManagerStats {
            usage: self.arbiter.usage(),
            capacity,
            budget: capacity.saturating_sub(self.arbiter.headroom()),
            resident_weights: models.iter().map(|m| m.resident_bytes()).sum(),
            models: models.len(),
            host_bytes: models.iter().map(|m| m.host_bytes()).sum(),
            registered_bytes: models.iter().map(|m| m.registered_bytes()).sum(),
            pageable_copies: self.pageable_copies.load(Ordering::Relaxed),
            loads: self.next_model.load(Ordering::Relaxed).saturating_sub(1),
        }
    }
}
