//! The interpreter: runs a [`Program`]'s `main` for one fragment at a time.

use super::ShaderError;
use super::compile::Program;
use super::ir::{Arg, BinOp, Expr, Place, Step, Stmt, Swizzle, Var};
use super::ops;
use super::texture::Texture;
use super::value::{Base, Mat, Num, Record, Ty, Val};

/// How many loop iterations, all loops together, one fragment may run before the shader is stopped (a GPU's
/// watchdog would have reset the device long before).
const MAX_ITERATIONS: u64 = 1 << 24;

/// How often, in loop iterations, a fragment checks whether the prompt was interrupted.
const STOP_CHECK: u64 = 1 << 16;

/// How deeply calls may nest (GLSL forbids recursion; a recursive shader stops here).
const MAX_DEPTH: usize = 64;

/// Why a fragment stopped early.
pub(super) enum Halt {
    /// `discard`: the fragment writes nothing.
    Discard,
    /// Boxed, so that a result of the interpreter stays the size of a value.
    Error(Box<ShaderError>),
    /// The prompt was interrupted while a fragment looped.
    Stopped,
}

impl From<ShaderError> for Halt {
    fn from(e: ShaderError) -> Halt {
        Halt::Error(Box::new(e))
    }
}

/// How many index steps one place may take (`a[i][j]`); deeper ones are refused.
const MAX_INDICES: usize = 8;

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
    stop: &'p (dyn Fn() -> bool + Sync),
    /// Loop iterations the running fragment may still take.
    budget: u64,
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
        stop: &'p (dyn Fn() -> bool + Sync),
    ) -> Machine<'p> {
        let (stack, base, depth, budget) = (Vec::new(), 0, 0, MAX_ITERATIONS);
        Machine { program, textures, stop, budget, globals, stack, base, depth }
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
        self.budget = MAX_ITERATIONS;
        self.stack.clear();
        self.base = 0;
        self.depth = 0;
        self.invoke_at(self.program.main, 0).map(|_| ())
    }

    fn slot(&mut self, var: Var) -> &mut Val {
        match var {
            Var::Local(i) => &mut self.stack[self.base + i],
            Var::Global(i) => &mut self.globals[i],
        }
    }

    fn eval(&mut self, e: &Expr) -> Result<Val, Halt> {
        match e {
            Expr::Const(v) => Ok(v.clone()),
            Expr::Read(place) if place.steps.is_empty() => Ok(self.slot(place.var).clone()),
            Expr::Binary(op, a, b) => {
                let a = self.eval(a)?;
                let b = self.eval(b)?;
                Ok(ops::binary(*op, &a, &b)?)
            }
            _ => self.eval_rest(e),
        }
    }

    /// The expressions [`Machine::eval`] does not handle itself: kept out of it so that its frame, entered
    /// for every node of every expression, stays small.
    #[inline(never)]
    fn eval_rest(&mut self, e: &Expr) -> Result<Val, Halt> {
        Ok(match e {
            // `eval` answers these itself.
            Expr::Const(_) | Expr::Binary(..) => return self.eval(e),
            Expr::Read(place) => self.read(place)?,
            Expr::Unary(op, x) => {
                let x = self.eval(x)?;
                ops::unary(*op, &x)?
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
                // The place's indices first, once (`a[i++] += x` steps i once).
                let indices = self.indices(place)?;
                let mut value = self.eval(rhs)?;
                if let Some(op) = op {
                    let current = self.read_at(place, &indices)?;
                    value = ops::binary(*op, &current, &value)?;
                }
                self.write_at(place, &indices, value)?
            }
            Expr::Step { place, delta, post } => {
                let indices = self.indices(place)?;
                let current = self.read_at(place, &indices)?;
                let n = current.num("++/--")?;
                let one = match n.base {
                    Base::Float => Num::float(*delta as f32),
                    Base::Int | Base::Uint => Num::int(*delta),
                    Base::Bool => return Err(ShaderError::new("cannot increment a bool").into()),
                };
                let next = ops::binary(BinOp::Add, &current, &Val::Num(one.convert(n.base)))?;
                let stored = self.write_at(place, &indices, next)?;
                if *post { current } else { stored }
            }
            Expr::Builtin(builtin, name, args) if args.len() <= 4 => {
                let mut values = [Val::Void, Val::Void, Val::Void, Val::Void];
                for (slot, a) in values.iter_mut().zip(args) {
                    *slot = self.eval(a)?;
                }
                builtin.call(name, &values[..args.len()], self.textures)?
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
                let value = self.eval(base)?;
                let n = parts(&value)
                    .ok_or_else(|| ShaderError::new(format!("length() of {}", value.describe())))?;
                Val::Num(Num::int(n as i32))
            }
            Expr::Comma(a, b) => {
                self.eval(a)?;
                self.eval(b)?
            }
        })
    }

    /// An index step's value, which must be an integer scalar.
    fn index(&mut self, e: &Expr) -> Result<i32, Halt> {
        let n = self.eval(e)?.num("an index")?;
        if !n.is_scalar() || matches!(n.base, Base::Float | Base::Bool) {
            return Err(ShaderError::new("an index must be an integer").into());
        }
        Ok(n.i(0))
    }

    /// The part of `value` a step names (its index expression evaluated here).
    fn step(&mut self, value: Val, step: &Step) -> Result<Val, Halt> {
        let index = match step {
            Step::Index(e) => self.index(e)?,
            Step::Field(..) => 0,
        };
        self.part(value, step, index)
    }

    /// The part of `value` a step names, an index step's value being `index`.
    fn part(&self, value: Val, step: &Step, index: i32) -> Result<Val, Halt> {
        match step {
            Step::Index(_) => {
                let len = parts(&value).ok_or_else(|| {
                    ShaderError::new(format!("cannot index {}", value.describe()))
                })?;
                Ok(part_at(value, checked(len, index)?))
            }
            Step::Field(name, swizzle) => self.field_of(value, name, *swizzle),
        }
    }

    /// `.name` of a struct, or the swizzle `name` of a vector.
    fn field_of(&self, value: Val, name: &str, swizzle: Option<Swizzle>) -> Result<Val, Halt> {
        match (value, swizzle) {
            (Val::Struct(mut record), _) => {
                let i = self.field(record.id, name)?;
                Ok(std::mem::replace(&mut record.fields[i], Val::Void))
            }
            (Val::Num(n), Some(s)) => Ok(Val::Num(swizzled(&n, s, name)?)),
            (value, _) => {
                Err(ShaderError::new(format!("{} has no field `{name}`", value.describe())).into())
            }
        }
    }

    fn field(&self, id: usize, name: &str) -> Result<usize, Halt> {
        Ok(field_index(&self.program.structs, id, name)?)
    }

    /// The integer values of a place's index steps, in order.
    fn indices(&mut self, place: &Place) -> Result<Indices, Halt> {
        let mut indices = [0i32; MAX_INDICES];
        let mut count = 0;
        for step in &place.steps {
            if let Step::Index(e) = step {
                if count == MAX_INDICES {
                    return Err(ShaderError::new("too many indices in one expression").into());
                }
                indices[count] = self.index(e)?;
                count += 1;
            }
        }
        Ok(Indices { values: indices, count })
    }

    fn read(&mut self, place: &Place) -> Result<Val, Halt> {
        if place.steps.is_empty() {
            return Ok(self.slot(place.var).clone());
        }
        let indices = self.indices(place)?;
        self.read_at(place, &indices)
    }

    /// The value at `place`, its index steps at `indices`.
    fn read_at(&mut self, place: &Place, indices: &Indices) -> Result<Val, Halt> {
        let indices = &indices.values[..indices.count];
        let program = self.program;
        let mut value: &Val = self.slot(place.var);
        let mut k = 0;
        for (s, step) in place.steps.iter().enumerate() {
            match (value, step) {
                (Val::Array(items), Step::Index(_)) => {
                    value = checked(items.len(), indices[k]).map(|i| &items[i])?;
                    k += 1;
                }
                (Val::Struct(record), Step::Field(name, _)) => {
                    value = &record.fields[field_index(&program.structs, record.id, name)?];
                }
                // A number's parts: columns, components and swizzles, by value from here on.
                (Val::Num(_) | Val::Mat(_), _) => {
                    let mut part = value.clone();
                    for step in &place.steps[s..] {
                        let index = match step {
                            Step::Index(_) => {
                                k += 1;
                                indices[k - 1]
                            }
                            Step::Field(..) => 0,
                        };
                        part = self.part(part, step, index)?;
                    }
                    return Ok(part);
                }
                (other, _) => {
                    let message = format!("cannot take a part of {}", other.describe());
                    return Err(ShaderError::new(message).into());
                }
            }
        }
        Ok(value.clone())
    }

    /// Writes `value` at `place`, its index steps at `indices`; returns what was stored.
    fn write_at(&mut self, place: &Place, indices: &Indices, value: Val) -> Result<Val, Halt> {
        let (indices, count) = (indices.values, indices.count);
        let structs = &self.program.structs;
        let target = match place.var {
            Var::Local(i) => &mut self.stack[self.base + i],
            Var::Global(i) => &mut self.globals[i],
        };
        store(target, &place.steps, &indices[..count], value, structs).map_err(Halt::from)
    }

    /// Calls one of the functions `ids` (overloads of one arity) with `args`: the arguments are evaluated onto
    /// the stack, where they become the callee's parameters.
    fn call(&mut self, ids: &[usize], args: &[Arg]) -> Result<Val, Halt> {
        let base = self.stack.len();
        // Each out argument's indices are taken before the call, as GLSL evaluates the argument then.
        let mut places = Vec::new();
        for arg in args {
            let value = match arg {
                Arg::In(e) => self.eval(e)?,
                Arg::Out(place) => {
                    let indices = self.indices(place)?;
                    // Read for `inout`; for `out`, only to tell overloads apart (replaced by zeros).
                    let value = self.read_at(place, &indices)?;
                    places.push(indices);
                    value
                }
            };
            self.stack.push(value);
        }
        let program = self.program;
        let given = &self.stack[base..];
        let chosen = if ids.len() == 1 {
            ids[0]
        } else {
            ids.iter()
                .copied()
                .find(|&id| {
                    program.functions[id].params.iter().zip(given).all(|(p, v)| p.ty.matches(v))
                })
                .unwrap_or(ids[0])
        };
        let function = &program.functions[chosen];
        for (k, param) in function.params.iter().enumerate() {
            let slot = &mut self.stack[base + k];
            let value = std::mem::replace(slot, Val::Void);
            *slot = if param.writes && !param.reads {
                param.ty.zero(&program.structs)
            } else {
                param.ty.fit(value)?
            };
        }
        let result = self.invoke_at(chosen, base);
        let outs: Vec<Val> = if places.is_empty() || result.is_err() {
            Vec::new()
        } else {
            function
                .params
                .iter()
                .enumerate()
                .filter(|(_, p)| p.writes)
                .map(|(k, _)| std::mem::replace(&mut self.stack[base + k], Val::Void))
                .collect()
        };
        self.stack.truncate(base);
        let result = result?;
        let out_places = args.iter().filter_map(|a| match a {
            Arg::Out(place) => Some(place),
            Arg::In(_) => None,
        });
        for ((place, indices), value) in out_places.zip(&places).zip(outs) {
            self.write_at(place, indices, value)?;
        }
        Ok(result)
    }

    /// Runs function `id` whose parameters are on the stack from `base`; leaves the frame there (the caller
    /// reads `out` parameters from it and truncates).
    fn invoke_at(&mut self, id: usize, base: usize) -> Result<Val, Halt> {
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
        self.stack.resize(base + function.frame.max(function.params.len()), Val::Void);
        self.base = base;
        self.depth += 1;
        let flow = self.block(&function.body);
        self.depth -= 1;
        self.base = saved;
        Ok(match flow? {
            Flow::Return(v) if function.ret != Ty::Void => function.ret.fit(v)?,
            _ => function.ret.zero(&program.structs),
        })
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
            Stmt::Loop { cond, step, body, test_first } => loop {
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
                self.budget -= 1;
                if self.budget == 0 {
                    let message =
                        format!("loops ran more than {MAX_ITERATIONS} times for one pixel");
                    return Err(ShaderError::new(message).into());
                }
                if self.budget.is_multiple_of(STOP_CHECK) && (self.stop)() {
                    return Err(Halt::Stopped);
                }
            },
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

/// A place's index values, evaluated once.
pub(super) struct Indices {
    values: [i32; MAX_INDICES],
    count: usize,
}

/// The position of field `name` in struct `id`.
fn field_index(structs: &[Vec<(String, Ty)>], id: usize, name: &str) -> Result<usize, ShaderError> {
    structs[id]
        .iter()
        .position(|(field, _)| field == name)
        .ok_or_else(|| ShaderError::new(format!("the struct has no field `{name}`")))
}

/// How many parts an index step chooses among: an array's items, a matrix's columns, a vector's components.
fn parts(value: &Val) -> Option<usize> {
    match value {
        Val::Array(items) => Some(items.len()),
        Val::Mat(m) => Some(usize::from(m.cols)),
        Val::Num(n) => Some(n.len()),
        _ => None,
    }
}

/// Index `i` of a value known to have more than `i` parts: an array's item, a matrix's column, a vector's
/// component.
fn part_at(value: Val, i: usize) -> Val {
    match value {
        Val::Array(items) => items.into_vec().swap_remove(i),
        Val::Mat(m) => Val::Num(m.column(i)),
        Val::Num(n) => {
            let mut out = Num::zero(n.base, 1);
            out.bits[0] = n.bits[i];
            Val::Num(out)
        }
        other => other,
    }
}

/// `i` as a position below `len`.
fn checked(len: usize, i: i32) -> Result<usize, ShaderError> {
    usize::try_from(i)
        .ok()
        .filter(|&i| i < len)
        .ok_or_else(|| ShaderError::new(format!("index {i} is out of range for {len} items")))
}

/// A vector's (or scalar's) components picked by the swizzle `.name`.
fn swizzled(n: &Num, s: Swizzle, name: &str) -> Result<Num, ShaderError> {
    let mut out = Num::zero(n.base, s.len);
    for (k, &lane) in s.lanes[..usize::from(s.len)].iter().enumerate() {
        if lane >= n.len {
            return Err(ShaderError::new(format!(
                "`.{name}` reads past the end of a {}",
                n.type_name()
            )));
        }
        out.bits[k] = n.bits[usize::from(lane)];
    }
    Ok(out)
}

/// Writes `value` into `target` at `steps` (index steps at `indices`, in order); returns what was stored.
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
    match (target, step) {
        (Val::Array(items), Step::Index(_)) => {
            let i = checked(items.len(), indices.first().copied().unwrap_or(-1))?;
            store(&mut items[i], rest, &indices[1..], value, structs)
        }
        (Val::Struct(record), Step::Field(name, _)) => {
            let i = structs[record.id]
                .iter()
                .position(|(f, _)| f == name)
                .ok_or_else(|| ShaderError::new(format!("the struct has no field `{name}`")))?;
            store(&mut record.fields[i], rest, indices, value, structs)
        }
        (Val::Mat(m), Step::Index(_)) => {
            // A column, then perhaps its components.
            let j = checked(usize::from(m.cols), indices.first().copied().unwrap_or(-1))?;
            let mut column = m.column(j);
            let stored = store_lanes(&mut column, rest, &indices[1..], value)?;
            let rows = usize::from(m.rows);
            for i in 0..rows {
                m.data[j * rows + i] = column.f(i);
            }
            Ok(stored)
        }
        (Val::Num(n), _) => store_lanes(n, steps, indices, value),
        (target, _) => Err(ShaderError::new(format!("cannot index {}", target.describe()))),
    }
}

/// Writes `value` into the components of the vector `n` that `steps` name (a component, swizzles).
fn store_lanes(
    n: &mut Num,
    steps: &[Step],
    indices: &[i32],
    value: Val,
) -> Result<Val, ShaderError> {
    // The positions in `n.bits` addressed so far.
    let mut lanes = [0usize, 1, 2, 3];
    let mut count = n.len();
    let mut indices = indices.iter();
    for step in steps {
        match step {
            Step::Index(_) => {
                let i = checked(count, indices.next().copied().unwrap_or(-1))?;
                lanes[0] = lanes[i];
                count = 1;
            }
            Step::Field(_, Some(s)) => {
                let mut picked = [0usize; 4];
                for (k, &lane) in s.lanes[..usize::from(s.len)].iter().enumerate() {
                    if usize::from(lane) >= count {
                        return Err(ShaderError::new(
                            "a swizzle names a component the vector does not have",
                        ));
                    }
                    picked[k] = lanes[usize::from(lane)];
                }
                lanes = picked;
                count = usize::from(s.len);
            }
            Step::Field(name, None) => {
                return Err(ShaderError::new(format!("a vector has no field `{name}`")));
            }
        }
    }
    let value = value.num("an assignment")?;
    if value.len() != count {
        return Err(ShaderError::new(format!(
            "cannot assign {} to {count} components",
            value.type_name()
        )));
    }
    let mut stored = Num::zero(n.base, value.len);
    for (k, &lane) in lanes[..count].iter().enumerate() {
        n.bits[lane] = value.bits_as(k, n.base);
        stored.bits[k] = n.bits[lane];
    }
    Ok(Val::Num(stored))
}

/// `value` converted to the base of what `target` holds, which must have its shape.
fn fit_like(target: &Val, value: Val) -> Result<Val, ShaderError> {
    match (target, value) {
        (Val::Num(t), Val::Num(v)) if t.len == v.len => Ok(Val::Num(v.convert(t.base))),
        (Val::Mat(t), Val::Mat(v)) if (t.cols, t.rows) == (v.cols, v.rows) => Ok(Val::Mat(v)),
        (Val::Array(t), Val::Array(v)) if t.len() == v.len() => Ok(Val::Array(
            t.iter().zip(v.into_vec()).map(|(t, v)| fit_like(t, v)).collect::<Result<_, _>>()?,
        )),
        (Val::Struct(a), Val::Struct(b)) if a.id == b.id => Ok(Val::Struct(b)),
        (Val::Sampler(_), v @ Val::Sampler(_)) => Ok(v),
        (target, value) => Err(ShaderError::new(format!(
            "cannot assign {} to {}",
            value.describe(),
            target.describe()
        ))),
    }
}

/// A constructor call: `float(x)`, `vec3(...)`, `mat2(...)`, `T[](...)`, `S(...)`.
pub(super) fn construct(
    ty: &Ty,
    args: Vec<Val>,
    structs: &[Vec<(String, Ty)>],
) -> Result<Val, ShaderError> {
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
            Ok(Val::Struct(Box::new(Record { id: *id, fields: values })))
        }
        Ty::Num { cols, rows, .. } if *cols > 1 => construct_mat(*cols, *rows, &args),
        Ty::Num { base, rows, .. } => construct_num(*base, *rows, &args),
        other => Err(ShaderError::new(format!("cannot construct {}", other.describe()))),
    }
}

/// The components of constructor arguments, in order (a matrix's column after column).
fn components(args: &[Val], name: &str) -> Result<Vec<f32>, ShaderError> {
    let mut out = Vec::with_capacity(16);
    for arg in args {
        match arg {
            Val::Num(n) => out.extend((0..n.len()).map(|i| n.f(i))),
            Val::Mat(m) => out.extend_from_slice(&m.data[..m.len()]),
            other => {
                return Err(ShaderError::new(format!("{name}() cannot take {}", other.describe())));
            }
        }
    }
    Ok(out)
}

fn construct_num(base: Base, len: u8, args: &[Val]) -> Result<Val, ShaderError> {
    let mut out = Num::zero(base, len);
    let name = out.type_name();
    match args {
        [] => Err(ShaderError::new(format!("{name}() needs arguments"))),
        [Val::Num(n)] if n.is_scalar() => {
            for i in 0..out.len() {
                out.bits[i] = n.bits_as(0, base);
            }
            Ok(Val::Num(out))
        }
        [Val::Num(n)] if n.len() >= out.len() => {
            for i in 0..out.len() {
                out.bits[i] = n.bits_as(i, base);
            }
            Ok(Val::Num(out))
        }
        _ => {
            let mut k = 0;
            for (a, arg) in args.iter().enumerate() {
                let n = match arg {
                    Val::Num(n) => *n,
                    Val::Mat(m) => {
                        // A matrix's components, column after column, as floats.
                        let values = components(std::slice::from_ref(arg), &name)?;
                        let mut taken = 0;
                        for v in values.iter().take(out.len().saturating_sub(k)) {
                            out.bits[k] = Num::float(*v).bits_as(0, base);
                            k += 1;
                            taken += 1;
                        }
                        if taken < m.len() && a + 1 < args.len() {
                            return Err(ShaderError::new(format!(
                                "too many arguments to {name}()"
                            )));
                        }
                        continue;
                    }
                    other => {
                        return Err(ShaderError::new(format!(
                            "{name}() cannot take {}",
                            other.describe()
                        )));
                    }
                };
                if k >= out.len() {
                    return Err(ShaderError::new(format!("too many arguments to {name}()")));
                }
                for i in 0..n.len() {
                    if k < out.len() {
                        out.bits[k] = n.bits_as(i, base);
                        k += 1;
                    }
                }
            }
            if k < out.len() {
                return Err(ShaderError::new(format!("not enough values for {name}()")));
            }
            Ok(Val::Num(out))
        }
    }
}

fn construct_mat(cols: u8, rows: u8, args: &[Val]) -> Result<Val, ShaderError> {
    let mut out = Mat::zero(cols, rows);
    let name = out.type_name();
    let (c, r) = (usize::from(cols), usize::from(rows));
    match args {
        // One scalar: on the diagonal.
        [Val::Num(n)] if n.is_scalar() => {
            for i in 0..c.min(r) {
                out.data[i * r + i] = n.f(0);
            }
        }
        // A matrix: the overlap copied, the rest of the identity.
        [Val::Mat(m)] => {
            let (mc, mr) = (usize::from(m.cols), usize::from(m.rows));
            for j in 0..c {
                for i in 0..r {
                    out.data[j * r + i] = if j < mc && i < mr {
                        m.data[j * mr + i]
                    } else if i == j {
                        1.0
                    } else {
                        0.0
                    };
                }
            }
        }
        _ => {
            let values = components(args, &name)?;
            if values.len() != c * r {
                return Err(ShaderError::new(format!(
                    "{name}() needs {} values, not {}",
                    c * r,
                    values.len()
                )));
            }
            out.data[..c * r].copy_from_slice(&values);
        }
    }
    Ok(Val::Mat(Box::new(out)))
}
