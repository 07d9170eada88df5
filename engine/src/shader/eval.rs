//! The interpreter: runs a [`Program`]'s `main` for one fragment at a time.

use super::ShaderError;
use super::compile::Program;
use super::ir::{Arg, BinOp, Expr, Place, Step, Stmt, Swizzle, Var};
use super::ops;
use super::texture::Texture;
use super::value::{Base, Num, Ty, Val};

/// How many times one loop may run for one fragment before the shader is stopped (a GPU's watchdog would
/// have reset the device long before).
const MAX_ITERATIONS: u64 = 1 << 22;

/// How deeply calls may nest (GLSL forbids recursion; a recursive shader stops here).
const MAX_DEPTH: usize = 64;

/// Why a fragment stopped early.
pub(super) enum Halt {
    /// `discard`: the fragment writes nothing.
    Discard,
    Error(ShaderError),
}

impl From<ShaderError> for Halt {
    fn from(e: ShaderError) -> Halt {
        Halt::Error(e)
    }
}

/// Where a statement leaves control.
enum Flow {
    Next,
    Break,
    Continue,
    Return(Val),
}

/// One thread's interpreter state.
pub(super) struct Machine<'p> {
    program: &'p Program,
    textures: &'p [&'p Texture],
    pub(super) globals: Vec<Val>,
    /// Every active call's parameters and locals.
    stack: Vec<Val>,
    base: usize,
    depth: usize,
}

impl<'p> Machine<'p> {
    pub(super) fn new(
        program: &'p Program,
        textures: &'p [&'p Texture],
        globals: Vec<Val>,
    ) -> Machine<'p> {
        Machine { program, textures, globals, stack: Vec::new(), base: 0, depth: 0 }
    }

    /// Runs the global initialisers, in order.
    pub(super) fn initialise(&mut self) -> Result<(), Halt> {
        for (slot, init) in &self.program.inits {
            let value = self.eval(init)?;
            let ty = &self.program.globals[*slot].ty;
            self.globals[*slot] = ty.fit(value)?;
        }
        Ok(())
    }

    /// Runs `main` once.
    pub(super) fn run_main(&mut self) -> Result<(), Halt> {
        self.stack.clear();
        self.base = 0;
        self.depth = 0;
        self.invoke(self.program.main, Vec::new()).map(|_| ())
    }

    fn slot(&mut self, var: Var) -> &mut Val {
        match var {
            Var::Local(i) => &mut self.stack[self.base + i],
            Var::Global(i) => &mut self.globals[i],
        }
    }

    fn eval(&mut self, e: &Expr) -> Result<Val, Halt> {
        Ok(match e {
            Expr::Const(v) => v.clone(),
            Expr::Read(place) => self.read(place)?,
            Expr::Unary(op, x) => {
                let x = self.eval(x)?;
                ops::unary(*op, &x)?
            }
            Expr::Binary(op, a, b) => {
                let a = self.eval(a)?;
                let b = self.eval(b)?;
                ops::binary(*op, &a, &b)?
            }
            Expr::And(a, b) => {
                let value = self.eval(a)?.truth("&&")? && self.eval(b)?.truth("&&")?;
                Val::Num(Num::boolean(value))
            }
            Expr::Or(a, b) => {
                let value = self.eval(a)?.truth("||")? || self.eval(b)?.truth("||")?;
                Val::Num(Num::boolean(value))
            }
            Expr::Ternary(c, a, b) => {
                if self.eval(c)?.truth("?:")? {
                    self.eval(a)?
                } else {
                    self.eval(b)?
                }
            }
            Expr::Assign(place, op, rhs) => {
                let mut value = self.eval(rhs)?;
                if let Some(op) = op {
                    let current = self.read(place)?;
                    value = ops::binary(*op, &current, &value)?;
                }
                self.write(place, value)?
            }
            Expr::Step { place, delta, post } => {
                let current = self.read(place)?;
                let n = current.num("++/--")?;
                let one = match n.base {
                    Base::Float => Num::float(*delta as f32),
                    Base::Int | Base::Uint => Num::int(*delta),
                    Base::Bool => return Err(ShaderError::new("cannot increment a bool").into()),
                };
                let next = ops::binary(BinOp::Add, &current, &Val::Num(one.convert(n.base)))?;
                let stored = self.write(place, next)?;
                if *post { current } else { stored }
            }
            Expr::Builtin(builtin, name, args) => {
                let mut values = Vec::with_capacity(args.len());
                for a in args {
                    values.push(self.eval(a)?);
                }
                builtin.call(name, &values, self.textures)?
            }
            Expr::Call(ids, args) => self.call(ids, args)?,
            Expr::Construct(ty, args) => {
                let mut values = Vec::with_capacity(args.len());
                for a in args {
                    values.push(self.eval(a)?);
                }
                construct(ty, values, &self.program.structs)?
            }
            Expr::Part(base, steps) => {
                let mut value = self.eval(base)?;
                for step in steps {
                    value = self.step(value, step)?;
                }
                value
            }
            Expr::Length(base) => {
                let n = match self.eval(base)? {
                    Val::Array(items) => items.len(),
                    Val::Num(n) if n.cols > 1 => usize::from(n.cols),
                    Val::Num(n) => usize::from(n.rows),
                    other => {
                        let message = format!("length() of {}", other.describe());
                        return Err(ShaderError::new(message).into());
                    }
                };
                Val::Num(Num::int(n as i32))
            }
            Expr::Comma(a, b) => {
                self.eval(a)?;
                self.eval(b)?
            }
        })
    }

    /// An index step's value as a position below `len`.
    fn index(&mut self, e: &Expr, len: usize) -> Result<usize, Halt> {
        let n = self.eval(e)?.num("an index")?;
        if !n.is_scalar() || n.base == Base::Float || n.base == Base::Bool {
            return Err(ShaderError::new("an index must be an integer").into());
        }
        let i = n.i(0);
        usize::try_from(i).ok().filter(|&i| i < len).ok_or_else(|| {
            ShaderError::new(format!("index {i} is out of range for {len} items")).into()
        })
    }

    /// The part of `value` a step names.
    fn step(&mut self, value: Val, step: &Step) -> Result<Val, Halt> {
        match (value, step) {
            (Val::Array(mut items), Step::Index(e)) => {
                let i = self.index(e, items.len())?;
                Ok(items.swap_remove(i))
            }
            (Val::Num(n), Step::Index(e)) => {
                let lanes = if n.cols > 1 { n.cols } else { n.rows };
                let i = self.index(e, usize::from(lanes))?;
                Ok(Val::Num(column_or_lane(&n, i)))
            }
            (Val::Struct(id, mut fields), Step::Field(name, _)) => {
                let i = self.field(id, name)?;
                Ok(fields.swap_remove(i))
            }
            (Val::Num(n), Step::Field(_, Some(s))) => Ok(Val::Num(swizzled(&n, *s)?)),
            (value, Step::Field(name, _)) => {
                Err(ShaderError::new(format!("{} has no field `{name}`", value.describe())).into())
            }
            (value, _) => {
                Err(ShaderError::new(format!("cannot index {}", value.describe())).into())
            }
        }
    }

    fn field(&self, id: usize, name: &str) -> Result<usize, Halt> {
        self.program.structs[id]
            .iter()
            .position(|(field, _)| field == name)
            .ok_or_else(|| ShaderError::new(format!("the struct has no field `{name}`")).into())
    }

    fn read(&mut self, place: &Place) -> Result<Val, Halt> {
        let mut value = self.slot(place.var).clone();
        for step in &place.steps {
            value = self.step(value, step)?;
        }
        Ok(value)
    }

    /// Writes `value` where `place` names (converted to the base of what is there) and returns what was
    /// stored.
    fn write(&mut self, place: &Place, value: Val) -> Result<Val, Halt> {
        // Index expressions are evaluated first, in order, before the variable is borrowed.
        let mut indices = Vec::new();
        for step in &place.steps {
            if let Step::Index(e) = step {
                let n = self.eval(e)?.num("an index")?;
                if !n.is_scalar() || matches!(n.base, Base::Float | Base::Bool) {
                    return Err(ShaderError::new("an index must be an integer").into());
                }
                indices.push(n.i(0));
            }
        }
        let structs = &self.program.structs;
        let target = match place.var {
            Var::Local(i) => &mut self.stack[self.base + i],
            Var::Global(i) => &mut self.globals[i],
        };
        store(target, &place.steps, &indices, value, structs).map_err(Halt::from)
    }

    /// Calls one of the functions `ids` (overloads of one arity) with `args`.
    fn call(&mut self, ids: &[usize], args: &[Arg]) -> Result<Val, Halt> {
        let mut values = Vec::with_capacity(args.len());
        for arg in args {
            values.push(match arg {
                Arg::In(e) => Some(self.eval(e)?),
                Arg::Out(place, true) => Some(self.read(place)?),
                Arg::Out(_, false) => None,
            });
        }
        let program = self.program;
        let chosen = ids
            .iter()
            .copied()
            .find(|&id| {
                program.functions[id]
                    .params
                    .iter()
                    .zip(&values)
                    .all(|(p, v)| v.as_ref().is_none_or(|v| p.ty.matches(v)))
            })
            .unwrap_or(ids[0]);
        let function = &program.functions[chosen];
        let mut params = Vec::with_capacity(values.len());
        for (param, value) in function.params.iter().zip(values) {
            params.push(match value {
                Some(v) => param.ty.fit(v)?,
                None => param.ty.zero(&program.structs),
            });
        }
        let (result, outs) = self.invoke_with_outputs(chosen, params)?;
        for (arg, value) in args.iter().zip(outs) {
            if let (Arg::Out(place, _), Some(value)) = (arg, value) {
                self.write(place, value)?;
            }
        }
        Ok(result)
    }

    /// Runs function `id` with its parameters' values.
    fn invoke(&mut self, id: usize, params: Vec<Val>) -> Result<Val, Halt> {
        self.invoke_with_outputs(id, params).map(|(v, _)| v)
    }

    /// Runs function `id`; returns its value and the final values of its `out` parameters.
    fn invoke_with_outputs(
        &mut self,
        id: usize,
        params: Vec<Val>,
    ) -> Result<(Val, Vec<Option<Val>>), Halt> {
        let program = self.program;
        let function = &program.functions[id];
        if !function.defined {
            let message = format!("function `{}` is declared but never defined", function.name);
            return Err(ShaderError::new(message).into());
        }
        if self.depth >= MAX_DEPTH {
            let message = format!("calls nest deeper than {MAX_DEPTH} (`{}`)", function.name);
            return Err(ShaderError::new(message).into());
        }
        let saved = self.base;
        let base = self.stack.len();
        self.stack.extend(params);
        self.stack.resize(base + function.frame.max(function.params.len()), Val::Void);
        self.base = base;
        self.depth += 1;
        let flow = self.block(&function.body);
        self.depth -= 1;
        let outs = function
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| p.writes.then(|| self.stack[base + i].clone()))
            .collect();
        self.stack.truncate(base);
        self.base = saved;
        let value = match flow? {
            Flow::Return(v) if function.ret != Ty::Void => function.ret.fit(v)?,
            _ => function.ret.zero(&program.structs),
        };
        Ok((value, outs))
    }

    fn block(&mut self, stmts: &[Stmt]) -> Result<Flow, Halt> {
        for s in stmts {
            match self.statement(s)? {
                Flow::Next => {}
                other => return Ok(other),
            }
        }
        Ok(Flow::Next)
    }

    fn statement(&mut self, s: &Stmt) -> Result<Flow, Halt> {
        match s {
            Stmt::Expr(e) => {
                self.eval(e)?;
            }
            Stmt::Declare(slot, ty, init) => {
                let value = match init {
                    Some(e) => {
                        let v = self.eval(e)?;
                        ty.fit(v)?
                    }
                    None => ty.zero(&self.program.structs),
                };
                self.stack[self.base + slot] = value;
            }
            Stmt::If(cond, then, otherwise) => {
                let branch = if self.eval(cond)?.truth("if")? { then } else { otherwise };
                return self.block(branch);
            }
            Stmt::Loop { cond, step, body, test_first } => {
                let mut iterations = 0u64;
                loop {
                    if *test_first
                        && let Some(c) = cond
                        && !self.eval(c)?.truth("a loop condition")?
                    {
                        break;
                    }
                    match self.block(body)? {
                        Flow::Break => break,
                        Flow::Return(v) => return Ok(Flow::Return(v)),
                        Flow::Next | Flow::Continue => {}
                    }
                    if let Some(step) = step {
                        self.eval(step)?;
                    }
                    if !*test_first
                        && let Some(c) = cond
                        && !self.eval(c)?.truth("a loop condition")?
                    {
                        break;
                    }
                    iterations += 1;
                    if iterations > MAX_ITERATIONS {
                        let message = format!("a loop ran more than {MAX_ITERATIONS} times");
                        return Err(ShaderError::new(message).into());
                    }
                }
            }
            Stmt::Switch(head, labels, body) => {
                let value = self.eval(head)?;
                let mut start = None;
                for (label, at) in labels {
                    if let Some(label) = label
                        && ops::binary(BinOp::Eq, &value, label)?.truth("case")?
                    {
                        start = Some(*at);
                        break;
                    }
                }
                let start =
                    start.or_else(|| labels.iter().find(|(l, _)| l.is_none()).map(|(_, at)| *at));
                if let Some(start) = start {
                    match self.block(&body[start..])? {
                        Flow::Break | Flow::Next => {}
                        other => return Ok(other),
                    }
                }
            }
            Stmt::Block(stmts) => return self.block(stmts),
            Stmt::Break => return Ok(Flow::Break),
            Stmt::Continue => return Ok(Flow::Continue),
            Stmt::Return(e) => {
                let value = match e {
                    Some(e) => self.eval(e)?,
                    None => Val::Void,
                };
                return Ok(Flow::Return(value));
            }
            Stmt::Discard => return Err(Halt::Discard),
        }
        Ok(Flow::Next)
    }
}

/// Column `i` of a matrix, or component `i` of a vector.
fn column_or_lane(n: &Num, i: usize) -> Num {
    if n.cols > 1 {
        let rows = usize::from(n.rows);
        let mut out = Num::zero(n.base, 1, n.rows);
        out.bits[..rows].copy_from_slice(&n.bits[i * rows..(i + 1) * rows]);
        out
    } else {
        let mut out = Num::zero(n.base, 1, 1);
        out.bits[0] = n.bits[i];
        out
    }
}

/// A vector's (or scalar's) components picked by a swizzle.
fn swizzled(n: &Num, s: Swizzle) -> Result<Num, ShaderError> {
    if n.cols > 1 {
        return Err(ShaderError::new("a matrix cannot be swizzled (index its columns)"));
    }
    let mut out = Num::zero(n.base, 1, s.len);
    for (k, &lane) in s.lanes[..usize::from(s.len)].iter().enumerate() {
        if lane >= n.rows {
            return Err(ShaderError::new(format!(
                "{} has no component {}",
                n.type_name(),
                ["x", "y", "z", "w"][usize::from(lane)]
            )));
        }
        out.bits[k] = n.bits[usize::from(lane)];
    }
    Ok(out)
}

/// Writes `value` into `target` at `steps` (index steps at `indices`, in order).
fn store(
    target: &mut Val,
    steps: &[Step],
    indices: &[i32],
    value: Val,
    structs: &[Vec<(String, Ty)>],
) -> Result<Val, ShaderError> {
    let Some((step, rest)) = steps.split_first() else {
        let fitted = fit_like(target, value)?;
        *target = fitted.clone();
        return Ok(fitted);
    };
    let take_index =
        |indices: &[i32], len: usize| -> Result<(usize, usize), ShaderError> {
            let i = indices.first().copied().unwrap_or(-1);
            usize::try_from(i).ok().filter(|&i| i < len).map(|i| (i, 1)).ok_or_else(|| {
                ShaderError::new(format!("index {i} is out of range for {len} items"))
            })
        };
    match (target, step) {
        (Val::Array(items), Step::Index(_)) => {
            let (i, used) = take_index(indices, items.len())?;
            store(&mut items[i], rest, &indices[used..], value, structs)
        }
        (Val::Struct(id, fields), Step::Field(name, _)) => {
            let i = structs[*id]
                .iter()
                .position(|(f, _)| f == name)
                .ok_or_else(|| ShaderError::new(format!("the struct has no field `{name}`")))?;
            store(&mut fields[i], rest, indices, value, structs)
        }
        (Val::Num(n), _) => store_lanes(n, steps, indices, value),
        (target, _) => Err(ShaderError::new(format!("cannot index {}", target.describe()))),
    }
}

/// Writes `value` into the components of `n` that `steps` name (columns, components, swizzles).
fn store_lanes(
    n: &mut Num,
    steps: &[Step],
    indices: &[i32],
    value: Val,
) -> Result<Val, ShaderError> {
    // The positions in `n.bits` addressed so far, as a vector (`shape` columns of this many rows).
    let mut lanes: Vec<usize> = (0..n.len()).collect();
    let (mut cols, mut rows) = (usize::from(n.cols), usize::from(n.rows));
    let mut indices = indices.iter();
    for step in steps {
        match step {
            Step::Index(_) => {
                let i = indices.next().copied().unwrap_or(-1);
                let count = if cols > 1 { cols } else { rows };
                let i = usize::try_from(i).ok().filter(|&i| i < count).ok_or_else(|| {
                    ShaderError::new(format!("index {i} is out of range for {count} items"))
                })?;
                if cols > 1 {
                    lanes = lanes[i * rows..(i + 1) * rows].to_vec();
                    cols = 1;
                } else {
                    lanes = vec![lanes[i]];
                    rows = 1;
                }
            }
            Step::Field(_, Some(s)) if cols == 1 => {
                let mut picked = Vec::with_capacity(usize::from(s.len));
                for &lane in &s.lanes[..usize::from(s.len)] {
                    let at = lanes.get(usize::from(lane)).ok_or_else(|| {
                        ShaderError::new("a swizzle names a component the vector does not have")
                    })?;
                    picked.push(*at);
                }
                lanes = picked;
                rows = lanes.len();
            }
            _ => return Err(ShaderError::new("cannot write this part of a number")),
        }
    }
    let value = value.num("an assignment")?;
    if value.len() != lanes.len() {
        return Err(ShaderError::new(format!(
            "cannot assign {} to {} components",
            value.type_name(),
            lanes.len()
        )));
    }
    let mut stored = Num::zero(n.base, value.cols, value.rows);
    for (k, &lane) in lanes.iter().enumerate() {
        n.bits[lane] = value.bits_as(k, n.base);
        stored.bits[k] = n.bits[lane];
    }
    Ok(Val::Num(stored))
}

/// `value` converted to the base of what `target` holds, which must have its shape.
fn fit_like(target: &Val, value: Val) -> Result<Val, ShaderError> {
    match (target, value) {
        (Val::Num(t), Val::Num(v)) if t.cols == v.cols && t.rows == v.rows => {
            Ok(Val::Num(v.convert(t.base)))
        }
        (Val::Array(t), Val::Array(v)) if t.len() == v.len() => {
            Ok(Val::Array(t.iter().zip(v).map(|(t, v)| fit_like(t, v)).collect::<Result<_, _>>()?))
        }
        (Val::Struct(a, _), v @ Val::Struct(b, _)) if *a == b => Ok(v),
        (Val::Sampler(_), v @ Val::Sampler(_)) => Ok(v),
        (target, value) => Err(ShaderError::new(format!(
            "cannot assign {} to {}",
            value.describe(),
            target.describe()
        ))),
    }
}

/// A constructor call: `float(x)`, `vec3(...)`, `mat2(...)`, `T[](...)`, `S(...)`.
fn construct(ty: &Ty, args: Vec<Val>, structs: &[Vec<(String, Ty)>]) -> Result<Val, ShaderError> {
    match ty {
        Ty::Array(item, len) => {
            if args.len() != *len {
                return Err(ShaderError::new(format!(
                    "an array of {len} needs {len} values, not {}",
                    args.len()
                )));
            }
            Ok(Val::Array(args.into_iter().map(|a| item.fit(a)).collect::<Result<_, _>>()?))
        }
        Ty::Struct(id) => {
            let fields = &structs[*id];
            if args.len() != fields.len() {
                return Err(ShaderError::new(format!(
                    "the struct has {} fields, not {}",
                    fields.len(),
                    args.len()
                )));
            }
            let values =
                fields.iter().zip(args).map(|((_, t), a)| t.fit(a)).collect::<Result<_, _>>()?;
            Ok(Val::Struct(*id, values))
        }
        Ty::Num { base, cols, rows } => {
            let nums =
                args.iter().map(|a| a.num("a constructor")).collect::<Result<Vec<_>, _>>()?;
            construct_num(*base, *cols, *rows, &nums).map(Val::Num)
        }
        other => Err(ShaderError::new(format!("cannot construct {}", other.describe()))),
    }
}

fn construct_num(base: Base, cols: u8, rows: u8, args: &[Num]) -> Result<Num, ShaderError> {
    let mut out = Num::zero(base, cols, rows);
    let name = out.type_name();
    let Some(first) = args.first() else {
        return Err(ShaderError::new(format!("{name}() needs arguments")));
    };
    if cols > 1 && args.len() == 1 && first.is_scalar() {
        // A matrix from one scalar: that scalar on the diagonal.
        for i in 0..usize::from(cols.min(rows)) {
            out.bits[i * usize::from(rows) + i] = first.bits_as(0, base);
        }
        return Ok(out);
    }
    if cols > 1 && args.len() == 1 && first.cols > 1 {
        // A matrix from a matrix: the overlap copied, the rest of the identity.
        for j in 0..usize::from(cols) {
            for i in 0..usize::from(rows) {
                let value = if j < usize::from(first.cols) && i < usize::from(first.rows) {
                    first.bits_as(j * usize::from(first.rows) + i, base)
                } else if i == j {
                    1.0f32.to_bits()
                } else {
                    0
                };
                out.bits[j * usize::from(rows) + i] = value;
            }
        }
        return Ok(out);
    }
    if args.len() == 1 && first.is_scalar() {
        for i in 0..out.len() {
            out.bits[i] = first.bits_as(0, base);
        }
        return Ok(out);
    }
    let mut k = 0;
    for arg in args {
        if k >= out.len() {
            return Err(ShaderError::new(format!("too many arguments to {name}()")));
        }
        for i in 0..arg.len() {
            if k < out.len() {
                out.bits[k] = arg.bits_as(i, base);
                k += 1;
            }
        }
    }
    if k < out.len() {
        return Err(ShaderError::new(format!("not enough values for {name}()")));
    }
    Ok(out)
}
