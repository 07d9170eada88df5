//! GLSL ES 3.00 fragment shaders run on the CPU, for `GLSLShader`.
//!
//! ComfyUI draws one full-screen triangle with OpenGL ES (ANGLE) into RGBA32F textures: every pixel runs the
//! fragment shader once, with `v_texCoord` at the pixel's centre and `gl_FragCoord` in OpenGL's bottom-up
//! pixel coordinates; images are uploaded flipped to OpenGL's row order and sampled linearly, clamped to the
//! edge; outputs are read back and flipped again. Kiln does the same, interpreting the shader: the source is
//! parsed by the `glsl` crate, resolved by `compile.rs` and run per pixel by `eval.rs`, in f32 (`highp`;
//! `mediump` too, as ANGLE on a desktop GPU computes it).
//!
//! Not supported, each refused by name: derivatives (`dFdx`, `dFdy`, `fwidth`), function-like macros and
//! conditional compilation other than `#ifdef`/`#ifndef`, uniform blocks, and samplers other than
//! `sampler2D`. Desktop GLSL's implicit conversions (an int where a float is expected) are accepted where
//! GLSL ES would refuse them.

mod builtins;
mod compile;
mod eval;
mod ir;
mod ops;
mod preprocess;
mod texture;
mod value;

use glsl::parser::Parse;

pub use texture::Texture;

use compile::{GlobalKind, Program};
use eval::{Halt, Machine};
use value::{Base, Num, Ty, Val};

/// How many fragment outputs (`fragColor0` … `fragColor3`) GLSLShader reads back.
pub const MAX_OUTPUTS: usize = 4;

/// Why a shader did not compile or stopped while running, in words for the user.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ShaderError {
    message: String,
}

impl ShaderError {
    pub(crate) fn new(message: impl Into<String>) -> ShaderError {
        ShaderError { message: message.into() }
    }
}

/// A uniform value the node sets by name, as `glUniform*` would.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Uniform {
    /// `glUniform1f`: sets a `float` uniform.
    Float(f32),
    /// `glUniform1i`: sets an `int` or `bool` uniform.
    Int(i32),
    /// `glUniform2f`: sets a `vec2` uniform.
    Vec2(f32, f32),
}

/// What a draw reads: textures by sampler name, uniforms by name, and the texture of unit 0 (which every
/// sampler left unset reads, as a sampler uniform defaults to unit 0).
pub struct Bindings<'a> {
    /// Sampler uniforms and their textures.
    pub textures: Vec<(String, &'a Texture)>,
    /// Other uniforms.
    pub uniforms: Vec<(String, Uniform)>,
    /// The texture bound to unit 0.
    pub unit0: &'a Texture,
}

/// A compiled fragment shader.
pub struct Shader {
    program: Program,
    passes: usize,
    outputs: usize,
}

/// One rendered output: RGBA pixels in image order (top row first).
pub type Rgba = Vec<[f32; 4]>;

impl Shader {
    /// Parses and compiles `source`.
    pub fn compile(source: &str) -> Result<Shader, ShaderError> {
        if source.len() > MAX_SOURCE {
            return Err(ShaderError::new(format!(
                "the shader is {} bytes; at most {MAX_SOURCE} are taken",
                source.len()
            )));
        }
        let depth = nesting(source);
        if depth > MAX_BRACKETS {
            return Err(ShaderError::new(format!(
                "brackets nest {depth} deep; at most {MAX_BRACKETS} are taken"
            )));
        }
        // The parser and the syntax tree's drop recurse once per level of a long chain of operators: on a
        // thread of its own with room for the longest source taken.
        on_big_stack(|| {
            let pre = preprocess::preprocess(source)?;
            let unit = glsl::syntax::TranslationUnit::parse(&pre.source)
                .map_err(|e| ShaderError::new(format!("the shader does not parse: {e}")))?;
            let program = compile::compile(&unit)?;
            Ok(Shader { program, passes: pre.passes, outputs: output_count(source) })
        })
    }

    /// Draws the shader over `width` × `height` pixels on up to `threads` threads and returns
    /// as many images as ComfyUI reads back (one more than the highest `fragColorN` in the source, at most
    /// [`MAX_OUTPUTS`]; one without), or `None` once `stop` says to stop (checked between rows). With several
    /// passes each pass before the last draws its first output into the texture unit 0 holds for the next,
    /// and `u_pass` is the pass's number.
    pub fn render(
        &self,
        width: usize,
        height: usize,
        bindings: &Bindings,
        threads: usize,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<Option<Vec<Rgba>>, ShaderError> {
        if width == 0 || height == 0 {
            return Err(ShaderError::new(format!("cannot draw {width} × {height} pixels")));
        }
        let mut previous: Option<Texture> = None;
        for pass in 0..self.passes {
            let last = pass + 1 == self.passes;
            let unit0 = previous.as_ref().unwrap_or(bindings.unit0);
            let outputs = if last { self.outputs } else { 1 };
            let Some(rendered) =
                self.draw(width, height, bindings, unit0, pass, outputs, threads, stop)?
            else {
                return Ok(None);
            };
            if last {
                let flipped = rendered
                    .into_iter()
                    .map(|texels| {
                        texels.chunks_exact(width).rev().flatten().copied().collect::<Rgba>()
                    })
                    .collect();
                return Ok(Some(flipped));
            }
            let texels = rendered.into_iter().next().unwrap_or_default();
            previous = Some(Texture::from_texels(width, height, texels));
        }
        Ok(Some(Vec::new()))
    }

    /// The globals' values before `main` runs: uniforms bound, initialisers run.
    fn globals(
        &self,
        bindings: &Bindings,
        pass: usize,
        width: usize,
        height: usize,
    ) -> Result<Vec<Val>, ShaderError> {
        let program = &self.program;
        let mut globals: Vec<Val> =
            program.globals.iter().map(|g| g.ty.zero(&program.structs)).collect();
        let mut uniforms = bindings.uniforms.clone();
        uniforms.push(("u_resolution".to_owned(), Uniform::Vec2(width as f32, height as f32)));
        uniforms.push(("u_pass".to_owned(), Uniform::Int(pass as i32)));
        for (slot, global) in program.globals.iter().enumerate() {
            if global.kind != GlobalKind::Uniform {
                continue;
            }
            if global.ty == Ty::Sampler {
                let index = program.samplers.iter().position(|s| *s == global.name).unwrap_or(0);
                globals[slot] = Val::Sampler(index);
                continue;
            }
            let Some((_, value)) = uniforms.iter().find(|(name, _)| *name == global.name) else {
                continue;
            };
            // A value of another type is refused by OpenGL and leaves the uniform 0; so here.
            let set = match (value, &global.ty) {
                (Uniform::Float(x), Ty::Num { base: Base::Float, cols: 1, rows: 1 }) => {
                    Some(Num::float(*x))
                }
                (Uniform::Int(i), Ty::Num { base: Base::Int, cols: 1, rows: 1 }) => {
                    Some(Num::int(*i))
                }
                (Uniform::Int(i), Ty::Num { base: Base::Bool, cols: 1, rows: 1 }) => {
                    Some(Num::boolean(*i != 0))
                }
                (Uniform::Vec2(x, y), Ty::Num { base: Base::Float, cols: 1, rows: 2 }) => {
                    Some(Num::floats(&[*x, *y]))
                }
                _ => None,
            };
            if let Some(n) = set {
                globals[slot] = Val::Num(n);
            }
        }
        Ok(globals)
    }

    /// One pass: each pixel's outputs, bottom row first.
    #[allow(clippy::too_many_arguments)]
    fn draw(
        &self,
        width: usize,
        height: usize,
        bindings: &Bindings,
        unit0: &Texture,
        pass: usize,
        outputs: usize,
        threads: usize,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<Option<Vec<Rgba>>, ShaderError> {
        let program = &self.program;
        let textures: Vec<&Texture> = program
            .samplers
            .iter()
            .map(|name| {
                let bound = bindings.textures.iter().find(|(n, _)| n == name);
                match bound {
                    Some((n, t)) if !(n == "u_image0" && pass > 0) => *t,
                    _ => unit0,
                }
            })
            .collect();
        let mut initial = self.globals(bindings, pass, width, height)?;
        let mut machine = Machine::new(program, &textures, initial.clone(), stop);
        match machine.initialise() {
            Ok(()) => initial = machine.globals,
            Err(Halt::Error(e)) => return Err(*e),
            Err(Halt::Stopped) => return Ok(None),
            Err(Halt::Discard) => return Err(ShaderError::new("`discard` outside main")),
        }
        let frag_coord = self.slot_of(&GlobalKind::FragCoord);
        let tex_coord = self.slot_of(&GlobalKind::TexCoord);
        let output_slots: Vec<Option<usize>> =
            (0..outputs).map(|location| self.slot_of(&GlobalKind::Output(location))).collect();

        let mut images: Vec<Rgba> = vec![vec![[0.0; 4]; width * height]; outputs];
        let threads = threads.clamp(1, height.max(1));
        let rows_per_task = height.div_ceil(threads).max(1);
        let textures = &textures;
        let initial = &initial;
        let results: Vec<Result<Option<Vec<Rgba>>, ShaderError>> = std::thread::scope(|scope| {
            let tasks: Vec<_> = (0..height)
                .step_by(rows_per_task)
                .map(|first| {
                    let rows = first..(first + rows_per_task).min(height);
                    let output_slots = &output_slots;
                    std::thread::Builder::new().stack_size(STACK).spawn_scoped(scope, move || {
                        let mut machine = Machine::new(program, textures, initial.clone(), stop);
                        let mut out: Vec<Rgba> =
                            vec![Vec::with_capacity(rows.len() * width); outputs];
                        for y in rows {
                            if stop() {
                                return Ok(None);
                            }
                            for x in 0..width {
                                machine.globals.clone_from(initial);
                                if let Some(slot) = frag_coord {
                                    let at = [x as f32 + 0.5, y as f32 + 0.5, 0.5, 1.0];
                                    machine.globals[slot] = Val::Num(Num::floats(&at));
                                }
                                if let Some(slot) = tex_coord {
                                    let uv = [
                                        (x as f32 + 0.5) / width as f32,
                                        (y as f32 + 0.5) / height as f32,
                                    ];
                                    machine.globals[slot] = Val::Num(Num::floats(&uv));
                                }
                                let discarded = match machine.run_main() {
                                    Ok(()) => false,
                                    Err(Halt::Discard) => true,
                                    Err(Halt::Error(e)) => return Err(*e),
                                    Err(Halt::Stopped) => return Ok(None),
                                };
                                for (image, slot) in out.iter_mut().zip(output_slots) {
                                    let pixel = match (discarded, slot) {
                                        (false, Some(slot)) => rgba(&machine.globals[*slot]),
                                        _ => [0.0; 4],
                                    };
                                    image.push(pixel);
                                }
                            }
                        }
                        Ok(Some(out))
                    })
                })
                .collect();
            tasks
                .into_iter()
                .map(|t| match t {
                    Ok(t) => t
                        .join()
                        .unwrap_or_else(|_| Err(ShaderError::new("the shader's thread panicked"))),
                    Err(e) => Err(ShaderError::new(format!("cannot start a thread: {e}"))),
                })
                .collect()
        });
        let mut offset = 0;
        for result in results {
            let Some(parts) = result? else { return Ok(None) };
            let len = parts.first().map_or(0, Vec::len);
            for (image, part) in images.iter_mut().zip(parts) {
                image[offset..offset + part.len()].copy_from_slice(&part);
            }
            offset += len;
        }
        Ok(Some(images))
    }

    fn slot_of(&self, kind: &GlobalKind) -> Option<usize> {
        self.program.globals.iter().position(|g| g.kind == *kind)
    }
}

/// The longest shader source taken (the template's longest is 9 KB).
const MAX_SOURCE: usize = 1 << 18;

/// How deeply brackets may nest in a source.
const MAX_BRACKETS: usize = 200;

/// The stack of the threads that parse, compile and draw: the interpreter recurses per level of an expression
/// and per call (both bounded), the parser per operator of a chain.
const STACK: usize = 64 << 20;

/// The deepest nesting of `(`, `[` and `{` in a source.
fn nesting(source: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    for c in source.chars() {
        match c {
            '(' | '[' | '{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// `work` on a thread with a [`STACK`]-sized stack.
fn on_big_stack<T: Send>(
    work: impl FnOnce() -> Result<T, ShaderError> + Send,
) -> Result<T, ShaderError> {
    std::thread::scope(|scope| {
        match std::thread::Builder::new().stack_size(STACK).spawn_scoped(scope, work) {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|_| Err(ShaderError::new("the shader's thread panicked"))),
            Err(e) => Err(ShaderError::new(format!("cannot start a thread: {e}"))),
        }
    })
}

/// An output variable's value as RGBA.
fn rgba(value: &Val) -> [f32; 4] {
    match value {
        Val::Num(n) if n.len() == 4 => [n.f(0), n.f(1), n.f(2), n.f(3)],
        _ => [0.0; 4],
    }
}

/// ComfyUI's `_detect_output_count`: one more than the highest `fragColorN` in the source, capped at
/// [`MAX_OUTPUTS`]; one when there is none.
fn output_count(source: &str) -> usize {
    let mut highest = None;
    for (at, _) in source.match_indices("fragColor") {
        let digits: String =
            source[at + "fragColor".len()..].chars().take_while(char::is_ascii_digit).collect();
        if !digits.is_empty() {
            // A number too long to parse is above every location.
            let n = digits.parse::<usize>().unwrap_or(usize::MAX);
            highest = highest.max(Some(n));
        }
    }
    highest.map_or(1, |n| n.saturating_add(1).min(MAX_OUTPUTS))
}

#[cfg(test)]
mod tests;
