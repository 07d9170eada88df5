//! [`Normalizer`]: SentencePiece's text normalisation before segmentation, from a model's `NormalizerSpec`: the
//! model's user-defined symbols kept out of the compiled character map, which rewrites the rest (longest match
//! wins; a Darts double-array trie over UTF-8 bytes whose values index NUL-terminated replacements), then the
//! whitespace rules: leading, trailing and repeated spaces dropped when `remove_extra_whitespaces`, spaces
//! escaped as `▁`, a dummy `▁` before (or, with `treat_whitespace_as_suffix`, after) the text.
//!
//! Only the ASCII space is whitespace here; other characters become spaces only through the map. The output
//! is bytes: a map may in principle produce anything, and the segmentation works on bytes.

use super::matcher::PrefixMatcher;
use super::proto::NormalizerSpec;
use crate::error::{Error, Result};

/// `▁` (U+2581), SentencePiece's escaped space.
pub(crate) const SPACE_SYMBOL: &str = "\u{2581}";
/// U+FFFD, what a malformed UTF-8 byte becomes.
const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();

/// A model's normaliser.
#[derive(Debug, Clone)]
pub(crate) struct Normalizer {
    /// The user-defined symbols, which the map never rewrites.
    user_defined: PrefixMatcher,
    map: Option<CharsMap>,
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
    escape_whitespaces: bool,
    treat_whitespace_as_suffix: bool,
}

impl Normalizer {
    /// The normaliser `spec` describes, keeping the model's `user_defined` symbols as written;
    /// [`Error::Tokenizer`] for a malformed character map.
    pub(crate) fn new(
        spec: &NormalizerSpec,
        treat_whitespace_as_suffix: bool,
        user_defined: PrefixMatcher,
    ) -> Result<Normalizer> {
        let map =
            if spec.charsmap.is_empty() { None } else { Some(CharsMap::new(&spec.charsmap)?) };
        Ok(Normalizer {
            user_defined,
            map,
            add_dummy_prefix: spec.add_dummy_prefix,
            remove_extra_whitespaces: spec.remove_extra_whitespaces,
            escape_whitespaces: spec.escape_whitespaces,
            treat_whitespace_as_suffix,
        })
    }

    /// `input` normalised (empty for an empty or, with `remove_extra_whitespaces`, all-space input).
    pub(crate) fn normalize(&self, input: &str) -> Vec<u8> {
        let mut input = input.as_bytes();
        let mut out = Vec::with_capacity(input.len() * 3 / 2);
        if self.remove_extra_whitespaces {
            while !input.is_empty() {
                let (normalized, consumed) = self.prefix(input);
                if normalized != b" " {
                    break;
                }
                input = &input[consumed..];
            }
        }
        if input.is_empty() {
            return out;
        }
        let space: &[u8] = if self.escape_whitespaces { SPACE_SYMBOL.as_bytes() } else { b" " };
        if !self.treat_whitespace_as_suffix && self.add_dummy_prefix {
            out.extend_from_slice(space);
        }
        let mut prev_space = self.remove_extra_whitespaces;
        while !input.is_empty() {
            let (mut piece, consumed) = self.prefix(input);
            while prev_space && piece.first() == Some(&b' ') {
                piece = &piece[1..];
            }
            if !piece.is_empty() {
                for &byte in piece {
                    match byte {
                        b' ' => out.extend_from_slice(space),
                        byte => out.push(byte),
                    }
                }
                prev_space = piece.last() == Some(&b' ');
            }
            input = &input[consumed..];
            if !self.remove_extra_whitespaces {
                prev_space = false;
            }
        }
        if self.remove_extra_whitespaces {
            while out.ends_with(space) {
                out.truncate(out.len() - space.len());
            }
        }
        if self.treat_whitespace_as_suffix && self.add_dummy_prefix {
            out.extend_from_slice(space);
        }
        out
    }

    /// The normalised form of `input`'s first character (or of the longest user-defined symbol it starts with,
    /// unchanged, or else of the longest prefix the map has a rule for) and how many bytes it takes.
    fn prefix<'s>(&'s self, input: &'s [u8]) -> (&'s [u8], usize) {
        if let Some(len) = self.user_defined.longest(input) {
            return (&input[..len], len);
        }
        if let Some((replacement, len)) = self.map.as_ref().and_then(|m| m.longest(input)) {
            return (replacement, len);
        }
        if input[0] < 0x80 {
            return (&input[..1], 1);
        }
        let len = one_char_len(input[0]);
        match input.get(..len) {
            Some(ch) if std::str::from_utf8(ch).is_ok() => (ch, len),
            _ => (REPLACEMENT, 1),
        }
    }
}

/// The byte length of the UTF-8 character whose first byte is `lead` (1 for a stray continuation byte), as
/// SentencePiece's `OneCharLen` counts it.
pub(crate) fn one_char_len(lead: u8) -> usize {
    const LENGTHS: [u8; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    usize::from(LENGTHS[usize::from(lead >> 4)])
}

/// A compiled character map: a Darts double-array trie over the source strings' bytes, each leaf's value the
/// offset of its NUL-terminated replacement in the strings that follow the trie.
#[derive(Debug, Clone)]
struct CharsMap {
    units: Vec<u32>,
    replacements: Vec<u8>,
}

impl CharsMap {
    /// The map in `blob`: a little-endian u32 trie size in bytes, the trie, the replacements.
    fn new(blob: &[u8]) -> Result<CharsMap> {
        let bad = |msg: &str| {
            Error::Tokenizer(format!(
                "the SentencePiece model's normalisation map is malformed: {msg}"
            ))
        };
        let (size, rest) = blob.split_first_chunk::<4>().ok_or_else(|| bad("it is too short"))?;
        let size = u32::from_le_bytes(*size) as usize;
        if size == 0 || !size.is_multiple_of(4) || size >= rest.len() {
            return Err(bad("its trie size does not fit it"));
        }
        let (trie, replacements) = rest.split_at(size);
        if replacements.last() != Some(&0) {
            return Err(bad("its replacements do not end with NUL"));
        }
        let units = trie.chunks_exact(4).map(|u| u32::from_le_bytes([u[0], u[1], u[2], u[3]]));
        Ok(CharsMap { units: units.collect(), replacements: replacements.to_vec() })
    }

    /// The replacement of the longest prefix of `key` the map has, and that prefix's length.
    fn longest(&self, key: &[u8]) -> Option<(&[u8], usize)> {
        let has_leaf = |unit: u32| (unit >> 8) & 1 == 1;
        let value = |unit: u32| (unit & ((1 << 31) - 1)) as usize;
        let label = |unit: u32| unit & ((1 << 31) | 0xFF);
        let offset = |unit: u32| ((unit >> 10) << ((unit & (1 << 9)) >> 6)) as usize;
        let mut found = None;
        let mut node = 0usize;
        let mut unit = *self.units.first()?;
        for (i, &byte) in key.iter().enumerate() {
            node ^= offset(unit) ^ usize::from(byte);
            let Some(&next) = self.units.get(node) else { break };
            unit = next;
            if label(unit) != u32::from(byte) {
                break;
            }
            if has_leaf(unit)
                && let Some(&leaf) = self.units.get(node ^ offset(unit))
            {
                found = Some((value(leaf), i + 1));
            }
        }
        let (at, len) = found?;
        let tail = self.replacements.get(at..)?;
        let end = tail.iter().position(|&b| b == 0)?;
        Some((&tail[..end], len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normalizer(add_dummy_prefix: bool, remove: bool, suffix: bool) -> Normalizer {
        let spec = NormalizerSpec {
            add_dummy_prefix,
            remove_extra_whitespaces: remove,
            ..NormalizerSpec::default()
        };
        Normalizer::new(&spec, suffix, PrefixMatcher::new([])).unwrap()
    }

    fn text(bytes: Vec<u8>) -> String {
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn whitespace_rules() {
        let n = normalizer(true, true, false);
        assert_eq!(text(n.normalize("  a   b  ")), "▁a▁b");
        assert_eq!(text(n.normalize("   ")), "");
        assert_eq!(text(n.normalize("")), "");
        let n = normalizer(true, false, false);
        assert_eq!(text(n.normalize(" a  b ")), "▁▁a▁▁b▁");
        assert_eq!(text(n.normalize(" ")), "▁▁");
        let n = normalizer(false, true, false);
        assert_eq!(text(n.normalize(" a b")), "a▁b");
        let n = normalizer(true, true, true);
        assert_eq!(text(n.normalize("a b ")), "a▁b▁");
        // Only the ASCII space is whitespace.
        let n = normalizer(true, true, false);
        assert_eq!(text(n.normalize("a\tb\u{3000}")), "▁a\tb\u{3000}");
    }

    #[test]
    fn a_char_map_replaces_the_longest_match() {
        // A hand-built double array with rules "a" → "x" and "ab" → "y z" (ComfyUI's maps come from the files).
        // Node 0 (root, offset 256): "a" at 256 ^ 0x61 = 353; node 353 (offset 512, leaf) → "b" at 353 ^ 512 ^
        // 0x62 = 771 (offset 1024, leaf), and the leaves at 353 ^ 512 = 865 and 771 ^ 1024 = 1795.
        let mut units = vec![0u32; 2048];
        let unit =
            |offset: u32, label: u32, leaf: bool| (offset << 10) | (u32::from(leaf) << 8) | label;
        units[0] = unit(256, 0, false);
        units[353] = unit(512, 0x61, true);
        units[865] = 1 << 31;
        units[771] = unit(1024, 0x62, true);
        units[1795] = (1 << 31) | 2;
        let mut blob = ((units.len() * 4) as u32).to_le_bytes().to_vec();
        blob.extend(units.iter().flat_map(|u| u.to_le_bytes()));
        blob.extend_from_slice(b"x\0y z\0");
        let spec = NormalizerSpec { charsmap: blob, ..NormalizerSpec::default() };
        let n = Normalizer::new(&spec, false, PrefixMatcher::new([])).unwrap();
        assert_eq!(text(n.normalize("abac")), "▁y▁zxc");
        // A user-defined symbol is kept as written, and the map applies after it.
        let n = Normalizer::new(&spec, false, PrefixMatcher::new(["aba"])).unwrap();
        assert_eq!(text(n.normalize("abab")), "▁abab");
        assert_eq!(text(n.normalize("aab")), "▁xy▁z");
        let bad = NormalizerSpec { charsmap: vec![4, 0, 0, 0], ..spec };
        assert!(Normalizer::new(&bad, false, PrefixMatcher::new([])).is_err());
    }
}
