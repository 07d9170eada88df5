//! Text nodes of `comfy_extras.nodes_string` (`StringConcatenate`, `StringReplace`, `RegexExtract`,
//! `JsonExtractString`) and the utilities templates wire around prompts and sizes: `ResolutionSelector`
//! (`comfy_extras.nodes_resolution`) and `ComfyNumberConvert` (`comfy_extras.nodes_number_convert`). All V3
//! classes.

use std::collections::BTreeMap;

use super::expression::{Num, evaluate};
use super::pure::Pure;
use super::strings::{python_regex, regex_flags};
use crate::nodes::{ErrorKind, InputDef, Inputs, NodeError, NodeSpec, OutputDef};
use crate::value::Value;

/// A multiline `STRING` input without a default, as `io.String.Input(name, multiline=True)` declares it.
pub(super) fn multiline(name: &str) -> InputDef {
    InputDef::bare(name, "STRING").option("multiline", true)
}

/// An advanced `BOOLEAN` input (V3 writes `advanced` before `default`).
pub(super) fn advanced_bool(name: &str, default: bool) -> InputDef {
    InputDef::bare(name, "BOOLEAN").option("advanced", true).option("default", default)
}

/// `RegexExtract`'s modes, in ComfyUI's order.
const EXTRACT_MODES: [&str; 4] = ["First Match", "All Matches", "First Group", "All Groups"];

/// `RegexExtract`: what a Python regular expression finds in the string, as its `mode` says (matches or one
/// group, the first or all of them joined by newlines); a pattern Python would reject, or nothing found, is "".
fn regex_extract(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let text = inputs.string("string")?;
    let group = usize::try_from(inputs.int("group_index")?).unwrap_or(0);
    let Some(regex) = python_regex(inputs, inputs.string("regex_pattern")?, [true, false, false])?
    else {
        return Ok(vec![Value::String(String::new())]);
    };
    let groups = regex.captures_len() - 1;
    let text_of = |c: &fancy_regex::Captures<'_>, i: usize| {
        c.get(i).map_or(String::new(), |m| m.as_str().to_owned())
    };
    let all = || regex.captures_iter(text).filter_map(Result::ok);
    let result = match inputs.string("mode")? {
        "First Match" => regex.captures(text).ok().flatten().map(|c| text_of(&c, 0)),
        // Python's findall: the whole match without groups, else the first group.
        "All Matches" => {
            Some(all().map(|c| text_of(&c, usize::from(groups > 0))).collect::<Vec<_>>().join("\n"))
        }
        "First Group" if groups >= group => {
            regex.captures(text).ok().flatten().map(|c| text_of(&c, group))
        }
        "All Groups" if groups >= group && groups > 0 => {
            Some(all().map(|c| text_of(&c, group)).collect::<Vec<_>>().join("\n"))
        }
        _ => None,
    };
    Ok(vec![Value::String(result.unwrap_or_default())])
}

/// The aspect ratios of `ResolutionSelector`, with their width and height parts, in ComfyUI's order.
const ASPECT_RATIOS: [(&str, f64, f64); 8] = [
    ("1:1 (Square)", 1.0, 1.0),
    ("2:3 (Portrait Photo)", 2.0, 3.0),
    ("3:2 (Photo)", 3.0, 2.0),
    ("3:4 (Portrait Standard)", 3.0, 4.0),
    ("4:3 (Standard)", 4.0, 3.0),
    ("9:16 (Portrait Widescreen)", 9.0, 16.0),
    ("16:9 (Widescreen)", 16.0, 9.0),
    ("21:9 (Ultrawide)", 21.0, 9.0),
];

/// The nodes, in ComfyUI's registration order within each module.
/// `JsonExtractString`: Python's `str()` of `key`'s value in the JSON object `json_string`; empty for a
/// missing key, a `null`, something not an object, or text that is not JSON.
fn json_extract(json: &str, key: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(map)) => match map.get(key) {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(value) => crate::graph::py_str(value),
        },
        _ => String::new(),
    }
}

pub(super) fn nodes() -> Vec<Pure> {
    let text = |name: &str, display: &str| {
        NodeSpec::new(name, display, "text").python_module("comfy_extras.nodes_string").v3()
    };
    let ratios: Vec<&str> = ASPECT_RATIOS.iter().map(|r| r.0).collect();
    vec![
        Pure::new(
            text("JsonExtractString", "Extract Text from JSON")
                .input(multiline("json_string"))
                .input(InputDef::bare("key", "STRING").option("multiline", false))
                .output(OutputDef::new("STRING"))
                .aliases(&["json", "extract json", "parse json", "json value", "read json"]),
            |inputs| {
                let out = json_extract(inputs.string("json_string")?, inputs.string("key")?);
                Ok(vec![Value::String(out)])
            },
        ),
        Pure::new(
            text("StringConcatenate", "Concatenate Text")
                .input(multiline("string_a"))
                .input(multiline("string_b"))
                .input(InputDef::string("delimiter", "").option("multiline", false))
                .output(OutputDef::new("STRING"))
                .aliases(&[
                    "concatenate",
                    "text concat",
                    "join text",
                    "merge text",
                    "combine strings",
                    "string concat",
                    "append text",
                    "combine text",
                ]),
            |inputs| {
                let delimiter = inputs.string("delimiter")?;
                let joined =
                    [inputs.string("string_a")?, inputs.string("string_b")?].join(delimiter);
                Ok(vec![Value::String(joined)])
            },
        ),
        Pure::new(
            text("StringReplace", "Replace Text")
                .input(multiline("string"))
                .input(multiline("find"))
                .input(multiline("replace"))
                .output(OutputDef::new("STRING"))
                .aliases(&["replace", "find and replace", "substitute", "swap text"]),
            // Python's `str.replace`: every occurrence; an empty `find` matches between all characters.
            |inputs| {
                let replaced = inputs
                    .string("string")?
                    .replace(inputs.string("find")?, inputs.string("replace")?);
                Ok(vec![Value::String(replaced)])
            },
        ),
        Pure::new(
            regex_flags(
                text("RegexExtract", "Extract Text")
                    .input(multiline("string"))
                    .input(multiline("regex_pattern"))
                    .input(InputDef::v3_combo("mode", &EXTRACT_MODES)),
            )
            .input(
                InputDef::bare("group_index", "INT")
                    .option("advanced", true)
                    .option("default", 1)
                    .option("min", 0)
                    .option("max", 100),
            )
            .output(OutputDef::new("STRING"))
            .aliases(&[
                "regex extract",
                "regex",
                "pattern extract",
                "text parser",
                "parse text",
            ]),
            regex_extract,
        ),
        Pure::new(
            NodeSpec::new("ResolutionSelector", "Resolution Selector", "utilities")
                .python_module("comfy_extras.nodes_resolution")
                .v3()
                .description(
                    "Calculate width and height from aspect ratio and megapixel target. Useful \
                         for setting up Empty Latent Image dimensions.",
                )
                .input(
                    InputDef::bare("aspect_ratio", "COMBO")
                        .tooltip("The aspect ratio for the output dimensions.")
                        .option("default", "1:1 (Square)")
                        .option("multiselect", false)
                        .option("options", ratios),
                )
                .input(
                    InputDef::bare("megapixels", "FLOAT")
                        .tooltip("Target total megapixels. 1.0 MP ≈ 1024x1024 for square.")
                        .option("default", 1.0)
                        .option("min", 0.1)
                        .option("max", 16.0)
                        .option("step", 0.1),
                )
                .input(
                    InputDef::bare("multiple", "INT")
                        .tooltip(
                            "Nearest multiple of the result to set the selected resolution to.",
                        )
                        .option("advanced", true)
                        .option("default", 8)
                        .option("min", 8)
                        .option("max", 128)
                        .option("step", 4),
                )
                .output(
                    OutputDef::new("INT")
                        .named("width")
                        .tooltip("Calculated width in pixels multiplied by the selected multiple."),
                )
                .output(
                    OutputDef::new("INT").named("height").tooltip(
                        "Calculated height in pixels multiplied by the selected multiple.",
                    ),
                ),
            |inputs| {
                let name = inputs.string("aspect_ratio")?;
                let Some(&(_, w, h)) = ASPECT_RATIOS.iter().find(|r| r.0 == name) else {
                    return Err(NodeError::of_kind(
                        ErrorKind::InvalidValue,
                        format!("unknown aspect ratio `{name}`"),
                    ));
                };
                let (width, height) =
                    resolution(w, h, inputs.float("megapixels")?, inputs.int("multiple")?);
                Ok(vec![Value::Int(width), Value::Int(height)])
            },
        ),
        Pure::new(
            NodeSpec::new("ComfyMathExpression", "Math Expression", "utilities")
                .python_module("comfy_extras.nodes_math")
                .v3()
                .input(InputDef::string("expression", "a + b").option("multiline", true))
                .autogrow("values", InputDef::bare("value", "FLOAT,INT,BOOLEAN"), &VALUE_NAMES, 1)
                .output(OutputDef::new("FLOAT"))
                .output(OutputDef::new("INT"))
                .output(OutputDef::new("BOOLEAN").named("BOOL"))
                .aliases(&["expression", "formula", "calculate", "calculator", "eval", "math"]),
            math_expression,
        ),
        Pure::new(
            NodeSpec::new("ComfyNumberConvert", "Convert Number", "utilities")
                .python_module("comfy_extras.nodes_number_convert")
                .v3()
                .input(
                    InputDef::bare("value", "INT,FLOAT,STRING,BOOLEAN")
                        .option("display_name", "value"),
                )
                .output(OutputDef::new("FLOAT"))
                .output(OutputDef::new("INT"))
                .aliases(&[
                    "int to float",
                    "float to int",
                    "number convert",
                    "int2float",
                    "float2int",
                    "cast",
                    "parse number",
                    "string to number",
                    "bool to int",
                ]),
            |inputs| {
                let value = inputs.get("value").ok_or_else(|| {
                    NodeError::of_kind(ErrorKind::WrongType, "input `value` is missing")
                })?;
                let (float, int) = convert_number(value)?;
                Ok(vec![Value::Float(float), Value::Int(int)])
            },
        ),
    ]
}

/// The names `ComfyMathExpression` grows its `values` under.
const VALUE_NAMES: [&str; 26] = [
    "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s",
    "t", "u", "v", "w", "x", "y", "z",
];

/// `ComfyMathExpression`: the expression over the inputs given (`a`, `b`, ... and `values`, all of them in
/// order), as a float, an int (truncated) and a bool.
fn math_expression(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let invalid = |msg: String| NodeError::of_kind(ErrorKind::InvalidValue, msg);
    let expression = inputs.string("expression")?;
    if expression.trim().is_empty() {
        return Err(invalid("Expression cannot be empty.".to_owned()));
    }
    let mut names = BTreeMap::new();
    let mut all = Vec::new();
    for name in VALUE_NAMES {
        let Some(value) = inputs.get(&format!("values.{name}")) else { continue };
        let num = match value {
            Value::Int(i) => Num::Int(*i),
            Value::Float(f) => Num::Float(*f),
            Value::Bool(b) => Num::Bool(*b),
            Value::Json(json) => match &**json {
                serde_json::Value::Bool(b) => Num::Bool(*b),
                serde_json::Value::Number(n) => n
                    .as_i64()
                    .map(Num::Int)
                    .or_else(|| n.as_f64().map(Num::Float))
                    .unwrap_or(Num::Int(0)),
                other => return Err(invalid(format!("`{name}` is not a number: {other}"))),
            },
            other => {
                return Err(invalid(format!("`{name}` is {}, not a number", other.type_name())));
            }
        };
        all.push(num.clone());
        names.insert(name.to_owned(), num);
    }
    names.insert("values".to_owned(), Num::List(all));
    let result = evaluate(expression, &names).map_err(invalid)?;
    let float = match &result {
        Num::Bool(_) | Num::Int(_) | Num::Float(_) => match result {
            Num::Bool(b) => f64::from(u8::from(b)),
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
            Num::List(_) => 0.0,
        },
        Num::List(_) => {
            return Err(invalid(format!(
                "Math Expression '{expression}' must evaluate to a numeric result, got list"
            )));
        }
    };
    if !float.is_finite() {
        return Err(invalid(format!(
            "Math Expression '{expression}' produced a non-finite result: {float}"
        )));
    }
    let int = match result {
        Num::Bool(b) => i64::from(b),
        Num::Int(i) => i,
        _ if float.abs() < 9.223_372_036_854_776e18 => float.trunc() as i64,
        _ => {
            return Err(invalid(format!("Math Expression '{expression}' is too large for an INT")));
        }
    };
    Ok(vec![Value::Float(float), Value::Int(int), Value::Bool(float != 0.0)])
}

/// `ResolutionSelector`'s size: the ratio scaled to `megapixels` (of 1024² pixels), each side rounded to the
/// nearest multiple (Python's `round`, ties to even).
fn resolution(w: f64, h: f64, megapixels: f64, multiple: i64) -> (i64, i64) {
    let scale = (megapixels * 1024.0 * 1024.0 / (w * h)).sqrt();
    let m = multiple as f64;
    let side = |part: f64| (part * scale / m).round_ties_even() as i64 * multiple;
    (side(w), side(h))
}

/// `ComfyNumberConvert`: a boolean, integer, float or numeric string as a float and an integer (floats
/// truncate toward zero; a string is read as an integer if it is one, else through its float).
fn convert_number(value: &Value) -> Result<(f64, i64), NodeError> {
    let invalid = |msg: String| NodeError::of_kind(ErrorKind::InvalidValue, msg);
    let finite = |v: f64| {
        if v.is_finite() {
            Ok(v)
        } else {
            Err(invalid(format!("Cannot convert non-finite value to number: {v}")))
        }
    };
    let from_json = |json: &serde_json::Value| -> Option<Value> {
        match json {
            serde_json::Value::Bool(b) => Some(Value::Bool(*b)),
            serde_json::Value::Number(n) => {
                n.as_i64().map(Value::Int).or_else(|| n.as_f64().map(Value::Float))
            }
            serde_json::Value::String(s) => Some(Value::String(s.clone())),
            _ => None,
        }
    };
    let value = match value {
        Value::Json(json) => from_json(json).ok_or_else(|| {
            NodeError::of_kind(ErrorKind::WrongType, format!("Unsupported input type: {json}"))
        })?,
        other => other.clone(),
    };
    match value {
        Value::Bool(b) => Ok((f64::from(u8::from(b)), i64::from(b))),
        Value::Int(i) => Ok((i as f64, i)),
        Value::Float(f) => Ok((finite(f)?, f.trunc() as i64)),
        Value::String(s) => {
            let text = s.trim();
            if text.is_empty() {
                return Err(invalid("Cannot convert empty string to number.".to_owned()));
            }
            let float = text
                .parse::<f64>()
                .map_err(|_| invalid(format!("Cannot convert string to number: '{s}'")))?;
            let float = finite(float)?;
            Ok((float, text.parse::<i64>().unwrap_or(float.trunc() as i64)))
        }
        other => Err(NodeError::of_kind(
            ErrorKind::WrongType,
            format!("Unsupported input type: {}", other.type_name()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_follows_comfyuis_rounding() {
        assert_eq!(resolution(1.0, 1.0, 1.0, 8), (1024, 1024));
        assert_eq!(resolution(16.0, 9.0, 1.0, 8), (1368, 768));
        assert_eq!(resolution(2.0, 3.0, 0.5, 64), (576, 896));
    }

    #[test]
    fn numbers_convert_as_comfyui_converts_them() {
        assert_eq!(convert_number(&Value::Bool(true)).unwrap(), (1.0, 1));
        assert_eq!(convert_number(&Value::Float(-2.7)).unwrap(), (-2.7, -2));
        assert_eq!(convert_number(&Value::String(" 42 ".into())).unwrap(), (42.0, 42));
        assert_eq!(convert_number(&Value::String("3.9".into())).unwrap(), (3.9, 3));
        let json = Value::Json(std::sync::Arc::new(serde_json::json!(7)));
        assert_eq!(convert_number(&json).unwrap(), (7.0, 7));
        for bad in ["", "abc", "inf"] {
            assert!(convert_number(&Value::String(bad.into())).is_err(), "{bad}");
        }
    }
}
