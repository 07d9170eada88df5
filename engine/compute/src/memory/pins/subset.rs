//! One model's pin set for one subset (§7.1): a stack of pins in the order they were made, the highest
//! registered index (`split`), the registered bytes, and the stealing buckets (§7.5).
//!
//! Invariants every method keeps (the tests check them after every step):
//! - `stack[i]` owns the range `[offset, offset + size)` of the subset's host buffer; offsets grow with `i`
//!   because pins are cut by extending the buffer and freed from the top;
//! - `split` is the highest index whose pin is registered (`None` when none is);
//! - `registered_bytes` is the sum of the registered pins' sizes;
//! - `index_of` maps each module holding a pin to its index, and every pin has exactly one bucket entry
//!   `(size) → (priority, module)`.
//!
//! This type only keeps the books; the host buffer actions are taken by [`super::Pins`] before it calls in.

use std::collections::{BTreeMap, BTreeSet};

use super::ModuleId;

/// One pin: a module's slice of the subset's host buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    pub(super) module: ModuleId,
    pub(super) offset: u64,
    pub(super) size: u64,
    pub(super) registered: bool,
}

/// The books of one (model, subset) pin set.
#[derive(Debug, Default)]
pub(super) struct SubsetPins {
    pub(super) stack: Vec<Slot>,
    pub(super) split: Option<usize>,
    pub(super) registered_bytes: u64,
    counter: u32,
    priorities: BTreeMap<ModuleId, u16>,
    index_of: BTreeMap<ModuleId, usize>,
    buckets: BTreeMap<u64, BTreeSet<(u16, ModuleId)>>,
}

/// `value`'s low 16 bits in reverse order: consecutive counters land as far apart as possible
/// (0, 32768, 16384, 49152, …), so the pins that lose to stealing are spread evenly through the model.
pub(super) fn bit_reverse16(value: u32) -> u16 {
    (value as u16).reverse_bits()
}

impl SubsetPins {
    /// The index of `module`'s pin, if it has one.
    pub(super) fn index_of(&self, module: ModuleId) -> Option<usize> {
        self.index_of.get(&module).copied()
    }

    /// `module`'s stealing priority, assigned on its first pin attempt as `bit_reverse16(counter++)` and kept
    /// for as long as the set lives.
    pub(super) fn priority_of(&mut self, module: ModuleId) -> u16 {
        *self.priorities.entry(module).or_insert_with(|| {
            let priority = bit_reverse16(self.counter);
            self.counter = self.counter.wrapping_add(1);
            priority
        })
    }

    /// Pushes a new pin for `module` (which holds none) and returns its index.
    pub(super) fn push(
        &mut self,
        module: ModuleId,
        offset: u64,
        size: u64,
        registered: bool,
    ) -> usize {
        debug_assert!(!self.index_of.contains_key(&module), "{module:?} already holds a pin");
        let index = self.stack.len();
        self.stack.push(Slot { module, offset, size, registered: false });
        self.index_of.insert(module, index);
        let priority = self.priority_of(module);
        self.buckets.entry(size).or_default().insert((priority, module));
        if registered {
            self.set_registered(index, true);
        }
        index
    }

    /// Pops the top pin, which must already be unregistered.
    pub(super) fn pop(&mut self) -> Option<Slot> {
        let slot = self.stack.pop()?;
        debug_assert!(!slot.registered, "popping a registered pin");
        self.index_of.remove(&slot.module);
        self.unbucket(slot.size, slot.module);
        Some(slot)
    }

    /// Marks the pin at `index` registered or not, keeping `split` and `registered_bytes`.
    pub(super) fn set_registered(&mut self, index: usize, registered: bool) {
        let slot = &mut self.stack[index];
        if slot.registered == registered {
            return;
        }
        slot.registered = registered;
        if registered {
            self.registered_bytes += slot.size;
            self.split = Some(self.split.map_or(index, |s| s.max(index)));
        } else {
            self.registered_bytes -= slot.size;
            if self.split == Some(index) {
                self.split = self.stack[..index].iter().rposition(|s| s.registered);
            }
        }
    }

    /// Hands the pin of the lowest-priority module of exactly `size` bytes to `thief` (which holds none), if
    /// that priority is strictly lower than the thief's; returns the pin's index and the module that lost it.
    pub(super) fn steal(&mut self, thief: ModuleId, size: u64) -> Option<(usize, ModuleId)> {
        let priority = self.priority_of(thief);
        let &(victim_priority, victim) = self.buckets.get(&size)?.first()?;
        if victim_priority >= priority {
            return None;
        }
        self.unbucket(size, victim);
        let index = self.index_of.remove(&victim)?;
        self.stack[index].module = thief;
        self.index_of.insert(thief, index);
        self.buckets.entry(size).or_default().insert((priority, thief));
        Some((index, victim))
    }

    /// Forgets everything, priorities and counter included (a recreated set).
    pub(super) fn clear(&mut self) {
        debug_assert!(self.stack.is_empty(), "clearing a set that still holds pins");
        *self = SubsetPins::default();
    }

    fn unbucket(&mut self, size: u64, module: ModuleId) {
        let priority = self.priorities.get(&module).copied().unwrap_or_default();
        if let Some(bucket) = self.buckets.get_mut(&size) {
            bucket.remove(&(priority, module));
            if bucket.is_empty() {
                self.buckets.remove(&size);
            }
        }
    }

    /// The bucket entries, for the tests' invariant checks.
    #[cfg(test)]
    pub(super) fn bucket_entries(&self) -> Vec<(u64, u16, ModuleId)> {
        self.buckets
            .iter()
            .flat_map(|(size, set)| set.iter().map(move |&(p, m)| (*size, p, m)))
            .collect()
    }

    /// The `index_of` map, for the tests' invariant checks.
    #[cfg(test)]
    pub(super) fn index_entries(&self) -> Vec<(ModuleId, usize)> {
        self.index_of.iter().map(|(m, i)| (*m, *i)).collect()
    }

    /// The priority a module was given, if any, for the tests.
    #[cfg(test)]
    pub(super) fn known_priority(&self, module: ModuleId) -> Option<u16> {
        self.priorities.get(&module).copied()
    }
}
