//! JSON read strictly: only a JSON object is ever taken for an object.
//!
//! serde's derived `Deserialize` for a struct also accepts the struct's fields as a sequence, in order (`[true,
//! null]` for `{"free_memory": true, "unload_models": null}`), and serde_json offers arrays to it; a
//! `serde_json::Map` takes `null` for an empty map. The spec says object, and ComfyUI fails on anything else. So
//! request JSON is read into a `Value`, then deserialized through [`Strict`], which hands structs and maps
//! nothing but JSON objects, at every depth; everything else is as serde_json reads a `Value`.

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, IntoDeserializer as _, MapAccess,
    SeqAccess, Unexpected, Visitor,
};
use serde_json::Value;

type Error = serde_json::Error;

/// Where a value does not read as the expected type, and why.
#[derive(Debug)]
pub(crate) struct ShapeError {
    /// The path to the value, e.g. `prompt.3._meta`.
    pub(crate) path: String,
    /// What serde says is wrong with it.
    pub(crate) error: Error,
}

/// Deserializes `T` from a parsed JSON value, objects only where `T` has a struct.
pub(crate) fn from_value<T: DeserializeOwned>(value: &Value) -> Result<T, ShapeError> {
    serde_path_to_error::deserialize(Strict(value))
        .map_err(|e| ShapeError { path: e.path().to_string(), error: e.into_inner() })
}

/// A JSON value as a serde deserializer that refuses arrays for structs.
struct Strict<'a>(&'a Value);

fn unexpected(value: &Value) -> Unexpected<'_> {
    match value {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(_) => Unexpected::Other("number"),
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

impl<'a> Deserializer<'a> for Strict<'a> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => n.deserialize_any(visitor),
            Value::String(s) => visitor.visit_borrowed_str(s),
            Value::Array(items) => visitor.visit_seq(Items(items.iter())),
            Value::Object(fields) => {
                visitor.visit_map(Fields { fields: fields.iter(), value: None })
            }
        }
    }

    fn deserialize_option<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_map(visitor)
    }

    fn deserialize_map<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Object(_) => self.deserialize_any(visitor),
            other => Err(de::Error::invalid_type(unexpected(other), &visitor)),
        }
    }

    fn deserialize_enum<V: Visitor<'a>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::String(s) => visitor.visit_enum(s.as_str().into_deserializer()),
            // Externally tagged variants with data: none of the request types has one; serde_json reads them.
            other => other.clone().deserialize_enum(name, variants, visitor),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        <W: Visitor<'a>>
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct seq tuple tuple_struct identifier
    }
}

/// The elements of an array, each read strictly.
struct Items<'a>(std::slice::Iter<'a, Value>);

impl<'a> SeqAccess<'a> for Items<'a> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'a>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0.next().map(|value| seed.deserialize(Strict(value))).transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

/// The members of an object, each value read strictly.
struct Fields<'a> {
    fields: serde_json::map::Iter<'a>,
    value: Option<&'a Value>,
}

impl<'a> MapAccess<'a> for Fields<'a> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'a>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some((key, value)) = self.fields.next() else { return Ok(None) };
        self.value = Some(value);
        seed.deserialize(BorrowedStrDeserializer::<Error>::new(key)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'a>>(&mut self, seed: V) -> Result<V::Value, Error> {
        match self.value.take() {
            Some(value) => seed.deserialize(Strict(value)),
            None => Err(de::Error::custom("a map value was asked for before its key")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.fields.len())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use kiln_spec::types;
    use serde_json::json;

    use super::from_value;

    #[test]
    fn an_array_is_never_an_object() {
        let refused = from_value::<types::FreeRequest>(&json!([true, null])).unwrap_err();
        assert!(refused.error.to_string().contains("invalid type: sequence"), "{}", refused.error);
        // At any depth, with the path to the value.
        let refused = from_value::<types::PromptNode>(&json!(
            {"class_type": "EmptyImage", "inputs": {}, "_meta": ["a title"]}
        ))
        .unwrap_err();
        assert_eq!(refused.path, "_meta");
        // `serde_json::Map` on its own would take `null` for `{}`.
        assert!(from_value::<types::Settings>(&json!(null)).is_err());
        assert!(from_value::<types::Settings>(&json!([])).is_err());
    }

    #[test]
    fn everything_else_reads_as_serde_json_reads_it() {
        let request: types::PromptRequest = from_value(&json!({
            "prompt": {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "image": ["2", 0]}}},
            "number": 3, "front": null, "client_id": "me", "extra_data": {"extra_pnginfo": {"a": [1]}, "x": 1},
        }))
        .expect("a valid request");
        assert_eq!(request.number, Some(3.0));
        assert_eq!(request.client_id.as_deref(), Some("me"));
        let extra = request.extra_data.expect("extra_data");
        assert_eq!(extra.get("x"), Some(&json!(1)), "open objects keep their other keys");
        let node = &request.prompt.expect("prompt")["1"];
        assert_eq!(
            node["inputs"]["image"],
            json!(["2", 0]),
            "arrays stay arrays where the schema says any"
        );
        let ids: types::JobsCancelRequest =
            from_value(&json!({"job_ids": ["a", "b"]})).expect("ids");
        assert_eq!(ids.job_ids, ["a", "b"]);
        let kind: types::FileType = from_value(&json!("temp")).expect("a string enum");
        assert_eq!(kind, types::FileType::Temp);
        let numbers: HashMap<String, i64> = from_value(&json!({"a": 1})).expect("a map");
        assert_eq!(numbers["a"], 1);
        assert!(from_value::<types::FileType>(&json!("elsewhere")).is_err());
        assert!(from_value::<i64>(&json!(1.5)).is_err(), "no float for an integer");
    }
}
