//! Pinned memory management (memory-manager.md §7): which weights get a RAM copy in a growable host buffer
//! (a *pin*), which pins stay registered (page-locked, so copies from them are DMA) under the registration
//! cap, and which pins give their RAM back when RAM runs short.
//!
//! **Books, not buffers.** [`Pins`] keeps, per model and [`Subset`], a stack of pins (module, offset, size),
//! the highest registered index (`split`), the registered bytes, and per-size stealing buckets; globally it
//! keeps the registered bytes against [`PinConfig::cap`]. Every action on host memory — extending a subset's
//! buffer, registering a range, unregistering it, truncating the buffer — goes through [`PinBacking`], which
//! the memory manager implements over its pinned host buffers and the tests implement with a recording fake.
//! The books change only after the action they record has succeeded, so a failing backing never leaves them
//! claiming memory that is not there. Backing failures are not errors of the caller: as upstream, a pin that
//! cannot be made is simply not made (the weight is streamed another way), and the failure is logged.
//!
//! **Two budgets** (§7.3). A new pin needs RAM — available RAM must stay above a floor of
//! `max(active cache threshold / 2, 2 GiB)`, else pins are *freed* (`free_pins`, 256 MiB extra) — and it
//! needs registration room under the cap, else pins are *unregistered* without freeing their RAM
//! (`free_registrations`, 2 GiB extra: each unregistration costs a device sync). An unregistered pin is
//! re-registered when next used ([`Pins::get_pin`], the registration swap), so RAM copies may exceed the
//! cap while only the hot set is page-locked. **Invariant: the registered bytes never exceed the cap.**
//!
//! **Stealing** (§7.5, HEAD). Each module gets a priority `bit_reverse16(counter++)` on its first pin
//! attempt. When a pin cannot be made, the module takes the pin of the lowest-priority module of *identical
//! size* in the same set, if that priority is strictly lower than its own; the caller must let copies from
//! the pin finish before overwriting it (it learns the victim from [`PinOutcome::Stolen`]). The effect is
//! that the weights left unpinned are spread evenly through the model.
//!
//! **Who goes first** when RAM or registrations are taken back: see `tiers.rs` (§7.4, §7.5): models by
//! tier (not in the prompt, `-loaded` copies, inactive in the prompt, active), oldest loaded first, and
//! within a subset the most recent pin first. Models are named by [`ModelId`]s the caller picks; whether a
//! model is active, in the current prompt, and when it was last loaded is told by the caller.
//!
//! After every node, [`Pins::reset_node`] drops every patch pin (LoRA pins never outlive their node, §6.3)
//! and marks every model inactive.

mod config;
mod subset;
mod tiers;

use std::collections::BTreeMap;

pub use config::{
    MIN_PIN_RAM_FLOOR, PIN_PRESSURE_HYSTERESIS, PinConfig, REGISTERABLE_PIN_HYSTERESIS,
    linux_pin_cap, windows_pin_cap,
};

use crate::error::{Error, Result};
use crate::memory::pressure::{OutputCache, PinReleaser, RamProbe};
use subset::{Slot, SubsetPins};
use tiers::{Tier, free_tiers, registration_tiers};

/// A model (on one device), as the caller names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelId(pub u64);

/// A module of a model whose weights get one pin per subset (a layer, with its weight and bias).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModuleId(pub u64);

/// Which of a model's pin sets (§7.1); each has its own host buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Subset {
    /// Weights streamed from RAM (offloaded: not resident in VRAM).
    Weights,
    /// Packed LoRA/adapter tensors; dropped after every node.
    Patches,
    /// RAM copies of weights resident in VRAM, kept so a later eviction costs no disk read (HEAD, #15027).
    WeightsLoaded,
    /// RAM copies of patches of resident weights; dropped after every node.
    PatchesLoaded,
}

impl Subset {
    /// Every subset, in the order a model gives pins back (HEAD): `-loaded` copies first.
    pub const ALL: [Subset; 4] =
        [Subset::WeightsLoaded, Subset::PatchesLoaded, Subset::Weights, Subset::Patches];

    /// Whether it holds RAM copies of VRAM-resident data (a `-loaded` subset).
    pub fn is_loaded(self) -> bool {
        matches!(self, Subset::WeightsLoaded | Subset::PatchesLoaded)
    }

    /// Whether it holds patches (dropped after every node).
    pub fn is_patches(self) -> bool {
        matches!(self, Subset::Patches | Subset::PatchesLoaded)
    }

    /// Upstream's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Subset::Weights => "weights",
            Subset::Patches => "patches",
            Subset::WeightsLoaded => "weights-loaded",
            Subset::PatchesLoaded => "patches-loaded",
        }
    }

    fn index(self) -> usize {
        match self {
            Subset::WeightsLoaded => 0,
            Subset::PatchesLoaded => 1,
            Subset::Weights => 2,
            Subset::Patches => 3,
        }
    }
}

/// A pin: `size` bytes at `offset` of its (model, subset) host buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin {
    /// First byte in the subset's host buffer.
    pub offset: u64,
    /// Length in bytes.
    pub size: u64,
    /// Whether the range is registered now (copies from it are DMA); an unregistered pin is still a valid,
    /// slower copy source.
    pub registered: bool,
}

/// What [`Pins::pin`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinOutcome {
    /// The module already had a pin (re-registered if it had lost its registration and room was found).
    Existing(Pin),
    /// A new pin was cut from the host buffer and registered; it holds no data yet.
    Created(Pin),
    /// The module took `victim`'s pin; its bytes are the victim's until overwritten, so the caller waits for
    /// copies queued from it first.
    Stolen {
        /// The pin, now the module's.
        pin: Pin,
        /// The module that lost it.
        victim: ModuleId,
    },
    /// No pin: pinning is off, or neither the budgets nor stealing allowed one.
    NotPinned,
}

impl PinOutcome {
    /// The module's pin, if it has one now.
    pub fn pin(&self) -> Option<Pin> {
        match *self {
            PinOutcome::Existing(pin)
            | PinOutcome::Created(pin)
            | PinOutcome::Stolen { pin, .. } => Some(pin),
            PinOutcome::NotPinned => None,
        }
    }
}

/// The host-memory actions behind the pin books: one growable host buffer per (model, subset).
///
/// Offsets are bytes from the start of that buffer. An implementation over the pinned host buffer maps
/// `extend` to `HostBuffer::extend(size, register = false)`, `register`/`unregister` to its range
/// (un)registration, and `truncate` to `HostBuffer::truncate(offset, unregister = false)`.
pub trait PinBacking {
    /// Grows the buffer by `size` bytes without registering them and returns where the new range starts (the
    /// old end). Fails when the buffer cannot grow (its reservation is full, RAM cannot be committed).
    fn extend(&mut self, model: ModelId, subset: Subset, size: u64) -> Result<u64>;

    /// Registers (page-locks) `[offset, offset + size)`.
    fn register(&mut self, model: ModelId, subset: Subset, offset: u64, size: u64) -> Result<()>;

    /// Undoes the registration that starts at `offset`. Copies queued from the range must have finished when
    /// it returns (the implementation waits for them).
    fn unregister(&mut self, model: ModelId, subset: Subset, offset: u64) -> Result<()>;

    /// Shrinks the buffer to `offset` bytes, giving the RAM above back (asynchronously is fine; `0` empties
    /// the buffer but keeps it usable). Everything above `offset` is already unregistered, and copies queued
    /// from it must have finished when it returns.
    fn truncate(&mut self, model: ModelId, subset: Subset, offset: u64) -> Result<()>;
}

/// What [`Pins::pin`] works with besides the books.
pub struct PinEnv<'a> {
    /// The host buffers.
    pub backing: &'a mut dyn PinBacking,
    /// Available RAM.
    pub ram: &'a dyn RamProbe,
    /// The node-output cache in RAM-pressure mode, whose inactive entries give way to a new pin; `None` in
    /// the other cache modes.
    pub outputs: Option<&'a mut dyn OutputCache>,
}

/// A snapshot of one pin set, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubsetStats {
    /// Pins on the stack.
    pub pins: usize,
    /// Bytes of RAM they hold.
    pub bytes: u64,
    /// Bytes of them registered.
    pub registered_bytes: u64,
    /// Highest registered stack index.
    pub split: Option<usize>,
}

#[derive(Debug)]
struct ModelPins {
    loaded_seq: u64,
    active: bool,
    in_prompt: bool,
    subsets: [SubsetPins; 4],
}

/// The pin books of every model (one per process: registration is a host-wide resource).
#[derive(Debug)]
pub struct Pins {
    config: PinConfig,
    registered: u64,
    models: BTreeMap<ModelId, ModelPins>,
    clock: u64,
}

impl Pins {
    /// No models, nothing pinned.
    pub fn new(config: PinConfig) -> Pins {
        Pins { config, registered: 0, models: BTreeMap::new(), clock: 0 }
    }

    /// The settings.
    pub fn config(&self) -> &PinConfig {
        &self.config
    }

    /// Bytes registered now, all models together (`TOTAL_PINNED_MEMORY`); never above the cap.
    pub fn registered_bytes(&self) -> u64 {
        self.registered
    }

    /// Records a model load: adds the model if new, makes it the most recently loaded (the last to lose
    /// pins in its tier) and active.
    pub fn load_model(&mut self, model: ModelId) {
        self.clock += 1;
        let seq = self.clock;
        let entry = self.models.entry(model).or_insert_with(|| ModelPins {
            loaded_seq: seq,
            active: true,
            in_prompt: false,
            subsets: Default::default(),
        });
        entry.loaded_seq = seq;
        entry.active = true;
    }

    /// Marks a model active (running in the current node) or not; unknown models are ignored.
    pub fn set_active(&mut self, model: ModelId, active: bool) {
        if let Some(m) = self.models.get_mut(&model) {
            m.active = active;
        }
    }

    /// Marks a model as used by the current prompt or not; unknown models are ignored.
    pub fn set_in_prompt(&mut self, model: ModelId, in_prompt: bool) {
        if let Some(m) = self.models.get_mut(&model) {
            m.in_prompt = in_prompt;
        }
    }

    /// Marks exactly `models` as used by the current prompt (at a prompt's start).
    pub fn set_prompt_models(&mut self, models: &[ModelId]) {
        for (id, m) in &mut self.models {
            m.in_prompt = models.contains(id);
        }
    }

    /// Frees every pin of a model that is going away and forgets it; returns the bytes freed.
    pub fn remove_model(&mut self, backing: &mut dyn PinBacking, model: ModelId) -> u64 {
        let freed =
            Subset::ALL.iter().map(|&s| self.free_subset(backing, model, s, u64::MAX)).sum();
        let emptied =
            self.models.get(&model).is_some_and(|m| m.subsets.iter().all(|s| s.stack.is_empty()));
        if emptied {
            self.models.remove(&model);
        } else if self.models.contains_key(&model) {
            tracing::warn!(
                model = model.0,
                "pins: a removed model keeps pins its host buffers would not free"
            );
        }
        freed
    }

    /// The state of one pin set, if the model is known.
    pub fn stats(&self, model: ModelId, subset: Subset) -> Option<SubsetStats> {
        let set = &self.models.get(&model)?.subsets[subset.index()];
        Some(SubsetStats {
            pins: set.stack.len(),
            bytes: set.stack.iter().map(|s| s.size).sum(),
            registered_bytes: set.registered_bytes,
            split: set.split,
        })
    }

    /// RAM held by a model's pins, all subsets.
    pub fn pinned_bytes(&self, model: ModelId) -> u64 {
        self.models
            .get(&model)
            .map_or(0, |m| m.subsets.iter().flat_map(|s| &s.stack).map(|s| s.size).sum())
    }

    /// A module's pin as it stands, without side effects.
    pub fn pin_of(&self, model: ModelId, subset: Subset, module: ModuleId) -> Option<Pin> {
        let set = &self.models.get(&model)?.subsets[subset.index()];
        set.index_of(module).map(|i| as_pin(set.stack[i]))
    }

    /// A module's pin for use, re-registering it if it lost its registration and room can be made under the
    /// cap (the registration swap); `None` when it has no pin.
    pub fn get_pin(
        &mut self,
        backing: &mut dyn PinBacking,
        model: ModelId,
        subset: Subset,
        module: ModuleId,
    ) -> Option<Pin> {
        let index = self.models.get(&model)?.subsets[subset.index()].index_of(module)?;
        self.register_existing(backing, model, subset, index)
    }

    /// Makes sure `module` has a pin of `size` bytes in `subset` (`pin_memory`, §7.2): an existing pin is
    /// returned (see [`Pins::get_pin`]); otherwise inactive cached outputs are released down to the active
    /// threshold, both budgets are checked, and a new pin is cut and registered — or, where that fails, one
    /// is stolen. A zero-byte request gets no pin. Errors only for a model never passed to
    /// [`Pins::load_model`].
    pub fn pin(
        &mut self,
        env: &mut PinEnv<'_>,
        model: ModelId,
        subset: Subset,
        module: ModuleId,
        size: u64,
    ) -> Result<PinOutcome> {
        let Some(m) = self.models.get_mut(&model) else {
            return Err(Error::Host(format!("pins: model {} was never loaded", model.0)));
        };
        if !self.config.enabled() || size == 0 {
            return Ok(PinOutcome::NotPinned);
        }
        let set = &mut m.subsets[subset.index()];
        if let Some(index) = set.index_of(module) {
            let pin = self.register_existing(env.backing, model, subset, index);
            return Ok(pin.map_or(PinOutcome::NotPinned, PinOutcome::Existing));
        }
        set.priority_of(module);
        if let Some(outputs) = env.outputs.as_deref_mut() {
            outputs.release(self.config.ram_cache_headroom, false, 0);
        }
        if !self.ensure_pin_budget(env.backing, env.ram, size, false, subset.is_loaded())
            || !self.ensure_registerable(env.backing, size, true)
        {
            return Ok(self.steal(env.backing, model, subset, module, size));
        }
        let offset = match env.backing.extend(model, subset, size) {
            Ok(offset) => offset,
            Err(err) => {
                tracing::debug!(model = model.0, subset = subset.name(), size, %err, "pins: buffer did not grow");
                return Ok(self.steal(env.backing, model, subset, module, size));
            }
        };
        if env.backing.register(model, subset, offset, size).is_err() {
            // Registration can fail short of the cap (the OS limit is lower): make room and retry once.
            self.free_registrations(env.backing, size, true);
            if let Err(err) = env.backing.register(model, subset, offset, size) {
                tracing::debug!(model = model.0, subset = subset.name(), size, %err, "pins: registration failed");
                if let Err(err) = env.backing.truncate(model, subset, offset) {
                    tracing::warn!(model = model.0, subset = subset.name(), %err, "pins: could not shrink buffer");
                }
                return Ok(self.steal(env.backing, model, subset, module, size));
            }
        }
        let Some(m) = self.models.get_mut(&model) else {
            return Err(Error::Host(format!("pins: model {} vanished while pinning", model.0)));
        };
        m.subsets[subset.index()].push(module, offset, size, true);
        self.registered += size;
        Ok(PinOutcome::Created(Pin { offset, size, registered: true }))
    }

    /// The RAM budget for a new pin of `size` bytes (`ensure_pin_budget`): passes when available RAM stays
    /// above the floor, else frees pins (§7.5 order, inactive models unless `evict_active`, no in-prompt
    /// `weights`/`patches` when `loaded`) for the shortfall plus 256 MiB and passes if the shortfall was
    /// freed. Always passes with `--high-ram`.
    pub fn ensure_pin_budget(
        &mut self,
        backing: &mut dyn PinBacking,
        ram: &dyn RamProbe,
        size: u64,
        evict_active: bool,
        loaded: bool,
    ) -> bool {
        if self.config.high_ram {
            return true;
        }
        let need = size.saturating_add(self.config.ram_floor());
        let available = ram.available();
        if need <= available {
            return true;
        }
        let shortfall = need - available;
        let target = shortfall.saturating_add(PIN_PRESSURE_HYSTERESIS);
        self.free_pins(backing, target, evict_active, loaded) >= shortfall
    }

    /// The registration budget for `size` more bytes (`ensure_pin_registerable`): passes when the registered
    /// bytes stay within the cap, else unregisters for the excess (see [`Pins::free_registrations`]). Fails
    /// when pinning is off.
    pub fn ensure_registerable(
        &mut self,
        backing: &mut dyn PinBacking,
        size: u64,
        evict_active: bool,
    ) -> bool {
        if !self.config.enabled() {
            return false;
        }
        let after = self.registered.saturating_add(size);
        after <= self.config.cap
            || self.free_registrations(backing, after - self.config.cap, evict_active)
    }

    /// Unregisters pins — keeping their RAM — for `shortfall` bytes plus 2 GiB, in the registration tiers
    /// (inactive models first; active ones only with `evict_active`), oldest model first, each subset walked
    /// down from its `split`; passes if at least `shortfall` bytes were unregistered.
    pub fn free_registrations(
        &mut self,
        backing: &mut dyn PinBacking,
        shortfall: u64,
        evict_active: bool,
    ) -> bool {
        if !self.config.enabled() {
            return false;
        }
        if shortfall == 0 {
            return true;
        }
        let target = shortfall.saturating_add(REGISTERABLE_PIN_HYSTERESIS);
        self.walk(backing, &registration_tiers(evict_active), target, Action::Unregister)
            >= shortfall
    }

    /// Frees pins (RAM and registration) until `bytes` are freed or no eligible pin is left, in the tiers of
    /// §7.5: see `tiers.rs`. Returns the bytes freed (it may pass `bytes` by part of one pin).
    pub fn free_pins(
        &mut self,
        backing: &mut dyn PinBacking,
        bytes: u64,
        evict_active: bool,
        loaded: bool,
    ) -> u64 {
        let freed = self.walk(backing, &free_tiers(loaded, evict_active), bytes, Action::Free);
        if freed > 0 {
            tracing::debug!(
                asked = bytes,
                freed,
                evict_active,
                loaded,
                "pins: freed under RAM pressure"
            );
        }
        freed
    }

    /// The per-node reset (§4.4, §6.3): frees every `patches` and `patches-loaded` pin, forgets their
    /// priorities (the sets are recreated empty), and marks every model inactive.
    pub fn reset_node(&mut self, backing: &mut dyn PinBacking) {
        let ids: Vec<ModelId> = self.models.keys().copied().collect();
        for model in ids {
            for subset in [Subset::PatchesLoaded, Subset::Patches] {
                self.free_subset(backing, model, subset, u64::MAX);
                if let Some(m) = self.models.get_mut(&model) {
                    let set = &mut m.subsets[subset.index()];
                    if set.stack.is_empty() {
                        set.clear();
                    } else {
                        tracing::warn!(
                            model = model.0,
                            subset = subset.name(),
                            "pins: patch pins outlive their node"
                        );
                    }
                }
            }
            self.set_active(model, false);
        }
    }

    /// The pins as the post-node arbitration frees them (inactive models, [`Pins::free_pins`]).
    pub fn releaser<'a>(&'a mut self, backing: &'a mut dyn PinBacking) -> PinsReleaser<'a> {
        PinsReleaser { pins: self, backing }
    }

    /// Registers the existing pin at `index` if it is not and room can be made; returns it as it stands.
    fn register_existing(
        &mut self,
        backing: &mut dyn PinBacking,
        model: ModelId,
        subset: Subset,
        index: usize,
    ) -> Option<Pin> {
        let slot = self.slot(model, subset, index)?;
        if slot.registered || !self.ensure_registerable(backing, slot.size, true) {
            return Some(as_pin(slot));
        }
        match backing.register(model, subset, slot.offset, slot.size) {
            Ok(()) => {
                if let Some(m) = self.models.get_mut(&model) {
                    m.subsets[subset.index()].set_registered(index, true);
                    self.registered += slot.size;
                }
            }
            Err(err) => {
                tracing::debug!(model = model.0, subset = subset.name(), %err, "pins: re-registration failed")
            }
        }
        self.slot(model, subset, index).map(as_pin)
    }

    /// Gives `module` the pin of a lower-priority module of the same size, if there is one.
    fn steal(
        &mut self,
        backing: &mut dyn PinBacking,
        model: ModelId,
        subset: Subset,
        module: ModuleId,
        size: u64,
    ) -> PinOutcome {
        let Some(m) = self.models.get_mut(&model) else { return PinOutcome::NotPinned };
        let Some((index, victim)) = m.subsets[subset.index()].steal(module, size) else {
            return PinOutcome::NotPinned;
        };
        match self.register_existing(backing, model, subset, index) {
            Some(pin) => PinOutcome::Stolen { pin, victim },
            None => PinOutcome::NotPinned,
        }
    }

    fn slot(&self, model: ModelId, subset: Subset, index: usize) -> Option<Slot> {
        self.models.get(&model)?.subsets[subset.index()].stack.get(index).copied()
    }

    /// Models in `tier`, oldest loaded first.
    fn models_in(&self, tier: &Tier) -> Vec<ModelId> {
        let mut models: Vec<(u64, ModelId)> = self
            .models
            .iter()
            .filter(|(_, m)| tier.covers(m.in_prompt, m.active))
            .map(|(id, m)| (m.loaded_seq, *id))
            .collect();
        models.sort_unstable();
        models.into_iter().map(|(_, id)| id).collect()
    }

    /// Takes `bytes` back through `tiers`, model by model, subset by subset.
    fn walk(
        &mut self,
        backing: &mut dyn PinBacking,
        tiers: &[Tier],
        bytes: u64,
        action: Action,
    ) -> u64 {
        let mut done = 0;
        for tier in tiers {
            for model in self.models_in(tier) {
                for &subset in tier.subsets {
                    if done >= bytes {
                        return done;
                    }
                    done += match action {
                        Action::Free => self.free_subset(backing, model, subset, bytes - done),
                        Action::Unregister => {
                            self.unregister_subset(backing, model, subset, bytes - done)
                        }
                    };
                }
            }
        }
        done
    }

    /// Frees pins from the top of one stack (LIFO) until `bytes` are freed; returns the bytes freed.
    fn free_subset(
        &mut self,
        backing: &mut dyn PinBacking,
        model: ModelId,
        subset: Subset,
        bytes: u64,
    ) -> u64 {
        let Some(m) = self.models.get_mut(&model) else { return 0 };
        let set = &mut m.subsets[subset.index()];
        let mut freed = 0;
        while freed < bytes {
            let Some(&top) = set.stack.last() else { break };
            if top.registered {
                if let Err(err) = backing.unregister(model, subset, top.offset) {
                    tracing::warn!(model = model.0, subset = subset.name(), %err, "pins: could not unregister");
                    break;
                }
                set.set_registered(set.stack.len() - 1, false);
                self.registered -= top.size;
            }
            set.pop();
            if let Err(err) = backing.truncate(model, subset, top.offset) {
                tracing::warn!(model = model.0, subset = subset.name(), %err, "pins: could not shrink buffer");
                break;
            }
            freed += top.size;
        }
        freed
    }

    /// Unregisters pins of one stack walking down from `split`, keeping their RAM, until `bytes` are
    /// unregistered; returns the bytes unregistered.
    fn unregister_subset(
        &mut self,
        backing: &mut dyn PinBacking,
        model: ModelId,
        subset: Subset,
        bytes: u64,
    ) -> u64 {
        let Some(m) = self.models.get_mut(&model) else { return 0 };
        let set = &mut m.subsets[subset.index()];
        let mut done = 0;
        let mut cursor = set.split;
        while let Some(index) = cursor {
            if done >= bytes {
                break;
            }
            let slot = set.stack[index];
            if slot.registered {
                match backing.unregister(model, subset, slot.offset) {
                    Ok(()) => {
                        set.set_registered(index, false);
                        self.registered -= slot.size;
                        done += slot.size;
                    }
                    Err(err) => {
                        tracing::warn!(model = model.0, subset = subset.name(), %err, "pins: could not unregister")
                    }
                }
            }
            cursor = index.checked_sub(1);
        }
        done
    }
}

/// What a walk through the tiers does to each pin.
#[derive(Debug, Clone, Copy)]
enum Action {
    Free,
    Unregister,
}

fn as_pin(slot: Slot) -> Pin {
    Pin { offset: slot.offset, size: slot.size, registered: slot.registered }
}

/// [`Pins`] with its host buffers, as [`crate::memory::pressure::arbitrate_after_node`] frees pins.
pub struct PinsReleaser<'a> {
    pins: &'a mut Pins,
    backing: &'a mut dyn PinBacking,
}

impl PinReleaser for PinsReleaser<'_> {
    fn free_inactive_pins(&mut self, bytes: u64) -> u64 {
        self.pins.free_pins(self.backing, bytes, false, false)
    }
}

#[cfg(test)]
mod fake;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
