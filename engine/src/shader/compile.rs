//! From the parsed GLSL ES fragment shader to the [`Program`] the interpreter runs: every name resolved to
//! a slot, function or built-in, declarations to types, and the shader's interface (uniforms, samplers,
//! outputs, `v_texCoord`, `gl_FragCoord`) collected.

use std::collections::HashMap;

use glsl::syntax as ast;

use super::ShaderError;
use super::builtins::Builtin;
use super::ir::{Arg, BinOp, Expr, Function, Param, Place, Step, Stmt, Swizzle, UnOp, Var};
use super::value::{Base, Num, Ty, Val};

/// The most scalars one variable may hold (GPUs give a fragment shader far less room).
const MAX_SCALARS: usize = 1 << 16;

/// How deeply expressions may nest (and so how deeply the interpreter recurses).
const MAX_NESTING: usize = 256;

/// What a global variable is to the shader's interface.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum GlobalKind {
    /// Set by the node (`u_float0`, `u_image0`, `u_resolution`, ...) and read-only.
    Uniform,
    /// A `const`.
    Const,
    /// The interpolated texture coordinate of ComfyUI's vertex shader.
    TexCoord,
    /// `gl_FragCoord`.
    FragCoord,
    /// A fragment output at this location (`fragColor0`, `gl_FragColor`).
    Output(usize),
    /// Any other global (`gl_FragDepth` among them).
    Plain,
}

/// A global variable.
#[derive(Clone, Debug)]
pub(super) struct Global {
    pub(super) name: String,
    pub(super) ty: Ty,
    pub(super) kind: GlobalKind,
}

/// A compiled fragment shader.
#[derive(Clone, Debug)]
pub(super) struct Program {
    pub(super) globals: Vec<Global>,
    /// Global initialisers, in declaration order.
    pub(super) inits: Vec<(usize, Expr)>,
    pub(super) functions: Vec<Function>,
    pub(super) main: usize,
    /// Each struct's fields, by declaration.
    pub(super) structs: Vec<Vec<(String, Ty)>>,
    /// The `sampler2D` uniforms' names; `Val::Sampler(i)` is the i-th.
    pub(super) samplers: Vec<String>,
}

/// One declared name in a scope: its slot, whether it may be written, and a constant's value.
#[derive(Clone)]
struct Local {
    slot: usize,
    writable: bool,
    value: Option<Val>,
}

/// The compiler's state.
#[derive(Default)]
struct Compiler {
    globals: Vec<Global>,
    global_names: HashMap<String, usize>,
    inits: Vec<(usize, Expr)>,
    /// Values of global constants known at compile time (array sizes, case labels).
    constants: HashMap<String, Val>,
    functions: Vec<Function>,
    /// Each name's functions.
    function_names: HashMap<String, Vec<usize>>,
    structs: Vec<Vec<(String, Ty)>>,
    struct_names: HashMap<String, usize>,
    samplers: Vec<String>,
    /// The function being compiled: its scopes and next free slot.
    scopes: Vec<HashMap<String, Local>>,
    next_slot: usize,
    /// How deeply the expression being compiled nests.
    nesting: usize,
    /// Outputs declared without a location.
    unplaced_outputs: usize,
}

/// Compiles a parsed translation unit.
pub(super) fn compile(unit: &ast::TranslationUnit) -> Result<Program, ShaderError> {
    let mut c = Compiler::default();
    for declaration in &unit.0.0 {
        match declaration {
            ast::ExternalDeclaration::Preprocessor(_) => {}
            ast::ExternalDeclaration::Declaration(d) => c.global_declaration(d)?,
            ast::ExternalDeclaration::FunctionDefinition(f) => c.function(f)?,
        }
    }
    let main = c
        .function_names
        .get("main")
        .and_then(|ids| ids.iter().copied().find(|&i| c.functions[i].params.is_empty()))
        .filter(|&i| c.functions[i].defined)
        .ok_or_else(|| ShaderError::new("the shader has no `void main()`"))?;
    let mut locations: Vec<(usize, &str)> = c
        .globals
        .iter()
        .filter_map(|g| match g.kind {
            GlobalKind::Output(location) => Some((location, g.name.as_str())),
            _ => None,
        })
        .collect();
    if locations.len() > 1 && c.unplaced_outputs > 0 {
        return Err(ShaderError::new(
            "with more than one output, each needs `layout(location = N)`",
        ));
    }
    locations.sort_unstable();
    if let Some(pair) = locations.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(ShaderError::new(format!(
            "outputs `{}` and `{}` share location {}",
            pair[0].1, pair[1].1, pair[0].0
        )));
    }
    Ok(Program {
        globals: c.globals,
        inits: c.inits,
        functions: c.functions,
        main,
        structs: c.structs,
        samplers: c.samplers,
    })
}

/// The storage qualifiers and layout location of a declaration.
#[derive(Default)]
struct Qualifiers {
    uniform: bool,
    constant: bool,
    input: bool,
    output: bool,
    inout: bool,
    location: Option<usize>,
}

fn qualifiers(q: Option<&ast::TypeQualifier>) -> Result<Qualifiers, ShaderError> {
    let mut out = Qualifiers::default();
    let Some(q) = q else { return Ok(out) };
    for spec in &q.qualifiers.0 {
        match spec {
            ast::TypeQualifierSpec::Storage(s) => match s {
                ast::StorageQualifier::Uniform => out.uniform = true,
                ast::StorageQualifier::Const => out.constant = true,
                ast::StorageQualifier::In | ast::StorageQualifier::Varying => out.input = true,
                ast::StorageQualifier::Out => out.output = true,
                ast::StorageQualifier::InOut => out.inout = true,
                ast::StorageQualifier::Centroid => {}
                other => {
                    return Err(ShaderError::new(format!(
                        "the storage qualifier {other:?} is not part of GLSL ES fragment shaders"
                    )));
                }
            },
            ast::TypeQualifierSpec::Layout(layout) => {
                for id in &layout.ids.0 {
                    if let ast::LayoutQualifierSpec::Identifier(name, Some(value)) = id
                        && name.0 == "location"
                        && let ast::Expr::IntConst(n) = **value
                    {
                        out.location = usize::try_from(n).ok();
                    }
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The swizzle a field name reads as (`xyz`, `rgba`, `st`), if it is one.
fn swizzle(name: &str) -> Option<Swizzle> {
    if name.is_empty() || name.len() > 4 {
        return None;
    }
    let mut lanes = [0u8; 4];
    let mut set = None;
    for (i, ch) in name.chars().enumerate() {
        let (s, lane) = ["xyzw", "rgba", "stpq"]
            .iter()
            .enumerate()
            .find_map(|(s, letters)| letters.find(ch).map(|l| (s, l as u8)))?;
        if *set.get_or_insert(s) != s {
            return None;
        }
        lanes[i] = lane;
    }
    Some(Swizzle { lanes, len: name.len() as u8 })
}

impl Compiler {
    /// The type a type specifier names.
    fn type_of(&mut self, spec: &ast::TypeSpecifierNonArray) -> Result<Ty, ShaderError> {
        use ast::TypeSpecifierNonArray as T;
        let num = |base, cols, rows| Ty::Num { base, cols, rows };
        Ok(match spec {
            T::Void => Ty::Void,
            T::Bool => num(Base::Bool, 1, 1),
            T::Int => num(Base::Int, 1, 1),
            T::UInt => num(Base::Uint, 1, 1),
            T::Float => num(Base::Float, 1, 1),
            T::Vec2 => num(Base::Float, 1, 2),
            T::Vec3 => num(Base::Float, 1, 3),
            T::Vec4 => num(Base::Float, 1, 4),
            T::BVec2 => num(Base::Bool, 1, 2),
            T::BVec3 => num(Base::Bool, 1, 3),
            T::BVec4 => num(Base::Bool, 1, 4),
            T::IVec2 => num(Base::Int, 1, 2),
            T::IVec3 => num(Base::Int, 1, 3),
            T::IVec4 => num(Base::Int, 1, 4),
            T::UVec2 => num(Base::Uint, 1, 2),
            T::UVec3 => num(Base::Uint, 1, 3),
            T::UVec4 => num(Base::Uint, 1, 4),
            T::Mat2 => num(Base::Float, 2, 2),
            T::Mat3 => num(Base::Float, 3, 3),
            T::Mat4 => num(Base::Float, 4, 4),
            T::Mat23 => num(Base::Float, 2, 3),
            T::Mat24 => num(Base::Float, 2, 4),
            T::Mat32 => num(Base::Float, 3, 2),
            T::Mat34 => num(Base::Float, 3, 4),
            T::Mat42 => num(Base::Float, 4, 2),
            T::Mat43 => num(Base::Float, 4, 3),
            T::Sampler2D => Ty::Sampler,
            T::Struct(s) => self.structure(s)?,
            T::TypeName(name) => match self.struct_names.get(&name.0) {
                Some(&id) => Ty::Struct(id),
                None => return Err(ShaderError::new(format!("unknown type `{}`", name.0))),
            },
            other => {
                return Err(ShaderError::new(format!(
                    "the type {other:?} is not supported (GLSLShader binds 2D textures and numbers)"
                )));
            }
        })
    }

    /// Declares a struct (a named one once) and returns its type.
    fn structure(&mut self, s: &ast::StructSpecifier) -> Result<Ty, ShaderError> {
        let mut fields = Vec::new();
        for field in &s.fields.0 {
            let base = self.type_of(&field.ty.ty)?;
            let base = self.arrayed(base, field.ty.array_specifier.as_ref(), None)?;
            for ident in &field.identifiers.0 {
                let ty = self.arrayed(base.clone(), ident.array_spec.as_ref(), None)?;
                fields.push((ident.ident.0.clone(), ty));
            }
        }
        let id = self.structs.len();
        self.structs.push(fields);
        if let Some(name) = &s.name {
            self.struct_names.insert(name.0.clone(), id);
        }
        Ok(Ty::Struct(id))
    }

    /// `ty` made an array by `spec` (sized by its constant, or by `initializer_len` when unsized).
    fn arrayed(
        &mut self,
        ty: Ty,
        spec: Option<&ast::ArraySpecifier>,
        initializer_len: Option<usize>,
    ) -> Result<Ty, ShaderError> {
        let Some(spec) = spec else { return Ok(ty) };
        let mut ty = ty;
        for dim in spec.dimensions.0.iter().rev() {
            let len = match dim {
                ast::ArraySpecifierDimension::Unsized => initializer_len.ok_or_else(|| {
                    ShaderError::new("an array without a size needs an initialiser")
                })?,
                ast::ArraySpecifierDimension::ExplicitlySized(e) => {
                    let size = self.expr(e)?;
                    match self.constant(&size).and_then(|v| v.num("").ok()) {
                        Some(n) if n.is_scalar() && n.base != Base::Float && n.i(0) > 0 => {
                            n.i(0) as usize
                        }
                        _ => {
                            return Err(ShaderError::new(
                                "an array size must be a positive constant integer",
                            ));
                        }
                    }
                }
            };
            ty = Ty::Array(Box::new(ty), len);
            if ty.scalars() > MAX_SCALARS {
                return Err(ShaderError::new(format!(
                    "an array of more than {MAX_SCALARS} values is too large for a fragment shader"
                )));
            }
        }
        Ok(ty)
    }

    /// The value of an expression known at compile time: literals, constants and their negations.
    fn constant(&self, e: &Expr) -> Option<Val> {
        match e {
            Expr::Const(v) => Some(v.clone()),
            Expr::Unary(UnOp::Neg, inner) => {
                super::ops::unary(UnOp::Neg, &self.constant(inner)?).ok()
            }
            Expr::Read(Place { var: Var::Global(g), steps }) if steps.is_empty() => {
                self.constants.get(&self.globals[*g].name).cloned()
            }
            Expr::Read(Place { var: Var::Local(slot), steps }) if steps.is_empty() => self
                .scopes
                .iter()
                .rev()
                .flat_map(|scope| scope.values())
                .find(|local| local.slot == *slot)
                .and_then(|local| local.value.clone()),
            _ => None,
        }
    }

    fn add_global(&mut self, name: &str, ty: Ty, kind: GlobalKind) -> Result<usize, ShaderError> {
        if self.global_names.contains_key(name) {
            return Err(ShaderError::new(format!("`{name}` is declared twice")));
        }
        let slot = self.globals.len();
        self.globals.push(Global { name: name.to_owned(), ty, kind });
        self.global_names.insert(name.to_owned(), slot);
        Ok(slot)
    }

    /// A declaration at file scope.
    fn global_declaration(&mut self, d: &ast::Declaration) -> Result<(), ShaderError> {
        match d {
            ast::Declaration::Precision(..) => Ok(()),
            ast::Declaration::FunctionPrototype(p) => self.prototype(p).map(|_| ()),
            ast::Declaration::Block(_) => Err(ShaderError::new(
                "uniform blocks are not supported: GLSLShader sets each uniform by name \
                 (declare `uniform float u_float0;`)",
            )),
            ast::Declaration::Global(..) => Ok(()),
            ast::Declaration::InitDeclaratorList(list) => {
                let q = qualifiers(list.head.ty.qualifier.as_ref())?;
                let base = self.type_of(&list.head.ty.ty.ty)?;
                for (name, array, init) in declarators(list) {
                    let (ty, init) = self.declarator(&base, &list.head.ty.ty, array, init)?;
                    self.global(&name.0, ty, &q, init)?;
                }
                Ok(())
            }
        }
    }

    /// One declarator's type and compiled initialiser: `base` made an array by the type's and the name's
    /// specifiers, an unsized one sized by its initialiser.
    fn declarator(
        &mut self,
        base: &Ty,
        spec: &ast::TypeSpecifier,
        array: Option<&ast::ArraySpecifier>,
        init: &Option<ast::Initializer>,
    ) -> Result<(Ty, Option<Expr>), ShaderError> {
        let init = match init {
            Some(i) => Some(self.initializer(i)?),
            None => None,
        };
        let len = init.as_ref().and_then(array_len);
        let ty = self.arrayed(base.clone(), spec.array_specifier.as_ref(), len)?;
        let ty = self.arrayed(ty, array, len)?;
        Ok((ty, init))
    }

    /// Declares one global variable of the shader's interface or its own.
    fn global(
        &mut self,
        name: &str,
        ty: Ty,
        q: &Qualifiers,
        init: Option<Expr>,
    ) -> Result<(), ShaderError> {
        let kind = if q.uniform {
            if ty == Ty::Sampler {
                self.samplers.push(name.to_owned());
            }
            GlobalKind::Uniform
        } else if q.input {
            if name != "v_texCoord" {
                return Err(ShaderError::new(format!(
                    "input `{name}` is not written by GLSLShader's vertex shader, whose only output is \
                     `in vec2 v_texCoord`"
                )));
            }
            GlobalKind::TexCoord
        } else if q.output {
            if ty != Ty::vector(Base::Float, 4) {
                return Err(ShaderError::new(format!(
                    "output `{name}` must be a vec4 (the outputs are RGBA float images)"
                )));
            }
            if q.location.is_none() {
                self.unplaced_outputs += 1;
            }
            let location = q.location.unwrap_or(0);
            if location >= super::MAX_OUTPUTS {
                return Err(ShaderError::new(format!(
                    "output `{name}` is at location {location}; GLSLShader has {} outputs",
                    super::MAX_OUTPUTS
                )));
            }
            GlobalKind::Output(location)
        } else if q.constant {
            GlobalKind::Const
        } else {
            GlobalKind::Plain
        };
        let slot = self.add_global(name, ty, kind.clone())?;
        if let Some(init) = init {
            if kind == GlobalKind::Const
                && let Some(value) = self.constant(&init)
            {
                self.constants.insert(name.to_owned(), value);
            }
            self.inits.push((slot, init));
        } else if kind == GlobalKind::Const {
            return Err(ShaderError::new(format!("constant `{name}` needs a value")));
        }
        Ok(())
    }

    fn initializer(&mut self, i: &ast::Initializer) -> Result<Expr, ShaderError> {
        match i {
            ast::Initializer::Simple(e) => self.expr(e),
            ast::Initializer::List(_) => {
                Err(ShaderError::new("initialiser lists `{...}` are not part of GLSL ES 3.00"))
            }
        }
    }

    /// Declares a function's signature; returns its index (an earlier prototype's if it has one).
    fn prototype(&mut self, p: &ast::FunctionPrototype) -> Result<usize, ShaderError> {
        let ret = self.type_of(&p.ty.ty.ty)?;
        let ret = self.arrayed(ret, p.ty.ty.array_specifier.as_ref(), None)?;
        let mut params = Vec::new();
        for param in &p.parameters {
            let (q, spec, array) = match param {
                ast::FunctionParameterDeclaration::Named(q, d) => {
                    (q, &d.ty, d.ident.array_spec.as_ref())
                }
                ast::FunctionParameterDeclaration::Unnamed(q, ty) => (q, ty, None),
            };
            let q = qualifiers(q.as_ref())?;
            let ty = self.type_of(&spec.ty)?;
            let ty = self.arrayed(ty, spec.array_specifier.as_ref(), None)?;
            let ty = self.arrayed(ty, array, None)?;
            if ty == Ty::Void {
                continue;
            }
            params.push(Param { ty, writes: q.output || q.inout, reads: !q.output || q.inout });
        }
        let name = p.name.0.clone();
        let existing = self.function_names.get(&name).and_then(|ids| {
            ids.iter().copied().find(|&i| {
                let f = &self.functions[i];
                f.params.len() == params.len()
                    && f.params.iter().zip(&params).all(|(a, b)| a.ty == b.ty)
            })
        });
        if let Some(i) = existing {
            return Ok(i);
        }
        let id = self.functions.len();
        let function = Function {
            name: name.clone(),
            params,
            ret,
            body: Vec::new(),
            frame: 0,
            defined: false,
        };
        self.functions.push(function);
        self.function_names.entry(name).or_default().push(id);
        Ok(id)
    }

    fn function(&mut self, f: &ast::FunctionDefinition) -> Result<(), ShaderError> {
        let id = self.prototype(&f.prototype)?;
        if self.functions[id].defined {
            return Err(ShaderError::new(format!(
                "function `{}` is defined twice",
                f.prototype.name.0
            )));
        }
        // Defined before its body: a call to itself (GLSL forbids recursion) is refused when it is made.
        self.functions[id].defined = true;
        self.scopes = vec![HashMap::new()];
        self.next_slot = 0;
        for param in &f.prototype.parameters {
            let slot = self.next_slot;
            self.next_slot += 1;
            if let ast::FunctionParameterDeclaration::Named(q, d) = param {
                let writable = !qualifiers(q.as_ref())?.constant;
                self.scopes[0]
                    .insert(d.ident.ident.0.clone(), Local { slot, writable, value: None });
            }
        }
        let body = self.statements(&f.statement.statement_list)?;
        let function = &mut self.functions[id];
        function.body = body;
        function.frame = self.next_slot;
        self.scopes.clear();
        Ok(())
    }

    fn statements(&mut self, list: &[ast::Statement]) -> Result<Vec<Stmt>, ShaderError> {
        let mut out = Vec::new();
        for s in list {
            self.statement(s, &mut out)?;
        }
        Ok(out)
    }

    /// A statement in a scope of its own.
    fn scoped(&mut self, s: &ast::Statement) -> Result<Vec<Stmt>, ShaderError> {
        self.scopes.push(HashMap::new());
        let mut out = Vec::new();
        let result = self.statement(s, &mut out);
        self.scopes.pop();
        result.map(|()| out)
    }

    fn statement(&mut self, s: &ast::Statement, out: &mut Vec<Stmt>) -> Result<(), ShaderError> {
        match s {
            ast::Statement::Compound(c) => {
                self.scopes.push(HashMap::new());
                let body = self.statements(&c.statement_list);
                self.scopes.pop();
                out.push(Stmt::Block(body?));
            }
            ast::Statement::Simple(simple) => self.simple(simple, out)?,
        }
        Ok(())
    }

    fn simple(&mut self, s: &ast::SimpleStatement, out: &mut Vec<Stmt>) -> Result<(), ShaderError> {
        use ast::SimpleStatement as S;
        match s {
            S::Declaration(d) => self.local_declaration(d, out)?,
            S::Expression(Some(e)) => out.push(Stmt::Expr(self.expr(e)?)),
            S::Expression(None) => {}
            S::Selection(sel) => {
                let cond = self.expr(&sel.cond)?;
                let (then, otherwise) = match &sel.rest {
                    ast::SelectionRestStatement::Statement(t) => (self.scoped(t)?, Vec::new()),
                    ast::SelectionRestStatement::Else(t, e) => (self.scoped(t)?, self.scoped(e)?),
                };
                out.push(Stmt::If(cond, then, otherwise));
            }
            S::Switch(sw) => {
                let head = self.expr(&sw.head)?;
                self.scopes.push(HashMap::new());
                let result = self.switch_body(&sw.body);
                self.scopes.pop();
                let (labels, body) = result?;
                out.push(Stmt::Switch(head, labels, body));
            }
            S::CaseLabel(_) => {
                return Err(ShaderError::new("a `case` label outside a `switch`"));
            }
            S::Iteration(it) => self.iteration(it, out)?,
            S::Jump(jump) => out.push(match jump {
                ast::JumpStatement::Break => Stmt::Break,
                ast::JumpStatement::Continue => Stmt::Continue,
                ast::JumpStatement::Discard => Stmt::Discard,
                ast::JumpStatement::Return(e) => Stmt::Return(match e {
                    Some(e) => Some(self.expr(e)?),
                    None => None,
                }),
            }),
        }
        Ok(())
    }

    /// A switch's statements, with each label's value and the index of the statement it starts at.
    #[allow(clippy::type_complexity)]
    fn switch_body(
        &mut self,
        body: &[ast::Statement],
    ) -> Result<(Vec<(Option<Val>, usize)>, Vec<Stmt>), ShaderError> {
        let mut labels = Vec::new();
        let mut out = Vec::new();
        for s in body {
            if let ast::Statement::Simple(simple) = s
                && let ast::SimpleStatement::CaseLabel(label) = &**simple
            {
                let value = match label {
                    ast::CaseLabel::Def => None,
                    ast::CaseLabel::Case(e) => {
                        let e = self.expr(e)?;
                        Some(self.constant(&e).ok_or_else(|| {
                            ShaderError::new("a `case` label must be a constant integer")
                        })?)
                    }
                };
                labels.push((value, out.len()));
            } else {
                self.statement(s, &mut out)?;
            }
        }
        Ok((labels, out))
    }

    fn condition(&mut self, c: &ast::Condition) -> Result<Expr, ShaderError> {
        match c {
            ast::Condition::Expr(e) => self.expr(e),
            ast::Condition::Assignment(..) => {
                Err(ShaderError::new("a declaration as a loop condition is not supported"))
            }
        }
    }

    fn iteration(
        &mut self,
        it: &ast::IterationStatement,
        out: &mut Vec<Stmt>,
    ) -> Result<(), ShaderError> {
        match it {
            ast::IterationStatement::While(cond, body) => {
                let cond = self.condition(cond)?;
                let body = self.scoped(body)?;
                out.push(Stmt::Loop { cond: Some(cond), step: None, body, test_first: true });
            }
            ast::IterationStatement::DoWhile(body, cond) => {
                let body = self.scoped(body)?;
                let cond = self.expr(cond)?;
                out.push(Stmt::Loop { cond: Some(cond), step: None, body, test_first: false });
            }
            ast::IterationStatement::For(init, rest, body) => {
                self.scopes.push(HashMap::new());
                let result = self.for_loop(init, rest, body);
                self.scopes.pop();
                out.push(Stmt::Block(result?));
            }
        }
        Ok(())
    }

    fn for_loop(
        &mut self,
        init: &ast::ForInitStatement,
        rest: &ast::ForRestStatement,
        body: &ast::Statement,
    ) -> Result<Vec<Stmt>, ShaderError> {
        let mut out = Vec::new();
        match init {
            ast::ForInitStatement::Expression(Some(e)) => out.push(Stmt::Expr(self.expr(e)?)),
            ast::ForInitStatement::Expression(None) => {}
            ast::ForInitStatement::Declaration(d) => self.local_declaration(d, &mut out)?,
        }
        let cond = match &rest.condition {
            Some(c) => Some(self.condition(c)?),
            None => None,
        };
        let step = match &rest.post_expr {
            Some(e) => Some(self.expr(e)?),
            None => None,
        };
        let body = self.scoped(body)?;
        out.push(Stmt::Loop { cond, step, body, test_first: true });
        Ok(out)
    }

    fn local_declaration(
        &mut self,
        d: &ast::Declaration,
        out: &mut Vec<Stmt>,
    ) -> Result<(), ShaderError> {
        let list = match d {
            ast::Declaration::InitDeclaratorList(list) => list,
            ast::Declaration::Precision(..) => return Ok(()),
            _ => return Err(ShaderError::new("this declaration is only allowed at file scope")),
        };
        let q = qualifiers(list.head.ty.qualifier.as_ref())?;
        let base = self.type_of(&list.head.ty.ty.ty)?;
        for (name, array, init) in declarators(list) {
            // The initialiser is compiled before the name is in scope (`float x = x;` reads an outer x).
            let (ty, init) = self.declarator(&base, &list.head.ty.ty, array, init)?;
            let slot = self.next_slot;
            self.next_slot += 1;
            // A local constant's value, when known, stands for it where a constant is needed.
            let value =
                if q.constant { init.as_ref().and_then(|e| self.constant(e)) } else { None };
            let scope = self.scopes.last_mut().ok_or_else(|| ShaderError::new("no scope"))?;
            scope.insert(name.0.clone(), Local { slot, writable: !q.constant, value });
            out.push(Stmt::Declare(slot, ty, init));
        }
        Ok(())
    }

    /// The variable a name refers to, and whether it may be written.
    fn variable(&mut self, name: &str) -> Result<(Var, bool), ShaderError> {
        for scope in self.scopes.iter().rev() {
            if let Some(local) = scope.get(name) {
                return Ok((Var::Local(local.slot), local.writable));
            }
        }
        let slot = match self.global_names.get(name) {
            Some(&slot) => slot,
            None => {
                let (ty, kind) = match name {
                    "gl_FragCoord" => (Ty::vector(Base::Float, 4), GlobalKind::FragCoord),
                    "gl_FragColor" => (Ty::vector(Base::Float, 4), GlobalKind::Output(0)),
                    "gl_FragDepth" => (Ty::vector(Base::Float, 1), GlobalKind::Plain),
                    "gl_FrontFacing" => (Ty::vector(Base::Bool, 1), GlobalKind::Uniform),
                    _ => return Err(ShaderError::new(format!("`{name}` is not declared"))),
                };
                let slot = self.add_global(name, ty, kind)?;
                if name == "gl_FrontFacing" {
                    self.inits.push((slot, Expr::Const(Val::Num(Num::boolean(true)))));
                }
                slot
            }
        };
        let writable = !matches!(
            self.globals[slot].kind,
            GlobalKind::Uniform | GlobalKind::Const | GlobalKind::TexCoord | GlobalKind::FragCoord
        );
        Ok((Var::Global(slot), writable))
    }

    /// An expression that must name something writable.
    fn place(&mut self, e: &ast::Expr) -> Result<Place, ShaderError> {
        let read_only = || ShaderError::new("the left side of an assignment must be a variable");
        let Some(name) = root_name(e) else { return Err(read_only()) };
        if !self.variable(name)?.1 {
            return Err(ShaderError::new(format!("`{name}` is read-only")));
        }
        match self.expr(e)? {
            Expr::Read(place) => Ok(place),
            _ => Err(read_only()),
        }
    }

    /// `base` followed by one more step.
    fn part(&mut self, base: Expr, step: Step) -> Expr {
        match base {
            Expr::Read(mut place) => {
                place.steps.push(step);
                Expr::Read(place)
            }
            Expr::Part(inner, mut steps) => {
                steps.push(step);
                Expr::Part(inner, steps)
            }
            other => Expr::Part(Box::new(other), vec![step]),
        }
    }

    fn boxed(&mut self, e: &ast::Expr) -> Result<Box<Expr>, ShaderError> {
        self.expr(e).map(Box::new)
    }

    /// An expression, folded to its value when that is known at compile time (literals, constants and the
    /// operators and functions of them): each pixel then reads the value.
    fn expr(&mut self, e: &ast::Expr) -> Result<Expr, ShaderError> {
        if self.nesting >= MAX_NESTING {
            return Err(ShaderError::new(format!(
                "expressions nest deeper than {MAX_NESTING} levels"
            )));
        }
        self.nesting += 1;
        let compiled = self.unfolded(e);
        self.nesting -= 1;
        self.fold(compiled?)
    }

    fn fold(&self, e: Expr) -> Result<Expr, ShaderError> {
        let known = |args: &[Expr]| -> Option<Vec<Val>> {
            args.iter()
                .map(|a| match a {
                    Expr::Const(v) => Some(v.clone()),
                    _ => None,
                })
                .collect()
        };
        Ok(match &e {
            Expr::Read(_) => match self.constant(&e) {
                Some(v) => Expr::Const(v),
                None => e,
            },
            Expr::Unary(op, x) => match &**x {
                Expr::Const(v) => Expr::Const(super::ops::unary(*op, v)?),
                _ => e,
            },
            Expr::Binary(op, a, b) => match (&**a, &**b) {
                (Expr::Const(x), Expr::Const(y)) => Expr::Const(super::ops::binary(*op, x, y)?),
                _ => e,
            },
            Expr::Builtin(builtin, name, args) if !builtin.reads_textures() => match known(args) {
                Some(values) => Expr::Const(builtin.call(name, &values, &[])?),
                None => e,
            },
            Expr::Construct(ty, args) if !matches!(ty, Ty::Struct(_)) => match known(args) {
                Some(values) => Expr::Const(super::eval::construct(ty, values, &self.structs)?),
                None => e,
            },
            _ => e,
        })
    }

    fn unfolded(&mut self, e: &ast::Expr) -> Result<Expr, ShaderError> {
        use ast::Expr as E;
        Ok(match e {
            E::Variable(id) => {
                let (var, _) = self.variable(&id.0)?;
                Expr::Read(Place { var, steps: Vec::new() })
            }
            E::IntConst(i) => Expr::Const(Val::Num(Num::int(*i))),
            E::UIntConst(u) => {
                let mut n = Num::zero(Base::Uint, 1);
                n.bits[0] = *u;
                Expr::Const(Val::Num(n))
            }
            E::BoolConst(b) => Expr::Const(Val::Num(Num::boolean(*b))),
            E::FloatConst(f) => Expr::Const(Val::Num(Num::float(*f))),
            E::DoubleConst(d) => Expr::Const(Val::Num(Num::float(*d as f32))),
            E::Unary(op, inner) => match op {
                ast::UnaryOp::Inc | ast::UnaryOp::Dec => Expr::Step {
                    place: self.place(inner)?,
                    delta: if *op == ast::UnaryOp::Inc { 1 } else { -1 },
                    post: false,
                },
                ast::UnaryOp::Add => self.expr(inner)?,
                ast::UnaryOp::Minus => Expr::Unary(UnOp::Neg, self.boxed(inner)?),
                ast::UnaryOp::Not => Expr::Unary(UnOp::Not, self.boxed(inner)?),
                ast::UnaryOp::Complement => Expr::Unary(UnOp::Complement, self.boxed(inner)?),
            },
            E::Binary(op, a, b) => {
                let (a, b) = (self.boxed(a)?, self.boxed(b)?);
                match op {
                    ast::BinaryOp::Or => Expr::Or(a, b),
                    ast::BinaryOp::And => Expr::And(a, b),
                    other => Expr::Binary(binary_op(other), a, b),
                }
            }
            E::Ternary(c, a, b) => Expr::Ternary(self.boxed(c)?, self.boxed(a)?, self.boxed(b)?),
            E::Assignment(lhs, op, rhs) => {
                let place = self.place(lhs)?;
                let op = assignment_op(op);
                Expr::Assign(place, op, self.boxed(rhs)?)
            }
            E::Bracket(base, spec) => {
                let [ast::ArraySpecifierDimension::ExplicitlySized(index)] =
                    spec.dimensions.0.as_slice()
                else {
                    return Err(ShaderError::new("an index needs one expression"));
                };
                let base = self.expr(base)?;
                let index = self.expr(index)?;
                self.part(base, Step::Index(index))
            }
            E::Dot(base, field) => {
                let base = self.expr(base)?;
                let step = Step::Field(field.0.clone(), swizzle(&field.0));
                self.part(base, step)
            }
            E::PostInc(inner) => Expr::Step { place: self.place(inner)?, delta: 1, post: true },
            E::PostDec(inner) => Expr::Step { place: self.place(inner)?, delta: -1, post: true },
            E::Comma(a, b) => Expr::Comma(self.boxed(a)?, self.boxed(b)?),
            E::FunCall(callee, args) => self.call(callee, args)?,
        })
    }

    fn call(
        &mut self,
        callee: &ast::FunIdentifier,
        args: &[ast::Expr],
    ) -> Result<Expr, ShaderError> {
        let name = match callee {
            ast::FunIdentifier::Identifier(id) => id.0.as_str(),
            ast::FunIdentifier::Expr(e) => {
                return match &**e {
                    // `T[](...)` or `T[n](...)`: an array constructor.
                    ast::Expr::Bracket(ty, spec) => {
                        let ast::Expr::Variable(name) = &**ty else {
                            return Err(ShaderError::new("not a callable expression"));
                        };
                        let item = self.named_type(&name.0)?.ok_or_else(|| {
                            ShaderError::new(format!("unknown type `{}`", name.0))
                        })?;
                        let ty = self.arrayed(item, Some(spec), Some(args.len()))?;
                        Ok(Expr::Construct(ty, self.args(args)?))
                    }
                    // `a.length()`.
                    ast::Expr::Dot(base, field) if field.0 == "length" && args.is_empty() => {
                        Ok(Expr::Length(self.boxed(base)?))
                    }
                    _ => Err(ShaderError::new("not a callable expression")),
                };
            }
        };
        if let Some(ty) = self.named_type(name)? {
            return Ok(Expr::Construct(ty, self.args(args)?));
        }
        if let Some(ids) = self.function_names.get(name) {
            let ids: Vec<usize> = ids
                .iter()
                .copied()
                .filter(|&i| self.functions[i].params.len() == args.len())
                .collect();
            if let Some(&first) = ids.first() {
                let params = self.functions[first].params.clone();
                let mut compiled = Vec::new();
                for (k, (arg, param)) in args.iter().zip(&params).enumerate() {
                    let agree = ids.iter().all(|&i| {
                        let p = &self.functions[i].params[k];
                        p.writes == param.writes && p.reads == param.reads
                    });
                    if !agree {
                        return Err(ShaderError::new(format!(
                            "the overloads of `{name}` differ in which parameters are `out`"
                        )));
                    }
                    compiled.push(if param.writes {
                        Arg::Out(self.place(arg)?)
                    } else {
                        Arg::In(self.expr(arg)?)
                    });
                }
                return Ok(Expr::Call(ids, compiled));
            }
            return Err(ShaderError::new(format!(
                "no function `{name}` takes {} arguments",
                args.len()
            )));
        }
        if let Some(builtin) = Builtin::named(name) {
            return Ok(Expr::Builtin(builtin, name.to_owned(), self.args(args)?));
        }
        match name {
            "dFdx" | "dFdy" | "fwidth" => Err(ShaderError::new(format!(
                "`{name}` needs neighbouring pixels shaded together, which Kiln's shader interpreter \
                 does not do"
            ))),
            "modf" | "frexp" | "ldexp" | "textureProj" | "textureProjLod" | "textureProjOffset"
            | "packSnorm2x16" | "unpackSnorm2x16" | "packUnorm2x16" | "unpackUnorm2x16"
            | "packHalf2x16" | "unpackHalf2x16" => Err(ShaderError::new(format!(
                "the GLSL ES built-in `{name}` is not implemented by Kiln's shader interpreter"
            ))),
            _ => Err(ShaderError::new(format!("no function `{name}`"))),
        }
    }

    fn args(&mut self, args: &[ast::Expr]) -> Result<Vec<Expr>, ShaderError> {
        args.iter().map(|a| self.expr(a)).collect()
    }

    /// The type a constructor's name names (`vec3`, `mat2`, a struct), if it is one.
    fn named_type(&mut self, name: &str) -> Result<Option<Ty>, ShaderError> {
        use ast::TypeSpecifierNonArray as T;
        let spec = match name {
            "bool" => T::Bool,
            "int" => T::Int,
            "uint" => T::UInt,
            "float" => T::Float,
            "vec2" => T::Vec2,
            "vec3" => T::Vec3,
            "vec4" => T::Vec4,
            "bvec2" => T::BVec2,
            "bvec3" => T::BVec3,
            "bvec4" => T::BVec4,
            "ivec2" => T::IVec2,
            "ivec3" => T::IVec3,
            "ivec4" => T::IVec4,
            "uvec2" => T::UVec2,
            "uvec3" => T::UVec3,
            "uvec4" => T::UVec4,
            "mat2" | "mat2x2" => T::Mat2,
            "mat3" | "mat3x3" => T::Mat3,
            "mat4" | "mat4x4" => T::Mat4,
            "mat2x3" => T::Mat23,
            "mat2x4" => T::Mat24,
            "mat3x2" => T::Mat32,
            "mat3x4" => T::Mat34,
            "mat4x2" => T::Mat42,
            "mat4x3" => T::Mat43,
            _ => {
                return Ok(self.struct_names.get(name).map(|&id| Ty::Struct(id)));
            }
        };
        self.type_of(&spec).map(Some)
    }
}

/// The variable an lvalue expression starts from (`a` of `a.b[1].xy`).
fn root_name(e: &ast::Expr) -> Option<&str> {
    match e {
        ast::Expr::Variable(id) => Some(&id.0),
        ast::Expr::Bracket(base, _) | ast::Expr::Dot(base, _) => root_name(base),
        _ => None,
    }
}

/// How many items an array initialiser gives (to size `float a[] = float[](...)`).
fn array_len(e: &Expr) -> Option<usize> {
    match e {
        Expr::Construct(Ty::Array(_, n), _) => Some(*n),
        Expr::Const(Val::Array(items)) => Some(items.len()),
        _ => None,
    }
}

/// A declaration list's declarators: each name with its own array specifier and initialiser.
#[allow(clippy::type_complexity)]
fn declarators(
    list: &ast::InitDeclaratorList,
) -> Vec<(&ast::Identifier, Option<&ast::ArraySpecifier>, &Option<ast::Initializer>)> {
    let mut names = Vec::new();
    if let Some(name) = &list.head.name {
        names.push((name, list.head.array_specifier.as_ref(), &list.head.initializer));
    }
    for more in &list.tail {
        names.push((&more.ident.ident, more.ident.array_spec.as_ref(), &more.initializer));
    }
    names
}

fn binary_op(op: &ast::BinaryOp) -> BinOp {
    use ast::BinaryOp as B;
    match op {
        B::Xor => BinOp::Xor,
        B::BitOr => BinOp::BitOr,
        B::BitXor => BinOp::BitXor,
        B::BitAnd => BinOp::BitAnd,
        B::Equal => BinOp::Eq,
        B::NonEqual => BinOp::NotEq,
        B::LT => BinOp::Less,
        B::GT => BinOp::Greater,
        B::LTE => BinOp::LessEq,
        B::GTE => BinOp::GreaterEq,
        B::LShift => BinOp::Shl,
        B::RShift => BinOp::Shr,
        B::Add => BinOp::Add,
        B::Sub => BinOp::Sub,
        B::Mult => BinOp::Mul,
        B::Div => BinOp::Div,
        B::Mod => BinOp::Mod,
        // `&&` and `||` short-circuit and never reach here.
        B::Or | B::And => BinOp::BitOr,
    }
}

fn assignment_op(op: &ast::AssignmentOp) -> Option<BinOp> {
    use ast::AssignmentOp as A;
    match op {
        A::Equal => None,
        A::Mult => Some(BinOp::Mul),
        A::Div => Some(BinOp::Div),
        A::Mod => Some(BinOp::Mod),
        A::Add => Some(BinOp::Add),
        A::Sub => Some(BinOp::Sub),
        A::LShift => Some(BinOp::Shl),
        A::RShift => Some(BinOp::Shr),
        A::And => Some(BinOp::BitAnd),
        A::Xor => Some(BinOp::BitXor),
        A::Or => Some(BinOp::BitOr),
    }
}
