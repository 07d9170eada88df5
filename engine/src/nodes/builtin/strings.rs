//! The rest of `comfy_extras.nodes_string`'s text nodes: `StringSubstring`, `StringLength`, `CaseConverter`,
//! `StringTrim`, `StringContains`, `StringCompare`, `RegexMatch` and `RegexReplace`, following Python's `str`
//! (code points, Unicode case mapping with title case and the final sigma) and `re` (its end anchors,
//! `re.sub`'s templates and scan) where the two differ from Rust's.
//!
//! Known difference: after an empty match, Python's scan retries the same place for a non-empty match
//! (`re.sub("a??", "-", "aa")` is `-----`); Kiln moves on one character (`-a-a-`). Patterns are compiled by
//! `fancy-regex`, whose syntax is Python's for everyday patterns.

use super::pure::Pure;
use super::text::{advanced_bool, multiline};
use crate::nodes::{ErrorKind, InputDef, Inputs, NodeError, NodeSpec, OutputDef};
use crate::value::Value;

/// The regular-expression flag inputs of `RegexMatch` and `RegexExtract`, in their order.
pub(super) fn regex_flags(spec: NodeSpec) -> NodeSpec {
    spec.input(advanced_bool("case_insensitive", true))
        .input(advanced_bool("multiline", false))
        .input(advanced_bool("dotall", false))
}

/// `pattern` as Python's `re` compiles it with the node's `case_insensitive`, `multiline` and `dotall` flags
/// (each read where given, else `defaults`); `None` where Python would raise `re.error` (or the engine cannot
/// run the pattern).
pub(super) fn python_regex(
    inputs: &Inputs,
    pattern: &str,
    defaults: [bool; 3],
) -> Result<Option<fancy_regex::Regex>, NodeError> {
    let mut flags = String::new();
    for ((input, flag), default) in
        [("case_insensitive", 'i'), ("multiline", 'm'), ("dotall", 's')].into_iter().zip(defaults)
    {
        let set = if inputs.has(input) { inputs.bool(input)? } else { default };
        if set {
            flags.push(flag);
        }
    }
    let pattern = python_anchors(pattern, flags.contains('m'));
    let pattern = if flags.is_empty() { pattern } else { format!("(?{flags}){pattern}") };
    Ok(fancy_regex::Regex::new(&pattern).ok())
}

/// `pattern` with Python's end anchors in the engine's terms: without MULTILINE Python's `$` also matches
/// before a final newline (`(?=\n?\z)`), and its `\Z` is the very end (`\z`). Escapes and character classes
/// are left alone.
fn python_anchors(pattern: &str, multiline: bool) -> String {
    let mut out = String::with_capacity(pattern.len());
    let (mut escaped, mut in_class) = (false, false);
    for c in pattern.chars() {
        match c {
            _ if escaped => {
                escaped = false;
                out.push(if c == 'Z' && !in_class { 'z' } else { c });
                continue;
            }
            '\\' => escaped = true,
            '[' => in_class = true,
            ']' => in_class = false,
            '$' if !in_class && !multiline => {
                out.push_str(r"(?=\n?\z)");
                continue;
            }
            _ => {}
        }
        out.push(c);
    }
    out
}

/// The nodes, in ComfyUI's registration order.
pub(super) fn nodes() -> Vec<Pure> {
    let text = |name: &str, display: &str| {
        NodeSpec::new(name, display, "text").python_module("comfy_extras.nodes_string").v3()
    };
    vec![
        Pure::new(
            text("StringSubstring", "Substring")
                .input(multiline("string"))
                .input(InputDef::bare("start", "INT").with_options())
                .input(InputDef::bare("end", "INT").with_options())
                .output(OutputDef::new("STRING"))
                .aliases(&["substring", "extract text", "text portion"]),
            |inputs| {
                let chars: Vec<char> = inputs.string("string")?.chars().collect();
                let (from, to) =
                    python_slice(chars.len(), inputs.int("start")?, inputs.int("end")?);
                Ok(vec![Value::String(chars[from..to.max(from)].iter().collect())])
            },
        ),
        Pure::new(
            text("StringLength", "Text Length")
                .input(multiline("string"))
                .output(OutputDef::new("INT").named("length"))
                .aliases(&["character count", "text size", "string length"]),
            |inputs| Ok(vec![Value::Int(inputs.string("string")?.chars().count() as i64)]),
        ),
        Pure::new(
            text("CaseConverter", "Convert Text Case")
                .input(multiline("string"))
                .input(InputDef::v3_combo(
                    "mode",
                    &["UPPERCASE", "lowercase", "Capitalize", "Title Case"],
                ))
                .output(OutputDef::new("STRING"))
                .aliases(&["case converter", "text case", "uppercase", "lowercase", "capitalize"]),
            |inputs| {
                let s = inputs.string("string")?;
                let out = match inputs.string("mode")? {
                    "UPPERCASE" => s.to_uppercase(),
                    "lowercase" => s.to_lowercase(),
                    "Capitalize" => capitalize(s),
                    "Title Case" => title(s),
                    _ => s.to_owned(),
                };
                Ok(vec![Value::String(out)])
            },
        ),
        Pure::new(
            text("StringTrim", "Trim Text")
                .input(multiline("string"))
                .input(InputDef::v3_combo("mode", &["Both", "Left", "Right"]))
                .output(OutputDef::new("STRING"))
                .aliases(&[
                    "trim",
                    "clean whitespace",
                    "remove whitespace",
                    "remove spaces",
                    "strip",
                ]),
            |inputs| {
                let s = inputs.string("string")?;
                let out = match inputs.string("mode")? {
                    "Both" => s.trim_matches(is_python_space),
                    "Left" => s.trim_start_matches(is_python_space),
                    "Right" => s.trim_end_matches(is_python_space),
                    _ => s,
                };
                Ok(vec![Value::String(out.to_owned())])
            },
        ),
        Pure::new(
            text("StringContains", "Contains Text")
                .input(multiline("string"))
                .input(multiline("substring"))
                .input(advanced_bool("case_sensitive", true))
                .output(OutputDef::new("BOOLEAN").named("contains"))
                .aliases(&["contains", "text includes", "string includes"]),
            |inputs| {
                let [s, sub] = cased(inputs, ["string", "substring"])?;
                Ok(vec![Value::Bool(s.contains(sub.as_str()))])
            },
        ),
        Pure::new(
            text("StringCompare", "Compare Text")
                .input(multiline("string_a"))
                .input(multiline("string_b"))
                .input(InputDef::v3_combo("mode", &["Starts With", "Ends With", "Equal"]))
                .input(advanced_bool("case_sensitive", true))
                .output(OutputDef::new("BOOLEAN"))
                .aliases(&["compare", "text match", "string equals", "starts with", "ends with"]),
            |inputs| {
                let [a, b] = cased(inputs, ["string_a", "string_b"])?;
                let result = match inputs.string("mode")? {
                    "Starts With" => a.starts_with(b.as_str()),
                    "Ends With" => a.ends_with(b.as_str()),
                    _ => a == b,
                };
                Ok(vec![Value::Bool(result)])
            },
        ),
        Pure::new(
            regex_flags(
                text("RegexMatch", "Match Text")
                    .input(multiline("string"))
                    .input(multiline("regex_pattern")),
            )
            .output(OutputDef::new("BOOLEAN").named("matches"))
            .aliases(&["regex match", "regex", "pattern match", "text contains", "string match"]),
            |inputs| {
                let regex =
                    python_regex(inputs, inputs.string("regex_pattern")?, [true, false, false])?;
                let text = inputs.string("string")?;
                // A pattern Python rejects matches nothing, as ComfyUI catches `re.error`.
                let found = regex.is_some_and(|r| r.is_match(text).unwrap_or(false));
                Ok(vec![Value::Bool(found)])
            },
        ),
        Pure::new(
            text("RegexReplace", "Replace Text (Regex)")
                .description("Find and replace text using regex patterns.")
                .input(multiline("string"))
                .input(multiline("regex_pattern"))
                .input(multiline("replace"))
                .optional(advanced_bool("case_insensitive", true))
                .optional(advanced_bool("multiline", false))
                .optional(
                    InputDef::bare("dotall", "BOOLEAN")
                        .tooltip(
                            "When enabled, the dot (.) character will match any character including \
                             newline characters. When disabled, dots won't match newlines.",
                        )
                        .option("advanced", true)
                        .option("default", false),
                )
                .optional(
                    InputDef::bare("count", "INT")
                        .tooltip(
                            "Maximum number of replacements to make. Set to 0 to replace all occurrences \
                             (default). Set to 1 to replace only the first match, 2 for the first two \
                             matches, etc.",
                        )
                        .option("advanced", true)
                        .option("default", 0)
                        .option("min", 0)
                        .option("max", 100),
                )
                .output(OutputDef::new("STRING"))
                .aliases(&["regex replace", "regex", "pattern replace", "substitution"]),
            regex_replace,
        ),
    ]
}

/// Python's whitespace for `str.strip` (`str.isspace`): Unicode White_Space and the four ASCII separators
/// U+001C…U+001F.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The two inputs, lowercased as Python's `lower()` unless `case_sensitive`.
fn cased(inputs: &Inputs, names: [&str; 2]) -> Result<[String; 2], NodeError> {
    let sensitive = inputs.bool("case_sensitive")?;
    let read = |name: &str| -> Result<String, NodeError> {
        let s = inputs.string(name)?;
        Ok(if sensitive { s.to_owned() } else { s.to_lowercase() })
    };
    Ok([read(names[0])?, read(names[1])?])
}

/// Python's `s[start:end]` bounds over `len` code points: negative indices count from the end, both clamped.
fn python_slice(len: usize, start: i64, end: i64) -> (usize, usize) {
    let len = len as i64;
    let at = |i: i64| if i < 0 { (len + i).max(0) } else { i.min(len) } as usize;
    (at(start), at(end))
}

/// The titlecase letters (Unicode Lt), cased but neither upper nor lower.
const TITLECASE: [char; 4] = ['ǅ', 'ǈ', 'ǋ', 'ǲ'];

/// Whether `c` is cased as Python counts it (a lowercase, uppercase or titlecase letter).
fn is_cased(c: char) -> bool {
    c.is_lowercase() || c.is_uppercase() || TITLECASE.contains(&c)
}

/// `c` in title case (Python's `title()` of one character): its uppercase, but for the characters whose title
/// case differs (ß, the Latin digraphs and ligatures, Armenian և).
fn to_titlecase(c: char, out: &mut String) {
    let special = match c {
        'ß' => "Ss",
        'Ǆ' | 'ǅ' | 'ǆ' => "ǅ",
        'Ǉ' | 'ǈ' | 'ǉ' => "ǈ",
        'Ǌ' | 'ǋ' | 'ǌ' => "ǋ",
        'Ǳ' | 'ǲ' | 'ǳ' => "ǲ",
        'ﬀ' => "Ff",
        'ﬁ' => "Fi",
        'ﬂ' => "Fl",
        'ﬃ' => "Ffi",
        'ﬄ' => "Ffl",
        'ﬅ' | 'ﬆ' => "St",
        'և' => "Եւ",
        // Georgian Mkhedruli letters have no title case (their uppercase is Mtavruli).
        '\u{10d0}'..='\u{10fa}' | '\u{10fd}'..='\u{10ff}' => {
            out.push(c);
            return;
        }
        _ => {
            out.extend(c.to_uppercase());
            return;
        }
    };
    out.push_str(special);
}

/// Character `i` of `chars` lowercased as Python lowercases it in context: a capital sigma after a cased
/// letter and not before one is final (ς).
fn lower_at(chars: &[char], i: usize, out: &mut String) {
    if chars[i] == 'Σ' {
        let before =
            chars[..i].iter().rev().find(|c| !is_case_ignorable(**c)).is_some_and(|c| is_cased(*c));
        let after =
            chars[i + 1..].iter().find(|c| !is_case_ignorable(**c)).is_some_and(|c| is_cased(*c));
        if before && !after {
            out.push('ς');
            return;
        }
    }
    out.extend(chars[i].to_lowercase());
}

/// Characters Unicode's casing skips when it looks for the letters around a sigma (apostrophes, periods,
/// colons, combining marks and the like).
fn is_case_ignorable(c: char) -> bool {
    matches!(c, '\'' | '.' | ':' | '^' | '`' | '\u{ad}' | '\u{b7}' | '\u{2019}')
        || ('\u{300}'..='\u{36f}').contains(&c)
}

/// Python's `str.capitalize()`: the first character in title case, the rest lowercase.
fn capitalize(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    for i in 0..chars.len() {
        if i == 0 {
            to_titlecase(chars[0], &mut out);
        } else {
            lower_at(&chars, i, &mut out);
        }
    }
    out
}

/// Python's `str.title()`: a cased character after an uncased one in title case, after a cased one lowercase
/// ("they're" → "They'Re").
fn title(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut previous_cased = false;
    for (i, &c) in chars.iter().enumerate() {
        if previous_cased {
            lower_at(&chars, i, &mut out);
        } else {
            to_titlecase(c, &mut out);
        }
        previous_cased = is_cased(c);
    }
    out
}

/// `RegexReplace`: Python's `re.sub(regex_pattern, replace, string, count, flags)`; a pattern or template
/// Python rejects (a bad escape, a group the pattern lacks, whether or not anything matches) is the node's
/// error, as ComfyUI does not catch it.
fn regex_replace(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let pattern = inputs.string("regex_pattern")?;
    let regex = python_regex(inputs, pattern, [true, false, false])?.ok_or_else(|| {
        NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("RegexReplace: bad pattern {pattern:?}"),
        )
    })?;
    let template = Template::parse(inputs.string("replace")?)?;
    // Python checks the template's groups when it compiles it, before any search.
    template.check_groups(&regex)?;
    let count = if inputs.has("count") { inputs.int("count")?.max(0) as usize } else { 0 };
    let text = inputs.string("string")?;
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    // Python's scan (3.7 on): each search starts where the last match ended; after an empty match the next
    // may not be empty at that same place, but after a non-empty one it may ("x*" on "abxd": -a-b--d-). Where
    // Python would then retry the place for a non-empty match, this moves on a character (module docs).
    let (mut pos, mut must_advance, mut replaced) = (0, false, 0);
    while pos <= text.len() && (count == 0 || replaced < count) {
        let found = regex.captures_from_pos(text, pos).map_err(|e| {
            NodeError::of_kind(ErrorKind::InvalidValue, format!("RegexReplace: {e}"))
        })?;
        let Some(captures) = found else { break };
        let whole = captures.get(0).expect("group 0 is the match");
        if must_advance && whole.start() == pos && whole.end() == pos {
            match text[pos..].chars().next() {
                Some(c) => {
                    pos += c.len_utf8();
                    must_advance = false;
                    continue;
                }
                None => break,
            }
        }
        out.push_str(&text[last..whole.start()]);
        template.expand(&captures, &mut out);
        last = whole.end();
        replaced += 1;
        must_advance = whole.start() == whole.end();
        pos = whole.end();
    }
    out.push_str(&text[last..]);
    Ok(vec![Value::String(out)])
}

/// A piece of a parsed `re.sub` replacement template.
enum Piece {
    /// Text as it is.
    Literal(String),
    /// A group by number (`\1`, `\g<1>`).
    Group(usize),
    /// A group by name (`\g<name>`).
    Named(String),
}

/// Python's replacement template (`re._parser.parse_template`): `\g<name>`, `\g<n>`, `\n` for groups 1–99,
/// the escapes `\a \b \f \n \r \t \v \\`, `\0` and three-digit octal escapes; an ASCII letter after `\` is an
/// error; any other character keeps its backslash.
struct Template(Vec<Piece>);

impl Template {
    fn parse(template: &str) -> Result<Template, NodeError> {
        let bad = |what: String| {
            NodeError::of_kind(ErrorKind::InvalidValue, format!("RegexReplace: {what}"))
        };
        let chars: Vec<char> = template.chars().collect();
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            i += 1;
            if c != '\\' {
                literal.push(c);
                continue;
            }
            let Some(&next) = chars.get(i) else {
                return Err(bad("bad escape (end of pattern)".to_owned()));
            };
            i += 1;
            let mut group = |piece: Piece, literal: &mut String| {
                pieces.push(Piece::Literal(std::mem::take(literal)));
                pieces.push(piece);
            };
            match next {
                'g' => {
                    let close = chars[i..].iter().position(|&c| c == '>');
                    let (Some('<'), Some(close)) = (chars.get(i), close) else {
                        return Err(bad("missing <, or > in \\g<...>".to_owned()));
                    };
                    let name: String = chars[i + 1..i + close].iter().collect();
                    i += close + 1;
                    match name.parse::<usize>() {
                        Ok(n) => group(Piece::Group(n), &mut literal),
                        Err(_) if !name.is_empty() => group(Piece::Named(name), &mut literal),
                        Err(_) => return Err(bad("missing group name".to_owned())),
                    }
                }
                '0' => {
                    // \0 and up to two more octal digits.
                    let mut value = 0u32;
                    let mut taken = 0;
                    while taken < 2 && chars.get(i).is_some_and(|c| ('0'..='7').contains(c)) {
                        value = value * 8 + chars[i].to_digit(8).unwrap_or(0);
                        i += 1;
                        taken += 1;
                    }
                    literal.extend(char::from_u32(value));
                }
                '1'..='9' => {
                    let mut digits = next.to_string();
                    if chars.get(i).is_some_and(char::is_ascii_digit) {
                        digits.push(chars[i]);
                        i += 1;
                        // Three octal digits are a character, not a group.
                        let octal = |d: &str| d.chars().all(|c| ('0'..='7').contains(&c));
                        if chars.get(i).is_some_and(|c| ('0'..='7').contains(c)) && octal(&digits) {
                            digits.push(chars[i]);
                            i += 1;
                            let value = u32::from_str_radix(&digits, 8).unwrap_or(0);
                            if value > 0o377 {
                                return Err(bad(format!(
                                    "octal escape value \\{digits} outside of range 0-0o377"
                                )));
                            }
                            literal.extend(char::from_u32(value));
                            continue;
                        }
                    }
                    group(Piece::Group(digits.parse().unwrap_or(0)), &mut literal);
                }
                'a' => literal.push('\u{7}'),
                'b' => literal.push('\u{8}'),
                'f' => literal.push('\u{c}'),
                'n' => literal.push('\n'),
                'r' => literal.push('\r'),
                't' => literal.push('\t'),
                'v' => literal.push('\u{b}'),
                '\\' => literal.push('\\'),
                c if c.is_ascii_alphabetic() => return Err(bad(format!("bad escape \\{c}"))),
                c => {
                    literal.push('\\');
                    literal.push(c);
                }
            }
        }
        pieces.push(Piece::Literal(literal));
        Ok(Template(pieces))
    }

    /// An error for a group the pattern does not have (`invalid group reference`).
    fn check_groups(&self, regex: &fancy_regex::Regex) -> Result<(), NodeError> {
        let invalid = |what: String| {
            NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("RegexReplace: invalid group reference {what}"),
            )
        };
        for piece in &self.0 {
            match piece {
                Piece::Group(n) if *n >= regex.captures_len() => {
                    return Err(invalid(n.to_string()));
                }
                Piece::Named(name) if !regex.capture_names().flatten().any(|n| n == name) => {
                    return Err(invalid(format!("'{name}'")));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The template for one match ([`Template::check_groups`] first): groups that did not take part give ""
    /// (Python 3.5 on).
    fn expand(&self, captures: &fancy_regex::Captures<'_>, out: &mut String) {
        for piece in &self.0 {
            match piece {
                Piece::Literal(s) => out.push_str(s),
                Piece::Group(n) => out.push_str(captures.get(*n).map_or("", |m| m.as_str())),
                Piece::Named(name) => out.push_str(captures.name(name).map_or("", |m| m.as_str())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::Node;

    /// `scripts/reference/strings.py`'s record of ComfyUI's text nodes: each case's output, or an error where
    /// ComfyUI raises.
    #[test]
    fn text_nodes_follow_pythons_str_and_re() {
        let cases: serde_json::Value =
            serde_json::from_str(&crate::fixtures::text("strings/cases.json")).expect("JSON");
        let mut all = nodes();
        all.extend(super::super::text::nodes());
        for case in cases.as_array().expect("cases") {
            let name = case["node"].as_str().expect("node");
            let node = all.iter().find(|n| n.spec().name == name).expect("the node");
            let inputs = (case["inputs"].as_object().expect("inputs").iter())
                .map(|(k, v)| {
                    let value = match v {
                        serde_json::Value::String(s) => Value::String(s.clone()),
                        serde_json::Value::Bool(b) => Value::Bool(*b),
                        other => Value::Int(other.as_i64().expect("an int")),
                    };
                    (k.as_str(), value)
                })
                .collect();
            let got = crate::fixtures::node_outputs(node, inputs);
            match (&case["output"], got) {
                (serde_json::Value::Null, Err(_)) => {}
                (serde_json::Value::Null, Ok(v)) => {
                    panic!("{case}: ComfyUI raises, Kiln gave {v:?}")
                }
                (want, Ok(v)) => {
                    let got = match &v[0] {
                        Value::String(s) => serde_json::json!(s),
                        Value::Bool(b) => serde_json::json!(b),
                        Value::Int(i) => serde_json::json!(i),
                        other => panic!("{case}: {other:?}"),
                    };
                    assert_eq!(&got, want, "{case}");
                }
                (_, Err(e)) => panic!("{case}: {}", e.message),
            }
        }
    }
}
