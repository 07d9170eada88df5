//! The tags media save nodes write: `extra_pnginfo`'s keys, then `prompt`, each value as Python's
//! `json.dumps` writes it (`", "` and `": "` separators, non-ASCII escaped as `\uXXXX`), which is how ComfyUI
//! puts them into MP4, FLAC, WebP and PNG files.

use serde_json::ser::Formatter;

/// `extra_pnginfo`'s entries then `prompt` (ComfyUI's `metadata.update(extra_pnginfo)`;
/// `metadata["prompt"] = prompt`), values JSON-encoded; nothing for null inputs.
pub(crate) fn save_tags(
    prompt: &serde_json::Value,
    extra_pnginfo: &serde_json::Value,
) -> Vec<(String, String)> {
    let mut tags: Vec<(String, String)> = Vec::new();
    if let Some(extra) = extra_pnginfo.as_object() {
        tags.extend(extra.iter().map(|(k, v)| (k.clone(), python_json(v))));
    }
    if !prompt.is_null() {
        tags.retain(|(k, _)| k != "prompt");
        tags.push(("prompt".to_owned(), python_json(prompt)));
    }
    tags
}

/// `value` as Python's `json.dumps(value)` writes it.
pub(crate) fn python_json(value: &serde_json::Value) -> String {
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
    match serde::Serialize::serialize(value, &mut serializer) {
        Ok(()) => String::from_utf8(out).unwrap_or_default(),
        Err(_) => value.to_string(),
    }
}

/// Python's default separators and `ensure_ascii`.
struct PythonFormatter;

impl Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        for ch in fragment.chars() {
            if ch.is_ascii() {
                w.write_all(&[ch as u8])?;
            } else {
                let mut units = [0u16; 2];
                for unit in ch.encode_utf16(&mut units) {
                    write!(w, "\\u{unit:04x}")?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{python_json, save_tags};
    use serde_json::json;

    #[test]
    fn json_is_written_as_python_writes_it() {
        let v = json!({"a": [1, 2.5, "é😀"], "b": {"c": null}});
        assert_eq!(python_json(&v), r#"{"a": [1, 2.5, "\u00e9\ud83d\ude00"], "b": {"c": null}}"#);
    }

    #[test]
    fn extra_keys_come_before_the_prompt() {
        let tags = save_tags(&json!({"1": {}}), &json!({"workflow": {"id": 1}}));
        assert_eq!(
            tags,
            [("workflow".into(), r#"{"id": 1}"#.into()), ("prompt".into(), r#"{"1": {}}"#.into())]
        );
    }
}
