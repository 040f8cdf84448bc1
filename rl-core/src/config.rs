//! Limits files (feature `serde`; TOML with feature `config`): per limit
//! name its rates, algorithm, burst, failure policy and shadow mode, and
//! the allow and deny lists, applied to a running [`Limiter`]
//! all-or-nothing. Read from TOML ([`LimitsFile::parse`], [`LimitsFile::load`])
//! or from any self-describing serde format (`Deserialize for LimitsFile`,
//! [`LimitsFile::from_deserializer`]): YAML, JSON, a config-rs or figment
//! tree. Every format goes through one reader, with the same checks and
//! messages.

use std::collections::BTreeMap;
#[cfg(feature = "config")]
use std::path::Path;

use serde_core::de::{Deserialize, Deserializer, Error as _};

use crate::limiter::Limiter;
use crate::model::error::LimitError;
use crate::model::limit::Limit;
use crate::model::lists::ListEntry;
use crate::model::policy::FailurePolicy;
use crate::model::value::Value;

// Reading a file from any format's values, and writing it back.
mod read;
mod write;

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
    /// A key given twice in one table (a format such as JSON lets it
    /// through; TOML and YAML refuse it as a syntax error).
    #[error(
        "{}`{key}` given twice; keep one",
        .name.as_ref().map(|n| format!("limit `{n}`: ")).unwrap_or_default()
    )]
    Duplicate {
        /// The limit name, when the key is one of its settings.
        name: Option<String>,
        /// The key (`limits.<name>` for a limit name given twice).
        key: String,
    },
    /// The whole file is not a table (e.g. a YAML list).
    #[error(
        "a limits file is a table of `limits` (e.g. `[limits.sms_phone]`) and `lists`; got {0}"
    )]
    NotAFile(String),
    /// The format itself failed (e.g. JSON that does not parse), in
    /// [`LimitsFile::from_deserializer`]: its message.
    #[error("limits configuration cannot be read: {0}")]
    Format(String),
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

/// Limits per name, read from TOML ([`LimitsFile::parse`]) or any
/// self-describing serde format (`Deserialize`), and written back to any
/// (`Serialize`):
///
/// ```toml
/// [limits.sms_phone]
/// rates = ["1/1m", "5/1h", "10/1d"]
/// algorithm = "sliding_log"   # optional, default gcra
/// block_for = "15m"           # optional: once refused, refused for this long (not with lease)
/// on_error = "fail_closed"    # optional: fail_open | fail_closed | local:<share>
/// shadow = true               # optional, default false
///
/// [limits.api]
/// rates = ["600/1m", "10000/1d", { rate = "20/1s", algorithm = "sliding_window", slots = 20 }]
/// burst = 50                  # optional (token bucket, leaky bucket, gcra)
/// slots = 10                  # optional (sliding_window)
/// lease = 100                 # optional: quota leasing, units per process at most
///
/// [limits.export]
/// rates = ["100/1h", { max_in_flight = 4, in_flight_ttl = "30s" }]
///
/// [lists]                     # optional: identities of every limit
/// deny = ["203.0.113.9"]
///
/// [lists.sms_phone]           # optional: identities of one limit
/// allow = ["+15550100"]
/// deny = ["+33612345678"]
/// ```
///
/// Each rate is a rate (`"5/1h"`, `"10 per minute"`) or a limit's table,
/// the forms of [`Limit`]'s `Deserialize`: the name's `algorithm`,
/// `burst`, `slots`, `lease` and `block_for` apply to the rates written as
/// text, while a table carries its own (`{ rate = "20/1s", algorithm =
/// "sliding_window", slots = 20 }`), and `{ max_in_flight = 4,
/// in_flight_ttl = "30s" }` is a concurrency limit. `burst` is refused
/// where the algorithm has none (the window algorithms) and `slots` off
/// `sliding_window`, as in the macro. `block_for` (a duration such as
/// `"15m"`, or whole seconds; 1 ms to 30 days) is a penalty box
/// ([`Limit::with_block`]), refused beside `lease`.
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
    #[cfg(feature = "config")]
    #[cfg_attr(docsrs, doc(cfg(feature = "config")))]
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let value: Value = toml::from_str(text)
            .map_err(|e: toml::de::Error| ConfigError::Syntax(e.to_string().trim().to_owned()))?;
        read::file(&value)
    }

    /// Reads and validates a limits file from any self-describing serde
    /// format's deserializer (a `serde_json::Value`, a `config::Value`, a
    /// YAML document...), with the typed [`ConfigError`] that
    /// `Deserialize for LimitsFile` turns into the format's error.
    ///
    /// ```
    /// use ratewall::config::{ConfigError, LimitsFile};
    /// // A table from a TOML document of the application's own: any
    /// // deserializer does (a `serde_json::Value`, a `config::Value`, ...).
    /// let app: toml::Table = toml::from_str(r#"
    ///     [ratewall.limits.sms_phone]
    ///     rates = ["1/1m", { rate = "5/1h", algorithm = "sliding_log" }]
    /// "#)?;
    /// let file = LimitsFile::from_deserializer(app["ratewall"].clone())?;
    /// assert_eq!(file.get("sms_phone").unwrap().limits().len(), 2);
    ///
    /// let bad: toml::Table = toml::from_str("limits.sms_phone.rates = [\"5 every hour\"]")?;
    /// let error = LimitsFile::from_deserializer(toml::Value::Table(bad)).unwrap_err();
    /// assert!(matches!(&error, ConfigError::BadRate { name, .. } if name == "sms_phone"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::Format`] with the format's message when the
    /// deserializer fails on its own (text that does not parse, a value it
    /// cannot give); otherwise as [`LimitsFile::parse`], the first problem
    /// found naming the limit, the key and the value.
    pub fn from_deserializer<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Self, ConfigError> {
        let value =
            Value::deserialize(deserializer).map_err(|e| ConfigError::Format(e.to_string()))?;
        read::file(&value)
    }

    /// Reads the file at `path` and [parses](LimitsFile::parse) it.
    ///
    /// # Errors
    /// [`ConfigError::Read`], with the path and the operating system's reason,
    /// when the file cannot be read; otherwise as [`LimitsFile::parse`].
    #[cfg(feature = "config")]
    #[cfg_attr(docsrs, doc(cfg(feature = "config")))]
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

/// Read from any self-describing serde format, through the reader of
/// [`LimitsFile::parse`]: the same keys, checks and messages, a problem
/// becoming the format's error with the [`ConfigError`]'s message, which
/// names the limit (`limit `sms_phone`: rate "5 every hour": ...`). For
/// the typed error, use [`LimitsFile::from_deserializer`].
///
/// In an application's configuration, a `LimitsFile` field (or
/// `config.get::<LimitsFile>("ratewall")` with config-rs,
/// `figment.extract_inner::<LimitsFile>("ratewall")` with figment) reads
/// the section; the error carries the limit's name in its message, and
/// the section's path where the library adds it.
///
/// ```
/// use ratewall::config::LimitsFile;
///
/// let doc: toml::Table = toml::from_str(r#"
///     [ratewall.limits."api@pro"]
///     rates = ["1000/1m", { max_in_flight = 20 }]
/// "#)?;
/// let file: LimitsFile = doc["ratewall"].clone().try_into()?;
/// assert!(file.get("api@pro").unwrap().limits()[1].is_in_flight());
///
/// let bad: toml::Table = toml::from_str("limits.sms.rates = [{ rate = \"5/1h\", algorithm = \"fixed_window\", burst = 9 }]")?;
/// let error = toml::Value::Table(bad).try_into::<LimitsFile>().unwrap_err().to_string();
/// assert!(error.contains("limit `sms`: rate \"5/1h\": `burst` has no effect with `fixed_window`"), "{error}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl<'de> Deserialize<'de> for LimitsFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        read::file(&value).map_err(D::Error::custom)
    }
}
