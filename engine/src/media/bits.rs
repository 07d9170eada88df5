//! Big-endian bit reading for the codec headers Kiln reads itself (an H.264 SPS, a VP9 frame header): single
//! bits, fixed-width fields and exp-Golomb numbers.

/// A reader over bytes, most significant bit first.
pub(crate) struct Bits<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Bits<'a> {
    /// Reading `data` from bit `at`.
    pub(crate) fn new(data: &'a [u8], at: usize) -> Bits<'a> {
        Bits { data, at }
    }

    /// One bit; `None` past the end.
    pub(crate) fn bit(&mut self) -> Option<u32> {
        let byte = self.data.get(self.at / 8)?;
        let bit = (byte >> (7 - self.at % 8)) & 1;
        self.at += 1;
        Some(u32::from(bit))
    }

    /// An `n`-bit unsigned field (`n` ≤ 32).
    pub(crate) fn read(&mut self, n: usize) -> Option<u32> {
        (0..n).try_fold(0u32, |value, _| Some(value << 1 | self.bit()?))
    }

    /// An unsigned exp-Golomb number (`ue(v)`).
    pub(crate) fn ue(&mut self) -> Option<u32> {
        let mut zeros = 0;
        while self.bit()? == 0 {
            zeros += 1;
            if zeros > 31 {
                return None;
            }
        }
        let mut value = 1u64;
        for _ in 0..zeros {
            value = (value << 1) | u64::from(self.bit()?);
        }
        u32::try_from(value - 1).ok()
    }

    /// A signed exp-Golomb number (`se(v)`).
    pub(crate) fn se(&mut self) -> Option<i32> {
        let k = i64::from(self.ue()?);
        let value = if k % 2 == 1 { (k + 1) / 2 } else { -(k / 2) };
        i32::try_from(value).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::Bits;

    #[test]
    fn fields_and_exp_golomb_numbers() {
        // 1 | 010 | 011 | 00100 | 0 -> bit 1, ue 1, ue 2, ue 3, then a bit.
        let mut bits = Bits::new(&[0b1010_0110, 0b0100_0000], 0);
        assert_eq!(bits.bit(), Some(1));
        assert_eq!(bits.ue(), Some(1));
        assert_eq!(bits.ue(), Some(2));
        assert_eq!(bits.ue(), Some(3));
        assert_eq!(bits.read(1), Some(0));
        // se: codes 1, 2, 3 are +1, -1, +2.
        let mut bits = Bits::new(&[0b0100_1100, 0b1000_0000], 0);
        assert_eq!((bits.se(), bits.se(), bits.se()), (Some(1), Some(-1), Some(2)));
        assert_eq!(Bits::new(&[0xAB], 0).read(8), Some(0xAB));
        assert_eq!(Bits::new(&[0xAB], 4).read(8), None);
    }
}
