//! Ogg pages (RFC 3533), Kiln's writer for `.opus` files: packets laid into pages of at most 255 segments (a
//! longer packet continues on the next page), each page stamped with the granule position of its last
//! completed packet (-1 where none ends) and its CRC.

/// One logical stream, written page by page.
pub(crate) struct OggStream {
    serial: u32,
    sequence: u32,
    out: Vec<u8>,
}

/// The most 48 kHz samples a page holds before the next one starts (about a second, as libogg pages do).
const PAGE_GRANULES: u64 = 48_000;

/// The granule position of a page on which no packet ends.
const NO_PACKET_ENDS: u64 = u64::MAX;

/// A page being filled: its lacing values, body, the granule position of its last completed packet, and
/// whether it begins with the rest of a packet.
struct Page {
    lacing: Vec<u8>,
    body: Vec<u8>,
    granule: u64,
    continued: bool,
}

impl Page {
    fn new(continued: bool) -> Page {
        Page { lacing: Vec::new(), body: Vec::new(), granule: NO_PACKET_ENDS, continued }
    }
}

impl OggStream {
    /// A stream with this serial number.
    pub(crate) fn new(serial: u32) -> OggStream {
        OggStream { serial, sequence: 0, out: Vec::new() }
    }

    /// A header packet (Opus's `OpusHead`, `OpusTags`): it starts a page and its last page ends with it,
    /// however many pages it takes.
    pub(crate) fn header(&mut self, packet: &[u8]) {
        self.packets(&[(packet, 0)], false, false);
    }

    /// Audio packets and each one's granule position, in pages of about a second; the last page ends the
    /// stream.
    pub(crate) fn audio(&mut self, packets: &[(Vec<u8>, u64)]) {
        let packets: Vec<(&[u8], u64)> = packets.iter().map(|(p, g)| (p.as_slice(), *g)).collect();
        self.packets(&packets, true, true);
    }

    /// The file.
    pub(crate) fn finish(self) -> Vec<u8> {
        self.out
    }

    /// Lays packets into pages: a packet longer than a page's 255 segments continues on the next page. With
    /// `split`, a page also ends at a packet boundary once it spans a second (the last packet stays with the
    /// one before it, so an end-trimmed final granule position never falls below the page before's).
    fn packets(&mut self, packets: &[(&[u8], u64)], split: bool, last: bool) {
        let mut page = Page::new(false);
        let mut page_start = None;
        for (i, &(packet, granule)) in packets.iter().enumerate() {
            let spans =
                page_start.is_some_and(|start| granule.saturating_sub(start) >= PAGE_GRANULES);
            if split && spans && !page.lacing.is_empty() && i + 1 < packets.len() {
                self.emit(std::mem::replace(&mut page, Page::new(false)), false);
                page_start = None;
            }
            page_start.get_or_insert(granule);
            let mut rest = packet;
            loop {
                if page.lacing.len() == 255 {
                    self.emit(std::mem::replace(&mut page, Page::new(true)), false);
                }
                let take = rest.len().min(255);
                page.lacing.push(take as u8);
                page.body.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                // A packet ends with a lacing value below 255 (a zero one when its length is a multiple).
                if take < 255 {
                    break;
                }
            }
            page.granule = granule;
        }
        self.emit(page, last);
    }

    fn emit(&mut self, page: Page, last: bool) {
        let mut flags = 0u8;
        if page.continued {
            flags |= 0x01;
        }
        if self.sequence == 0 {
            flags |= 0x02;
        }
        if last {
            flags |= 0x04;
        }
        let mut bytes = b"OggS".to_vec();
        bytes.push(0); // version
        bytes.push(flags);
        bytes.extend(page.granule.to_le_bytes());
        bytes.extend(self.serial.to_le_bytes());
        bytes.extend(self.sequence.to_le_bytes());
        bytes.extend([0; 4]); // CRC, filled below
        bytes.push(page.lacing.len() as u8);
        bytes.extend(page.lacing);
        bytes.extend(page.body);
        let crc = crc(&bytes);
        bytes[22..26].copy_from_slice(&crc.to_le_bytes());
        self.sequence += 1;
        self.out.extend(bytes);
    }
}

/// Ogg's CRC-32: polynomial 0x04C11DB7, not reflected, starting at 0.
fn crc(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0u32, |mut crc, &byte| {
        crc ^= u32::from(byte) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 { (crc << 1) ^ 0x04C1_1DB7 } else { crc << 1 };
        }
        crc
    })
}

#[cfg(test)]
mod tests {
    use super::{OggStream, crc};

    /// The pages of a stream: (flags, granule position, segment count, body length).
    fn pages(bytes: &[u8]) -> Vec<(u8, u64, usize, usize)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            assert_eq!(&bytes[at..at + 4], b"OggS");
            let granule = u64::from_le_bytes(bytes[at + 6..at + 14].try_into().expect("8 bytes"));
            let count = usize::from(bytes[at + 26]);
            let body: usize = bytes[at + 27..at + 27 + count].iter().map(|&b| usize::from(b)).sum();
            out.push((bytes[at + 5], granule, count, body));
            at += 27 + count + body;
        }
        out
    }

    #[test]
    fn a_long_packet_continues_over_pages() {
        let mut stream = OggStream::new(1);
        stream.header(&[7; 19]);
        // 100 000 bytes: 392 segments of 255 and one of 40, over two pages.
        stream.header(&vec![1; 100_000]);
        stream.audio(&[(vec![2; 10], 960), (vec![3; 10], 1_920)]);
        let pages = pages(&stream.finish());
        assert_eq!(
            pages,
            [
                (0x02, 0, 1, 19),
                (0x00, u64::MAX, 255, 255 * 255),
                (0x01, 0, 138, 100_000 - 255 * 255),
                (0x04, 1_920, 2, 20),
            ]
        );
    }

    #[test]
    fn the_crc_is_oggs() {
        // The check value (over the ASCII digits 1 to 9) of Ogg's CRC: polynomial 0x04C11DB7, start 0,
        // no reflection, no final xor.
        assert_eq!(crc(b"123456789"), 0x89A1_897F);
    }
}
