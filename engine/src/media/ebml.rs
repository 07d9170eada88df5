//! EBML, the binary format Matroska and WebM files are made of: each element is an ID, its body's length as a
//! variable-length integer, and the body (a number, a string, bytes or more elements).

/// An element with its body, ready to be nested or written.
pub(crate) fn element(id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = id_bytes(id);
    out.extend(size(body.len() as u64));
    out.extend_from_slice(body);
    out
}

/// An element holding elements.
pub(crate) fn master(id: u32, children: &[Vec<u8>]) -> Vec<u8> {
    element(id, &children.concat())
}

/// An unsigned integer element in its fewest bytes (at least one).
pub(crate) fn uint(id: u32, value: u64) -> Vec<u8> {
    let bytes = value.to_be_bytes();
    let skip = (value.leading_zeros() / 8).min(7) as usize;
    element(id, &bytes[skip..])
}

/// An unsigned integer element always 8 bytes long (a position written before the layout around it is final).
pub(crate) fn uint8(id: u32, value: u64) -> Vec<u8> {
    element(id, &value.to_be_bytes())
}

/// A 64-bit float element.
pub(crate) fn float(id: u32, value: f64) -> Vec<u8> {
    element(id, &value.to_be_bytes())
}

/// A UTF-8 string element.
pub(crate) fn string(id: u32, value: &str) -> Vec<u8> {
    element(id, value.as_bytes())
}

/// An element ID's bytes: IDs carry their own length marker, so they are written as they are numbered.
fn id_bytes(id: u32) -> Vec<u8> {
    let bytes = id.to_be_bytes();
    let skip = (id.leading_zeros() / 8).min(3) as usize;
    bytes[skip..].to_vec()
}

/// A body length as an EBML variable-length integer: the first byte's leading zeros count the bytes that follow.
/// The all-ones value of each length is reserved (unknown size), so it moves to the next length.
pub(crate) fn size(value: u64) -> Vec<u8> {
    let len = (1..=8).find(|&n| value < (1u64 << (7 * n)) - 1).unwrap_or(8);
    let marked = value | (1u64 << (7 * len));
    marked.to_be_bytes()[8 - len..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::{element, size, uint};

    #[test]
    fn lengths_take_their_fewest_bytes_and_avoid_the_reserved_value() {
        assert_eq!(size(0), [0x80]);
        assert_eq!(size(126), [0xFE]);
        assert_eq!(size(127), [0x40, 0x7F]);
        assert_eq!(size(16_382), [0x7F, 0xFE]);
        assert_eq!(size(16_383), [0x20, 0x3F, 0xFF]);
    }

    #[test]
    fn ids_keep_their_marker_and_numbers_their_fewest_bytes() {
        assert_eq!(element(0x1A45_DFA3, &[]), [0x1A, 0x45, 0xDF, 0xA3, 0x80]);
        assert_eq!(uint(0xD7, 1), [0xD7, 0x81, 0x01]);
        assert_eq!(uint(0x002A_D7B1, 1_000_000), [0x2A, 0xD7, 0xB1, 0x83, 0x0F, 0x42, 0x40]);
        assert_eq!(uint(0xD7, 0), [0xD7, 0x81, 0x00]);
    }
}
