//! Exact positive rationals for frame rates, as Python's `Fraction` holds them: a float widget value becomes
//! the exact binary value of the float (`Fraction(29.97)`), and a saved file's rate is that value to the
//! nearest thousandth (`Fraction(round(fps * 1000), 1000)`, ties to even).

/// A positive rational number in lowest terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rational {
    num: u64,
    den: u64,
}

impl Rational {
    /// One.
    pub const ONE: Rational = Rational { num: 1, den: 1 };

    /// `num / den` in lowest terms; `None` when either is zero.
    pub fn new(num: u64, den: u64) -> Option<Rational> {
        if num == 0 || den == 0 {
            return None;
        }
        let g = gcd(num, den);
        Some(Rational { num: num / g, den: den / g })
    }

    /// The exact value of a positive finite float (Python's `Fraction(float)`); `None` for zero, negative,
    /// non-finite values or values whose exact fraction does not fit 64-bit terms.
    pub fn from_f64(value: f64) -> Option<Rational> {
        if !value.is_finite() || value <= 0.0 {
            return None;
        }
        let bits = value.to_bits();
        let exponent = ((bits >> 52) & 0x7ff) as i32;
        let fraction = bits & ((1u64 << 52) - 1);
        let (mantissa, exponent) = if exponent == 0 {
            (fraction, -1074)
        } else {
            (fraction | (1u64 << 52), exponent - 1075)
        };
        // value = mantissa · 2^exponent.
        let twos = mantissa.trailing_zeros() as i32;
        let (mantissa, exponent) = (mantissa >> twos, exponent + twos);
        if exponent >= 0 {
            if mantissa.leading_zeros() < exponent as u32 {
                return None;
            }
            Rational::new(mantissa << exponent, 1)
        } else {
            let shift = exponent.unsigned_abs();
            if shift >= 64 {
                return None;
            }
            Rational::new(mantissa, 1u64 << shift)
        }
    }

    /// The closest fraction to `num / den` whose terms are both at most `max` (the best rational approximation
    /// by continued fractions, as FFmpeg's `av_reduce` finds it); `None` when either is zero.
    pub fn approximate(num: u64, den: u64, max: u64) -> Option<Rational> {
        let exact = Rational::new(num, den)?;
        if exact.num <= max && exact.den <= max {
            return Some(exact);
        }
        let (mut n, mut d) = (exact.num, exact.den);
        // Convergents p/q: the one before and the latest.
        let (mut p0, mut q0, mut p1, mut q1) = (0u64, 1u64, 1u64, 0u64);
        while d != 0 {
            let x = n / d;
            let (p2, q2) = (x * p1 + p0, x * q1 + q0);
            if p2 > max || q2 > max {
                // The largest semiconvergent within bounds, if it is closer than the last convergent.
                let mut k = x;
                for bound in
                    [(max - p0).checked_div(p1), (max - q0).checked_div(q1)].into_iter().flatten()
                {
                    k = k.min(bound);
                }
                if d as u128 * (2 * k as u128 * q1 as u128 + q0 as u128) > n as u128 * q1 as u128 {
                    (p1, q1) = (k * p1 + p0, k * q1 + q0);
                }
                break;
            }
            (p0, q0, p1, q1) = (p1, q1, p2, q2);
            (n, d) = (d, n - d * x);
        }
        Rational::new(p1, q1)
    }

    /// The numerator.
    pub fn num(self) -> u64 {
        self.num
    }

    /// The denominator.
    pub fn den(self) -> u64 {
        self.den
    }

    /// The nearest float (Python's `float(Fraction)`).
    pub fn to_f64(self) -> f64 {
        self.num as f64 / self.den as f64
    }

    /// `round(self · 1000)`, ties to even, as Python rounds a `Fraction`.
    pub fn thousandths(self) -> u64 {
        let scaled = u128::from(self.num) * 1000;
        let den = u128::from(self.den);
        let (q, r) = (scaled / den, scaled % den);
        let rounded = match (2 * r).cmp(&den) {
            std::cmp::Ordering::Less => q,
            std::cmp::Ordering::Greater => q + 1,
            std::cmp::Ordering::Equal => q + (q & 1),
        };
        u64::try_from(rounded).unwrap_or(u64::MAX)
    }
}

impl std::fmt::Display for Rational {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.den == 1 {
            write!(f, "{}", self.num)
        } else {
            write!(f, "{}/{}", self.num, self.den)
        }
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::Rational;

    #[test]
    fn floats_become_their_exact_binary_value() {
        let exact = |v: f64| Rational::from_f64(v).map(|r| (r.num(), r.den()));
        assert_eq!(exact(30.0), Some((30, 1)));
        assert_eq!(exact(0.5), Some((1, 2)));
        // Python: Fraction(29.97) == Fraction(1054475631502295, 35184372088832).
        assert_eq!(exact(29.97), Some((1054475631502295, 35184372088832)));
        assert_eq!(exact(0.0), None);
        assert_eq!(exact(-1.0), None);
        assert_eq!(exact(f64::NAN), None);
    }

    #[test]
    fn thousandths_round_half_to_even() {
        let r = |v: f64| Rational::from_f64(v).map(|r| r.thousandths());
        assert_eq!(r(24.0), Some(24000));
        assert_eq!(r(29.97), Some(29970));
        // Exact halves go to the even neighbour: 0.5 → 0, 1.5 → 2.
        assert_eq!(Rational::new(1, 2000).map(|r| r.thousandths()), Some(0));
        assert_eq!(Rational::new(3, 2000).map(|r| r.thousandths()), Some(2));
    }
}
