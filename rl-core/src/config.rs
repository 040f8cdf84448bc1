//! Limits from a TOML file (feature `config`): per limit name its rates,
//! algorithm, burst, failure policy and shadow mode, and the allow and deny
//! lists, applied to a running [`Limiter`] all-or-nothing.

use std::collections::BTreeMap;
use std::path::Path;

use crate::limiter::Limiter;
use crate::model::error::LimitError;
use crate::model::limit::{Algorithm, Limit};
use crate::model::lists::{ListEntry, ListKind, key_form};
use crate::model::policy::FailurePolicy;

/// The keys a limit's table may hold.
const KEYS: &str =
    "`rates`, `algorithm`, `burst`, `slots`, `lease`, `block_for`, `on_error`, `shadow`";

/// A limits file that can never be built from a bad file: the message names
/// the limit, the key and the bad value, and says what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read limits file {path}: {message}")]
    Read {
        /// The file's path.
        path: String,
        /// The operating system's reason.
        message: String,
    },
    /// The text is not TOML (the message gives the line and column).
    #[error("limits file is not valid TOML: {0}")]
    Syntax(String),
    /// A top-level key other than `limits` and `lists`.
    #[error(
        "unknown top-level key `{0}`; expected `limits` (e.g. `[limits.sms_phone]`) or `lists` (e.g. `[lists.sms_phone]`)"
    )]
    UnknownTopLevelKey(String),
    /// A malformed `lists` table.
    #[error(
        "lists{}: {message}; expected `allow = [\"id\", ...]` and `deny = [\"id\", ...]` in `[lists]` (every limit) or `[lists.<name>]`",
        .name.as_ref().map(|n| format!(" of `{n}`")).unwrap_or_default()
    )]
    BadList {
        /// The limit name (`None`: the lists of every limit).
        name: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// `limits` is not a table.
    #[error("`limits` must be a table of limit names, e.g. `[limits.sms_phone]`; got {0}")]
    LimitsNotATable(String),
    /// A limit name is empty.
    #[error("limit names must not be empty")]
    EmptyName,
    /// `limits.<name>` is not a table.
    #[error(
        "limit `{name}` must be a table, e.g. `[limits.{name}]` with `rates = [\"5/1h\"]`; got {value}"
    )]
    NotATable {
        /// The limit name.
        name: String,
        /// The value found instead, as TOML.
        value: String,
    },
    /// A key that no limit has (e.g. a typo).
    #[error("limit `{name}`: unknown key `{key}`; expected one of {KEYS}")]
    UnknownKey {
        /// The limit name.
        name: String,
        /// The unknown key.
        key: String,
    },
    /// A limit without `rates`.
    #[error("limit `{name}`: `rates` is missing; e.g. `rates = [\"1/1m\", \"5/1h\"]`")]
    MissingRates {
        /// The limit name.
        name: String,
    },
    /// A value of the wrong type or out of range.
    #[error("limit `{name}`: `{key}` = {value}: {expected}")]
    BadValue {
        /// The limit name.
        name: String,
        /// The key holding the value.
        key: &'static str,
        /// The bad value, as TOML.
        value: String,
        /// What was expected instead.
        expected: String,
    },
    /// A rate that does not make a limit with the given settings.
    #[error("limit `{name}`: rate {rate:?}: {source}")]
    BadRate {
        /// The limit name.
        name: String,
        /// The rate as written.
        rate: String,
        /// Why it is not a limit.
        source: LimitError,
    },
    /// Rates that cannot go together on one key (see [`Limit::check_distinct`]).
    #[error("limit `{name}`: {source}")]
    Conflict {
        /// The limit name.
        name: String,
        /// The conflict.
        source: LimitError,
    },
}

/// The settings of one limit name in a [`LimitsFile`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsEntry {
    limits: Vec<Limit>,
    policy: Option<FailurePolicy>,
    shadow: bool,
}

impl LimitsEntry {
    /// The limits, decided together, in the file's order (never empty).
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    /// The failure policy (`on_error`), if the file sets one.
    pub fn policy(&self) -> Option<FailurePolicy> {
        self.policy
    }

    /// Whether the name is in shadow mode (`shadow = true`).
    pub fn shadow(&self) -> bool {
        self.shadow
    }
}

/// Limits per name, read from TOML:
///
/// ```toml
/// [limits.sms_phone]
/// rates = ["1/1m", "5/1h", "10/1d"]
/// algorithm = "sliding_log"   # optional, default gcra
/// burst = 10                  # optional (token bucket, leaky bucket, gcra)
/// slots = 10                  # optional (sliding_window)
/// lease = 100                 # optional: quota leasing, units per process at most
/// block_for = "15m"           # optional: once refused, refused for this long (not with lease)
/// on_error = "fail_closed"    # optional: fail_open | fail_closed | local:<share>
/// shadow = true               # optional, default false
///
/// [lists]                     # optional: identities of every limit
/// deny = ["203.0.113.9"]
///
/// [lists.sms_phone]           # optional: identities of one limit
/// allow = ["+15550100"]
/// deny = ["+33612345678"]
/// ```
///
/// A name is the `name` of `#[rate_limit]` (by default `module::function`)
/// or of an `also(...)` group, or a tier's `<name>@<tier>`, quoted:
/// `[limits."api@pro"]` (see [`crate::call::Tier`]). [`LimitsFile::apply`] sets, for each name in
/// the file, its limits, its failure policy (none given: the one of the
/// macro or the limiter) and its shadow mode, and puts the listed
/// identities on this limiter's allow and deny lists (identities are
/// written as their `Display` form; an entry from a file does not expire).
///
/// ```
/// use ratewall::{FailurePolicy, Limiter, config::LimitsFile};
///
/// let file = LimitsFile::parse(r#"
///     [limits.sms_phone]
///     rates = ["1/1m", "5/1h"]
///     algorithm = "sliding_log"
///     on_error = "local:4"
/// "#)?;
/// let limiter = Limiter::builder().build()?;
/// file.apply(&limiter)?;
/// assert_eq!(limiter.settings().limits("sms_phone").unwrap().len(), 2);
/// assert_eq!(limiter.settings().policy_for("sms_phone", None), FailurePolicy::local(4).unwrap());
///
/// let bad = LimitsFile::parse("[limits.sms_phone]\nrates = [\"5 every hour\"]").unwrap_err();
/// assert!(bad.to_string().starts_with("limit `sms_phone`: rate \"5 every hour\""));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LimitsFile {
    entries: BTreeMap<String, LimitsEntry>,
    /// Allow and deny entries (identities in key form), sorted.
    lists: Vec<ListEntry>,
}

impl LimitsFile {
    /// Reads and validates a limits file's text; nothing is applied.
    ///
    /// # Errors
    /// A [`ConfigError`] for the first problem found, naming the limit, the key
    /// and the bad value: [`ConfigError::Syntax`] when the text is not TOML;
    /// another variant when it is TOML but not a limits file (an unknown key, a
    /// table or value of the wrong type or out of range, a rate that makes no
    /// limit, rates that would share state, a malformed list).
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let table: toml::Table = toml::from_str(text)
            .map_err(|e: toml::de::Error| ConfigError::Syntax(e.to_string().trim().to_owned()))?;
        let mut entries = BTreeMap::new();
        let mut lists = Vec::new();
        for (key, value) in table {
            match key.as_str() {
                "limits" => {
                    let toml::Value::Table(limits) = value else {
                        return Err(ConfigError::LimitsNotATable(value.to_string()));
                    };
                    for (name, value) in limits {
                        let entry = parse_entry(&name, value)?;
                        entries.insert(name, entry);
                    }
                }
                "lists" => parse_lists(value, &mut lists)?,
                _ => return Err(ConfigError::UnknownTopLevelKey(key)),
            }
        }
        lists.sort_by(|a: &ListEntry, b| (&a.name, &a.identity).cmp(&(&b.name, &b.identity)));
        Ok(Self { entries, lists })
    }

    /// Reads the file at `path` and [parses](LimitsFile::parse) it.
    ///
    /// # Errors
    /// [`ConfigError::Read`], with the path and the operating system's reason,
    /// when the file cannot be read; otherwise as [`LimitsFile::parse`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::parse(&text)
    }

    /// Sets, on `limiter`, every name's limits ([`Settings::set_limits`](crate::settings::Settings::set_limits),
    /// skipped when unchanged so the state and the published limits stay),
    /// failure policy ([`Settings::set_policy`](crate::settings::Settings::set_policy)) and shadow mode
    /// ([`Settings::set_shadow`](crate::settings::Settings::set_shadow)). Everything is checked before anything is
    /// applied: on `Err`, the limiter is unchanged.
    ///
    /// # Errors
    /// [`ConfigError::Conflict`] when a name's entry has no limits or limits
    /// that would share state on one key ([`Limit::check_distinct`]). Every name
    /// is checked before anything is applied: on `Err` the limiter is
    /// unchanged.
    pub fn apply(&self, limiter: &Limiter) -> Result<(), ConfigError> {
        for (name, entry) in &self.entries {
            if entry.limits.is_empty() {
                return Err(ConfigError::Conflict {
                    name: name.clone(),
                    source: LimitError::NoLimits,
                });
            }
            Limit::check_distinct(&entry.limits).map_err(|source| ConfigError::Conflict {
                name: name.clone(),
                source,
            })?;
        }
        for entry in &self.lists {
            limiter.settings().list_locally(entry.clone());
        }
        for (name, entry) in &self.entries {
            if limiter.settings().limits(name).as_deref() != Some(entry.limits.as_slice()) {
                limiter
                    .settings()
                    .set_limits(name, entry.limits.clone())
                    .map_err(|source| ConfigError::Conflict {
                        name: name.clone(),
                        source,
                    })?;
            }
            limiter.settings().set_policy(name, entry.policy);
            limiter.settings().set_shadow(name, entry.shadow);
        }
        Ok(())
    }

    /// Like [`LimitsFile::apply`], replacing `previous` (the file applied
    /// before, e.g. on a reload): the names only `previous` has go back to
    /// their compiled-in limits, no runtime failure policy and no shadow mode.
    ///
    /// # Errors
    /// As [`LimitsFile::apply`], checked before anything changes: on `Err` the
    /// limiter is unchanged (neither this file is applied nor `previous`
    /// undone).
    pub fn apply_over(&self, previous: &LimitsFile, limiter: &Limiter) -> Result<(), ConfigError> {
        self.apply(limiter)?;
        for name in previous.names().filter(|name| self.get(name).is_none()) {
            limiter.settings().clear_limits(name);
            limiter.settings().set_policy(name, None);
            limiter.settings().set_shadow(name, false);
        }
        for gone in previous.lists.iter().filter(|old| {
            !self
                .lists
                .iter()
                .any(|e| e.name == old.name && e.identity == old.identity)
        }) {
            limiter
                .settings()
                .unlist_locally(gone.name.as_deref(), &gone.identity);
        }
        Ok(())
    }

    /// The allow and deny entries (identities in key form), sorted by name
    /// and identity.
    pub fn lists(&self) -> &[ListEntry] {
        &self.lists
    }

    /// The settings of `name`, if the file has it.
    pub fn get(&self, name: &str) -> Option<&LimitsEntry> {
        self.entries.get(name)
    }

    /// The limit names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Every name with its settings, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &LimitsEntry)> {
        self.entries
            .iter()
            .map(|(name, entry)| (name.as_str(), entry))
    }

    /// How many names the file sets.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the file sets no name.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The raw settings of one name, each value checked for its type.
#[derive(Default)]
struct Raw {
    rates: Option<Vec<String>>,
    algorithm: Option<Algorithm>,
    burst: Option<u64>,
    slots: Option<u64>,
    lease: Option<u64>,
    block: Option<std::time::Duration>,
    policy: Option<FailurePolicy>,
    shadow: Option<bool>,
}

fn parse_entry(name: &str, value: toml::Value) -> Result<LimitsEntry, ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::EmptyName);
    }
    let toml::Value::Table(table) = value else {
        return Err(ConfigError::NotATable {
            name: name.to_owned(),
            value: value.to_string(),
        });
    };
    let bad = |key: &'static str, value: &toml::Value, expected: &str| ConfigError::BadValue {
        name: name.to_owned(),
        key,
        value: value.to_string(),
        expected: expected.to_owned(),
    };
    let positive = |key: &'static str, value: &toml::Value| match value {
        toml::Value::Integer(n) if *n >= 1 => Ok(*n as u64),
        _ => Err(bad(key, value, "expected a positive integer")),
    };
    let mut raw = Raw::default();
    for (key, value) in &table {
        match key.as_str() {
            "rates" => {
                let toml::Value::Array(items) = value else {
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
                let rates = items
                    .iter()
                    .map(|item| match item {
                        toml::Value::String(rate) => Ok(rate.clone()),
                        _ => Err(bad("rates", item, "each rate is a string such as \"5/1h\"")),
                    })
                    .collect::<Result<_, _>>()?;
                raw.rates = Some(rates);
            }
            "algorithm" => {
                let algorithm = value
                    .as_str()
                    .and_then(|text| text.parse().ok())
                    .ok_or_else(|| {
                        let names: Vec<String> = Algorithm::ALL
                            .iter()
                            .map(|a| format!("\"{}\"", a.name()))
                            .collect();
                        bad(
                            "algorithm",
                            value,
                            &format!("expected one of {}", names.join(", ")),
                        )
                    })?;
                raw.algorithm = Some(algorithm);
            }
            "burst" => raw.burst = Some(positive("burst", value)?),
            "slots" => raw.slots = Some(positive("slots", value)?),
            "lease" => raw.lease = Some(positive("lease", value)?),
            "block_for" => {
                let block = match value {
                    toml::Value::String(text) => crate::model::limit::parse_duration(text).ok(),
                    toml::Value::Integer(seconds) if *seconds >= 1 => {
                        Some(std::time::Duration::from_secs(*seconds as u64))
                    }
                    _ => None,
                };
                raw.block = Some(block.ok_or_else(|| {
                    bad(
                        "block_for",
                        value,
                        "expected a duration such as \"15m\" or \"1h\", or whole seconds",
                    )
                })?);
            }
            "on_error" => {
                let policy = value.as_str().and_then(parse_policy).ok_or_else(|| {
                    bad(
                        "on_error",
                        value,
                        "expected \"fail_open\", \"fail_closed\" or \"local:<share>\" (share >= 1, e.g. \"local:4\")",
                    )
                })?;
                raw.policy = Some(policy);
            }
            "shadow" => {
                let shadow = value
                    .as_bool()
                    .ok_or_else(|| bad("shadow", value, "expected true or false"))?;
                raw.shadow = Some(shadow);
            }
            _ => {
                return Err(ConfigError::UnknownKey {
                    name: name.to_owned(),
                    key: key.clone(),
                });
            }
        }
    }
    let Some(rates) = raw.rates else {
        return Err(ConfigError::MissingRates {
            name: name.to_owned(),
        });
    };
    let limits = rates
        .iter()
        .map(|rate| {
            let mut limit = rate.parse::<Limit>();
            if let Some(slots) = raw.slots {
                limit = limit.and_then(|l| l.with_slots(slots));
            }
            if let Some(burst) = raw.burst {
                limit = limit.and_then(|l| l.with_burst(burst));
            }
            if let Some(algorithm) = raw.algorithm {
                limit = limit.and_then(|l| l.with_algorithm(algorithm));
            }
            if let Some(lease) = raw.lease {
                limit = limit.and_then(|l| l.with_lease(lease));
            }
            if let Some(block) = raw.block {
                limit = limit.and_then(|l| l.with_block(block));
            }
            limit.map_err(|source| ConfigError::BadRate {
                name: name.to_owned(),
                rate: rate.clone(),
                source,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Limit::check_distinct(&limits).map_err(|source| ConfigError::Conflict {
        name: name.to_owned(),
        source,
    })?;
    Ok(LimitsEntry {
        limits,
        policy: raw.policy,
        shadow: raw.shadow.unwrap_or(false),
    })
}

/// `[lists]`: `allow` / `deny` arrays of identities for every limit, and
/// `[lists.<name>]` tables with the same keys for one limit.
fn parse_lists(value: toml::Value, out: &mut Vec<ListEntry>) -> Result<(), ConfigError> {
    let bad = |name: Option<&str>, message: String| ConfigError::BadList {
        name: name.map(str::to_owned),
        message,
    };
    let toml::Value::Table(table) = value else {
        return Err(bad(None, format!("`lists` must be a table, got {value}")));
    };
    let mut push = |name: Option<&str>, key: &str, value: &toml::Value| {
        let kind: ListKind = key
            .parse()
            .map_err(|_| bad(name, format!("unknown key `{key}`")))?;
        let toml::Value::Array(items) = value else {
            return Err(bad(
                name,
                format!("`{key}` must be a list of strings, got {value}"),
            ));
        };
        for item in items {
            let toml::Value::String(identity) = item else {
                return Err(bad(name, format!("`{key}` holds {item}, not a string")));
            };
            if let Some(other) = out
                .iter()
                .find(|e| e.name.as_deref() == name && e.identity == key_form(identity))
            {
                return Err(bad(
                    name,
                    format!(
                        "{identity:?} is on the {} list and the {key} list",
                        other.kind
                    ),
                ));
            }
            out.push(ListEntry::new(kind, name, key_form(identity), None));
        }
        Ok(())
    };
    for (key, value) in &table {
        match value {
            toml::Value::Table(lists) => {
                if key.is_empty() {
                    return Err(bad(None, "limit names must not be empty".into()));
                }
                for (list, items) in lists {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_for_applies_to_every_rate_of_its_entry_and_keeps_its_bounds() {
        let file = LimitsFile::parse(
            "[limits.login]\nrates = [\"5/1m\", \"20/1h\"]\nblock_for = \"15m\"\n\
             [limits.api]\nrates = [\"5/1s\"]\nblock_for = 30",
        )
        .unwrap();
        let login = file.get("login").unwrap().limits();
        assert!(
            login
                .iter()
                .all(|l| l.block() == Some(std::time::Duration::from_secs(900)))
        );
        let api = file.get("api").unwrap().limits();
        assert_eq!(api[0].block(), Some(std::time::Duration::from_secs(30)));
        for (value, expected) in [
            ("\"31d\"", "from 1ms to 30d"),
            ("\"soon\"", "expected a duration"),
            ("0", "expected a duration"),
        ] {
            let error = LimitsFile::parse(&format!(
                "[limits.x]\nrates = [\"1/1s\"]\nblock_for = {value}"
            ))
            .unwrap_err()
            .to_string();
            assert!(error.contains(expected), "{value}: {error}");
        }
        let error =
            LimitsFile::parse("[limits.x]\nrates = [\"9/1s\"]\nlease = 2\nblock_for = \"1m\"")
                .unwrap_err()
                .to_string();
        assert!(error.contains("cannot both lease and block"), "{error}");
    }

    #[test]
    fn failure_policies_read_as_in_the_docs() {
        assert_eq!(parse_policy("fail_open"), Some(FailurePolicy::FailOpen));
        assert_eq!(parse_policy("fail_closed"), Some(FailurePolicy::FailClosed));
        assert_eq!(parse_policy("local:3"), FailurePolicy::local(3));
        assert_eq!(parse_policy("local:0"), None);
        assert_eq!(parse_policy("local"), None);
        assert_eq!(parse_policy("closed"), None);
    }
}
