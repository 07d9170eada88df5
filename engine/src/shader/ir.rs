//! The compiled form of a shader the interpreter walks: names resolved to slots, calls to functions, types to
//! [`Ty`].

use super::builtins::Builtin;
use super::value::{Ty, Val};

/// Where a variable lives: a slot of the running function's frame, or of the globals.
#[derive(Clone, Copy, Debug)]
pub(super) enum Var {
    Local(usize),
    Global(usize),
}

/// The arithmetic, bitwise and comparison operators (`&&`, `||` short-circuit and are their own expressions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    BitAnd,
    BitOr,
    BitXor,
    Shl,
    Shr,
    Less,
    Greater,
    LessEq,
    GreaterEq,
    Eq,
    NotEq,
    Xor,
}

/// The prefix operators that do not write.
#[derive(Clone, Copy, Debug)]
pub(super) enum UnOp {
    Neg,
    Not,
    Complement,
}

/// Component indices of a swizzle (`.xzy`), and how many there are.
#[derive(Clone, Copy, Debug)]
pub(super) struct Swizzle {
    pub(super) lanes: [u8; 4],
    pub(super) len: u8,
}

/// One step from a variable to the part an expression names.
#[derive(Clone, Debug)]
pub(super) enum Step {
    Index(Expr),
    /// `.name` of a struct, or a swizzle when the value is a vector (`swizzle` when the name reads as one).
    Field(String, Option<Swizzle>),
}

/// What can be written: a variable and the steps into it.
#[derive(Clone, Debug)]
pub(super) struct Place {
    pub(super) var: Var,
    pub(super) steps: Vec<Step>,
}

/// How a call passes one argument.
#[derive(Clone, Debug)]
pub(super) enum Arg {
    In(Expr),
    /// `out` or `inout`: the place the parameter's final value is written back to.
    Out(Place),
}

/// An expression.
#[derive(Clone, Debug)]
pub(super) enum Expr {
    Const(Val),
    Read(Place),
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Ternary(Box<Expr>, Box<Expr>, Box<Expr>),
    /// `place op= value` (`None`: plain `=`).
    Assign(Place, Option<BinOp>, Box<Expr>),
    /// `++`/`--` by `delta`; `post` gives the value before.
    Step {
        place: Place,
        delta: i32,
        post: bool,
    },
    /// A built-in function, with the name it was called by.
    Builtin(Builtin, String, Vec<Expr>),
    /// A call to one of the functions of these indices (overloads of one name and arity).
    Call(Vec<usize>, Vec<Arg>),
    Construct(Ty, Vec<Expr>),
    /// Index, swizzle or field of a value that is not a variable (`f().x`, `vec3(1.0)[i]`).
    Part(Box<Expr>, Vec<Step>),
    Length(Box<Expr>),
    Comma(Box<Expr>, Box<Expr>),
}

/// A statement.
#[derive(Clone, Debug)]
pub(super) enum Stmt {
    Expr(Expr),
    /// A local's declaration: its slot, type and initial value (zero when absent).
    Declare(usize, Ty, Option<Expr>),
    If(Expr, Vec<Stmt>, Vec<Stmt>),
    /// `for` and `while` (`test_first`) and `do … while` loops.
    Loop {
        cond: Option<Expr>,
        step: Option<Expr>,
        body: Vec<Stmt>,
        test_first: bool,
    },
    /// A switch: the selector, each label's value (`None`: `default`) with the index of the statement it
    /// starts at, and the statements.
    Switch(Expr, Vec<(Option<Val>, usize)>, Vec<Stmt>),
    Block(Vec<Stmt>),
    Break,
    Continue,
    Return(Option<Expr>),
    Discard,
}

/// How a function takes one parameter.
#[derive(Clone, Debug)]
pub(super) struct Param {
    pub(super) ty: Ty,
    /// `out` or `inout`: written back to the caller's place.
    pub(super) writes: bool,
    /// `in` or `inout`: read from the caller.
    pub(super) reads: bool,
}

/// A user function.
#[derive(Clone, Debug)]
pub(super) struct Function {
    pub(super) name: String,
    /// Its parameters, in slots `0..params.len()` of its frame.
    pub(super) params: Vec<Param>,
    pub(super) ret: Ty,
    pub(super) body: Vec<Stmt>,
    /// Slots its frame needs (parameters and locals).
    pub(super) frame: usize,
    /// Whether it has a body (else only a prototype was seen).
    pub(super) defined: bool,
}
