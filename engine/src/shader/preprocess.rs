//! The preprocessor: object-like `#define`s expanded, `#ifdef`/`#ifndef`/`#else`/`#endif` and `#undef`
//! applied, `#pragma passes N` read; every directive line left blank so the parser's line numbers stay the
//! source's.

use std::collections::HashMap;

use super::ShaderError;

/// The source ready to parse, and the render passes it asks for.
pub(super) struct Preprocessed {
    pub(super) source: String,
    pub(super) passes: usize,
}

/// How many expansions one identifier may go through (a macro defined in terms of itself stops here).
const MAX_EXPANSIONS: usize = 32;

/// The longest a line may grow by expanding macros.
const MAX_LINE: usize = 1 << 16;

/// The passes ComfyUI's `_detect_pass_count` reads: the first `#pragma\s+passes\s+(\d+)` anywhere in the
/// source (comments and inactive blocks too), at least 1.
fn pass_count(source: &str) -> usize {
    for (at, _) in source.match_indices("#pragma") {
        let rest = &source[at + "#pragma".len()..];
        let after_space = rest.trim_start();
        if after_space.len() == rest.len() {
            continue;
        }
        let Some(after) = after_space.strip_prefix("passes") else { continue };
        let digits_from = after.trim_start();
        if digits_from.len() == after.len() {
            continue;
        }
        let digits: String = digits_from.chars().take_while(char::is_ascii_digit).collect();
        if digits.is_empty() {
            continue;
        }
        // An absurd count is as many passes as fit; each pass is a full draw.
        return digits.parse::<usize>().unwrap_or(usize::MAX).max(1);
    }
    1
}

/// `line` without its comments (a `/* … */` may span lines: `in_comment` carries that state).
fn code_of(line: &str, in_comment: &mut bool) -> String {
    let mut code = String::with_capacity(line.len());
    let mut rest = line;
    loop {
        if *in_comment {
            match rest.find("*/") {
                Some(end) => {
                    rest = &rest[end + 2..];
                    *in_comment = false;
                }
                None => return code,
            }
        }
        let line_comment = rest.find("//");
        let block = rest.find("/*");
        match (line_comment, block) {
            (Some(l), Some(b)) if l < b => return code + &rest[..l],
            (Some(l), None) => return code + &rest[..l],
            (_, Some(b)) => {
                code.push_str(&rest[..b]);
                rest = &rest[b + 2..];
                *in_comment = true;
            }
            (None, None) => return code + rest,
        }
    }
}

pub(super) fn preprocess(source: &str) -> Result<Preprocessed, ShaderError> {
    let mut macros: HashMap<String, String> = HashMap::new();
    let passes = pass_count(source);
    let mut in_comment = false;
    // Whether each enclosing conditional block is active.
    let mut active: Vec<bool> = Vec::new();
    let mut out = String::with_capacity(source.len());
    for (number, line) in source.lines().enumerate() {
        let starts_in_comment = in_comment;
        let code = code_of(line, &mut in_comment);
        if code.trim_start().get(1..).is_some_and(|rest| rest.contains('#')) {
            return Err(ShaderError::new(format!(
                "line {}: `#` may only begin a line, as a directive",
                number + 1
            )));
        }
        let trimmed = if starts_in_comment { "" } else { line.trim_start() };
        let on = active.iter().all(|a| *a);
        if let Some(directive) = trimmed.strip_prefix('#') {
            let mut words = directive.split_whitespace();
            let keyword = words.next().unwrap_or("");
            match keyword {
                "ifdef" | "ifndef" => {
                    let name = words.next().unwrap_or("");
                    active.push(macros.contains_key(name) == (keyword == "ifdef"));
                }
                "else" => match active.last_mut() {
                    Some(a) => *a = !*a,
                    None => return Err(unbalanced(number, "#else")),
                },
                "endif" => {
                    active.pop().ok_or_else(|| unbalanced(number, "#endif"))?;
                }
                _ if !on => {}
                "define" => define(directive, &mut macros, number)?,
                "undef" => {
                    macros.remove(words.next().unwrap_or(""));
                }
                "pragma" | "version" | "extension" | "line" | "" => {}
                "if" | "elif" => {
                    return Err(ShaderError::new(format!(
                        "line {}: `#{keyword}` is not supported (use #ifdef/#ifndef)",
                        number + 1
                    )));
                }
                "error" => {
                    return Err(ShaderError::new(format!("line {}: {trimmed}", number + 1)));
                }
                other => {
                    return Err(ShaderError::new(format!(
                        "line {}: unknown directive `#{other}`",
                        number + 1
                    )));
                }
            }
            out.push('\n');
            continue;
        }
        if on {
            let expanded = expand(line, &macros, 0)?;
            if expanded.len() > MAX_LINE {
                return Err(ShaderError::new(format!(
                    "line {}: macros expand it past {MAX_LINE} characters",
                    number + 1
                )));
            }
            out.push_str(&expanded);
        }
        out.push('\n');
    }
    if !active.is_empty() {
        return Err(ShaderError::new("an #ifdef or #ifndef has no #endif"));
    }
    Ok(Preprocessed { source: out, passes })
}

fn unbalanced(number: usize, what: &str) -> ShaderError {
    ShaderError::new(format!("line {}: `{what}` without #ifdef or #ifndef", number + 1))
}

/// Records `#define NAME value`.
fn define(
    directive: &str,
    macros: &mut HashMap<String, String>,
    number: usize,
) -> Result<(), ShaderError> {
    let rest = directive.trim_start().strip_prefix("define").unwrap_or("").trim_start();
    let name_len =
        rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
    let (name, body) = rest.split_at(name_len);
    if name.is_empty() {
        return Err(ShaderError::new(format!("line {}: #define needs a name", number + 1)));
    }
    if body.starts_with('(') {
        return Err(ShaderError::new(format!(
            "line {}: function-like macro `{name}` is not supported",
            number + 1
        )));
    }
    let body = body.split("//").next().unwrap_or("").trim();
    macros.insert(name.to_owned(), body.to_owned());
    Ok(())
}

/// `line` with each identifier that names a macro replaced by its (expanded) value.
fn expand(
    line: &str,
    macros: &HashMap<String, String>,
    depth: usize,
) -> Result<String, ShaderError> {
    if macros.is_empty() {
        return Ok(line.to_owned());
    }
    if depth > MAX_EXPANSIONS {
        return Err(ShaderError::new("a #define expands into itself"));
    }
    let mut out = String::with_capacity(line.len());
    let mut chars = line.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if c.is_ascii_alphabetic() || c == '_' {
            let mut end = start + c.len_utf8();
            while let Some(&(i, next)) = chars.peek() {
                if next.is_ascii_alphanumeric() || next == '_' {
                    end = i + next.len_utf8();
                    chars.next();
                } else {
                    break;
                }
            }
            let word = &line[start..end];
            match macros.get(word) {
                Some(value) => out.push_str(&expand(value, macros, depth + 1)?),
                None => out.push_str(word),
            }
            if out.len() > MAX_LINE {
                return Err(ShaderError::new(format!("macros expand past {MAX_LINE} characters")));
            }
        } else if c.is_ascii_digit() {
            // A number (with its suffixes and exponent) is not an identifier.
            out.push(c);
            while let Some(&(_, next)) = chars.peek() {
                if next.is_ascii_alphanumeric() || next == '.' || next == '_' {
                    out.push(next);
                    chars.next();
                } else {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}
