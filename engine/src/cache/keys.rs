//! Cache keys: class + fingerprint + node id if not idempotent + inputs with links replaced by the linked
//! node's key, hashed to 128 bits.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::graph::{Input, NodeId, Prompt};
use crate::nodes::{Fingerprint, Hidden, Inputs, Registry};

/// A node's cache key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheKey {
    /// A key that hits when the same computation was stored.
    Key(u128),
    /// A key that never hits (the node, or one it depends on, changes every time).
    Never,
}

impl CacheKey {
    pub(crate) fn id(&self) -> Option<u128> {
        match self {
            CacheKey::Key(id) => Some(*id),
            CacheKey::Never => None,
        }
    }
}

/// Hashes bytes to 128 bits with two independently salted SipHash states.
struct Hasher128(DefaultHasher, DefaultHasher);

impl Hasher128 {
    fn new() -> Hasher128 {
        let mut second = DefaultHasher::new();
        0x6b69_6c6e_u32.hash(&mut second);
        Hasher128(DefaultHasher::new(), second)
    }

    fn write(&mut self, part: &[u8]) {
        part.len().hash(&mut self.0);
        self.0.write(part);
        part.len().hash(&mut self.1);
        self.1.write(part);
    }

    fn finish(self) -> u128 {
        (u128::from(self.0.finish()) << 64) | u128::from(self.1.finish())
    }
}

/// The keys of every node of a validated prompt. Nodes of unknown classes, and nodes linking to missing
/// nodes, get [`CacheKey::Never`]. Keys include `partition` (a workspace) except for nodes shared between
/// partitions (the model loaders), so a partition is never served another's results, and its cache hits tell it
/// nothing of what another ran beyond which model files were loaded; a loaded model is still loaded once for
/// all.
pub fn compute_keys(
    prompt: &Prompt,
    registry: &Registry,
    partition: Option<&str>,
) -> HashMap<NodeId, CacheKey> {
    let mut keys: HashMap<NodeId, CacheKey> = HashMap::with_capacity(prompt.nodes.len());
    for root in prompt.nodes.keys() {
        // Iterative post-order walk, so long chains cannot overflow the stack.
        let mut stack = vec![(root.clone(), false)];
        while let Some((id, expanded)) = stack.pop() {
            if keys.contains_key(&id) {
                continue;
            }
            let Some(node) = prompt.nodes.get(&id) else {
                keys.insert(id, CacheKey::Never);
                continue;
            };
            if !expanded {
                stack.push((id.clone(), true));
                for input in node.inputs.values() {
                    if let Input::Link { node: source, .. } = input
                        && !keys.contains_key(source)
                        && *source != id
                    {
                        stack.push((source.clone(), false));
                    }
                }
                continue;
            }
            let key = node_key(&id, prompt, registry, &keys, partition);
            keys.insert(id, key);
        }
    }
    keys
}

fn node_key(
    id: &NodeId,
    prompt: &Prompt,
    registry: &Registry,
    keys: &HashMap<NodeId, CacheKey>,
    partition: Option<&str>,
) -> CacheKey {
    let node = &prompt.nodes[id];
    let Some(class_name) = node.class_type.as_deref() else { return CacheKey::Never };
    let Some(class) = registry.get(class_name) else { return CacheKey::Never };
    let spec = class.spec();
    let mut hasher = Hasher128::new();
    hasher.write(class_name.as_bytes());

    let literals =
        Inputs::from_values(node.inputs.iter().filter_map(|(name, input)| match input {
            Input::Literal(json) => Some((
                name.clone(),
                crate::graph::literal_value(spec.input_def(name).map(|d| d.0), json),
            )),
            Input::Link { .. } => None,
        }));
    match class.fingerprint(&literals) {
        Fingerprint::Unchanged => hasher.write(b"unchanged"),
        Fingerprint::Value(value) => {
            hasher.write(b"fingerprint");
            hasher.write(value.as_bytes());
        }
        Fingerprint::Always => return CacheKey::Never,
    }
    if let (false, Some(partition)) = (spec.shared_between_partitions, partition) {
        hasher.write(b"partition");
        hasher.write(partition.as_bytes());
    }
    if spec.not_idempotent || spec.hidden.iter().any(|(_, kind)| *kind == Hidden::UniqueId) {
        hasher.write(b"id");
        hasher.write(id.0.as_bytes());
    }
    for (name, input) in &node.inputs {
        hasher.write(name.as_bytes());
        match input {
            Input::Literal(json) => {
                hasher.write(b"=");
                hasher.write(json.to_string().as_bytes());
            }
            Input::Link { node: source, slot } => match keys.get(source) {
                Some(CacheKey::Key(ancestor)) => {
                    hasher.write(b"<-");
                    hasher.write(&ancestor.to_le_bytes());
                    hasher.write(&slot.to_le_bytes());
                }
                Some(CacheKey::Never) | None => return CacheKey::Never,
            },
        }
    }
    CacheKey::Key(hasher.finish())
}
