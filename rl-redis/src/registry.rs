//! The limits registry: which limit names a deployment decides in Redis, and
//! with which limits, for operators' tools (e.g. the `ratewall` CLI).
//!
//! The limiter publishes a name's limits on its first remote decision for
//! that name, again every hour and after `Settings::set_limits`
//! ([`ratewall::backend::Backend::publish_limits`]). [`RedisBackend`] keeps them in one
//! hash per key prefix:
//!
//! - key `<prefix>:{limits}`: its own hash tag, so it is a single key on Redis
//!   Cluster, and it still starts with `<prefix>:` (key-pattern ACLs such as
//!   `~app:*` cover it). It can never be an identity's key: those have a
//!   `:` inside their hash tag.
//! - field: the limit name, which is also the scope of its identities' keys.
//! - value: JSON, e.g.
//!   `{"v":1,"published_at_ms":1700000000000,"limits":[{"rate":"1/1m","algorithm":"sliding_log","threshold":1,"period_us":60000000,"burst":1,"slots":10,"capacity":1,"suffix":"sl:60000000"}]}`
//!   (a leasing limit also has `"lease"`: units one process may lease; a
//!   limit that blocks, `"block_us"`: how long, see
//!   [`ratewall::Limit::with_block`]). The identity's blocks are at
//!   `<ratewall::Key::new(prefix, name, id)>:b`, a hash of the blocking
//!   limits' suffixes to the blocks' ends.
//!   The state of identity `id` under limit name `name` and one of its limits
//!   is at `<ratewall::Key::new(prefix, name, id)>:<suffix>`, one key.
//! - TTL: [`RedisBackend::REGISTRY_TTL`] (7 days), set again on every
//!   publish: a deployment that stops deciding leaves nothing behind.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ratewall::{Algorithm, Limit, error::BackendError};
use redis::{Cmd, FromRedisValue};
use serde_json::{Value, json};

use crate::backend::RedisBackend;
use crate::error::from_redis;
use crate::script::is_missing_code;

/// The value format written by this version (`"v"` in the JSON).
const FORMAT_VERSION: u64 = 1;

/// One limit name as the registry holds it.
///
/// ```
/// use ratewall::Limit;
/// use ratewall_redis::RegisteredLimits;
/// use std::time::UNIX_EPOCH;
///
/// let registered = RegisteredLimits::new("sms", vec![Limit::per_minute(1)?], UNIX_EPOCH);
/// assert_eq!(registered.name, "sms");
/// assert_eq!(registered.limits[0].threshold(), 1);
/// # Ok::<(), ratewall::error::LimitError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegisteredLimits {
    /// The limit name: the `name` of `#[rate_limit]` (or of an `also(...)`
    /// group), which is also the scope of its identities' keys.
    pub name: String,
    /// Its limits, as last published, in the order they are decided.
    pub limits: Vec<Limit>,
    /// When they were last published (by the publisher's clock).
    pub published_at: SystemTime,
}

impl RegisteredLimits {
    /// A registry entry (what [`RedisBackend::registered_limits`] returns).
    pub fn new(name: impl Into<String>, limits: Vec<Limit>, published_at: SystemTime) -> Self {
        Self {
            name: name.into(),
            limits,
            published_at,
        }
    }
}

/// A Lua script of the registry or the lists: its source and SHA1, the
/// SHA computed once.
pub(crate) struct RegistryScript {
    source: &'static str,
    sha: OnceLock<String>,
}

impl RegistryScript {
    pub(crate) const fn new(source: &'static str) -> Self {
        Self {
            source,
            sha: OnceLock::new(),
        }
    }

    fn sha(&self) -> &str {
        self.sha
            .get_or_init(|| redis::Script::new(self.source).get_hash().to_owned())
    }
}

/// Writes one field and the TTL together (`lua/registry.lua`).
static PUBLISH: RegistryScript = RegistryScript::new(include_str!("lua/registry.lua"));

/// A command or a script call on the registry or lists keys.
pub(crate) enum Query {
    /// A script: keys, then arguments. Sent as `EVALSHA`, and as `EVAL`
    /// (which needs nothing cached) when the server lacks it.
    Script(&'static RegistryScript, Vec<String>, Vec<String>),
    Cmd(Cmd),
}

impl Query {
    fn script_command(
        script: &RegistryScript,
        keys: &[String],
        args: &[String],
        with_source: bool,
    ) -> Cmd {
        let mut cmd = if with_source {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(script.source);
            cmd
        } else {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(script.sha());
            cmd
        };
        cmd.arg(keys.len()).arg(keys).arg(args);
        cmd
    }
}

impl RedisBackend {
    /// How long the registry of a prefix lives after its last publish: 7 days.
    pub const REGISTRY_TTL: Duration = Duration::from_secs(7 * 86_400);

    /// The registry key of `prefix`: `<prefix>:{limits}`.
    ///
    /// ```
    /// assert_eq!(ratewall_redis::RedisBackend::registry_key("app"), "app:{limits}");
    /// ```
    pub fn registry_key(prefix: &str) -> String {
        format!("{prefix}:{{limits}}")
    }

    /// Every limit name published under `prefix`, sorted by name (empty when
    /// nothing was published in the last [`RedisBackend::REGISTRY_TTL`]).
    ///
    /// # Errors
    /// [`BackendError::Timeout`] when Redis does not answer within the call
    /// timeout; [`BackendError::Unavailable`] or [`BackendError::Protocol`]
    /// when it cannot be reached or answers with an error;
    /// [`BackendError::Protocol`] naming the field when an entry cannot be
    /// read (e.g. written by a newer version of this crate).
    pub async fn registered_limits(
        &self,
        prefix: &str,
    ) -> Result<Vec<RegisteredLimits>, BackendError> {
        let key = Self::registry_key(prefix);
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(&key);
        let entries: BTreeMap<String, String> = self
            .registry_query("reading the limits registry", Query::Cmd(cmd))
            .await?;
        entries
            .iter()
            .map(|(name, value)| {
                decode(name, value).map_err(|reason| unreadable(&key, name, &reason))
            })
            .collect()
    }

    /// Every prefix with a limits registry in this Redis, sorted: the
    /// prefixes of the deployments that decided a call in the last
    /// [`RedisBackend::REGISTRY_TTL`] (e.g. to tell an operator who asked for
    /// the wrong prefix which ones exist).
    ///
    /// Found with `SCAN ... MATCH *:{limits} TYPE hash` (never `KEYS`), a
    /// page of 1000 keys per call, each call within the per-call timeout. On
    /// Redis Cluster every registry key has the hash tag `{limits}`, so one
    /// master holds them all and only it is scanned.
    ///
    /// # Errors
    /// [`BackendError::Timeout`] when a page of the scan does not come within
    /// the call timeout; [`BackendError::Unavailable`] or
    /// [`BackendError::Protocol`] when Redis cannot be reached or answers with
    /// an error.
    pub async fn registered_prefixes(&self) -> Result<Vec<String>, BackendError> {
        let (connection, settings) = self.parts();
        let suffix = Self::registry_key("");
        let pattern = format!("*{}", escape_glob(&suffix));
        let mut prefixes = std::collections::BTreeSet::new();
        let mut cursor = 0_u64;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .arg("TYPE")
                .arg("hash");
            let deadline = tokio::time::Instant::now() + settings.timeout;
            let page: (u64, Vec<String>) =
                match connection.query_at_key(deadline, &suffix, &cmd).await {
                    None => return Err(BackendError::Timeout(settings.timeout)),
                    Some(Err(err)) => {
                        return Err(from_redis(
                            &format_args!("scanning for limits registries on {}", settings.target),
                            &err,
                            settings.timeout,
                        ));
                    }
                    Some(Ok(page)) => page,
                };
            prefixes.extend(
                page.1
                    .iter()
                    .filter_map(|key| key.strip_suffix(suffix.as_str()))
                    .filter(|prefix| !prefix.is_empty())
                    .map(str::to_owned),
            );
            cursor = page.0;
            if cursor == 0 {
                return Ok(prefixes.into_iter().collect());
            }
        }
    }

    /// The limits published under `prefix` for `name`, if any.
    ///
    /// # Errors
    /// [`BackendError::Timeout`] when Redis does not answer within the call
    /// timeout; [`BackendError::Unavailable`] or [`BackendError::Protocol`] when
    /// it cannot be reached or answers with an error; [`BackendError::Protocol`]
    /// naming the field when the entry cannot be read (e.g. written by a newer
    /// version of this crate).
    pub async fn registered(
        &self,
        prefix: &str,
        name: &str,
    ) -> Result<Option<RegisteredLimits>, BackendError> {
        let key = Self::registry_key(prefix);
        let mut cmd = redis::cmd("HGET");
        cmd.arg(&key).arg(name);
        let value: Option<String> = self
            .registry_query("reading the limits registry", Query::Cmd(cmd))
            .await?;
        value
            .map(|value| decode(name, &value).map_err(|reason| unreadable(&key, name, &reason)))
            .transpose()
    }

    /// Records `limits` as those of `name` under `prefix` and sets the
    /// registry's TTL again ([`ratewall::backend::Backend::publish_limits`]).
    pub(crate) async fn publish(
        &self,
        prefix: &str,
        name: &str,
        limits: &[Limit],
    ) -> Result<(), BackendError> {
        let published_at_ms = match &self.parts().1.clock {
            Some(clock) => clock.now_micros() / 1_000,
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        };
        let args = vec![
            name.to_owned(),
            encode(limits, published_at_ms),
            (Self::REGISTRY_TTL.as_millis() as u64).to_string(),
        ];
        let _: i64 = self
            .registry_query(
                "publishing to the limits registry",
                Query::Script(&PUBLISH, vec![Self::registry_key(prefix)], args),
            )
            .await?;
        Ok(())
    }

    /// Runs `query` within the per-call timeout, mapping failures like the
    /// rate-limit script's.
    pub(crate) async fn registry_query<T: FromRedisValue>(
        &self,
        what: &str,
        query: Query,
    ) -> Result<T, BackendError> {
        let (connection, settings) = self.parts();
        let deadline = tokio::time::Instant::now() + settings.timeout;
        let result = match &query {
            Query::Cmd(cmd) => connection.query(deadline, cmd).await,
            Query::Script(script, keys, args) => {
                match connection
                    .query(deadline, &Query::script_command(script, keys, args, false))
                    .await
                {
                    Some(Err(err)) if is_missing_code(&err) => {
                        connection
                            .query(deadline, &Query::script_command(script, keys, args, true))
                            .await
                    }
                    other => other,
                }
            }
        };
        match result {
            None => Err(BackendError::Timeout(settings.timeout)),
            Some(Err(err)) => Err(from_redis(
                &format_args!("{what} on {}", settings.target),
                &err,
                settings.timeout,
            )),
            Some(Ok(value)) => Ok(value),
        }
    }
}

/// `text` as a `SCAN MATCH` pattern matching exactly itself.
fn escape_glob(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len() + 4);
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

fn unreadable(key: &str, name: &str, reason: &str) -> BackendError {
    BackendError::protocol(format_args!(
        "limits registry `{key}`, field `{name}`: {reason}"
    ))
}

/// `"5/1h"` from `"5/1h (gcra)"`.
fn rate(limit: &Limit) -> String {
    let text = limit.to_string();
    match text.split_once(" (") {
        Some((rate, _)) => rate.to_owned(),
        None => text,
    }
}

/// The registry value describing `limits`.
fn encode(limits: &[Limit], published_at_ms: u64) -> String {
    let limits: Vec<Value> = limits
        .iter()
        .map(|limit| {
            let mut described = json!({
                "rate": rate(limit),
                "algorithm": limit.algorithm().name(),
                "threshold": limit.threshold(),
                "period_us": limit.period_micros(),
                "burst": limit.burst(),
                "slots": limit.slots(),
                "capacity": limit.capacity(),
                "suffix": limit.storage_suffix(),
            });
            if let Some(lease) = limit.lease() {
                described["lease"] = json!(lease);
            }
            if limit.block().is_some() {
                described["block_us"] = json!(limit.block_micros());
            }
            described
        })
        .collect();
    json!({ "v": FORMAT_VERSION, "published_at_ms": published_at_ms, "limits": limits }).to_string()
}

/// Reads a registry value back (unknown JSON members are ignored).
fn decode(name: &str, text: &str) -> Result<RegisteredLimits, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let number = |value: &Value, member: &str| {
        value
            .get(member)
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("`{member}` is missing or not a non-negative integer"))
    };
    let version = number(&value, "v")?;
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version} is not understood (this version reads {FORMAT_VERSION})"
        ));
    }
    let published_at = UNIX_EPOCH + Duration::from_millis(number(&value, "published_at_ms")?);
    let limits = value
        .get("limits")
        .and_then(Value::as_array)
        .filter(|limits| !limits.is_empty())
        .ok_or("`limits` is missing or empty")?
        .iter()
        .map(|limit| {
            let algorithm: Algorithm = limit
                .get("algorithm")
                .and_then(Value::as_str)
                .ok_or("`algorithm` is missing or not a string")?
                .parse()
                .map_err(|e| format!("{e}"))?;
            let built = Limit::from_parts(
                number(limit, "threshold")?,
                number(limit, "period_us")?,
                algorithm,
                number(limit, "burst")?,
                number(limit, "slots")?,
            );
            let lease = match limit.get("lease") {
                None => None,
                Some(_) => Some(number(limit, "lease")?),
            };
            let block = match limit.get("block_us") {
                None => None,
                Some(_) => Some(Duration::from_micros(number(limit, "block_us")?)),
            };
            let built = match lease {
                None => built,
                Some(lease) => built.and_then(|l| l.with_lease(lease)),
            };
            match block {
                None => built,
                Some(block) => built.and_then(|l| l.with_block(block)),
            }
            .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(RegisteredLimits::new(name, limits, published_at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_algorithm() -> Vec<Limit> {
        Algorithm::ALL
            .into_iter()
            .map(|algorithm| {
                let limit = Limit::per_hour(20)
                    .and_then(|l| l.with_burst(7))
                    .and_then(|l| l.with_slots(12))
                    .and_then(|l| l.with_algorithm(algorithm))
                    .unwrap();
                // Every algorithm that can lease does, in the registry too.
                limit.with_lease(3).unwrap_or(limit)
            })
            .chain([Limit::per_day(5)
                .and_then(|l| l.with_block(Duration::from_secs(3_600)))
                .unwrap()])
            .collect()
    }

    #[test]
    fn registry_values_read_back_as_the_same_limits() {
        let limits = every_algorithm();
        let decoded = decode("sms", &encode(&limits, 1_700_000_000_123)).unwrap();
        assert_eq!(decoded.name, "sms");
        assert_eq!(decoded.limits, limits);
        assert_eq!(
            decoded.published_at,
            UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)
        );
    }

    #[test]
    fn registry_values_carry_the_rate_and_storage_suffixes_for_tools() {
        let limit = Limit::per_minute(1)
            .and_then(|l| l.with_algorithm(Algorithm::SlidingLog))
            .unwrap();
        let value: Value = serde_json::from_str(&encode(&[limit], 0)).unwrap();
        let described = &value["limits"][0];
        assert_eq!(described["rate"], "1/1m");
        assert_eq!(described["algorithm"], "sliding_log");
        assert_eq!(described["suffix"], limit.storage_suffix());
    }

    #[test]
    fn unreadable_registry_values_say_why() {
        assert!(decode("x", "nope").unwrap_err().contains("not JSON"));
        let newer = r#"{"v":2,"published_at_ms":0,"limits":[]}"#;
        assert!(decode("x", newer).unwrap_err().contains("version 2"));
        let zero = r#"{"v":1,"published_at_ms":0,"limits":[{"algorithm":"gcra","threshold":0,"period_us":1,"burst":1,"slots":1}]}"#;
        assert!(decode("x", zero).unwrap_err().contains("threshold"));
        let unknown = r#"{"v":1,"published_at_ms":0,"limits":[{"algorithm":"magic","threshold":1,"period_us":1,"burst":1,"slots":1}]}"#;
        assert!(decode("x", unknown).unwrap_err().contains("magic"));
    }

    #[test]
    fn glob_characters_are_escaped_in_scan_patterns() {
        assert_eq!(escape_glob(":{limits}"), ":{limits}");
        assert_eq!(escape_glob("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn the_registry_key_has_its_own_hash_tag_under_the_prefix() {
        assert_eq!(RedisBackend::registry_key("app:rl"), "app:rl:{limits}");
    }
}
