//! [`PrefixMatcher`]: the longest user-defined symbol a text starts with, as SentencePiece's `PrefixMatcher`
//! (normalizer.cc) finds it over a model's `USER_DEFINED` pieces. The normaliser keeps such a symbol out of its
//! character map (the whitespace rules still apply), and the BPE segmentation takes it as one symbol it never
//! merges.
//!
//! SentencePiece reads at most the 64 shortest matches of its trie search and keeps the longest of those; so does
//! this trie.

use super::normalize::one_char_len;

/// How many matches SentencePiece's prefix search reads (`kResultSize`).
const MAX_MATCHES: usize = 64;

/// A byte trie of user-defined symbols.
#[derive(Debug, Clone)]
pub(crate) struct PrefixMatcher {
    /// The nodes; 0 is the root.
    nodes: Vec<Node>,
}

/// A trie node: its children by byte (sorted), and whether a symbol ends here.
#[derive(Debug, Clone, Default)]
struct Node {
    children: Vec<(u8, u32)>,
    terminal: bool,
}

impl PrefixMatcher {
    /// The matcher of `symbols` (empty ones ignored: they match nothing).
    pub(crate) fn new<'a>(symbols: impl IntoIterator<Item = &'a str>) -> PrefixMatcher {
        let mut nodes = vec![Node::default()];
        for symbol in symbols.into_iter().filter(|s| !s.is_empty()) {
            let mut node = 0usize;
            for &byte in symbol.as_bytes() {
                let children = &nodes[node].children;
                node = match children.binary_search_by_key(&byte, |&(b, _)| b) {
                    Ok(i) => children[i].1 as usize,
                    Err(i) => {
                        let next = nodes.len();
                        nodes[node].children.insert(i, (byte, next as u32));
                        nodes.push(Node::default());
                        next
                    }
                };
            }
            nodes[node].terminal = true;
        }
        PrefixMatcher { nodes }
    }

    /// The byte length of the longest symbol `text` starts with, if any.
    pub(crate) fn longest(&self, text: &[u8]) -> Option<usize> {
        let mut node = 0usize;
        let mut found = None;
        let mut matches = 0;
        for (i, byte) in text.iter().enumerate() {
            let children = &self.nodes[node].children;
            let Ok(at) = children.binary_search_by_key(byte, |&(b, _)| b) else { break };
            node = children[at].1 as usize;
            if self.nodes[node].terminal {
                found = Some(i + 1);
                matches += 1;
                if matches == MAX_MATCHES {
                    break;
                }
            }
        }
        found
    }

    /// `text`'s first symbol: the longest user-defined symbol it starts with (and `true`), else its first
    /// character (and `false`). Empty for an empty text.
    pub(crate) fn prefix(&self, text: &[u8]) -> (usize, bool) {
        match (self.longest(text), text.first()) {
            (Some(len), _) => (len, true),
            (None, Some(&lead)) => (one_char_len(lead).min(text.len()), false),
            (None, None) => (0, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_symbol_wins_else_one_character() {
        let m = PrefixMatcher::new(["▁▁", "▁▁▁▁", "<s>", "<start>", ""]);
        assert_eq!(m.prefix("▁▁▁x".as_bytes()), (6, true));
        assert_eq!(m.prefix("▁▁▁▁▁".as_bytes()), (12, true));
        assert_eq!(m.prefix("<start>".as_bytes()), (7, true));
        assert_eq!(m.prefix("<sta".as_bytes()), (1, false));
        assert_eq!(m.prefix("色x".as_bytes()), (3, false));
        assert_eq!(m.prefix(&[0xE8, 0x89]), (2, false), "a truncated character");
        assert_eq!(m.prefix(b""), (0, false));
        assert_eq!(PrefixMatcher::new([]).prefix(b"ab"), (1, false));
    }

    #[test]
    fn only_the_64_shortest_matches_count() {
        let runs: Vec<String> = (1..=70).map(|n| "a".repeat(n)).collect();
        let m = PrefixMatcher::new(runs.iter().map(String::as_str));
        assert_eq!(m.longest("a".repeat(100).as_bytes()), Some(64));
    }
}
