//! GLSL's operators on numbers: component-wise arithmetic with a scalar spread over a vector or matrix, the
//! linear-algebra products of matrices and vectors, comparisons, and the bitwise operators on integers.

use super::ShaderError;
use super::ir::{BinOp, UnOp};
use super::value::{Base, Num, Val};

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
        let equal = match (a, b) {
            (Val::Num(x), Val::Num(y)) => {
                let base = common_base(x.base, y.base, op)?;
                x.cols == y.cols && x.rows == y.rows && x.convert(base) == y.convert(base)
            }
            _ => a == b,
        };
        return Ok(Val::Num(Num::boolean(equal == (op == BinOp::Eq))));
    }
    let (Val::Num(x), Val::Num(y)) = (a, b) else {
        let other = if matches!(a, Val::Num(_)) { b } else { a };
        return Err(ShaderError::new(format!(
            "operator {} needs numbers, not {}",
            symbol(op),
            other.describe()
        )));
    };
    let (x, y) = (*x, *y);
    match op {
        BinOp::Less | BinOp::Greater | BinOp::LessEq | BinOp::GreaterEq => compare(op, x, y),
        BinOp::Xor => {
            if x.base != Base::Bool || y.base != Base::Bool || !x.is_scalar() || !y.is_scalar() {
                return Err(ShaderError::new("operator ^^ needs two bools"));
            }
            Ok(Val::Num(Num::boolean(x.b(0) != y.b(0))))
        }
        BinOp::Shl | BinOp::Shr => shift(op, x, y),
        BinOp::Mul if !x.is_scalar() && !y.is_scalar() && (x.cols > 1 || y.cols > 1) => {
            product(x, y).map(Val::Num)
        }
        _ => componentwise(op, x, y).map(Val::Num),
    }
}

/// The shape of a component-wise result: both operands' when they agree, else the non-scalar one's.
fn shape(op: BinOp, x: &Num, y: &Num) -> Result<(u8, u8), ShaderError> {
    if x.cols == y.cols && x.rows == y.rows || y.is_scalar() {
        Ok((x.cols, x.rows))
    } else if x.is_scalar() {
        Ok((y.cols, y.rows))
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
    let (cols, rows) = shape(op, &x, &y)?;
    let mut out = Num::zero(base, cols, rows);
    let (sx, sy) = (x.is_scalar(), y.is_scalar());
    for i in 0..out.len() {
        let (i_x, i_y) = (if sx { 0 } else { i }, if sy { 0 } else { i });
        out.bits[i] = match base {
            Base::Float => {
                let (a, b) = (x.f(i_x), y.f(i_y));
                match op {
                    BinOp::Add => a + b,
                    BinOp::Sub => a - b,
                    BinOp::Mul => a * b,
                    BinOp::Div => a / b,
                    _ => {
                        return Err(ShaderError::new(format!(
                            "operator {} does not take floats{}",
                            symbol(op),
                            if op == BinOp::Mod { " (use mod())" } else { "" }
                        )));
                    }
                }
                .to_bits()
            }
            Base::Int => {
                let (a, b) = (x.i(i_x), y.i(i_y));
                (match op {
                    BinOp::Add => a.wrapping_add(b),
                    BinOp::Sub => a.wrapping_sub(b),
                    BinOp::Mul => a.wrapping_mul(b),
                    BinOp::Div => a.checked_div(b).unwrap_or(0),
                    BinOp::Mod => a.checked_rem(b).unwrap_or(0),
                    BinOp::BitAnd => a & b,
                    BinOp::BitOr => a | b,
                    BinOp::BitXor => a ^ b,
                    _ => unreachable_op(op)?,
                }) as u32
            }
            Base::Uint => {
                let (a, b) = (x.u(i_x), y.u(i_y));
                match op {
                    BinOp::Add => a.wrapping_add(b),
                    BinOp::Sub => a.wrapping_sub(b),
                    BinOp::Mul => a.wrapping_mul(b),
                    BinOp::Div => a.checked_div(b).unwrap_or(0),
                    BinOp::Mod => a.checked_rem(b).unwrap_or(0),
                    BinOp::BitAnd => a & b,
                    BinOp::BitOr => a | b,
                    BinOp::BitXor => a ^ b,
                    _ => unreachable_op(op)? as u32,
                }
            }
            Base::Bool => {
                return Err(ShaderError::new(format!(
                    "operator {} does not take bools",
                    symbol(op)
                )));
            }
        };
    }
    Ok(out)
}

/// An operator [`componentwise`] is never given.
fn unreachable_op(op: BinOp) -> Result<i32, ShaderError> {
    Err(ShaderError::new(format!("operator {} is not component-wise", symbol(op))))
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

/// The linear-algebra product of a matrix and a vector or matrix (or a vector and a matrix): `x` as `cols`
/// columns of `rows`, a vector on the left taken as a row.
fn product(x: Num, y: Num) -> Result<Num, ShaderError> {
    let (x, y) = (x.convert(Base::Float), y.convert(Base::Float));
    let mismatch =
        || ShaderError::new(format!("cannot multiply {} by {}", x.type_name(), y.type_name()));
    let (xc, xr, yc, yr) =
        (usize::from(x.cols), usize::from(x.rows), usize::from(y.cols), usize::from(y.rows));
    if x.cols == 1 {
        // A row vector times a matrix: one component per column of y.
        if xr != yr {
            return Err(mismatch());
        }
        let mut out = Num::zero(Base::Float, 1, y.cols);
        for j in 0..yc {
            let sum = (0..yr).fold(0.0f32, |acc, k| acc + x.f(k) * y.f(j * yr + k));
            out.bits[j] = sum.to_bits();
        }
        return Ok(out);
    }
    // A matrix times a column vector (one column) or a matrix.
    if xc != yr {
        return Err(mismatch());
    }
    let mut out = Num::zero(Base::Float, y.cols, x.rows);
    for j in 0..yc {
        for i in 0..xr {
            let sum = (0..xc).fold(0.0f32, |acc, k| acc + x.f(k * xr + i) * y.f(j * yr + k));
            out.bits[j * xr + i] = sum.to_bits();
        }
    }
    Ok(out)
}

/// `op x` for the operators that do not write.
pub(super) fn unary(op: UnOp, x: &Val) -> Result<Val, ShaderError> {
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
        let mut m = Num::floats(&[1.0, 2.0, 3.0, 4.0]);
        (m.cols, m.rows) = (2, 2);
        let v = floats(&[5.0, 6.0]);
        assert_eq!(binary(BinOp::Mul, &Val::Num(m), &v).unwrap(), floats(&[23.0, 34.0]));
        assert_eq!(binary(BinOp::Mul, &v, &Val::Num(m)).unwrap(), floats(&[17.0, 39.0]));
    }

    #[test]
    fn mismatched_operands_are_refused_by_name() {
        let err = binary(BinOp::Add, &floats(&[1.0, 2.0]), &floats(&[1.0, 2.0, 3.0])).unwrap_err();
        assert!(err.to_string().contains("cannot combine vec2 with vec3"), "{err}");
        let err = binary(BinOp::Mod, &floats(&[1.0]), &floats(&[2.0])).unwrap_err();
        assert!(err.to_string().contains("use mod()"), "{err}");
    }
}
