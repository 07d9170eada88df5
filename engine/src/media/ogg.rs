//! Ogg pages (RFC 3533), Kiln's writer for `.opus` files: packets laid into pages of at most 255 segments,
//! each page stamped with the granule position of its last completed packet and its CRC.

/// One logical stream's packets, each with the granule position after it.
pub(crate) struct OggStream {
    serial: u32,
    sequence: u32,
    out: Vec<u8>,
}

/// The most 48 kHz samples a page holds before the next one starts (about a second, as libogg pages do).
const PAGE_GRANULES: u64 = 48_000;

impl OggStream {
    /// A stream with this serial number.
    pub(crate) fn new(serial: u32) -> OggStream {
        OggStream { serial, sequence: 0, out: Vec::new() }
    }

    /// A packet alone on its page (the Opus headers: each begins a page and ends it).
    pub(crate) fn header(&mut self, packet: &[u8], first: bool) {
        self.page(&[packet], 0, if first { 0x02 } else { 0x00 });
    }

    /// Audio packets and each one's granule position, in pages of about a second; the last page ends the
    /// stream.
    pub(crate) fn audio(&mut self, packets: &[(Vec<u8>, u64)]) {
        let mut start = 0;
        while start < packets.len() {
            let mut end = start;
            let mut segments = 0;
            while end < packets.len() {
                let needed = packets[end].0.len() / 255 + 1;
                let fits = segments + needed <= 255;
                // The last packet stays with the one before it, so the end-trimmed granule position of the
                // last page never falls below the page before's.
                let long =
                    packets[end].1 - packets[start].1 >= PAGE_GRANULES && end + 1 < packets.len();
                if end > start && (!fits || long) {
                    break;
                }
                segments += needed;
                end += 1;
            }
            let last = end == packets.len();
            let bodies: Vec<&[u8]> =
                packets[start..end].iter().map(|(p, _)| p.as_slice()).collect();
            self.page(&bodies, packets[end - 1].1, if last { 0x04 } else { 0x00 });
            start = end;
        }
    }

    /// The file.
    pub(crate) fn finish(self) -> Vec<u8> {
        self.out
    }

    fn page(&mut self, packets: &[&[u8]], granule: u64, flags: u8) {
        let mut lacing = Vec::new();
        for packet in packets {
            lacing.extend(std::iter::repeat_n(255u8, packet.len() / 255));
            lacing.push((packet.len() % 255) as u8);
        }
        let mut page = b"OggS".to_vec();
        page.push(0); // version
        page.push(flags);
        page.extend(granule.to_le_bytes());
        page.extend(self.serial.to_le_bytes());
        page.extend(self.sequence.to_le_bytes());
        page.extend([0; 4]); // CRC, filled below
        page.push(lacing.len() as u8);
        page.extend(lacing);
        for packet in packets {
            page.extend_from_slice(packet);
        }
        let crc = crc(&page);
        page[22..26].copy_from_slice(&crc.to_le_bytes());
        self.sequence += 1;
        self.out.extend(page);
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
    use super::crc;

    #[test]
    fn the_crc_is_oggs() {
        // The check value (over the ASCII digits 1 to 9) of Ogg's CRC: polynomial 0x04C11DB7, start 0,
        // no reflection, no final xor.
        assert_eq!(crc(b"123456789"), 0x89A1_897F);
    }
}
