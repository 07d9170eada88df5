//! [`PieceTable`]: the ids of a vocabulary's pieces by their text, an open-addressing hash table of ids that
//! reads the text from the pieces themselves, so indexing Gemma's 256 000 pieces copies no string and takes a
//! few milliseconds.

use super::proto::Piece;

/// Ids by piece text; every method takes the pieces the ids index.
#[derive(Debug, Clone)]
pub(crate) struct PieceTable {
    /// Per slot an id plus one, 0 for an empty slot; a power of two at least twice the pieces.
    slots: Vec<u32>,
    /// log2 of the slot count.
    bits: u32,
}

impl PieceTable {
    /// An empty table with room for `capacity` pieces.
    pub(crate) fn with_capacity(capacity: usize) -> PieceTable {
        let bits = (capacity.max(1) * 2).next_power_of_two().trailing_zeros().max(4);
        PieceTable { slots: vec![0; 1 << bits], bits }
    }

    /// Adds piece `id` of `pieces`; the id already there for the same text, if any (the table keeps it).
    /// `id` must be below `u32::MAX` and the table must not hold more than its capacity.
    pub(crate) fn insert(&mut self, pieces: &[Piece], id: u32) -> Option<u32> {
        let key = pieces[id as usize].piece.as_bytes();
        let mut slot = self.home(key);
        loop {
            match self.slots[slot] {
                0 => {
                    self.slots[slot] = id + 1;
                    return None;
                }
                there if pieces[there as usize - 1].piece.as_bytes() == key => {
                    return Some(there - 1);
                }
                _ => slot = (slot + 1) & (self.slots.len() - 1),
            }
        }
    }

    /// The id of the piece of `pieces` whose text is `key`.
    pub(crate) fn get(&self, pieces: &[Piece], key: &[u8]) -> Option<u32> {
        let mut slot = self.home(key);
        loop {
            match self.slots[slot] {
                0 => return None,
                there if pieces[there as usize - 1].piece.as_bytes() == key => {
                    return Some(there - 1);
                }
                _ => slot = (slot + 1) & (self.slots.len() - 1),
            }
        }
    }

    /// The slot `key` hashes to: its bytes folded eight at a time (FxHash's step), the top bits of a
    /// Fibonacci multiply.
    fn home(&self, key: &[u8]) -> usize {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut h = key.len() as u64;
        let mut chunks = key.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            h = (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
        }
        let mut word = [0u8; 8];
        word[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        h = (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
        (h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::t5::spiece::proto::PieceType;

    #[test]
    fn pieces_are_found_by_text_and_repeats_reported() {
        let pieces: Vec<Piece> = ["a", "ab", "abcdefghij", "abcdefgh", "a"]
            .iter()
            .map(|p| Piece { piece: (*p).to_owned(), score: 0.0, kind: PieceType::Normal })
            .collect();
        let mut table = PieceTable::with_capacity(pieces.len());
        for id in 0..4 {
            assert_eq!(table.insert(&pieces, id), None);
        }
        assert_eq!(table.insert(&pieces, 4), Some(0));
        assert_eq!(table.get(&pieces, b"abcdefgh"), Some(3));
        assert_eq!(table.get(&pieces, b"abcdefghij"), Some(2));
        assert_eq!(table.get(&pieces, b"abc"), None);
        assert_eq!(table.get(&pieces, b""), None);
    }
}
