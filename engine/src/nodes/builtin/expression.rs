//! A Python arithmetic expression evaluator for `ComfyMathExpression`, with the semantics ComfyUI gets from
//! `simpleeval` and Python: integers and floats kept apart (`/` is true division, `//` and `%` floor toward −∞,
//! `**` of integers stays integer unless the exponent is negative), booleans counting as 0 and 1, `and`/`or`
//! giving an operand, chained comparisons, `x if c else y`, and the node's functions (`sum`, `min`, `max`,
//! `abs`, `round`, `pow`, `sqrt`, `ceil`, `floor`, `log`, `log2`, `log10`, `sin`, `cos`, `tan`, `int`, `float`).
//!
//! Integers are 64-bit here where Python's are unbounded: a result past ±2⁶³ is an error naming it.

use std::collections::BTreeMap;

/// A value of the expression language.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Num {
    /// A Python `bool` (an `int` too).
    Bool(bool),
    /// A Python `int`.
    Int(i64),
    /// A Python `float`.
    Float(f64),
    /// A list (the `values` name: every input in order).
    List(Vec<Num>),
}

/// Why an expression could not be evaluated, in words.
pub(crate) type EvalError = String;

type Result<T> = std::result::Result<T, EvalError>;

impl Num {
    fn as_f64(&self) -> Result<f64> {
        match self {
            Num::Bool(b) => Ok(f64::from(u8::from(*b))),
            Num::Int(i) => Ok(*i as f64),
            Num::Float(f) => Ok(*f),
            Num::List(_) => Err("a list is not a number".to_owned()),
        }
    }

    /// The integer of a bool or int (`None` for a float or a list).
    fn as_int(&self) -> Option<i64> {
        match self {
            Num::Bool(b) => Some(i64::from(*b)),
            Num::Int(i) => Some(*i),
            Num::Float(_) | Num::List(_) => None,
        }
    }

    /// Python's truth value.
    pub(crate) fn truthy(&self) -> bool {
        match self {
            Num::Bool(b) => *b,
            Num::Int(i) => *i != 0,
            Num::Float(f) => *f != 0.0,
            Num::List(items) => !items.is_empty(),
        }
    }

    /// Python's type name, for messages.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Num::Bool(_) => "bool",
            Num::Int(_) => "int",
            Num::Float(_) => "float",
            Num::List(_) => "list",
        }
    }
}

/// A token.
#[derive(Debug, Clone, PartialEq)]
enum Token {
    Int(i64),
    Float(f64),
    Name(String),
    Op(&'static str),
}

const OPERATORS: [&str; 27] = [
    "**", "//", "<<", ">>", "<=", ">=", "==", "!=", "+", "-", "*", "/", "%", "&", "|", "^", "~",
    "<", ">", "(", ")", ",", "[", "]", ".", ":", "=",
];

fn tokenize(text: &str) -> Result<Vec<Token>> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            let start = i;
            let hex = c == '0' && matches!(chars.get(i + 1), Some('x' | 'X'));
            while let Some(&d) = chars.get(i) {
                let exponent_sign = !hex
                    && matches!(d, '+' | '-')
                    && i > start
                    && matches!(chars[i - 1], 'e' | 'E');
                if !(d.is_ascii_alphanumeric() || d == '.' || d == '_' || exponent_sign) {
                    break;
                }
                i += 1;
            }
            let literal: String = chars[start..i].iter().filter(|&&c| c != '_').collect();
            tokens.push(number(&literal)?);
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(Token::Name(chars[start..i].iter().collect()));
        } else {
            let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let op = OPERATORS
                .iter()
                .find(|op| rest.starts_with(**op))
                .ok_or_else(|| format!("invalid syntax: unexpected `{c}`"))?;
            tokens.push(Token::Op(op));
            i += op.len();
        }
    }
    Ok(tokens)
}

/// A Python numeric literal: decimal, `0x`/`0o`/`0b` integers, floats with a point or an exponent.
fn number(literal: &str) -> Result<Token> {
    let lower = literal.to_ascii_lowercase();
    let radix = [("0x", 16), ("0o", 8), ("0b", 2)].into_iter().find(|(p, _)| lower.starts_with(p));
    if let Some((prefix, radix)) = radix {
        return i64::from_str_radix(&lower[prefix.len()..], radix)
            .map(Token::Int)
            .map_err(|_| format!("invalid number `{literal}`"));
    }
    if lower.contains(['.', 'e']) {
        return lower.parse().map(Token::Float).map_err(|_| format!("invalid number `{literal}`"));
    }
    lower.parse().map(Token::Int).map_err(|_| format!("invalid number `{literal}`"))
}

/// An expression tree.
#[derive(Debug, Clone)]
enum Expr {
    Const(Num),
    Name(String),
    Unary(&'static str, Box<Expr>),
    Binary(&'static str, Box<Expr>, Box<Expr>),
    Compare(Box<Expr>, Vec<(&'static str, Expr)>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    If { cond: Box<Expr>, then: Box<Expr>, otherwise: Box<Expr> },
    Call(String, Vec<Expr>),
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn eat_op(&mut self, op: &str) -> bool {
        if matches!(self.peek(), Some(Token::Op(o)) if *o == op) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn eat_name(&mut self, name: &str) -> bool {
        if matches!(self.peek(), Some(Token::Name(n)) if n == name) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn expect_op(&mut self, op: &str) -> Result<()> {
        if self.eat_op(op) { Ok(()) } else { Err(format!("invalid syntax: expected `{op}`")) }
    }

    /// `or_test ["if" or_test "else" test]`.
    fn expression(&mut self) -> Result<Expr> {
        let value = self.or()?;
        if self.eat_name("if") {
            let cond = self.or()?;
            if !self.eat_name("else") {
                return Err("invalid syntax: expected `else`".to_owned());
            }
            let otherwise = self.expression()?;
            return Ok(Expr::If {
                cond: Box::new(cond),
                then: Box::new(value),
                otherwise: Box::new(otherwise),
            });
        }
        Ok(value)
    }

    fn or(&mut self) -> Result<Expr> {
        let mut left = self.and()?;
        while self.eat_name("or") {
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr> {
        let mut left = self.not()?;
        while self.eat_name("and") {
            left = Expr::And(Box::new(left), Box::new(self.not()?));
        }
        Ok(left)
    }

    fn not(&mut self) -> Result<Expr> {
        if self.eat_name("not") {
            return Ok(Expr::Not(Box::new(self.not()?)));
        }
        self.comparison()
    }

    fn comparison(&mut self) -> Result<Expr> {
        let first = self.binary(0)?;
        let mut rest = Vec::new();
        loop {
            let op = ["<=", ">=", "==", "!=", "<", ">"].into_iter().find(|op| self.eat_op(op));
            let Some(op) = op else { break };
            rest.push((op, self.binary(0)?));
        }
        Ok(if rest.is_empty() { first } else { Expr::Compare(Box::new(first), rest) })
    }

    /// Binary operators by precedence level, loosest first: `|`, `^`, `&`, shifts, `+ -`, `* / // %`.
    fn binary(&mut self, level: usize) -> Result<Expr> {
        const LEVELS: [&[&str]; 6] =
            [&["|"], &["^"], &["&"], &["<<", ">>"], &["+", "-"], &["*", "/", "//", "%"]];
        if level == LEVELS.len() {
            return self.unary();
        }
        let mut left = self.binary(level + 1)?;
        loop {
            let op = LEVELS[level].iter().copied().find(|op| self.eat_op(op));
            let Some(op) = op else { break };
            left = Expr::Binary(op, Box::new(left), Box::new(self.binary(level + 1)?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr> {
        for op in ["-", "+", "~"] {
            if self.eat_op(op) {
                return Ok(Expr::Unary(op, Box::new(self.unary()?)));
            }
        }
        self.power()
    }

    /// `atom ["**" unary]`: right-associative, binding tighter than a unary minus on its left.
    fn power(&mut self) -> Result<Expr> {
        let base = self.atom()?;
        if self.eat_op("**") {
            return Ok(Expr::Binary("**", Box::new(base), Box::new(self.unary()?)));
        }
        Ok(base)
    }

    fn atom(&mut self) -> Result<Expr> {
        let token = self.peek().cloned().ok_or("invalid syntax: unexpected end of expression")?;
        self.at += 1;
        match token {
            Token::Int(i) => Ok(Expr::Const(Num::Int(i))),
            Token::Float(f) => Ok(Expr::Const(Num::Float(f))),
            Token::Op("(") => {
                let inner = self.expression()?;
                self.expect_op(")")?;
                Ok(inner)
            }
            Token::Name(name) => {
                if self.eat_op("(") {
                    let mut args = Vec::new();
                    if !self.eat_op(")") {
                        loop {
                            args.push(self.expression()?);
                            if self.eat_op(")") {
                                break;
                            }
                            self.expect_op(",")?;
                        }
                    }
                    return Ok(Expr::Call(name, args));
                }
                Ok(match name.as_str() {
                    "True" => Expr::Const(Num::Bool(true)),
                    "False" => Expr::Const(Num::Bool(false)),
                    _ => Expr::Name(name),
                })
            }
            Token::Op(op) => Err(format!("invalid syntax: unexpected `{op}`")),
        }
    }
}

/// Evaluates `text` with `names` bound.
pub(crate) fn evaluate(text: &str, names: &BTreeMap<String, Num>) -> Result<Num> {
    let mut parser = Parser { tokens: tokenize(text)?, at: 0 };
    let expr = parser.expression()?;
    if parser.at != parser.tokens.len() {
        return Err("invalid syntax: unexpected text after the expression".to_owned());
    }
    eval(&expr, names)
}

fn eval(expr: &Expr, names: &BTreeMap<String, Num>) -> Result<Num> {
    match expr {
        Expr::Const(n) => Ok(n.clone()),
        Expr::Name(name) => names
            .get(name)
            .cloned()
            .ok_or_else(|| format!("'{name}' is not defined for expression")),
        Expr::Not(e) => Ok(Num::Bool(!eval(e, names)?.truthy())),
        Expr::And(a, b) => {
            let left = eval(a, names)?;
            if left.truthy() { eval(b, names) } else { Ok(left) }
        }
        Expr::Or(a, b) => {
            let left = eval(a, names)?;
            if left.truthy() { Ok(left) } else { eval(b, names) }
        }
        Expr::If { cond, then, otherwise } => {
            if eval(cond, names)?.truthy() {
                eval(then, names)
            } else {
                eval(otherwise, names)
            }
        }
        Expr::Compare(first, rest) => {
            let mut left = eval(first, names)?;
            for (op, right) in rest {
                let right = eval(right, names)?;
                if !compare(op, &left, &right)? {
                    return Ok(Num::Bool(false));
                }
                left = right;
            }
            Ok(Num::Bool(true))
        }
        Expr::Unary(op, e) => unary(op, eval(e, names)?),
        Expr::Binary(op, a, b) => binary(op, eval(a, names)?, eval(b, names)?),
        Expr::Call(name, args) => {
            let args = args.iter().map(|a| eval(a, names)).collect::<Result<Vec<_>>>()?;
            call(name, args)
        }
    }
}

fn compare(op: &str, a: &Num, b: &Num) -> Result<bool> {
    let ordering = match (a.as_int(), b.as_int()) {
        (Some(x), Some(y)) => x.partial_cmp(&y),
        _ => a.as_f64()?.partial_cmp(&b.as_f64()?),
    };
    Ok(match op {
        "==" => ordering == Some(std::cmp::Ordering::Equal),
        "!=" => ordering != Some(std::cmp::Ordering::Equal),
        "<" => ordering == Some(std::cmp::Ordering::Less),
        ">" => ordering == Some(std::cmp::Ordering::Greater),
        "<=" => matches!(ordering, Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)),
        _ => matches!(ordering, Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal)),
    })
}

fn overflow(what: &str) -> EvalError {
    format!("{what}: an integer past 64 bits")
}

fn unary(op: &str, v: Num) -> Result<Num> {
    match (op, v.as_int(), &v) {
        ("+", Some(i), _) => Ok(Num::Int(i)),
        ("-", Some(i), _) => i.checked_neg().map(Num::Int).ok_or_else(|| overflow("negation")),
        ("~", Some(i), _) => Ok(Num::Int(!i)),
        ("+", None, Num::Float(f)) => Ok(Num::Float(*f)),
        ("-", None, Num::Float(f)) => Ok(Num::Float(-f)),
        _ => Err(format!("bad operand type for unary {op}: '{}'", v.type_name())),
    }
}

/// Python's floor division and modulo of integers.
fn floor_div_mod(a: i64, b: i64) -> Result<(i64, i64)> {
    if b == 0 {
        return Err("integer division or modulo by zero".to_owned());
    }
    let (q, r) = (a.checked_div(b).ok_or_else(|| overflow("division"))?, a % b);
    Ok(if r != 0 && ((r < 0) != (b < 0)) { (q - 1, r + b) } else { (q, r) })
}

fn binary(op: &str, a: Num, b: Num) -> Result<Num> {
    if let (Some(x), Some(y)) = (a.as_int(), b.as_int()) {
        let checked = |v: Option<i64>| v.map(Num::Int).ok_or_else(|| overflow(op));
        return match op {
            "+" => checked(x.checked_add(y)),
            "-" => checked(x.checked_sub(y)),
            "*" => checked(x.checked_mul(y)),
            "/" if y == 0 => Err("division by zero".to_owned()),
            "/" => Ok(Num::Float(x as f64 / y as f64)),
            "//" => Ok(Num::Int(floor_div_mod(x, y)?.0)),
            "%" => Ok(Num::Int(floor_div_mod(x, y)?.1)),
            "**" => power(Num::Int(x), Num::Int(y)),
            "&" => Ok(Num::Int(x & y)),
            "|" => Ok(Num::Int(x | y)),
            "^" => Ok(Num::Int(x ^ y)),
            "<<" | ">>" if y < 0 => Err("negative shift count".to_owned()),
            "<<" => checked(
                u32::try_from(y).ok().filter(|&s| s < 64).map(|s| x << s).filter(|v| v >> y == x),
            ),
            _ => Ok(Num::Int(if y >= 64 { if x < 0 { -1 } else { 0 } } else { x >> y })),
        };
    }
    if matches!(op, "&" | "|" | "^" | "<<" | ">>") {
        return Err(format!(
            "unsupported operand type(s) for {op}: '{}' and '{}'",
            a.type_name(),
            b.type_name()
        ));
    }
    let (x, y) = (a.as_f64()?, b.as_f64()?);
    let zero = || Err::<Num, _>("float division by zero".to_owned());
    match op {
        "+" => Ok(Num::Float(x + y)),
        "-" => Ok(Num::Float(x - y)),
        "*" => Ok(Num::Float(x * y)),
        "/" if y == 0.0 => zero(),
        "/" => Ok(Num::Float(x / y)),
        "//" | "%" if y == 0.0 => zero(),
        "//" => Ok(Num::Float(float_divmod(x, y).0)),
        "%" => Ok(Num::Float(float_divmod(x, y).1)),
        _ => power(a, b),
    }
}

/// Python's `divmod` of floats (CPython's `float_divmod`): the floored quotient and the remainder with the
/// divisor's sign.
fn float_divmod(x: f64, y: f64) -> (f64, f64) {
    let mut m = x % y;
    let mut div = (x - m) / y;
    if m != 0.0 {
        if (y < 0.0) != (m < 0.0) {
            m += y;
            div -= 1.0;
        }
    } else {
        m = 0.0f64.copysign(y);
    }
    let floor = if div != 0.0 {
        let f = div.floor();
        if div - f > 0.5 { f + 1.0 } else { f }
    } else {
        0.0f64.copysign(x / y)
    };
    (floor, m)
}

/// `**` and `pow`: integers stay integers for a non-negative exponent; exponents past 4000 are refused, as
/// ComfyUI caps them.
fn power(a: Num, b: Num) -> Result<Num> {
    let exp = b.as_f64()?;
    if exp.abs() > 4000.0 {
        return Err(format!("Exponent {exp} exceeds maximum allowed (4000)"));
    }
    if let (Some(x), Some(y)) = (a.as_int(), b.as_int())
        && y >= 0
    {
        return u32::try_from(y)
            .ok()
            .and_then(|y| x.checked_pow(y))
            .map(Num::Int)
            .ok_or_else(|| overflow("**"));
    }
    let (x, y) = (a.as_f64()?, exp);
    if x == 0.0 && y < 0.0 {
        return Err("0.0 cannot be raised to a negative power".to_owned());
    }
    if x < 0.0 && y.fract() != 0.0 {
        return Err("a negative number to a fractional power is complex".to_owned());
    }
    Ok(Num::Float(x.powf(y)))
}

/// Python's `round(x)`: to the nearest integer, ties to even.
fn round_half_even(x: f64) -> f64 {
    x.round_ties_even()
}

fn float_to_int(x: f64, what: &str) -> Result<Num> {
    if !x.is_finite() {
        return Err(format!("cannot convert float {x} to integer in {what}"));
    }
    if x.abs() >= 9.223_372_036_854_776e18 {
        return Err(overflow(what));
    }
    Ok(Num::Int(x as i64))
}

fn call(name: &str, args: Vec<Num>) -> Result<Num> {
    let one = |args: &[Num]| -> Result<Num> {
        match args {
            [x] => Ok(x.clone()),
            _ => Err(format!("{name}() takes exactly one argument ({} given)", args.len())),
        }
    };
    let float_fn = |f: fn(f64) -> f64, args: &[Num]| -> Result<Num> {
        Ok(Num::Float(f(one(args)?.as_f64()?)))
    };
    // `sum(values)` and `min(values)` take a list; `sum(a, b)` the arguments.
    let items = |args: Vec<Num>| -> Vec<Num> {
        match <[Num; 1]>::try_from(args) {
            Ok([Num::List(items)]) => items,
            Ok([other]) => vec![other],
            Err(args) => args,
        }
    };
    match name {
        "sum" => items(args).into_iter().try_fold(Num::Int(0), |acc, v| binary("+", acc, v)),
        "min" | "max" => {
            let items = items(args);
            let mut best = items
                .first()
                .cloned()
                .ok_or_else(|| format!("{name}() arg is an empty sequence"))?;
            for v in items.into_iter().skip(1) {
                let better =
                    if name == "min" { compare("<", &v, &best)? } else { compare(">", &v, &best)? };
                if better {
                    best = v;
                }
            }
            Ok(best)
        }
        "abs" => match one(&args)? {
            Num::Float(f) => Ok(Num::Float(f.abs())),
            v => v
                .as_int()
                .map(i64::checked_abs)
                .and_then(|v| v.map(Num::Int))
                .ok_or_else(|| overflow("abs")),
        },
        "round" => match args.as_slice() {
            [x] => match x.as_int() {
                Some(i) => Ok(Num::Int(i)),
                None => float_to_int(round_half_even(x.as_f64()?), "round"),
            },
            [x, digits] => {
                let digits = digits.as_int().ok_or("round() digits must be an integer")?;
                match x.as_int() {
                    Some(i) if digits >= 0 => Ok(Num::Int(i)),
                    _ => {
                        let scale = 10f64.powi(i32::try_from(digits).unwrap_or(0));
                        Ok(Num::Float(round_half_even(x.as_f64()? * scale) / scale))
                    }
                }
            }
            _ => Err("round() takes one or two arguments".to_owned()),
        },
        "pow" => match <[Num; 2]>::try_from(args) {
            Ok([a, b]) => power(a, b),
            Err(_) => Err("pow() takes exactly two arguments".to_owned()),
        },
        "sqrt" => {
            let x = one(&args)?.as_f64()?;
            if x < 0.0 { Err("math domain error".to_owned()) } else { Ok(Num::Float(x.sqrt())) }
        }
        "ceil" => float_to_int(one(&args)?.as_f64()?.ceil(), "ceil"),
        "floor" => float_to_int(one(&args)?.as_f64()?.floor(), "floor"),
        "log" => match args.as_slice() {
            [x] => log(x.as_f64()?, f64::ln),
            [x, base] => {
                let (x, base) = (x.as_f64()?, base.as_f64()?);
                Ok(Num::Float(positive(x)?.ln() / positive(base)?.ln()))
            }
            _ => Err("log() takes one or two arguments".to_owned()),
        },
        "log2" => log(one(&args)?.as_f64()?, f64::log2),
        "log10" => log(one(&args)?.as_f64()?, f64::log10),
        "sin" => float_fn(f64::sin, &args),
        "cos" => float_fn(f64::cos, &args),
        "tan" => float_fn(f64::tan, &args),
        "int" => match one(&args)? {
            Num::Float(f) => float_to_int(f.trunc(), "int"),
            v => v.as_int().map(Num::Int).ok_or_else(|| "int() of a list".to_owned()),
        },
        "float" => Ok(Num::Float(one(&args)?.as_f64()?)),
        _ => Err(format!("Function '{name}' not defined, for expression")),
    }
}

fn positive(x: f64) -> Result<f64> {
    if x > 0.0 { Ok(x) } else { Err("math domain error".to_owned()) }
}

fn log(x: f64, f: fn(f64) -> f64) -> Result<Num> {
    Ok(Num::Float(f(positive(x)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str) -> Result<Num> {
        let names = BTreeMap::from([
            ("a".to_owned(), Num::Int(7)),
            ("b".to_owned(), Num::Float(2.5)),
            ("c".to_owned(), Num::Bool(true)),
            ("values".to_owned(), Num::List(vec![Num::Int(7), Num::Float(2.5), Num::Bool(true)])),
        ]);
        evaluate(text, &names)
    }

    #[test]
    fn python_arithmetic() {
        assert_eq!(run("a + b"), Ok(Num::Float(9.5)));
        assert_eq!(run("a // 2"), Ok(Num::Int(3)));
        assert_eq!(run("-a // 2"), Ok(Num::Int(-4)));
        assert_eq!(run("-a % 3"), Ok(Num::Int(2)));
        assert_eq!(run("a / 2"), Ok(Num::Float(3.5)));
        assert_eq!(run("-2 ** 2"), Ok(Num::Int(-4)));
        assert_eq!(run("2 ** -1"), Ok(Num::Float(0.5)));
        assert_eq!(run("2 ** 3 ** 2"), Ok(Num::Int(512)));
        assert_eq!(run("a & -8"), Ok(Num::Int(0)));
        assert_eq!(run("(a + 9) & -8"), Ok(Num::Int(16)));
        assert_eq!(run("c + 1"), Ok(Num::Int(2)));
        assert_eq!(run("1 < a <= 7"), Ok(Num::Bool(true)));
        assert_eq!(run("a if b > 3 else 0"), Ok(Num::Int(0)));
        assert_eq!(run("0 or b"), Ok(Num::Float(2.5)));
        assert_eq!(run("not c"), Ok(Num::Bool(false)));
        assert_eq!(run("0x10 + 1e1"), Ok(Num::Float(26.0)));
    }

    #[test]
    fn functions() {
        assert_eq!(run("sum(values)"), Ok(Num::Float(10.5)));
        assert_eq!(run("max(a, b)"), Ok(Num::Int(7)));
        assert_eq!(run("min(values)"), Ok(Num::Bool(true)));
        assert_eq!(run("round(2.5)"), Ok(Num::Int(2)));
        assert_eq!(run("round(b, 0)"), Ok(Num::Float(2.0)));
        assert_eq!(run("int(-b)"), Ok(Num::Int(-2)));
        assert_eq!(run("floor(b) + ceil(b)"), Ok(Num::Int(5)));
        assert_eq!(run("sqrt(16)"), Ok(Num::Float(4.0)));
        assert_eq!(run("pow(2, 10)"), Ok(Num::Int(1024)));
    }

    #[test]
    fn errors_say_what_went_wrong() {
        assert!(run("a / 0").unwrap_err().contains("division by zero"));
        assert!(run("z + 1").unwrap_err().contains("'z' is not defined"));
        assert!(run("exec(1)").unwrap_err().contains("not defined"));
        assert!(run("a +").unwrap_err().contains("invalid syntax"));
        assert!(run("2 ** 5000").unwrap_err().contains("4000"));
        assert!(run("sqrt(-1)").unwrap_err().contains("domain"));
    }
}
