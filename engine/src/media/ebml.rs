//! EBML, the binary format Matroska and WebM files are made of: each element is an ID, its body's length as a
//! variable-length integer, and the body (a number, a string, bytes or more elements). [`id`] names the
//! Matroska elements Kiln writes (`webm`) and reads (`mkv`).

/// Matroska element IDs, as numbered with their length markers.
pub(crate) mod id {
    pub(crate) const EBML: u64 = 0x1A45_DFA3;
    pub(crate) const EBML_VERSION: u64 = 0x4286;
    pub(crate) const EBML_READ_VERSION: u64 = 0x42F7;
    pub(crate) const EBML_MAX_ID_LENGTH: u64 = 0x42F2;
    pub(crate) const EBML_MAX_SIZE_LENGTH: u64 = 0x42F3;
    pub(crate) const DOC_TYPE: u64 = 0x4282;
    pub(crate) const DOC_TYPE_VERSION: u64 = 0x4287;
    pub(crate) const DOC_TYPE_READ_VERSION: u64 = 0x4285;
    pub(crate) const SEGMENT: u64 = 0x1853_8067;
    pub(crate) const SEEK_HEAD: u64 = 0x114D_9B74;
    pub(crate) const SEEK: u64 = 0x4DBB;
    pub(crate) const SEEK_ID: u64 = 0x53AB;
    pub(crate) const SEEK_POSITION: u64 = 0x53AC;
    pub(crate) const INFO: u64 = 0x1549_A966;
    pub(crate) const TIMESTAMP_SCALE: u64 = 0x2A_D7B1;
    pub(crate) const MUXING_APP: u64 = 0x4D80;
    pub(crate) const WRITING_APP: u64 = 0x5741;
    pub(crate) const DURATION: u64 = 0x4489;
    pub(crate) const TRACKS: u64 = 0x1654_AE6B;
    pub(crate) const TRACK_ENTRY: u64 = 0xAE;
    pub(crate) const TRACK_NUMBER: u64 = 0xD7;
    pub(crate) const TRACK_UID: u64 = 0x73C5;
    pub(crate) const FLAG_LACING: u64 = 0x9C;
    pub(crate) const LANGUAGE: u64 = 0x22_B59C;
    pub(crate) const TRACK_TYPE: u64 = 0x83;
    pub(crate) const CODEC_ID: u64 = 0x86;
    pub(crate) const CODEC_PRIVATE: u64 = 0x63A2;
    pub(crate) const DEFAULT_DURATION: u64 = 0x0023_E383;
    pub(crate) const VIDEO: u64 = 0xE0;
    pub(crate) const PIXEL_WIDTH: u64 = 0xB0;
    pub(crate) const PIXEL_HEIGHT: u64 = 0xBA;
    pub(crate) const ALPHA_MODE: u64 = 0x53C0;
    pub(crate) const AUDIO: u64 = 0xE1;
    pub(crate) const SAMPLING_FREQUENCY: u64 = 0xB5;
    pub(crate) const CHANNELS: u64 = 0x9F;
    pub(crate) const TAGS: u64 = 0x1254_C367;
    pub(crate) const TAG: u64 = 0x7373;
    pub(crate) const TARGETS: u64 = 0x63C0;
    pub(crate) const TAG_TRACK_UID: u64 = 0x63C5;
    pub(crate) const TAG_EDITION_UID: u64 = 0x63C9;
    pub(crate) const TAG_CHAPTER_UID: u64 = 0x63C4;
    pub(crate) const TAG_ATTACHMENT_UID: u64 = 0x63C6;
    pub(crate) const SIMPLE_TAG: u64 = 0x67C8;
    pub(crate) const TAG_NAME: u64 = 0x45A3;
    pub(crate) const TAG_STRING: u64 = 0x4487;
    pub(crate) const CLUSTER: u64 = 0x1F43_B675;
    pub(crate) const TIMESTAMP: u64 = 0xE7;
    pub(crate) const SIMPLE_BLOCK: u64 = 0xA3;
    pub(crate) const BLOCK_GROUP: u64 = 0xA0;
    pub(crate) const BLOCK: u64 = 0xA1;
    pub(crate) const BLOCK_ADDITIONS: u64 = 0x75A1;
    pub(crate) const BLOCK_MORE: u64 = 0xA6;
    pub(crate) const BLOCK_ADD_ID: u64 = 0xEE;
    pub(crate) const BLOCK_ADDITIONAL: u64 = 0xA5;
    pub(crate) const REFERENCE_BLOCK: u64 = 0xFB;
    pub(crate) const DISCARD_PADDING: u64 = 0x75A2;
    pub(crate) const CUES: u64 = 0x1C53_BB6B;
    pub(crate) const CUE_POINT: u64 = 0xBB;
    pub(crate) const CUE_TIME: u64 = 0xB3;
    pub(crate) const CUE_TRACK_POSITIONS: u64 = 0xB7;
    pub(crate) const CUE_TRACK: u64 = 0xF7;
    pub(crate) const CUE_CLUSTER_POSITION: u64 = 0xF1;
    pub(crate) const CHAPTERS: u64 = 0x1043_A770;
    pub(crate) const ATTACHMENTS: u64 = 0x1941_A469;
}

/// An element with its body, ready to be nested or written.
pub(crate) fn element(id: u64, body: &[u8]) -> Vec<u8> {
    let mut out = id_bytes(id);
    out.extend(size(body.len() as u64));
    out.extend_from_slice(body);
    out
}

/// An element holding elements.
pub(crate) fn master(id: u64, children: &[Vec<u8>]) -> Vec<u8> {
    element(id, &children.concat())
}

/// An unsigned integer element in its fewest bytes (at least one).
pub(crate) fn uint(id: u64, value: u64) -> Vec<u8> {
    let bytes = value.to_be_bytes();
    let skip = (value.leading_zeros() / 8).min(7) as usize;
    element(id, &bytes[skip..])
}

/// An unsigned integer element always 8 bytes long (a position written before the layout around it is final).
pub(crate) fn uint8(id: u64, value: u64) -> Vec<u8> {
    element(id, &value.to_be_bytes())
}

/// A 64-bit float element.
pub(crate) fn float(id: u64, value: f64) -> Vec<u8> {
    element(id, &value.to_be_bytes())
}

/// A UTF-8 string element.
pub(crate) fn string(id: u64, value: &str) -> Vec<u8> {
    element(id, value.as_bytes())
}

/// An element ID's bytes: IDs carry their own length marker, so they are written as they are numbered.
pub(crate) fn id_bytes(id: u64) -> Vec<u8> {
    let bytes = id.to_be_bytes();
    let skip = (id.leading_zeros() / 8).min(7) as usize;
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
