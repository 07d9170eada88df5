//! GLSL's operators on numbers: component-wise arithmetic with a scalar spread over a vector or matrix, the
//! linear-algebra products of matrices and vectors, comparisons, and the bitwise operators on integers.

use super::ShaderError;
use super::ir::{BinOp, UnOp};
use super::value::{Base, Mat, Num, Val};

/// The base both operands are computed in: their own when they agree, float when either is one (desktop
/// GLSL's implicit conversion, which GLSL ES refuses), uint for int with uint.
fn common_base(a: Base, b: Base, op: BinOp) -> Result<Base, ShaderError> {
    match (a, b) {
        _ if a == b => Ok(a),
        (Base::Bool, _) | (_, Base::Bool) => {
            Err(ShaderError::new(format!("operator {} cannot mix bool with a number", symbol(op))))
        }
        (Base::Float, _) | (_, Base::Float) => Ok(Base::Float),
        _ => Ok(Base::Uint),
    }
}

/// The operator as GLSL spells it.
fn symbol(op: BinOp) -> &'static str {
    match op {
        BinOp::Add => "+",
        BinOp::Sub => "-",
        BinOp::Mul => "*",
        BinOp::Div => "/",
        BinOp::Mod => "%",
        BinOp::BitAnd => "&",
        BinOp::BitOr => "|",
        BinOp::BitXor => "^",
        BinOp::Shl => "<<",
        BinOp::Shr => ">>",
        BinOp::Less => "<",
        BinOp::Greater => ">",
        BinOp::LessEq => "<=",
        BinOp::GreaterEq => ">=",
        BinOp::Eq => "==",
        BinOp::NotEq => "!=",
        BinOp::Xor => "^^",
    }
}

/// `a op b`.
pub(super) fn binary(op: BinOp, a: &Val, b: &Val) -> Result<Val, ShaderError> {
    if matches!(op, BinOp::Eq | BinOp::NotEq) {
        let equal = equal(a, b)?;
        return Ok(Val::Num(Num::boolean(equal == (op == BinOp::Eq))));
    }
    let (x, y) = match (a, b) {
        (Val::Num(x), Val::Num(y)) => (*x, *y),
        (Val::Mat(_), _) | (_, Val::Mat(_)) => return matrix(op, a, b),
        _ => {
            let other = if matches!(a, Val::Num(_)) { b } else { a };
            return Err(ShaderError::new(format!(
                "operator {} needs numbers, not {}",
                symbol(op),
                other.describe()
            )));
        }
    };
    match op {
        BinOp::Less | BinOp::Greater | BinOp::LessEq | BinOp::GreaterEq => compare(op, x, y),
        BinOp::Xor => {
            if x.base != Base::Bool || y.base != Base::Bool || !x.is_scalar() || !y.is_scalar() {
                return Err(ShaderError::new("operator ^^ needs two bools"));
            }
            Ok(Val::Num(Num::boolean(x.b(0) != y.b(0))))
        }
        BinOp::Shl | BinOp::Shr => shift(op, x, y),
        _ => componentwise(op, x, y).map(Val::Num),
    }
}

/// `a == b` as GLSL compares: floats as numbers (`-0.0 == 0.0`, a NaN equal to nothing), aggregates member by
/// member.
fn equal(a: &Val, b: &Val) -> Result<bool, ShaderError> {
    Ok(match (a, b) {
        (Val::Num(x), Val::Num(y)) => {
            let base = common_base(x.base, y.base, BinOp::Eq)?;
            let (x, y) = (x.convert(base), y.convert(base));
            x.len == y.len
                && (0..x.len()).all(|i| match base {
                    Base::Float => x.f(i) == y.f(i),
                    _ => x.bits[i] == y.bits[i],
                })
        }
        (Val::Mat(x), Val::Mat(y)) => {
            (x.cols, x.rows) == (y.cols, y.rows)
                && x.data[..x.len()].iter().zip(&y.data[..y.len()]).all(|(p, q)| p == q)
        }
        (Val::Array(x), Val::Array(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y.iter())
                    .map(|(p, q)| equal(p, q))
                    .collect::<Result<Vec<_>, _>>()?
                    .into_iter()
                    .all(|e| e)
        }
        (Val::Struct(x), Val::Struct(y)) => {
            x.id == y.id
                && x.fields
                    .iter()
                    .zip(&y.fields)
                    .map(|(p, q)| equal(p, q))
                    .collect::<Result<Vec<_>, _>>()?
                    .into_iter()
                    .all(|e| e)
        }
        _ => {
            return Err(ShaderError::new(format!(
                "cannot compare {} with {}",
                a.describe(),
                b.describe()
            )));
        }
    })
}

/// An operator with a matrix on either side: the linear-algebra product for `*` of a matrix and a vector or
/// matrix, else component by component (a scalar spread over the matrix).
fn matrix(op: BinOp, a: &Val, b: &Val) -> Result<Val, ShaderError> {
    let refuse = || {
        ShaderError::new(format!(
            "operator {} cannot combine {} with {}",
            symbol(op),
            a.describe(),
            b.describe()
        ))
    };
    let scalar = |v: &Val| match v {
        Val::Num(n) if n.is_scalar() && n.base != Base::Bool => Some(n.f(0)),
        _ => None,
    };
    let arithmetic = |x: f32, y: f32| match op {
        BinOp::Add => Some(x + y),
        BinOp::Sub => Some(x - y),
        BinOp::Mul => Some(x * y),
        BinOp::Div => Some(x / y),
        _ => None,
    };
    let each = |m: &Mat, f: &dyn Fn(f32, usize) -> Option<f32>| -> Result<Val, ShaderError> {
        let mut out = *m;
        for i in 0..m.len() {
            out.data[i] = f(m.data[i], i).ok_or_else(refuse)?;
        }
        Ok(Val::Mat(Box::new(out)))
    };
    match (a, b) {
        (Val::Mat(m), Val::Mat(n)) if op == BinOp::Mul => {
            if m.cols != n.rows {
                return Err(refuse());
            }
            let (rows, inner) = (usize::from(m.rows), usize::from(m.cols));
            let mut out = Mat::zero(n.cols, m.rows);
            for j in 0..usize::from(n.cols) {
                for i in 0..rows {
                    out.data[j * rows + i] = (0..inner).fold(0.0, |acc, k| {
                        acc + m.data[k * rows + i] * n.data[j * usize::from(n.rows) + k]
                    });
                }
            }
            Ok(Val::Mat(Box::new(out)))
        }
        (Val::Mat(m), Val::Mat(n)) if m.cols == n.cols && m.rows == n.rows => {
            each(m, &|x, i| arithmetic(x, n.data[i]))
        }
        (Val::Mat(m), Val::Num(v)) if op == BinOp::Mul && !v.is_scalar() => {
            // A matrix times a column vector.
            if v.len() != usize::from(m.cols) {
                return Err(refuse());
            }
            let rows = usize::from(m.rows);
            let mut out = Num::zero(Base::Float, m.rows);
            for i in 0..rows {
                let sum = (0..v.len()).fold(0.0f32, |acc, k| acc + m.data[k * rows + i] * v.f(k));
                out.bits[i] = sum.to_bits();
            }
            Ok(Val::Num(out))
        }
        (Val::Num(v), Val::Mat(m)) if op == BinOp::Mul && !v.is_scalar() => {
            // A row vector times a matrix.
            if v.len() != usize::from(m.rows) {
                return Err(refuse());
            }
            let rows = usize::from(m.rows);
            let mut out = Num::zero(Base::Float, m.cols);
            for j in 0..usize::from(m.cols) {
                let sum = (0..rows).fold(0.0f32, |acc, k| acc + v.f(k) * m.data[j * rows + k]);
                out.bits[j] = sum.to_bits();
            }
            Ok(Val::Num(out))
        }
        (Val::Mat(m), other) => {
            let s = scalar(other).ok_or_else(refuse)?;
            each(m, &|x, _| arithmetic(x, s))
        }
        (other, Val::Mat(m)) => {
            let s = scalar(other).ok_or_else(refuse)?;
            each(m, &|x, _| arithmetic(s, x))
        }
        _ => Err(refuse()),
    }
}

/// How many components a component-wise result has: both operands' when they agree, else the vector's.
fn shape(op: BinOp, x: &Num, y: &Num) -> Result<u8, ShaderError> {
    if x.len == y.len || y.is_scalar() {
        Ok(x.len)
    } else if x.is_scalar() {
        Ok(y.len)
    } else {
        Err(ShaderError::new(format!(
            "operator {} cannot combine {} with {}",
            symbol(op),
            x.type_name(),
            y.type_name()
        )))
    }
}

/// `x op y` component by component (arithmetic and bitwise operators).
fn componentwise(op: BinOp, x: Num, y: Num) -> Result<Num, ShaderError> {
    let base = common_base(x.base, y.base, op)?;
    let len = usize::from(shape(op, &x, &y)?);
    let (x, y) = (x.convert(base), y.convert(base));
    let mut out = Num::zero(base, len as u8);
    let (sx, sy) = (x.is_scalar(), y.is_scalar());
    let pair = |i: usize| (x.bits[if sx { 0 } else { i }], y.bits[if sy { 0 } else { i }]);
    match base {
        Base::Float => {
            let f: fn(f32, f32) -> f32 = match op {
                BinOp::Add => |a, b| a + b,
                BinOp::Sub => |a, b| a - b,
                BinOp::Mul => |a, b| a * b,
                BinOp::Div => |a, b| a / b,
                _ => {
                    return Err(ShaderError::new(format!(
                        "operator {} does not take floats{}",
                        symbol(op),
                        if op == BinOp::Mod { " (use mod())" } else { "" }
                    )));
                }
            };
            for i in 0..len {
                let (a, b) = pair(i);
                out.bits[i] = f(f32::from_bits(a), f32::from_bits(b)).to_bits();
            }
        }
        Base::Int | Base::Uint => {
            // Two's complement: only division and remainder read the sign.
            let signed = base == Base::Int;
            let f: fn(u32, u32) -> u32 = match (op, signed) {
                (BinOp::Add, _) => u32::wrapping_add,
                (BinOp::Sub, _) => u32::wrapping_sub,
                (BinOp::Mul, _) => u32::wrapping_mul,
                (BinOp::Div, true) => |a, b| (a as i32).checked_div(b as i32).unwrap_or(0) as u32,
                (BinOp::Div, false) => |a, b| a.checked_div(b).unwrap_or(0),
                (BinOp::Mod, true) => |a, b| (a as i32).checked_rem(b as i32).unwrap_or(0) as u32,
                (BinOp::Mod, false) => |a, b| a.checked_rem(b).unwrap_or(0),
                (BinOp::BitAnd, _) => |a, b| a & b,
                (BinOp::BitOr, _) => |a, b| a | b,
                (BinOp::BitXor, _) => |a, b| a ^ b,
                _ => return Err(not_componentwise(op)),
            };
            for i in 0..len {
                let (a, b) = pair(i);
                out.bits[i] = f(a, b);
            }
        }
        Base::Bool => {
            return Err(ShaderError::new(format!("operator {} does not take bools", symbol(op))));
        }
    }
    Ok(out)
}

/// The error for an operator [`componentwise`] is never given.
fn not_componentwise(op: BinOp) -> ShaderError {
    ShaderError::new(format!("operator {} is not component-wise", symbol(op)))
}

/// `<`, `>`, `<=`, `>=` on two scalars.
fn compare(op: BinOp, x: Num, y: Num) -> Result<Val, ShaderError> {
    if !x.is_scalar() || !y.is_scalar() {
        return Err(ShaderError::new(format!(
            "operator {} compares scalars (use lessThan() and the like for vectors)",
            symbol(op)
        )));
    }
    let ordering = match common_base(x.base, y.base, op)? {
        Base::Float => x.f(0).partial_cmp(&y.f(0)),
        Base::Int => Some(x.i(0).cmp(&y.i(0))),
        Base::Uint => Some(x.u(0).cmp(&y.u(0))),
        Base::Bool => return Err(ShaderError::new("bools cannot be ordered")),
    };
    let result = ordering.is_some_and(|o| match op {
        BinOp::Less => o.is_lt(),
        BinOp::Greater => o.is_gt(),
        BinOp::LessEq => o.is_le(),
        _ => o.is_ge(),
    });
    Ok(Val::Num(Num::boolean(result)))
}

/// `<<` and `>>`: the left operand's type, shifted by the right's components (or its one scalar).
fn shift(op: BinOp, x: Num, y: Num) -> Result<Val, ShaderError> {
    let integers = |n: &Num| matches!(n.base, Base::Int | Base::Uint);
    if !integers(&x) || !integers(&y) || !(y.is_scalar() || y.len() == x.len()) {
        return Err(ShaderError::new(format!(
            "operator {} shifts integers by integers",
            symbol(op)
        )));
    }
    let mut out = x;
    for i in 0..x.len() {
        let by = y.u(if y.is_scalar() { 0 } else { i });
        out.bits[i] = match (op, x.base) {
            (BinOp::Shl, _) => x.bits[i].wrapping_shl(by),
            (_, Base::Int) => x.i(i).wrapping_shr(by) as u32,
            _ => x.bits[i].wrapping_shr(by),
        };
    }
    Ok(Val::Num(out))
}

/// `op x` for the operators that do not write.
pub(super) fn unary(op: UnOp, x: &Val) -> Result<Val, ShaderError> {
    if let (UnOp::Neg, Val::Mat(m)) = (op, x) {
        let mut out = **m;
        for v in &mut out.data {
            *v = -*v;
        }
        return Ok(Val::Mat(Box::new(out)));
    }
    let n = x.num("a unary operator")?;
    let mut out = n;
    match op {
        UnOp::Neg => {
            for i in 0..n.len() {
                out.bits[i] = match n.base {
                    Base::Float => (-n.f(i)).to_bits(),
                    Base::Int | Base::Uint => n.bits[i].wrapping_neg(),
                    Base::Bool => return Err(ShaderError::new("cannot negate a bool")),
                };
            }
        }
        UnOp::Not => {
            if n.base != Base::Bool || !n.is_scalar() {
                return Err(ShaderError::new("operator ! takes one bool (use not() for vectors)"));
            }
            out.bits[0] ^= 1;
        }
        UnOp::Complement => {
            if !matches!(n.base, Base::Int | Base::Uint) {
                return Err(ShaderError::new("operator ~ takes integers"));
            }
            for i in 0..n.len() {
                out.bits[i] = !n.bits[i];
            }
        }
    }
    Ok(Val::Num(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floats(v: &[f32]) -> Val {
        Val::Num(Num::floats(v))
    }

    #[test]
    fn a_scalar_spreads_over_a_vector_and_ints_divide_toward_zero() {
        let sum = binary(BinOp::Mul, &floats(&[2.0]), &floats(&[1.0, 2.0, 3.0])).unwrap();
        assert_eq!(sum, floats(&[2.0, 4.0, 6.0]));
        let q = binary(BinOp::Div, &Val::Num(Num::int(-7)), &Val::Num(Num::int(2))).unwrap();
        assert_eq!(q, Val::Num(Num::int(-3)));
        let shifted = binary(BinOp::Shr, &Val::Num(Num::int(0xABCDEF)), &Val::Num(Num::int(8)));
        assert_eq!(shifted.unwrap(), Val::Num(Num::int(0xABCD)));
    }

    #[test]
    fn matrices_multiply_column_major() {
        // mat2(1, 2, 3, 4) has columns (1, 2) and (3, 4).
        let mut m = Mat::zero(2, 2);
        m.data[..4].copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        let m = Val::Mat(Box::new(m));
        let v = floats(&[5.0, 6.0]);
        assert_eq!(binary(BinOp::Mul, &m, &v).unwrap(), floats(&[23.0, 34.0]));
        assert_eq!(binary(BinOp::Mul, &v, &m).unwrap(), floats(&[17.0, 39.0]));
    }

    #[test]
    fn floats_compare_as_numbers() {
        let eq = |a: f32, b: f32| binary(BinOp::Eq, &floats(&[a]), &floats(&[b])).unwrap();
        assert_eq!(eq(-0.0, 0.0), Val::Num(Num::boolean(true)));
        assert_eq!(eq(f32::NAN, f32::NAN), Val::Num(Num::boolean(false)));
    }

    #[test]
    fn mismatched_operands_are_refused_by_name() {
        let err = binary(BinOp::Add, &floats(&[1.0, 2.0]), &floats(&[1.0, 2.0, 3.0])).unwrap_err();
        assert!(err.to_string().contains("cannot combine vec2 with vec3"), "{err}");
        let err = binary(BinOp::Mod, &floats(&[1.0]), &floats(&[2.0])).unwrap_err();
        assert!(err.to_string().contains("use mod()"), "{err}");
    }
}
