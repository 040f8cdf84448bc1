//! A value as any self-describing serde format gives it (TOML, JSON, YAML,
//! a config-rs or figment tree): what the configuration forms of limits
//! are read from, whatever wrote them. A limit ([`super::limit::form`]) and
//! a limits file (`config/read.rs`) are read from this one tree, so every
//! format takes one path, with one set of messages.

use std::fmt;

use serde_core::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// One value of a configuration, as written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// JSON's `null`, YAML's `~` or an empty YAML value.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A whole number, signed or not.
    Integer(i128),
    /// A number with a fraction or an exponent.
    Float(f64),
    /// Text.
    String(String),
    /// A list.
    List(Vec<Value>),
    /// A table (a map), its keys in the order given and duplicates kept
    /// (JSON allows them): each reader reports a key given twice with its
    /// place ([`Value::entries`]).
    Table(Vec<(String, Value)>),
}

impl Value {
    /// The text, if this is text.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(text) => Some(text),
            _ => None,
        }
    }

    /// A table's entries sorted by key (every format reports the first
    /// problem in the same order), or the first key given twice.
    pub(crate) fn entries(table: &[(String, Value)]) -> Result<Vec<(&str, &Value)>, &str> {
        let mut entries: Vec<(&str, &Value)> = table.iter().map(|(k, v)| (k.as_str(), v)).collect();
        entries.sort_by_key(|(key, _)| *key);
        match entries.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            Some(pair) => Err(pair[0].0),
            None => Ok(entries),
        }
    }
}

/// Inline TOML (JSON's `null` aside), for messages: `"5 every hour"`,
/// `[1, 2]`, `{ rate = "5/1h", burst = 0 }`.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Integer(n) => write!(f, "{n}"),
            Value::Float(x) => write!(f, "{x:?}"),
            Value::String(text) => write!(f, "{text:?}"),
            Value::List(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            Value::Table(entries) if entries.is_empty() => f.write_str("{}"),
            Value::Table(entries) => {
                f.write_str("{ ")?;
                for (i, (key, value)) in entries.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    let bare = !key.is_empty()
                        && key
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                    if bare {
                        write!(f, "{key} = {value}")?;
                    } else {
                        write!(f, "{key:?} = {value}")?;
                    }
                }
                f.write_str(" }")
            }
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("text, a number, true or false, a list or a table")
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Integer(n.into()))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Integer(n.into()))
    }

    fn visit_i128<E: de::Error>(self, n: i128) -> Result<Value, E> {
        Ok(Value::Integer(n))
    }

    fn visit_u128<E: de::Error>(self, n: u128) -> Result<Value, E> {
        i128::try_from(n)
            .map(Value::Integer)
            .map_err(|_| E::custom(format!("{n} is too large a number")))
    }

    fn visit_f64<E: de::Error>(self, x: f64) -> Result<Value, E> {
        Ok(Value::Float(x))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Value, E> {
        Ok(Value::String(text.to_owned()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Value, E> {
        Ok(Value::String(text))
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        Value::deserialize(deserializer)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Value, D::Error> {
        Value::deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::List(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
        while let Some(key) = map.next_key::<Key>()? {
            entries.push((key.0, map.next_value()?));
        }
        Ok(Value::Table(entries))
    }
}

/// A table's key: text, or a number or boolean written as a key (YAML
/// allows `5: ...`), kept as its text.
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key written as text")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Key, E> {
                Ok(Key(text.to_owned()))
            }

            fn visit_string<E: de::Error>(self, text: String) -> Result<Key, E> {
                Ok(Key(text))
            }

            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Key, E> {
                Ok(Key(b.to_string()))
            }

            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Key, E> {
                Ok(Key(n.to_string()))
            }

            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Key, E> {
                Ok(Key(n.to_string()))
            }
        }
        deserializer.deserialize_any(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_display_as_inline_toml() {
        let value = Value::Table(vec![
            ("rate".into(), Value::String("5 every hour".into())),
            ("burst".into(), Value::Integer(-3)),
            (
                "api@pro".into(),
                Value::List(vec![Value::Bool(true), Value::Float(2.0)]),
            ),
            ("empty".into(), Value::Table(Vec::new())),
        ]);
        assert_eq!(
            value.to_string(),
            r#"{ rate = "5 every hour", burst = -3, "api@pro" = [true, 2.0], empty = {} }"#
        );
    }

    #[test]
    fn entries_are_sorted_and_a_key_given_twice_is_named() {
        let table = vec![("b".to_owned(), Value::Null), ("a".to_owned(), Value::Null)];
        let keys: Vec<&str> = Value::entries(&table)
            .unwrap()
            .iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(keys, ["a", "b"]);
        let twice = vec![
            ("a".to_owned(), Value::Null),
            ("b".to_owned(), Value::Null),
            ("a".to_owned(), Value::Bool(true)),
        ];
        assert_eq!(Value::entries(&twice), Err("a"));
    }
}
