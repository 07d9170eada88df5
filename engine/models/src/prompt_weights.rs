//! ComfyUI's prompt weighting and token layout for its CLIP-style encoders (CLIP-L, T5-XXL; `sd1_clip.py`'s
//! `SDTokenizer.tokenize_with_weights` and `ClipTokenWeightEncoder.encode_token_weights`):
//!
//! - `(text:1.2)` gives its tokens weight 1.2, `(text)` multiplies by 1.1 (nesting multiplies), `\(` and `\)`
//!   are literal parentheses;
//! - the weighted segments' words are tokenised and laid out in sections of the encoder's length (CLIP: 77 with
//!   start, end and padding; T5: one section, padded to a minimum), a word of fewer than 8 tokens never split
//!   across sections;
//! - a weighted token's embedding becomes `(z − z_empty)·w + z_empty`, `z_empty` being the encoding of an empty
//!   prompt laid out to the same length ([`empty_tokens`]).
//!
//! `embedding:name` (textual inversion) is read as ComfyUI reads a name whose file is not in its `embeddings`
//! folder: the name is dropped, the rest of the word kept. Kiln loads no textual-inversion embeddings.

/// A token id and its weight.
pub type Weighted = (u32, f32);

/// How an encoder's tokenizer lays out a prompt (the `SDTokenizer` arguments that matter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The token opening every section (CLIP's BOS), if any.
    pub start: Option<u32>,
    /// The token closing every section (EOS), if any.
    pub end: Option<u32>,
    /// The padding token.
    pub pad: u32,
    /// A section's length, end token included (CLIP: 77; T5: unbounded).
    pub max_length: usize,
    /// Whether every section is padded to `max_length` (CLIP) or only the last to `min_length` (T5).
    pub pad_to_max_length: bool,
    /// The last section's minimum length after padding (T5 for Flux: 256).
    pub min_length: Option<usize>,
    /// Pads added to the last section after its end token, before any other padding (`T5TokenizerOptions`'
    /// `min_padding`).
    pub min_padding: Option<usize>,
}

/// The word prefix of a textual-inversion embedding.
const EMBEDDING: &str = "embedding:";
/// Words of at least this many tokens may be split across sections; shorter ones move whole.
const MAX_WORD_LENGTH: usize = 8;

/// The prompt's weighted segments, as ComfyUI's `token_weights` parses them after escaping `\(` and `\)`,
/// with the escapes turned back into parentheses.
pub fn segments(prompt: &str) -> Vec<(String, f32)> {
    let escaped = prompt.replace("\\)", "\0\u{1}").replace("\\(", "\0\u{2}");
    // Python's floats are doubles: the weights nest in f64 and are rounded once.
    token_weights(&escaped, 1.0)
        .into_iter()
        .map(|(text, w)| (text.replace("\0\u{1}", ")").replace("\0\u{2}", "("), w as f32))
        .collect()
}

/// ComfyUI's `parse_parentheses`: top-level parenthesised groups (an unclosed one runs to the end) and the
/// text between them.
fn parse_parentheses(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut depth = 0i32;
    for c in text.chars() {
        match c {
            '(' => {
                if depth == 0 && !current.is_empty() {
                    out.push(std::mem::take(&mut current));
                }
                current.push('(');
                depth += 1;
            }
            ')' => {
                depth -= 1;
                current.push(')');
                if depth == 0 {
                    out.push(std::mem::take(&mut current));
                }
            }
            _ => current.push(c),
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// ComfyUI's `token_weights`: a group `(x)` weighs 1.1 × the enclosing weight, `(x:w)` weighs w when w
/// parses as a Python float (after the last colon).
fn token_weights(text: &str, weight: f64) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for part in parse_parentheses(text) {
        let Some(inner) =
            part.strip_prefix('(').and_then(|p| p.strip_suffix(')')).filter(|_| part.len() >= 2)
        else {
            out.push((part, weight));
            continue;
        };
        let mut inner = inner;
        let mut w = weight * 1.1;
        if let Some(colon) = inner.rfind(':').filter(|&c| c > 0)
            && let Some(value) = python_float(&inner[colon + 1..])
        {
            w = value;
            inner = &inner[..colon];
        }
        out.extend(token_weights(inner, w));
    }
    out
}

/// Python's `float(s)`: surrounding whitespace allowed, `inf`/`nan` too, `_` only between two digits, and any
/// Unicode decimal digit (full-width `１.５`, Arabic-Indic, Devanagari) read as its ASCII digit; `None` where
/// Python raises.
fn python_float(s: &str) -> Option<f64> {
    let chars: Vec<char> = s.trim().chars().map(ascii_digit).collect();
    let mut t = String::with_capacity(chars.len());
    for (i, &c) in chars.iter().enumerate() {
        if c == '_' {
            let digit = |j: Option<&char>| j.is_some_and(char::is_ascii_digit);
            if !(i > 0 && digit(chars.get(i - 1)) && digit(chars.get(i + 1))) {
                return None;
            }
        } else {
            t.push(c);
        }
    }
    let lower = t.to_ascii_lowercase();
    let word = lower.trim_start_matches(['+', '-']);
    if matches!(word, "inf" | "infinity" | "nan")
        || t.chars().all(|c| c.is_ascii_digit() || "+-.eE".contains(c))
    {
        t.parse::<f64>().ok()
    } else {
        None
    }
}

/// A Unicode decimal digit of the common scripts as its ASCII digit; other characters as they are.
fn ascii_digit(c: char) -> char {
    const ZEROS: [u32; 6] = [0x0660, 0x06F0, 0x0966, 0x09E6, 0x0E50, 0xFF10];
    let code = c as u32;
    ZEROS
        .iter()
        .find(|&&zero| (zero..zero + 10).contains(&code))
        .and_then(|&zero| char::from_digit(code - zero, 10))
        .unwrap_or(c)
}

/// The words ComfyUI tokenises for a segment: split before every whitespace-preceded `embedding:`, empty
/// pieces dropped, and an embedding's name dropped (Kiln has none) with what follows it on its word kept.
fn words(segment: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut start = 0;
    for (i, _) in segment.match_indices(EMBEDDING) {
        let preceded = segment[..i].chars().next_back().is_some_and(char::is_whitespace);
        if preceded && i > start {
            pieces.push(&segment[start..i]);
            start = i;
        }
    }
    pieces.push(&segment[start..]);
    let mut out = Vec::new();
    for piece in pieces.into_iter().filter(|p| !p.is_empty()) {
        match piece.strip_prefix(EMBEDDING) {
            Some(rest) => {
                let rest = rest.trim_matches('\n');
                let leftover = embedding_leftover(rest);
                if !leftover.is_empty() {
                    out.push(leftover);
                }
            }
            None => out.push(piece.to_owned()),
        }
    }
    out
}

/// What ComfyUI goes on tokenising after an embedding name it did not find (`_try_get_embedding`): the words
/// after the name joined by spaces, with any `<…`/`[…` tail of the name, then the name's stripped commas, in
/// front.
fn embedding_leftover(rest: &str) -> String {
    let mut split = rest.split_whitespace();
    let mut name = split.next().unwrap_or("");
    let after: Vec<&str> = split.collect();
    let mut leftover = after.join(" ");
    if let Some(at) = name.find(['<', '[']) {
        let tail = &name[at..];
        leftover = if leftover.is_empty() { tail.to_owned() } else { format!("{tail} {leftover}") };
        name = &name[..at];
    }
    tracing::warn!(
        embedding = name,
        "textual-inversion embeddings are not loaded by Kiln; the name is ignored"
    );
    let stripped = name.trim_matches(',');
    if stripped.len() < name.len() {
        // ComfyUI looks the name up without its commas and goes on with `name[len(stripped):]` (by
        // characters), a space and the rest.
        let tail: String = name.chars().skip(stripped.chars().count()).collect();
        return format!("{tail} {leftover}");
    }
    leftover
}

/// ComfyUI's `tokenize_with_weights`: the prompt's tokens with their weights, laid out in sections as `layout`
/// says. `word_ids` is the tokenizer's ids for a piece of text, without start or end tokens.
pub fn tokenize(
    prompt: &str,
    layout: &Layout,
    word_ids: impl Fn(&str) -> crate::Result<Vec<u32>>,
) -> crate::Result<Vec<Vec<Weighted>>> {
    let mut groups: Vec<Vec<Weighted>> = Vec::new();
    for (segment, weight) in segments(prompt) {
        for word in words(&segment) {
            groups.push(word_ids(&word)?.into_iter().map(|t| (t, weight)).collect());
        }
    }
    let has_end = usize::from(layout.end.is_some());
    let new_section = || -> Vec<Weighted> { layout.start.map(|s| (s, 1.0)).into_iter().collect() };
    let mut sections = Vec::new();
    let mut section = new_section();
    for group in groups {
        let large = group.len() >= MAX_WORD_LENGTH;
        let mut group = group.as_slice();
        while !group.is_empty() {
            if group.len() + section.len() > layout.max_length - has_end {
                let remaining = layout.max_length - section.len() - has_end;
                if large {
                    section.extend_from_slice(&group[..remaining]);
                    section.extend(layout.end.map(|e| (e, 1.0)));
                    group = &group[remaining..];
                } else {
                    section.extend(layout.end.map(|e| (e, 1.0)));
                    if layout.pad_to_max_length {
                        section.extend(std::iter::repeat_n((layout.pad, 1.0), remaining));
                    }
                }
                sections.push(std::mem::replace(&mut section, new_section()));
            } else {
                section.extend_from_slice(group);
                group = &[];
            }
        }
    }
    section.extend(layout.end.map(|e| (e, 1.0)));
    if let Some(pads) = layout.min_padding {
        section.extend(std::iter::repeat_n((layout.pad, 1.0), pads));
    }
    if layout.pad_to_max_length && section.len() < layout.max_length {
        section.extend(std::iter::repeat_n((layout.pad, 1.0), layout.max_length - section.len()));
    }
    if let Some(min) = layout.min_length
        && section.len() < min
    {
        section.extend(std::iter::repeat_n((layout.pad, 1.0), min - section.len()));
    }
    sections.push(section);
    Ok(sections)
}

/// ComfyUI's `gen_empty_tokens`: start, end, then padding, `len` tokens in all (what `z_empty` encodes).
pub fn empty_tokens(layout: &Layout, len: usize) -> Vec<u32> {
    let mut out: Vec<u32> = layout.start.into_iter().chain(layout.end).collect();
    out.resize(len.max(out.len()), layout.pad);
    out.truncate(len);
    out
}

/// Whether any token of `sections` has a weight other than 1 (then ComfyUI encodes [`empty_tokens`] too).
pub fn has_weights(sections: &[Vec<Weighted>]) -> bool {
    sections.iter().flatten().any(|&(_, w)| w != 1.0)
}

/// ComfyUI's escape/unescape round trip of the weighting syntax when weights are disabled: `\)` → `)` and
/// `\(` → `(` (in that order, as ComfyUI escapes them), and the two control-character pairs its escaping uses
/// as placeholders (`\0\1`, `\0\2`) turn into `)` and `(` as well, as they do there.
pub(crate) fn unescape_parentheses(prompt: &str) -> String {
    prompt
        .replace("\\)", "\0\u{1}")
        .replace("\\(", "\0\u{2}")
        .replace("\0\u{1}", ")")
        .replace("\0\u{2}", "(")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_parse_as_comfyui_parses_them() {
        assert_eq!(
            segments("a (b:1.5) c"),
            vec![("a ".to_owned(), 1.0), ("b".to_owned(), 1.5), (" c".to_owned(), 1.0)]
        );
        let nested = segments("((x))");
        assert_eq!(nested.len(), 1);
        assert!((nested[0].1 - 1.1f32 * 1.1).abs() < 1e-6);
        // Escaped parentheses are text; a colon whose tail is not a number stays in the text.
        assert_eq!(
            segments(r"\(a\) (b:c)"),
            vec![("(a) ".to_owned(), 1.0), ("b:c".to_owned(), 1.1)]
        );
        // An unclosed group runs to the end, unweighted as a group.
        assert_eq!(segments("a (b"), vec![("a ".to_owned(), 1.0), ("(b".to_owned(), 1.0)]);
        assert_eq!(segments("(b: 2 )")[0].1, 2.0);
        assert_eq!(segments("(b:１.５)")[0].1, 1.5);
        assert_eq!(segments("(b:1_0)")[0].1, 10.0);
        for text in ["1_.5", "1e_3", "_1", "in_f", "0x10", ""] {
            assert_eq!(python_float(text), None, "{text}");
        }
        for (text, value) in
            [("1e3", 1e3), (".5", 0.5), ("+2", 2.0), ("5.", 5.0), ("-inf", f64::NEG_INFINITY)]
        {
            assert_eq!(python_float(text), Some(value), "{text}");
        }
    }

    #[test]
    fn embeddings_are_dropped_keeping_the_rest() {
        assert_eq!(words("a embedding:foo b"), vec!["a ".to_owned(), "b".to_owned()]);
        assert_eq!(words("embedding:foo"), Vec::<String>::new());
        assert_eq!(words("xembedding:foo"), vec!["xembedding:foo".to_owned()]);
        assert_eq!(words("a embedding:foo<lora>"), vec!["a ".to_owned(), "<lora>".to_owned()]);
        assert_eq!(words("embedding:foo,<x>"), vec![", <x>".to_owned()]);
        assert_eq!(words("embedding:foo, b"), vec![", b".to_owned()]);
    }

    #[test]
    fn sections_follow_clips_layout() {
        let clip = Layout {
            start: Some(100),
            end: Some(101),
            pad: 101,
            max_length: 6,
            pad_to_max_length: true,
            min_length: None,
            min_padding: None,
        };
        let ids = |w: &str| Ok(w.split_whitespace().map(|t| t.len() as u32).collect());
        let s = tokenize("a bb", &clip, ids).unwrap();
        assert_eq!(
            s,
            vec![vec![(100, 1.0), (1, 1.0), (2, 1.0), (101, 1.0), (101, 1.0), (101, 1.0)]]
        );
        // A short word that does not fit moves whole to the next section.
        // (A segment is tokenised whole: `ids` sees "a bb " and "ccc dddd eeeee".)
        let s = tokenize("a bb (ccc dddd eeeee:2)", &clip, ids).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0], [(100, 1.0), (1, 1.0), (2, 1.0), (101, 1.0), (101, 1.0), (101, 1.0)]);
        assert_eq!(s[1][1..4], [(3, 2.0), (4, 2.0), (5, 2.0)]);
        let t5 = Layout {
            start: None,
            end: Some(1),
            pad: 0,
            max_length: usize::MAX / 2,
            pad_to_max_length: false,
            min_length: Some(4),
            min_padding: None,
        };
        assert_eq!(
            tokenize("", &t5, ids).unwrap(),
            vec![vec![(1, 1.0), (0, 1.0), (0, 1.0), (0, 1.0)]]
        );
        assert_eq!(empty_tokens(&clip, 4), vec![100, 101, 101, 101]);
        assert_eq!(empty_tokens(&t5, 3), vec![1, 0, 0]);
    }
}
