//! The values a shader computes with: scalars, vectors and matrices of one base type, arrays, structs and
//! samplers, and the types declarations give them.

use super::ShaderError;

/// The scalar type of a numeric value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Base {
    Float,
    Int,
    Uint,
    Bool,
}

impl Base {
    /// The GLSL name of a vector of `n` components of this base (`vec3`, `ivec2`, `bool`, ...).
    fn vector_name(self, n: u8) -> String {
        let (scalar, prefix) = match self {
            Base::Float => ("float", ""),
            Base::Int => ("int", "i"),
            Base::Uint => ("uint", "u"),
            Base::Bool => ("bool", "b"),
        };
        if n == 1 { scalar.to_owned() } else { format!("{prefix}vec{n}") }
    }
}

/// A scalar or vector of up to four components, each held as its 32 bits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Num {
    pub(super) base: Base,
    pub(super) len: u8,
    pub(super) bits: [u32; 4],
}

impl Num {
    /// A value of `base` with `len` components, every one zero.
    pub(super) fn zero(base: Base, len: u8) -> Num {
        Num { base, len, bits: [0; 4] }
    }

    /// A float scalar.
    pub(super) fn float(x: f32) -> Num {
        Num::floats(&[x])
    }

    /// An int scalar.
    pub(super) fn int(x: i32) -> Num {
        Num::ints(&[x])
    }

    /// A bool scalar.
    pub(super) fn boolean(x: bool) -> Num {
        Num { base: Base::Bool, len: 1, bits: [u32::from(x), 0, 0, 0] }
    }

    /// A float vector (a scalar for one component).
    pub(super) fn floats(values: &[f32]) -> Num {
        let mut n = Num::zero(Base::Float, values.len() as u8);
        for (bits, v) in n.bits.iter_mut().zip(values) {
            *bits = v.to_bits();
        }
        n
    }

    /// An int vector (a scalar for one component).
    pub(super) fn ints(values: &[i32]) -> Num {
        let mut n = Num::zero(Base::Int, values.len() as u8);
        for (bits, v) in n.bits.iter_mut().zip(values) {
            *bits = *v as u32;
        }
        n
    }

    /// How many components it has.
    #[inline]
    pub(super) fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether it is a scalar.
    #[inline]
    pub(super) fn is_scalar(&self) -> bool {
        self.len == 1
    }

    /// Component `i` as a float (ints and bools converted as GLSL's constructors convert them).
    #[inline]
    pub(super) fn f(&self, i: usize) -> f32 {
        let bits = self.bits[i];
        match self.base {
            Base::Float => f32::from_bits(bits),
            Base::Int => bits as i32 as f32,
            Base::Uint | Base::Bool => bits as f32,
        }
    }

    /// Component `i` as an int (floats truncated toward zero).
    pub(super) fn i(&self, i: usize) -> i32 {
        let bits = self.bits[i];
        match self.base {
            Base::Float => f32::from_bits(bits) as i32,
            Base::Int | Base::Uint | Base::Bool => bits as i32,
        }
    }

    /// Component `i` as a uint (floats truncated toward zero).
    pub(super) fn u(&self, i: usize) -> u32 {
        let bits = self.bits[i];
        match self.base {
            Base::Float => f32::from_bits(bits) as u32,
            Base::Int | Base::Uint | Base::Bool => bits,
        }
    }

    /// Component `i` as a bool (non-zero is true).
    pub(super) fn b(&self, i: usize) -> bool {
        match self.base {
            Base::Float => f32::from_bits(self.bits[i]) != 0.0,
            Base::Int | Base::Uint | Base::Bool => self.bits[i] != 0,
        }
    }

    /// Component `i` converted to `base`, as bits.
    pub(super) fn bits_as(&self, i: usize, base: Base) -> u32 {
        match base {
            Base::Float => self.f(i).to_bits(),
            Base::Int => self.i(i) as u32,
            Base::Uint => self.u(i),
            Base::Bool => u32::from(self.b(i)),
        }
    }

    /// The same components converted to `base`.
    #[inline]
    pub(super) fn convert(&self, base: Base) -> Num {
        if self.base == base {
            return *self;
        }
        let mut out = Num::zero(base, self.len);
        for i in 0..self.len() {
            out.bits[i] = self.bits_as(i, base);
        }
        out
    }

    /// The GLSL name of its type.
    pub(super) fn type_name(&self) -> String {
        self.base.vector_name(self.len)
    }
}

/// A float matrix: `cols` columns of `rows` components, column after column.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Mat {
    pub(super) cols: u8,
    pub(super) rows: u8,
    pub(super) data: [f32; 16],
}

impl Mat {
    /// A matrix of zeros.
    pub(super) fn zero(cols: u8, rows: u8) -> Mat {
        Mat { cols, rows, data: [0.0; 16] }
    }

    /// How many components it has.
    pub(super) fn len(&self) -> usize {
        usize::from(self.cols) * usize::from(self.rows)
    }

    /// Column `j` as a vector.
    pub(super) fn column(&self, j: usize) -> Num {
        let rows = usize::from(self.rows);
        Num::floats(&self.data[j * rows..(j + 1) * rows])
    }

    /// The GLSL name of its type.
    pub(super) fn type_name(&self) -> String {
        if self.cols == self.rows {
            format!("mat{}", self.cols)
        } else {
            format!("mat{}x{}", self.cols, self.rows)
        }
    }
}

/// A struct's value: its declaration's index and its fields.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Record {
    pub(super) id: usize,
    pub(super) fields: Vec<Val>,
}

/// A value: a number, a matrix, an array, a struct or a sampler (its texture's index among the program's
/// samplers). Kept small, since the interpreter moves values around all the time.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Val {
    Num(Num),
    Mat(Box<Mat>),
    Array(Box<[Val]>),
    Struct(Box<Record>),
    Sampler(usize),
    Void,
}

impl Val {
    /// The number it holds, or an error naming `what` needed one.
    pub(super) fn num(&self, what: &str) -> Result<Num, ShaderError> {
        match self {
            Val::Num(n) => Ok(*n),
            other => {
                Err(ShaderError::new(format!("{what} needs a number, not {}", other.describe())))
            }
        }
    }

    /// The single bool it holds (a condition).
    pub(super) fn truth(&self, what: &str) -> Result<bool, ShaderError> {
        match self {
            Val::Num(n) if n.base == Base::Bool && n.len == 1 => Ok(n.bits[0] != 0),
            other => {
                Err(ShaderError::new(format!("{what} needs a bool, not {}", other.describe())))
            }
        }
    }

    /// A short description of its type for messages.
    pub(super) fn describe(&self) -> String {
        match self {
            Val::Num(n) => n.type_name(),
            Val::Mat(m) => m.type_name(),
            Val::Array(items) => format!("an array of {}", items.len()),
            Val::Struct(_) => "a struct".to_owned(),
            Val::Sampler(_) => "sampler2D".to_owned(),
            Val::Void => "void".to_owned(),
        }
    }
}

/// A declared type.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Ty {
    Void,
    Num { base: Base, cols: u8, rows: u8 },
    Array(Box<Ty>, usize),
    Struct(usize),
    Sampler,
}

impl Ty {
    /// A scalar or vector type.
    pub(super) fn vector(base: Base, n: u8) -> Ty {
        Ty::Num { base, cols: 1, rows: n }
    }

    /// The value a variable of this type holds before anything is written to it: zeros (struct fields by
    /// the declarations' field types in `structs`).
    pub(super) fn zero(&self, structs: &[Vec<(String, Ty)>]) -> Val {
        match self {
            Ty::Void => Val::Void,
            Ty::Num { cols, rows, .. } if *cols > 1 => Val::Mat(Box::new(Mat::zero(*cols, *rows))),
            Ty::Num { base, rows, .. } => Val::Num(Num::zero(*base, *rows)),
            Ty::Array(item, n) => Val::Array(vec![item.zero(structs); *n].into_boxed_slice()),
            Ty::Struct(id) => Val::Struct(Box::new(Record {
                id: *id,
                fields: structs[*id].iter().map(|(_, ty)| ty.zero(structs)).collect(),
            })),
            Ty::Sampler => Val::Sampler(0),
        }
    }

    /// `value` as a value of this type: a number of the same shape converted to this base (GLSL ES would
    /// refuse what desktop GLSL converts implicitly; Kiln converts), arrays item by item.
    pub(super) fn fit(&self, value: Val) -> Result<Val, ShaderError> {
        match (self, value) {
            (Ty::Num { base, cols: 1, rows }, Val::Num(n)) if n.len == *rows => {
                Ok(Val::Num(n.convert(*base)))
            }
            (Ty::Num { cols, rows, .. }, Val::Mat(m)) if m.cols == *cols && m.rows == *rows => {
                Ok(Val::Mat(m))
            }
            (Ty::Array(item, len), Val::Array(items)) if items.len() == *len => Ok(Val::Array(
                items.into_vec().into_iter().map(|v| item.fit(v)).collect::<Result<_, _>>()?,
            )),
            (Ty::Struct(id), Val::Struct(record)) if *id == record.id => Ok(Val::Struct(record)),
            (Ty::Sampler, v @ Val::Sampler(_)) => Ok(v),
            (Ty::Void, Val::Void) => Ok(Val::Void),
            (ty, value) => Err(ShaderError::new(format!(
                "cannot use {} as {}",
                value.describe(),
                ty.describe()
            ))),
        }
    }

    /// How many scalars a value of this type holds.
    pub(super) fn scalars(&self) -> usize {
        match self {
            Ty::Num { cols, rows, .. } => usize::from(*cols) * usize::from(*rows),
            Ty::Array(item, n) => item.scalars().saturating_mul(*n),
            Ty::Void | Ty::Struct(_) | Ty::Sampler => 1,
        }
    }

    /// Whether `value` has this type exactly (to choose among overloads).
    pub(super) fn matches(&self, value: &Val) -> bool {
        match (self, value) {
            (Ty::Num { base, cols: 1, rows }, Val::Num(n)) => n.base == *base && n.len == *rows,
            (Ty::Num { cols, rows, .. }, Val::Mat(m)) => m.cols == *cols && m.rows == *rows,
            (Ty::Array(item, len), Val::Array(items)) => {
                items.len() == *len && items.iter().all(|v| item.matches(v))
            }
            (Ty::Struct(id), Val::Struct(record)) => *id == record.id,
            (Ty::Sampler, Val::Sampler(_)) => true,
            _ => false,
        }
    }

    /// A short description for messages.
    pub(super) fn describe(&self) -> String {
        match self {
            Ty::Void => "void".to_owned(),
            Ty::Num { cols, rows, .. } if *cols > 1 => Mat::zero(*cols, *rows).type_name(),
            Ty::Num { base, rows, .. } => Num::zero(*base, *rows).type_name(),
            Ty::Array(item, n) => format!("{}[{n}]", item.describe()),
            Ty::Struct(_) => "a struct".to_owned(),
            Ty::Sampler => "sampler2D".to_owned(),
        }
    }
}
