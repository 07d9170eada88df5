//! Test support: a recording [`PinBacking`] that checks the host buffer's contract, a RAM probe that sees
//! what the fake buffers commit, and the invariant check the tests run after every step.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;

use super::{ModelId, PinBacking, Pins, Subset};
use crate::error::{Error, Result};

pub(super) const MIB: u64 = 1 << 20;
pub(super) const GIB: u64 = 1 << 30;

/// One call made to the backing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    Extend { model: ModelId, subset: Subset, size: u64, offset: u64 },
    Register { model: ModelId, subset: Subset, offset: u64, size: u64 },
    Unregister { model: ModelId, subset: Subset, offset: u64 },
    Truncate { model: ModelId, subset: Subset, offset: u64 },
}

/// One fake host buffer: its committed end and its registered ranges (start → length).
#[derive(Debug, Default, Clone)]
pub(super) struct Buf {
    pub(super) end: u64,
    pub(super) registered: BTreeMap<u64, u64>,
}

/// Host buffers kept as numbers. Contract breaches (overlapping registrations, unregistering a range that
/// does not start at the offset, truncating over a registered range) panic, so a policy bug fails the test.
#[derive(Debug)]
pub(super) struct FakeBacking {
    pub(super) bufs: BTreeMap<(ModelId, Subset), Buf>,
    pub(super) calls: Vec<Call>,
    /// A buffer cannot grow past this many bytes (its reservation).
    pub(super) max_buffer: u64,
    /// The next this-many `register` calls fail.
    pub(super) register_failures: u32,
    /// Bytes committed in all buffers, shared with [`FakeBacking::ram`].
    committed: Rc<Cell<u64>>,
}

impl FakeBacking {
    pub(super) fn new() -> FakeBacking {
        FakeBacking {
            bufs: BTreeMap::new(),
            calls: Vec::new(),
            max_buffer: u64::MAX,
            register_failures: 0,
            committed: Rc::new(Cell::new(0)),
        }
    }

    /// A RAM probe for a machine with `total` bytes, of which the buffers' committed bytes are used.
    pub(super) fn ram(&self, total: u64) -> impl Fn() -> u64 + use<> {
        let committed = self.committed.clone();
        move || total.saturating_sub(committed.get())
    }

    pub(super) fn committed(&self) -> u64 {
        self.committed.get()
    }

    /// Calls made since `from`.
    pub(super) fn calls_since(&self, from: usize) -> Vec<Call> {
        self.calls[from..].to_vec()
    }

    fn buf(&mut self, model: ModelId, subset: Subset) -> &mut Buf {
        self.bufs.entry((model, subset)).or_default()
    }
}

impl PinBacking for FakeBacking {
    fn extend(&mut self, model: ModelId, subset: Subset, size: u64) -> Result<u64> {
        let max = self.max_buffer;
        let buf = self.buf(model, subset);
        if buf.end.saturating_add(size) > max {
            return Err(Error::Host("reservation full".into()));
        }
        let offset = buf.end;
        buf.end += size;
        self.committed.set(self.committed.get() + size);
        self.calls.push(Call::Extend { model, subset, size, offset });
        Ok(offset)
    }

    fn register(&mut self, model: ModelId, subset: Subset, offset: u64, size: u64) -> Result<()> {
        self.calls.push(Call::Register { model, subset, offset, size });
        if self.register_failures > 0 {
            self.register_failures -= 1;
            return Err(Error::Host("register refused".into()));
        }
        let buf = self.buf(model, subset);
        assert!(offset + size <= buf.end, "registering past the buffer's end");
        let overlaps =
            buf.registered.range(..offset + size).next_back().is_some_and(|(s, l)| s + l > offset);
        assert!(!overlaps, "registering {offset}+{size} over a registered range");
        buf.registered.insert(offset, size);
        Ok(())
    }

    fn unregister(&mut self, model: ModelId, subset: Subset, offset: u64) -> Result<()> {
        self.calls.push(Call::Unregister { model, subset, offset });
        let removed = self.buf(model, subset).registered.remove(&offset);
        assert!(removed.is_some(), "unregistering {offset}, which starts no registered range");
        Ok(())
    }

    fn truncate(&mut self, model: ModelId, subset: Subset, offset: u64) -> Result<()> {
        self.calls.push(Call::Truncate { model, subset, offset });
        let buf = self.buf(model, subset);
        assert!(offset <= buf.end, "truncating to {offset} past the end {}", buf.end);
        assert!(
            buf.registered.range(..).next_back().is_none_or(|(s, l)| s + l <= offset),
            "truncating to {offset} over a registered range"
        );
        let dropped = buf.end - offset;
        buf.end = offset;
        self.committed.set(self.committed.get() - dropped);
        Ok(())
    }
}

/// Checks the books against themselves, the cap and the fake buffers.
pub(super) fn check(pins: &Pins, fake: &FakeBacking) {
    let mut total = 0;
    for (&model, m) in &pins.models {
        for subset in Subset::ALL {
            let set = &m.subsets[subset.index()];
            let registered: u64 = set.stack.iter().filter(|s| s.registered).map(|s| s.size).sum();
            assert_eq!(set.registered_bytes, registered, "{model:?} {subset:?} registered bytes");
            total += registered;
            assert_eq!(
                set.split,
                set.stack.iter().rposition(|s| s.registered),
                "{model:?} {subset:?} split"
            );
            let mut end = 0;
            for slot in &set.stack {
                assert_eq!(
                    slot.offset, end,
                    "{model:?} {subset:?}: pins tile the buffer in stack order"
                );
                end += slot.size;
            }
            let buf = fake.bufs.get(&(model, subset)).cloned().unwrap_or_default();
            assert_eq!(buf.end, end, "{model:?} {subset:?}: buffer end");
            let expect: BTreeMap<u64, u64> =
                set.stack.iter().filter(|s| s.registered).map(|s| (s.offset, s.size)).collect();
            assert_eq!(buf.registered, expect, "{model:?} {subset:?}: registered ranges");
            let mut index: Vec<_> =
                set.stack.iter().enumerate().map(|(i, s)| (s.module, i)).collect();
            index.sort();
            assert_eq!(set.index_entries(), index, "{model:?} {subset:?}: index");
            let mut buckets: Vec<_> = set
                .stack
                .iter()
                .map(|s| {
                    (
                        s.size,
                        set.known_priority(s.module).expect("a pinned module has a priority"),
                        s.module,
                    )
                })
                .collect();
            buckets.sort();
            assert_eq!(set.bucket_entries(), buckets, "{model:?} {subset:?}: buckets");
        }
    }
    assert_eq!(pins.registered, total, "global registered bytes");
    assert!(
        pins.registered <= pins.config.cap,
        "registered {} over the cap {}",
        pins.registered,
        pins.config.cap
    );
    for ((model, subset), buf) in &fake.bufs {
        if !pins.models.contains_key(model) {
            assert!(
                buf.registered.is_empty() && buf.end == 0,
                "{model:?} {subset:?}: removed model kept memory"
            );
        }
    }
}
