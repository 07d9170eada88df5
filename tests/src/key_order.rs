//! Key order, compared: ComfyUI sends JSON objects in insertion order (Python dicts) and clients rely on it, so
//! the tests compare the order of keys in Kiln's bytes with the recorded answers, not only the structure.
//!
//! `serde_json::Value` equality ignores key order even with `preserve_order`, hence this walk. For each object
//! present in both documents it compares the order of the keys both have (Kiln may add or omit keys; the
//! structural comparison decides whether that is allowed). Objects with no key in common but the same number
//! of keys are maps keyed by volatile ids (prompt ids, placeholders): their values are compared in order.

use serde_json::Value;

/// Where `got` orders keys differently from `expected`, one line per object, with its JSON path.
pub fn differences(got: &Value, expected: &Value) -> Vec<String> {
    let mut found = Vec::new();
    walk(got, expected, "$", &mut found);
    found
}

/// Panics with every difference when `got` orders keys differently from `expected`.
pub fn assert_same(got: &Value, expected: &Value, what: &str) {
    let found = differences(got, expected);
    assert!(found.is_empty(), "{what}: key order differs from ComfyUI's:\n{}", found.join("\n"));
}

/// The key paths of a document in order (`$.system.os`; a list by its first element, `$.devices[].name`): its
/// shape, which is what the golden `get_system_stats_shape` capture records.
pub fn shape(value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    paths(value, "$", &mut out);
    out
}

/// Fields Kiln adds to answers ComfyUI clients read by name (they ignore unknown fields): the memory manager's
/// budget on each device of `/system_stats`.
pub const KILN_ONLY_FIELDS: &[&str] = &["$.devices[].vram_budget"];

/// [`shape`] without [`KILN_ONLY_FIELDS`]: what must equal the shape ComfyUI recorded.
pub fn comfyui_shape(value: &Value) -> Vec<String> {
    let mut out = shape(value);
    out.retain(|path| !KILN_ONLY_FIELDS.contains(&path.as_str()));
    out
}

fn paths(value: &Value, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                let path = format!("{path}.{key}");
                out.push(path.clone());
                paths(v, &path, out);
            }
        }
        Value::Array(items) => {
            if let Some(first) = items.first() {
                paths(first, &format!("{path}[]"), out);
            }
        }
        _ => {}
    }
}

fn walk(got: &Value, expected: &Value, path: &str, found: &mut Vec<String>) {
    match (got, expected) {
        (Value::Object(got), Value::Object(expected)) => {
            let common_expected: Vec<&String> =
                expected.keys().filter(|k| got.contains_key(*k)).collect();
            if common_expected.is_empty() && !got.is_empty() && got.len() == expected.len() {
                for (i, (g, e)) in got.values().zip(expected.values()).enumerate() {
                    walk(g, e, &format!("{path}.<{i}>"), found);
                }
                return;
            }
            let common_got: Vec<&String> =
                got.keys().filter(|k| expected.contains_key(*k)).collect();
            if common_got != common_expected {
                found.push(format!("{path}: kiln {common_got:?}, comfyui {common_expected:?}"));
            }
            for key in common_expected {
                walk(&got[key], &expected[key], &format!("{path}.{key}"), found);
            }
        }
        (Value::Array(got), Value::Array(expected)) => {
            for (i, (g, e)) in got.iter().zip(expected).enumerate() {
                walk(g, e, &format!("{path}[{i}]"), found);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::{differences, shape};

    #[test]
    fn a_shape_lists_key_paths_in_order_and_lists_by_their_first_element() {
        let value = json!({"system": {"os": "linux", "argv": ["a"]}, "devices": [{"name": "cpu"}, {"x": 1}]});
        assert_eq!(
            shape(&value),
            ["$.system", "$.system.os", "$.system.argv", "$.devices", "$.devices[].name"]
        );
    }
    use serde_json::json;

    #[test]
    fn same_order_with_extra_or_missing_keys_is_no_difference() {
        let expected = json!({"a": 1, "b": {"x": 1, "y": 2}, "c": 3});
        assert!(differences(&json!({"a": 1, "z": 0, "b": {"x": 1, "y": 2}}), &expected).is_empty());
    }

    #[test]
    fn swapped_keys_are_reported_with_their_path() {
        let got = json!({"a": 1, "b": {"y": 2, "x": 1}});
        let expected = json!({"a": 1, "b": {"x": 1, "y": 2}});
        assert_eq!(differences(&got, &expected), [r#"$.b: kiln ["y", "x"], comfyui ["x", "y"]"#]);
    }

    #[test]
    fn maps_keyed_by_volatile_ids_are_compared_in_order() {
        let got = json!({"0a1b": {"prompt": 1, "outputs": 2}, "9f8e": {"outputs": 2, "prompt": 1}});
        let expected =
            json!({"<ID_1>": {"prompt": 1, "outputs": 2}, "<ID_2>": {"prompt": 1, "outputs": 2}});
        assert_eq!(differences(&got, &expected).len(), 1);
    }

    #[test]
    fn arrays_are_walked_element_by_element() {
        let got = json!([{"a": 1, "b": 2}, {"b": 2, "a": 1}]);
        let expected = json!([{"a": 1, "b": 2}, {"a": 1, "b": 2}]);
        assert_eq!(differences(&got, &expected), [r#"$[1]: kiln ["b", "a"], comfyui ["a", "b"]"#]);
    }
}
