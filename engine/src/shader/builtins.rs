//! GLSL ES 3.00's built-in functions (the angle, exponential, common, geometric, matrix, vector-relational
//! and texture functions of chapter 8), computed in f32 as `highp` is.

use super::ShaderError;
use super::texture::Texture;
use super::value::{Base, Mat, Num, Val};

/// A built-in function.
#[derive(Clone, Copy, Debug)]
pub(super) enum Builtin {
    /// A float function of one argument, component by component.
    Unary(fn(f32) -> f32),
    Atan,
    Pow,
    Mod,
    Step,
    Abs,
    Sign,
    Min,
    Max,
    Clamp,
    Mix,
    Smoothstep,
    IsNan,
    IsInf,
    FloatBitsToInt,
    FloatBitsToUint,
    IntBitsToFloat,
    UintBitsToFloat,
    Length,
    Distance,
    Dot,
    Cross,
    Normalize,
    Faceforward,
    Reflect,
    Refract,
    MatrixCompMult,
    OuterProduct,
    Transpose,
    Determinant,
    Inverse,
    /// `lessThan`, `equal`, ...: component-wise comparisons into a bool vector.
    Relational(fn(std::cmp::Ordering) -> bool),
    Any,
    All,
    Not,
    /// `texture`, `texture2D`, `textureLod`, `textureGrad` (no mipmaps: bias, level and gradients do not
    /// change the value).
    Texture,
    TextureOffset,
    TexelFetch,
    TexelFetchOffset,
    TextureSize,
}

fn round_half_away(x: f32) -> f32 {
    x.round()
}

fn inverse_sqrt(x: f32) -> f32 {
    1.0 / x.sqrt()
}

fn fract(x: f32) -> f32 {
    x - x.floor()
}

impl Builtin {
    /// The built-in of this name, if there is one.
    pub(super) fn named(name: &str) -> Option<Builtin> {
        use std::cmp::Ordering;
        let unary = |f: fn(f32) -> f32| Some(Builtin::Unary(f));
        match name {
            "radians" => unary(f32::to_radians),
            "degrees" => unary(f32::to_degrees),
            "sin" => unary(f32::sin),
            "cos" => unary(f32::cos),
            "tan" => unary(f32::tan),
            "asin" => unary(f32::asin),
            "acos" => unary(f32::acos),
            "sinh" => unary(f32::sinh),
            "cosh" => unary(f32::cosh),
            "tanh" => unary(f32::tanh),
            "asinh" => unary(f32::asinh),
            "acosh" => unary(f32::acosh),
            "atanh" => unary(f32::atanh),
            "exp" => unary(f32::exp),
            "log" => unary(f32::ln),
            "exp2" => unary(f32::exp2),
            "log2" => unary(f32::log2),
            "sqrt" => unary(f32::sqrt),
            "inversesqrt" => unary(inverse_sqrt),
            "floor" => unary(f32::floor),
            "ceil" => unary(f32::ceil),
            "trunc" => unary(f32::trunc),
            "round" => unary(round_half_away),
            "roundEven" => unary(f32::round_ties_even),
            "fract" => unary(fract),
            "atan" => Some(Builtin::Atan),
            "pow" => Some(Builtin::Pow),
            "mod" => Some(Builtin::Mod),
            "step" => Some(Builtin::Step),
            "abs" => Some(Builtin::Abs),
            "sign" => Some(Builtin::Sign),
            "min" => Some(Builtin::Min),
            "max" => Some(Builtin::Max),
            "clamp" => Some(Builtin::Clamp),
            "mix" => Some(Builtin::Mix),
            "smoothstep" => Some(Builtin::Smoothstep),
            "isnan" => Some(Builtin::IsNan),
            "isinf" => Some(Builtin::IsInf),
            "floatBitsToInt" => Some(Builtin::FloatBitsToInt),
            "floatBitsToUint" => Some(Builtin::FloatBitsToUint),
            "intBitsToFloat" => Some(Builtin::IntBitsToFloat),
            "uintBitsToFloat" => Some(Builtin::UintBitsToFloat),
            "length" => Some(Builtin::Length),
            "distance" => Some(Builtin::Distance),
            "dot" => Some(Builtin::Dot),
            "cross" => Some(Builtin::Cross),
            "normalize" => Some(Builtin::Normalize),
            "faceforward" => Some(Builtin::Faceforward),
            "reflect" => Some(Builtin::Reflect),
            "refract" => Some(Builtin::Refract),
            "matrixCompMult" => Some(Builtin::MatrixCompMult),
            "outerProduct" => Some(Builtin::OuterProduct),
            "transpose" => Some(Builtin::Transpose),
            "determinant" => Some(Builtin::Determinant),
            "inverse" => Some(Builtin::Inverse),
            "lessThan" => Some(Builtin::Relational(Ordering::is_lt)),
            "lessThanEqual" => Some(Builtin::Relational(Ordering::is_le)),
            "greaterThan" => Some(Builtin::Relational(Ordering::is_gt)),
            "greaterThanEqual" => Some(Builtin::Relational(Ordering::is_ge)),
            "equal" => Some(Builtin::Relational(Ordering::is_eq)),
            "notEqual" => Some(Builtin::Relational(Ordering::is_ne)),
            "any" => Some(Builtin::Any),
            "all" => Some(Builtin::All),
            "not" => Some(Builtin::Not),
            "texture" | "texture2D" | "textureLod" | "texture2DLod" | "textureGrad" => {
                Some(Builtin::Texture)
            }
            "textureOffset" | "textureLodOffset" | "textureGradOffset" => {
                Some(Builtin::TextureOffset)
            }
            "texelFetch" => Some(Builtin::TexelFetch),
            "texelFetchOffset" => Some(Builtin::TexelFetchOffset),
            "textureSize" => Some(Builtin::TextureSize),
            _ => None,
        }
    }

    /// Whether it reads a texture (and so cannot be computed before the draw).
    pub(super) fn reads_textures(self) -> bool {
        matches!(
            self,
            Builtin::Texture
                | Builtin::TextureOffset
                | Builtin::TexelFetch
                | Builtin::TexelFetchOffset
                | Builtin::TextureSize
        )
    }

    /// The function's value for `args`; `textures` are the program's samplers' textures.
    pub(super) fn call(
        self,
        name: &str,
        args: &[Val],
        textures: &[&Texture],
    ) -> Result<Val, ShaderError> {
        let call = Call { name, args };
        call.run(self, textures)
    }
}

/// One call: the name it was made by (for messages) and its arguments.
struct Call<'a> {
    name: &'a str,
    args: &'a [Val],
}

/// Up to four numeric arguments, without allocating.
struct Nums {
    items: [Num; 4],
    len: usize,
}

impl std::ops::Deref for Nums {
    type Target = [Num];
    fn deref(&self) -> &[Num] {
        &self.items[..self.len]
    }
}

/// The dot product of two vectors' components.
fn dot(a: &Num, b: &Num) -> f32 {
    (0..a.len().min(b.len())).fold(0.0, |acc, i| acc + a.f(i) * b.f(i))
}

impl Call<'_> {
    fn error(&self, message: impl std::fmt::Display) -> ShaderError {
        ShaderError::new(format!("{}(): {message}", self.name))
    }

    fn count(&self, counts: &[usize]) -> Result<(), ShaderError> {
        if counts.contains(&self.args.len()) {
            return Ok(());
        }
        let list: Vec<String> = counts.iter().map(usize::to_string).collect();
        Err(self.error(format!("takes {} arguments, not {}", list.join(" or "), self.args.len())))
    }

    /// The arguments as numbers (scalars or vectors), which must be one of `counts` many.
    fn nums(&self, counts: &[usize]) -> Result<Nums, ShaderError> {
        self.count(counts)?;
        self.numbers(self.args)
    }

    /// `args` (at most four) as numbers.
    fn numbers(&self, args: &[Val]) -> Result<Nums, ShaderError> {
        let mut out = Nums { items: [Num::zero(Base::Float, 1); 4], len: args.len() };
        for (slot, a) in out.items.iter_mut().zip(args) {
            *slot = a.num(self.name)?;
        }
        Ok(out)
    }

    /// Argument `i` as a matrix.
    fn mat(&self, i: usize) -> Result<&Mat, ShaderError> {
        match self.args.get(i) {
            Some(Val::Mat(m)) => Ok(m),
            other => Err(self.error(format!(
                "takes a matrix, not {}",
                other.map_or_else(|| "nothing".to_owned(), Val::describe)
            ))),
        }
    }

    /// How many components the result has: the arguments' vectors' (scalars spread over them).
    fn shape(&self, args: &[Num]) -> Result<u8, ShaderError> {
        let mut len = 1;
        for a in args.iter().filter(|a| !a.is_scalar()) {
            if len != 1 && len != a.len {
                return Err(self.error(format!("cannot combine {}", a.type_name())));
            }
            len = a.len;
        }
        Ok(len)
    }

    /// `f` of the arguments' components as floats, component by component.
    fn floats(&self, args: &[Num], f: impl Fn(&[f32]) -> f32) -> Result<Val, ShaderError> {
        let len = self.shape(args)?;
        let mut out = Num::zero(Base::Float, len);
        let mut lane = [0.0f32; 3];
        for i in 0..usize::from(len) {
            for (slot, a) in lane.iter_mut().zip(args) {
                *slot = a.f(if a.is_scalar() { 0 } else { i });
            }
            out.bits[i] = f(&lane[..args.len()]).to_bits();
        }
        Ok(Val::Num(out))
    }

    /// `f` of the arguments' components in their integer base (`Int` or `Uint`), as bits.
    fn integers(
        &self,
        args: &[Num],
        base: Base,
        f: impl Fn(&[i64]) -> i64,
    ) -> Result<Val, ShaderError> {
        let len = self.shape(args)?;
        let mut out = Num::zero(base, len);
        let mut lane = [0i64; 3];
        for i in 0..usize::from(len) {
            for (slot, a) in lane.iter_mut().zip(args) {
                let at = if a.is_scalar() { 0 } else { i };
                *slot = if base == Base::Int { i64::from(a.i(at)) } else { i64::from(a.u(at)) };
            }
            out.bits[i] = f(&lane[..args.len()]) as u32;
        }
        Ok(Val::Num(out))
    }

    /// The integer base every argument has, if they all have the same one.
    fn integer_base(args: &[Num]) -> Option<Base> {
        let base = args.first()?.base;
        (matches!(base, Base::Int | Base::Uint) && args.iter().all(|a| a.base == base))
            .then_some(base)
    }

    fn run(&self, builtin: Builtin, textures: &[&Texture]) -> Result<Val, ShaderError> {
        match builtin {
            Builtin::Unary(f) => self.floats(&self.nums(&[1])?, |v| f(v[0])),
            Builtin::Atan => {
                let a = self.nums(&[1, 2])?;
                if a.len() == 1 {
                    self.floats(&a, |v| v[0].atan())
                } else {
                    self.floats(&a, |v| v[0].atan2(v[1]))
                }
            }
            // As GPUs compute it, exp2(y · log2(x)): NaN for a negative x.
            Builtin::Pow => self.floats(&self.nums(&[2])?, |v| (v[1] * v[0].log2()).exp2()),
            Builtin::Mod => self.floats(&self.nums(&[2])?, |v| v[0] - v[1] * (v[0] / v[1]).floor()),
            Builtin::Step => {
                self.floats(&self.nums(&[2])?, |v| if v[1] < v[0] { 0.0 } else { 1.0 })
            }
            Builtin::Abs | Builtin::Sign => {
                let a = self.nums(&[1])?;
                match (Self::integer_base(&a), builtin) {
                    (Some(base), Builtin::Abs) => self.integers(&a, base, |v| v[0].abs()),
                    (Some(base), _) => self.integers(&a, base, |v| v[0].signum()),
                    (None, Builtin::Abs) => self.floats(&a, |v| v[0].abs()),
                    (None, _) => self.floats(&a, |v| {
                        if v[0] > 0.0 {
                            1.0
                        } else if v[0] < 0.0 {
                            -1.0
                        } else {
                            0.0
                        }
                    }),
                }
            }
            Builtin::Min | Builtin::Max => {
                let a = self.nums(&[2])?;
                let max = matches!(builtin, Builtin::Max);
                match Self::integer_base(&a) {
                    Some(base) if max => self.integers(&a, base, |v| v[0].max(v[1])),
                    Some(base) => self.integers(&a, base, |v| v[0].min(v[1])),
                    // GLSL's min(x, y) is y < x ? y : x.
                    None if max => self.floats(&a, |v| if v[0] < v[1] { v[1] } else { v[0] }),
                    None => self.floats(&a, |v| if v[1] < v[0] { v[1] } else { v[0] }),
                }
            }
            Builtin::Clamp => {
                let a = self.nums(&[3])?;
                match Self::integer_base(&a) {
                    Some(base) => self.integers(&a, base, |v| v[0].max(v[1]).min(v[2])),
                    None => self.floats(&a, |v| {
                        let low = if v[0] < v[1] { v[1] } else { v[0] };
                        if v[2] < low { v[2] } else { low }
                    }),
                }
            }
            Builtin::Mix => {
                let a = self.nums(&[3])?;
                if a[2].base == Base::Bool {
                    let (x, y, pick) = (a[0], a[1], a[2]);
                    let mut out = Num::zero(x.base, self.shape(&a)?);
                    for i in 0..out.len() {
                        let from = if pick.b(if pick.is_scalar() { 0 } else { i }) { y } else { x };
                        out.bits[i] = from.bits[if from.is_scalar() { 0 } else { i }];
                    }
                    Ok(Val::Num(out))
                } else {
                    self.floats(&a, |v| v[0] * (1.0 - v[2]) + v[1] * v[2])
                }
            }
            Builtin::Smoothstep => self.floats(&self.nums(&[3])?, |v| {
                let t = ((v[2] - v[0]) / (v[1] - v[0])).clamp(0.0, 1.0);
                t * t * (3.0 - 2.0 * t)
            }),
            Builtin::IsNan | Builtin::IsInf => {
                let a = self.nums(&[1])?[0];
                let mut out = Num::zero(Base::Bool, a.len);
                for i in 0..a.len() {
                    let x = a.f(i);
                    let nan = matches!(builtin, Builtin::IsNan);
                    out.bits[i] = u32::from(if nan { x.is_nan() } else { x.is_infinite() });
                }
                Ok(Val::Num(out))
            }
            Builtin::FloatBitsToInt
            | Builtin::FloatBitsToUint
            | Builtin::IntBitsToFloat
            | Builtin::UintBitsToFloat => {
                let mut out = self.nums(&[1])?[0];
                let (from, to) = match builtin {
                    Builtin::FloatBitsToInt => (Base::Float, Base::Int),
                    Builtin::FloatBitsToUint => (Base::Float, Base::Uint),
                    Builtin::IntBitsToFloat => (Base::Int, Base::Float),
                    _ => (Base::Uint, Base::Float),
                };
                if out.base != from {
                    return Err(self.error(format!("takes {from:?}, not {}", out.type_name())));
                }
                out.base = to;
                Ok(Val::Num(out))
            }
            Builtin::Length => {
                let v = self.nums(&[1])?[0];
                Ok(Val::Num(Num::float(dot(&v, &v).sqrt())))
            }
            Builtin::Distance => {
                let a = self.nums(&[2])?;
                let mut d = a[0].convert(Base::Float);
                for i in 0..d.len() {
                    d.bits[i] = (a[0].f(i) - a[1].f(i)).to_bits();
                }
                Ok(Val::Num(Num::float(dot(&d, &d).sqrt())))
            }
            Builtin::Dot => {
                let a = self.nums(&[2])?;
                if a[0].len != a[1].len {
                    return Err(self.error("takes two vectors of one size"));
                }
                Ok(Val::Num(Num::float(dot(&a[0], &a[1]))))
            }
            Builtin::Cross => {
                let a = self.nums(&[2])?;
                let (x, y) = (a[0], a[1]);
                if x.len != 3 || y.len != 3 {
                    return Err(self.error("takes two vec3"));
                }
                Ok(Val::Num(Num::floats(&[
                    x.f(1) * y.f(2) - y.f(1) * x.f(2),
                    x.f(2) * y.f(0) - y.f(2) * x.f(0),
                    x.f(0) * y.f(1) - y.f(0) * x.f(1),
                ])))
            }
            Builtin::Normalize => {
                let a = self.nums(&[1])?;
                let length = dot(&a[0], &a[0]).sqrt();
                self.floats(&a, |x| x[0] / length)
            }
            Builtin::Faceforward => {
                let a = self.nums(&[3])?;
                let d = dot(&a[2], &a[1]);
                self.floats(&a[..1], |x| if d < 0.0 { x[0] } else { -x[0] })
            }
            Builtin::Reflect => {
                let a = self.nums(&[2])?;
                let d = dot(&a[1], &a[0]);
                self.floats(&a, |x| x[0] - 2.0 * d * x[1])
            }
            Builtin::Refract => {
                let a = self.nums(&[3])?;
                let eta = a[2].f(0);
                let d = dot(&a[1], &a[0]);
                let k = 1.0 - eta * eta * (1.0 - d * d);
                if k < 0.0 {
                    return Ok(Val::Num(Num::zero(Base::Float, a[0].len)));
                }
                self.floats(&a[..2], |x| eta * x[0] - (eta * d + k.sqrt()) * x[1])
            }
            Builtin::MatrixCompMult => {
                self.count(&[2])?;
                let (m, n) = (self.mat(0)?, self.mat(1)?);
                if (m.cols, m.rows) != (n.cols, n.rows) {
                    return Err(self.error("takes two matrices of one shape"));
                }
                let mut out = *m;
                for (o, v) in out.data.iter_mut().zip(&n.data) {
                    *o *= v;
                }
                Ok(Val::Mat(Box::new(out)))
            }
            Builtin::OuterProduct => {
                let a = self.nums(&[2])?;
                let (c, r) = (a[0], a[1]);
                if c.len < 2 || r.len < 2 {
                    return Err(self.error("takes two vectors"));
                }
                let mut out = Mat::zero(r.len, c.len);
                for j in 0..r.len() {
                    for i in 0..c.len() {
                        out.data[j * c.len() + i] = c.f(i) * r.f(j);
                    }
                }
                Ok(Val::Mat(Box::new(out)))
            }
            Builtin::Transpose => {
                self.count(&[1])?;
                let m = self.mat(0)?;
                let mut out = Mat::zero(m.rows, m.cols);
                let (cols, rows) = (usize::from(m.cols), usize::from(m.rows));
                for j in 0..cols {
                    for i in 0..rows {
                        out.data[i * cols + j] = m.data[j * rows + i];
                    }
                }
                Ok(Val::Mat(Box::new(out)))
            }
            Builtin::Determinant | Builtin::Inverse => {
                self.count(&[1])?;
                let m = self.mat(0)?;
                if m.cols != m.rows {
                    return Err(self.error("takes a square matrix"));
                }
                let (det, inverse) = invert(m);
                if matches!(builtin, Builtin::Determinant) {
                    Ok(Val::Num(Num::float(det)))
                } else {
                    Ok(Val::Mat(Box::new(inverse)))
                }
            }
            Builtin::Relational(test) => {
                let a = self.nums(&[2])?;
                if a[0].len < 2 || a[0].len != a[1].len {
                    return Err(self.error("takes two vectors of one size"));
                }
                let mut out = Num::zero(Base::Bool, a[0].len);
                for i in 0..a[0].len() {
                    let ordering = match a[0].base {
                        Base::Float => a[0].f(i).partial_cmp(&a[1].f(i)),
                        Base::Int => Some(a[0].i(i).cmp(&a[1].i(i))),
                        Base::Uint | Base::Bool => Some(a[0].u(i).cmp(&a[1].u(i))),
                    };
                    out.bits[i] = u32::from(ordering.is_some_and(test));
                }
                Ok(Val::Num(out))
            }
            Builtin::Any | Builtin::All | Builtin::Not => {
                let v = self.nums(&[1])?[0];
                if v.base != Base::Bool {
                    return Err(self.error("takes a bool vector"));
                }
                let mut lanes = (0..v.len()).map(|i| v.b(i));
                Ok(Val::Num(match builtin {
                    Builtin::Any => Num::boolean(lanes.any(|b| b)),
                    Builtin::All => Num::boolean(lanes.all(|b| b)),
                    _ => {
                        let mut out = v;
                        for i in 0..v.len() {
                            out.bits[i] ^= 1;
                        }
                        out
                    }
                }))
            }
            Builtin::Texture
            | Builtin::TextureOffset
            | Builtin::TexelFetch
            | Builtin::TexelFetchOffset
            | Builtin::TextureSize => self.texture(builtin, textures),
        }
    }

    /// The texture functions: the first argument is a sampler.
    fn texture(&self, builtin: Builtin, textures: &[&Texture]) -> Result<Val, ShaderError> {
        let texture = match self.args.first() {
            Some(Val::Sampler(i)) => textures.get(*i).copied(),
            _ => None,
        };
        let texture = texture.ok_or_else(|| self.error("takes a sampler2D first"))?;
        let n = self.args.len() - 1;
        let rest = |min: usize, max: usize| -> Result<Nums, ShaderError> {
            if n < min || n > max {
                return Err(self.error(format!("takes {} to {} arguments", min + 1, max + 1)));
            }
            self.numbers(&self.args[1..])
        };
        let rgba = |texel: [f32; 4]| Ok(Val::Num(Num::floats(&texel)));
        match builtin {
            Builtin::TextureSize => {
                rest(0, 1)?;
                let (w, h) = texture.size();
                Ok(Val::Num(Num::ints(&[w as i32, h as i32])))
            }
            Builtin::TexelFetch | Builtin::TexelFetchOffset => {
                let a = rest(2, 3)?;
                let (mut x, mut y) = (a[0].i(0), a[0].i(1));
                if let Some(offset) =
                    a.get(2).filter(|_| matches!(builtin, Builtin::TexelFetchOffset))
                {
                    x = x.wrapping_add(offset.i(0));
                    y = y.wrapping_add(offset.i(1));
                }
                rgba(texture.fetch(x, y))
            }
            _ => {
                let a = rest(1, 4)?;
                let (mut s, mut t) = (a[0].f(0), a[0].f(1));
                if matches!(builtin, Builtin::TextureOffset) {
                    // The offset follows the coordinates (and the level or gradients, if any).
                    let offset = a.last().filter(|o| o.base == Base::Int && o.len == 2);
                    let offset = offset.ok_or_else(|| self.error("takes an ivec2 offset"))?;
                    let (w, h) = texture.size();
                    s += offset.i(0) as f32 / w as f32;
                    t += offset.i(1) as f32 / h as f32;
                }
                rgba(texture.sample(s, t))
            }
        }
    }
}

/// The determinant and inverse of a square matrix (Gauss-Jordan with partial pivoting; GLSL leaves a singular
/// matrix's inverse undefined, here zeros).
fn invert(m: &Mat) -> (f32, Mat) {
    let n = usize::from(m.cols);
    // Row-major working copies: a[i][j] is row i, column j.
    let mut a: Vec<Vec<f32>> =
        (0..n).map(|i| (0..n).map(|j| m.data[j * n + i]).collect()).collect();
    let mut inv: Vec<Vec<f32>> =
        (0..n).map(|i| (0..n).map(|j| if i == j { 1.0 } else { 0.0 }).collect()).collect();
    let mut det = 1.0f32;
    for col in 0..n {
        let pivot =
            (col..n).max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs())).unwrap_or(col);
        if a[pivot][col] == 0.0 {
            return (0.0, Mat::zero(m.cols, m.rows));
        }
        if pivot != col {
            a.swap(pivot, col);
            inv.swap(pivot, col);
            det = -det;
        }
        let p = a[col][col];
        det *= p;
        for j in 0..n {
            a[col][j] /= p;
            inv[col][j] /= p;
        }
        for row in (0..n).filter(|&r| r != col) {
            let factor = a[row][col];
            for j in 0..n {
                a[row][j] -= factor * a[col][j];
                inv[row][j] -= factor * inv[col][j];
            }
        }
    }
    let mut out = Mat::zero(m.cols, m.rows);
    for (i, row) in inv.iter().enumerate() {
        for (j, v) in row.iter().enumerate() {
            out.data[j * n + i] = *v;
        }
    }
    (det, out)
}
