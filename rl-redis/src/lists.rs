//! The allow and deny lists every instance of one key prefix shares
//! ([`ratewall::backend::Backend::save_list_entry`], [`ratewall::backend::Backend::load_lists`]).
//!
//! - key `<prefix>:{lists}`: a hash; field the JSON array `[name, identity]`
//!   (`name` empty for every limit, `identity` in key form), value the JSON
//!   entry `{"kind":"deny","expires_at_ms":1700000000000}` (`null`: no
//!   expiry). Like the limits registry, its own hash tag keeps it one key on
//!   Redis Cluster and under the prefix for key-pattern ACLs.
//! - key `<prefix>:{lists}:version`: incremented by every change, in the
//!   same script call as the change; readers re-read the hash only when it
//!   moved.
//!
//! Expired entries are skipped when read. Entries are kept until removed:
//! they are operators' decisions, not state that refills.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ratewall::{
    backend::SharedLists,
    error::BackendError,
    lists::{ListEntry, ListKind},
};
use serde_json::{Value, json};

use crate::backend::RedisBackend;
use crate::registry::{Query, RegistryScript};

static SAVE: RegistryScript = RegistryScript::new(include_str!("lua/lists_save.lua"));
static LOAD: RegistryScript = RegistryScript::new(include_str!("lua/lists_load.lua"));

impl RedisBackend {
    /// The lists hash of `prefix`: `<prefix>:{lists}`.
    ///
    /// ```
    /// assert_eq!(ratewall_redis::RedisBackend::lists_key("app"), "app:{lists}");
    /// ```
    pub fn lists_key(prefix: &str) -> String {
        format!("{prefix}:{{lists}}")
    }

    pub(crate) async fn save_list(
        &self,
        prefix: &str,
        entry: &ListEntry,
        removed: bool,
    ) -> Result<(), BackendError> {
        let key = Self::lists_key(prefix);
        let field = json!([entry.name.as_deref().unwrap_or(""), entry.identity]).to_string();
        let value = if removed {
            String::new()
        } else {
            json!({
                "kind": entry.kind.name(),
                "expires_at_ms": entry.expires_at.map(millis),
            })
            .to_string()
        };
        let _: i64 = self
            .registry_query(
                "writing the allow and deny lists",
                Query::Script(
                    &SAVE,
                    vec![key.clone(), format!("{key}:version")],
                    vec![field, value],
                ),
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn load_list(
        &self,
        prefix: &str,
        known: u64,
    ) -> Result<Option<SharedLists>, BackendError> {
        let key = Self::lists_key(prefix);
        let reply: Vec<redis::Value> = self
            .registry_query(
                "reading the allow and deny lists",
                Query::Script(
                    &LOAD,
                    vec![key.clone(), format!("{key}:version")],
                    vec![known.to_string()],
                ),
            )
            .await?;
        let protocol = |what: &str| {
            BackendError::protocol(format_args!("allow and deny lists `{key}`: {what}"))
        };
        let mut items = reply.into_iter();
        let version: u64 = match items.next() {
            Some(redis::Value::Int(v)) => {
                u64::try_from(v).map_err(|_| protocol("negative version"))?
            }
            _ => return Err(protocol("no version")),
        };
        if version == known {
            return Ok(None);
        }
        let texts: Vec<String> = items
            .map(|item| redis::from_redis_value(item).map_err(|_| protocol("a field is not text")))
            .collect::<Result<_, _>>()?;
        let now = SystemTime::now();
        let mut entries = Vec::with_capacity(texts.len() / 2);
        for pair in texts.chunks(2) {
            let [field, value] = pair else {
                return Err(protocol("an odd number of values"));
            };
            let entry = decode(field, value)
                .map_err(|reason| protocol(&format!("field {field}: {reason}")))?;
            if entry.expires_at.is_none_or(|at| at > now) {
                entries.push(entry);
            }
        }
        Ok(Some((version, entries)))
    }
}

fn millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One field and value of the lists hash.
fn decode(field: &str, value: &str) -> Result<ListEntry, String> {
    let field: Value = serde_json::from_str(field).map_err(|e| e.to_string())?;
    let [Value::String(name), Value::String(identity)] =
        field.as_array().map(Vec::as_slice).unwrap_or_default()
    else {
        return Err("expected [name, identity]".into());
    };
    let value: Value = serde_json::from_str(value).map_err(|e| e.to_string())?;
    let kind: ListKind = value["kind"].as_str().ok_or("no kind")?.parse()?;
    let expires_at = match &value["expires_at_ms"] {
        Value::Null => None,
        other => Some(UNIX_EPOCH + Duration::from_millis(other.as_u64().ok_or("a bad expiry")?)),
    };
    Ok(ListEntry::new(
        kind,
        (!name.is_empty()).then_some(name.as_str()),
        identity.clone(),
        expires_at,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_through_their_field_and_value() {
        let entry = ListEntry::new(
            ListKind::Deny,
            Some("sms_phone"),
            "+33 6",
            Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_000)),
        );
        let field = json!([entry.name.as_deref().unwrap_or(""), entry.identity]).to_string();
        let value = json!({"kind": "deny", "expires_at_ms": 1_700_000_000_000u64}).to_string();
        assert_eq!(decode(&field, &value), Ok(entry));
        let every = decode(
            r#"["","10.0.0.1"]"#,
            r#"{"kind":"allow","expires_at_ms":null}"#,
        )
        .unwrap();
        assert_eq!(
            (every.name, every.kind, every.expires_at),
            (None, ListKind::Allow, None)
        );
        assert!(decode("x", "{}").is_err());
        assert!(decode(r#"["a","b"]"#, r#"{"kind":"block"}"#).is_err());
    }
}
