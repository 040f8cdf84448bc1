//! A limits file read from the tree of values any serde format gives
//! ([`Value`]): the one reader behind [`LimitsFile::parse`] (TOML) and
//! `Deserialize for LimitsFile` (every other format), so the two cannot
//! drift. Each problem is a [`ConfigError`] naming the limit, the key and
//! the value.

use std::collections::BTreeMap;

use super::{ConfigError, LimitsEntry, LimitsFile};
use crate::model::limit::Limit;
use crate::model::limit::form::{self, FormError, RateSettings};
use crate::model::lists::{ListEntry, ListKind, key_form};
use crate::model::policy::FailurePolicy;
use crate::model::value::Value;

/// The whole file: a table of `limits` and `lists`.
pub(super) fn file(value: &Value) -> Result<LimitsFile, ConfigError> {
    let table = match value {
        // An empty document (YAML's, or a section with nothing in it).
        Value::Null => return Ok(LimitsFile::default()),
        Value::Table(table) => table,
        other => return Err(ConfigError::NotAFile(other.to_string())),
    };
    let mut entries = BTreeMap::new();
    let mut lists = Vec::new();
    let top = Value::entries(table).map_err(|key| ConfigError::Duplicate {
        name: None,
        key: key.to_owned(),
    })?;
    for (key, value) in top {
        match key {
            "limits" => {
                let limits = match value {
                    Value::Null => &[][..],
                    Value::Table(limits) => limits,
                    other => return Err(ConfigError::LimitsNotATable(other.to_string())),
                };
                let limits = Value::entries(limits).map_err(|name| ConfigError::Duplicate {
                    name: None,
                    key: format!("limits.{name}"),
                })?;
                for (name, value) in limits {
                    entries.insert(name.to_owned(), entry(name, value)?);
                }
            }
            "lists" => read_lists(value, &mut lists)?,
            _ => return Err(ConfigError::UnknownTopLevelKey(key.to_owned())),
        }
    }
    lists.sort_by(|a: &ListEntry, b| (&a.name, &a.identity).cmp(&(&b.name, &b.identity)));
    Ok(LimitsFile { entries, lists })
}

/// One name's settings: `rates` (each a rate or a limit's table, see
/// [`form`]), the rate settings of the rates written as text (a table
/// carries its own), `on_error` and `shadow`.
fn entry(name: &str, value: &Value) -> Result<LimitsEntry, ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::EmptyName);
    }
    let Value::Table(table) = value else {
        return Err(ConfigError::NotATable {
            name: name.to_owned(),
            value: value.to_string(),
        });
    };
    let named = |error: FormError| match error {
        FormError::Rate { rate, source } => ConfigError::BadRate {
            name: name.to_owned(),
            rate,
            source,
        },
        FormError::Setting {
            key,
            value,
            expected,
        } => ConfigError::BadValue {
            name: name.to_owned(),
            key,
            value,
            expected,
        },
        FormError::Form { value, expected } => ConfigError::BadValue {
            name: name.to_owned(),
            key: "rates",
            value,
            expected,
        },
    };
    let bad =
        |key: &'static str, value: &Value, expected: &str| bad_value(name, key, value, expected);
    let table = Value::entries(table).map_err(|key| ConfigError::Duplicate {
        name: Some(name.to_owned()),
        key: key.to_owned(),
    })?;
    let mut settings = RateSettings::default();
    let mut rates = None;
    let mut policy = None;
    let mut shadow = false;
    let mut given = Vec::new();
    for &(key, value) in &table {
        if let Some(setting) = settings.read(key, value).map_err(named)? {
            given.push((setting, value));
            continue;
        }
        match key {
            "rates" => {
                let Value::List(items) = value else {
                    return Err(bad(
                        "rates",
                        value,
                        "expected a list such as [\"1/1m\", \"5/1h\"]",
                    ));
                };
                if items.is_empty() {
                    return Err(bad(
                        "rates",
                        value,
                        "at least one rate is needed, e.g. [\"5/1h\"]",
                    ));
                }
                rates = Some(items);
            }
            "on_error" => {
                policy = Some(value.as_str().and_then(parse_policy).ok_or_else(|| {
                    bad(
                        "on_error",
                        value,
                        "expected \"fail_open\", \"fail_closed\" or \"local:<share>\" (share >= 1, e.g. \"local:4\")",
                    )
                })?);
            }
            "shadow" => {
                let Value::Bool(on) = value else {
                    return Err(bad("shadow", value, "expected true or false"));
                };
                shadow = *on;
            }
            _ => {
                return Err(ConfigError::UnknownKey {
                    name: name.to_owned(),
                    key: key.to_owned(),
                });
            }
        }
    }
    let Some(rates) = rates else {
        return Err(ConfigError::MissingRates {
            name: name.to_owned(),
        });
    };
    let limits = rates
        .iter()
        .map(|item| form::read(item, settings).map_err(named))
        .collect::<Result<Vec<Limit>, _>>()?;
    if let Some((key, value)) = given.first()
        && !rates.iter().any(|item| matches!(item, Value::String(_)))
    {
        return Err(bad(
            key,
            value,
            "it sets the rates written as text, and `rates` has none (a limit's table carries its own \
             settings); move it into the tables",
        ));
    }
    Limit::check_distinct(&limits).map_err(|source| ConfigError::Conflict {
        name: name.to_owned(),
        source,
    })?;
    Ok(LimitsEntry {
        limits,
        policy,
        shadow,
    })
}

fn bad_value(name: &str, key: &'static str, value: &Value, expected: &str) -> ConfigError {
    ConfigError::BadValue {
        name: name.to_owned(),
        key,
        value: value.to_string(),
        expected: expected.to_owned(),
    }
}

/// `lists`: `allow` / `deny` lists of identities for every limit, and
/// tables of the same lists for one limit (`lists.<name>`). An identity is
/// text or a whole number (a YAML user id), taken as written.
fn read_lists(value: &Value, out: &mut Vec<ListEntry>) -> Result<(), ConfigError> {
    let bad = |name: Option<&str>, message: String| ConfigError::BadList {
        name: name.map(str::to_owned),
        message,
    };
    let table = match value {
        Value::Null => return Ok(()),
        Value::Table(table) => table,
        other => return Err(bad(None, format!("`lists` must be a table, got {other}"))),
    };
    let mut push = |name: Option<&str>, key: &str, value: &Value| {
        let kind: ListKind = key
            .parse()
            .map_err(|_| bad(name, format!("unknown key `{key}`")))?;
        let Value::List(items) = value else {
            return Err(bad(
                name,
                format!("`{key}` must be a list of strings, got {value}"),
            ));
        };
        for item in items {
            let identity = match item {
                Value::String(identity) => key_form(identity),
                Value::Integer(number) => key_form(number),
                _ => return Err(bad(name, format!("`{key}` holds {item}, not a string"))),
            };
            if let Some(other) = out
                .iter()
                .find(|e| e.name.as_deref() == name && e.identity == identity)
            {
                return Err(bad(
                    name,
                    format!("{item} is on the {} list and the {key} list", other.kind),
                ));
            }
            out.push(ListEntry::new(kind, name, identity, None));
        }
        Ok(())
    };
    let twice = |name: Option<&str>, key: &str| bad(name, format!("`{key}` given twice"));
    for (key, value) in Value::entries(table).map_err(|key| twice(None, key))? {
        match value {
            Value::Table(lists) => {
                if key.is_empty() {
                    return Err(bad(None, "limit names must not be empty".into()));
                }
                for (list, items) in Value::entries(lists).map_err(|list| twice(Some(key), list))? {
                    push(Some(key), list, items)?;
                }
            }
            _ => push(None, key, value)?,
        }
    }
    Ok(())
}

/// `fail_open`, `fail_closed` or `local:<share>` with `share >= 1`.
fn parse_policy(text: &str) -> Option<FailurePolicy> {
    match text.trim() {
        "fail_open" => Some(FailurePolicy::FailOpen),
        "fail_closed" => Some(FailurePolicy::FailClosed),
        other => {
            let share: u64 = other.strip_prefix("local:")?.trim().parse().ok()?;
            FailurePolicy::local(share)
        }
    }
}

/// What [`parse_policy`] reads back.
pub(super) fn policy_text(policy: FailurePolicy) -> String {
    match policy {
        FailurePolicy::FailOpen => "fail_open".to_owned(),
        FailurePolicy::FailClosed => "fail_closed".to_owned(),
        FailurePolicy::Local { share } => format!("local:{share}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_policies_read_as_in_the_docs_and_write_back() {
        assert_eq!(parse_policy("fail_open"), Some(FailurePolicy::FailOpen));
        assert_eq!(parse_policy("fail_closed"), Some(FailurePolicy::FailClosed));
        assert_eq!(parse_policy("local:3"), FailurePolicy::local(3));
        assert_eq!(parse_policy("local:0"), None);
        assert_eq!(parse_policy("local"), None);
        assert_eq!(parse_policy("closed"), None);
        for policy in [
            FailurePolicy::FailOpen,
            FailurePolicy::FailClosed,
            FailurePolicy::local(7).unwrap(),
        ] {
            assert_eq!(parse_policy(&policy_text(policy)), Some(policy));
        }
    }
}
