//! A limit in configuration (feature `serde`): read from the forms the
//! macro and the limits file accept, through the same parsing and checks
//! ([`Limit::from_str`](std::str::FromStr), the builders,
//! [`ratewall_grammar::check_settings`]), and written in the shortest form
//! that reads back to the same limit.
//!
//! - A rate: `"10/1m"`, `"10 per minute"`, `"5/30s"` (gcra, burst = threshold).
//! - A rate limit's table: `{ rate = "10/1m", algorithm = "sliding_window",
//!   slots = 20, burst = 5, lease = 100 }` or `{ rate = "5/1m", block_for =
//!   "15m" }` (every key but `rate` optional; `block_for` a duration or whole
//!   seconds, see [`Limit::with_block`]).
//! - A concurrency limit's table: `{ max_in_flight = 10, in_flight_ttl =
//!   "30s" }` (`in_flight_ttl` optional: 10 s), as the macro's
//!   `max_in_flight` and `in_flight_ttl`.

use std::fmt;
use std::time::Duration;

use ratewall_grammar::Problem;
use serde_core::de::{self, Deserialize, Deserializer};
use serde_core::ser::{Serialize, SerializeStruct, Serializer};

use super::{Algorithm, Limit, parse_duration};
use crate::model::error::LimitError;
use crate::model::value::Value;

/// The keys of a rate limit's table.
const RATE_KEYS: [&str; 6] = ["rate", "algorithm", "burst", "slots", "lease", "block_for"];
/// The keys of a concurrency limit's table.
const IN_FLIGHT_KEYS: [&str; 2] = ["max_in_flight", "in_flight_ttl"];
/// What a limit is written as, for messages.
const FORMS: &str = "a rate such as \"5/1h\" or \"10 per minute\", or a table such as \
                     { rate = \"5/1h\", algorithm = \"sliding_log\" } or { max_in_flight = 10 }";

/// A rate's settings: those of a limit's table, or those a limits file's
/// entry gives beside its `rates` (`algorithm`, `burst`, `slots`, `lease`,
/// `block_for`) for the rates written as text.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RateSettings {
    pub(crate) algorithm: Option<Algorithm>,
    pub(crate) burst: Option<u64>,
    pub(crate) slots: Option<u64>,
    pub(crate) lease: Option<u64>,
    /// `block_for`: a penalty box ([`Limit::with_block`]).
    pub(crate) block: Option<Duration>,
}

impl RateSettings {
    /// Reads `key` into these settings, if it is one of them: its name,
    /// or `None` for another key.
    pub(crate) fn read(
        &mut self,
        key: &str,
        value: &Value,
    ) -> Result<Option<&'static str>, FormError> {
        Ok(Some(match key {
            "algorithm" => {
                self.algorithm = Some(algorithm(value)?);
                "algorithm"
            }
            "burst" => {
                self.burst = Some(positive("burst", value)?);
                "burst"
            }
            "slots" => {
                self.slots = Some(positive("slots", value)?);
                "slots"
            }
            "lease" => {
                self.lease = Some(positive("lease", value)?);
                "lease"
            }
            "block_for" => {
                self.block = Some(block(value)?);
                "block_for"
            }
            _ => return Ok(None),
        }))
    }
}

/// Why a value is not a limit. The limits file names the limit in front
/// of it (`ConfigError`); alone, its message is the serde error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FormError {
    /// A rate, as written, that makes no limit with its settings.
    Rate {
        /// The rate as written.
        rate: String,
        /// Why.
        source: LimitError,
    },
    /// A setting of the wrong type or out of range.
    Setting {
        /// Its key.
        key: &'static str,
        /// The value, as inline TOML.
        value: String,
        /// What was expected instead.
        expected: String,
    },
    /// A value that is not a limit's form (an unknown key, no `rate`, a
    /// number...).
    Form {
        /// The value, as inline TOML.
        value: String,
        /// What was expected instead.
        expected: String,
    },
}

impl fmt::Display for FormError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormError::Rate { rate, source } => write!(f, "rate {rate:?}: {source}"),
            FormError::Setting {
                key,
                value,
                expected,
            } => write!(f, "`{key}` = {value}: {expected}"),
            FormError::Form { value, expected } => write!(f, "{value}: {expected}"),
        }
    }
}

fn setting(key: &'static str, value: &Value, expected: impl Into<String>) -> FormError {
    FormError::Setting {
        key,
        value: value.to_string(),
        expected: expected.into(),
    }
}

fn form(value: &Value, expected: impl Into<String>) -> FormError {
    FormError::Form {
        value: value.to_string(),
        expected: expected.into(),
    }
}

/// An integer of at least 1.
pub(crate) fn positive(key: &'static str, value: &Value) -> Result<u64, FormError> {
    match value {
        Value::Integer(n) if *n >= 1 => {
            u64::try_from(*n).map_err(|_| setting(key, value, "expected a positive integer"))
        }
        _ => Err(setting(key, value, "expected a positive integer")),
    }
}

/// A block (`block_for`): a duration (`"15m"`) or whole seconds, within
/// the grammar's bounds ([`ratewall_grammar::check_block`]: 1 ms ..= 30
/// days); whether it fits its limit (not beside a lease) is the rate's
/// check.
pub(crate) fn block(value: &Value) -> Result<Duration, FormError> {
    let expected = "expected a duration such as \"15m\" or \"1h\", or whole seconds";
    let block = match value {
        Value::String(text) => parse_duration(text).ok(),
        Value::Integer(seconds) => u64::try_from(*seconds)
            .ok()
            .and_then(|s| s.checked_mul(1_000_000))
            .map(Duration::from_micros),
        _ => None,
    }
    .ok_or_else(|| setting("block_for", value, expected))?;
    match ratewall_grammar::check_block(super::micros(block), Algorithm::Gcra, 0) {
        Ok(()) => Ok(block),
        Err(problem) => Err(setting("block_for", value, problem.to_string())),
    }
}

/// A rate algorithm's name (the concurrency limit has its own form).
pub(crate) fn algorithm(value: &Value) -> Result<Algorithm, FormError> {
    let name = value.as_str().unwrap_or_default();
    if let Some(algorithm) = Algorithm::ALL.into_iter().find(|a| a.name() == name) {
        return Ok(algorithm);
    }
    let names: Vec<String> = Algorithm::ALL
        .iter()
        .map(|a| format!("\"{}\"", a.name()))
        .collect();
    let mut expected = format!("expected one of {}", names.join(", "));
    if name == Algorithm::InFlight.name() {
        expected.push_str(
            "; a concurrency limit is not a rate: write { max_in_flight = 10 } as one of the limits",
        );
    }
    Err(setting("algorithm", value, expected))
}

/// Reads a limit from `value`, in one of the forms of the module docs,
/// a rate written as text taking `settings` (a limits file's entry's;
/// none for a limit alone). A table carries its own settings and takes
/// none.
pub(crate) fn read(value: &Value, settings: RateSettings) -> Result<Limit, FormError> {
    let table = match value {
        Value::String(rate) => return rate_limit(rate, settings),
        Value::Table(table) => table,
        _ => return Err(form(value, format!("expected {FORMS}"))),
    };
    let entries = Value::entries(table)
        .map_err(|key| form(value, format!("`{key}` given twice; keep one")))?;
    let find = |key: &str| entries.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    if let Some((key, _)) = entries
        .iter()
        .find(|(k, _)| !RATE_KEYS.contains(k) && !IN_FLIGHT_KEYS.contains(k))
    {
        return Err(form(
            value,
            format!(
                "unknown key `{key}`; a limit's table holds {} (a rate limit) or {} (a concurrency limit)",
                quoted(&RATE_KEYS),
                quoted(&IN_FLIGHT_KEYS)
            ),
        ));
    }
    let (keys, max) = match (find("rate"), find("max_in_flight")) {
        (Some(_), None) => (&RATE_KEYS[..], None),
        (None, Some(max)) => (&IN_FLIGHT_KEYS[..], Some(max)),
        _ => {
            return Err(form(
                value,
                "a limit's table holds `rate` (e.g. { rate = \"5/1h\", algorithm = \"sliding_log\" }) \
                 or `max_in_flight` (e.g. { max_in_flight = 10 }), one of them; write two limits for both",
            ));
        }
    };
    if let Some((key, _)) = entries.iter().find(|(k, _)| !keys.contains(k)) {
        return Err(form(
            value,
            format!(
                "`{key}` does not go with `{}`: a rate limit's table holds {}, a concurrency limit's {}; \
                 remove it or write two limits",
                keys[0],
                quoted(&RATE_KEYS),
                quoted(&IN_FLIGHT_KEYS)
            ),
        ));
    }
    if let Some(max) = max {
        return in_flight(max, find("in_flight_ttl"));
    }
    let mut own = RateSettings::default();
    let mut rate = "";
    for (key, item) in entries {
        if key == "rate" {
            rate = item.as_str().ok_or_else(|| {
                setting(
                    "rate",
                    item,
                    "expected a rate such as \"5/1h\" or \"10 per minute\"",
                )
            })?;
        } else {
            own.read(key, item)?;
        }
    }
    rate_limit(rate, own)
}

/// `keys` as `` `a`, `b`, `c` ``.
fn quoted(keys: &[&str]) -> String {
    keys.iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A rate with its settings: [`Limit::from_str`](std::str::FromStr), then
/// the builders, as the limits file always did.
fn rate_limit(rate: &str, settings: RateSettings) -> Result<Limit, FormError> {
    let failed = |source: LimitError| FormError::Rate {
        rate: rate.to_owned(),
        source,
    };
    let mut limit = rate.parse::<Limit>().map_err(failed)?;
    let algorithm = settings.algorithm.unwrap_or(limit.algorithm());
    ratewall_grammar::check_settings(
        algorithm,
        settings.burst.is_some(),
        settings.slots.is_some(),
    )
    .map_err(|problem| failed(problem.into()))?;
    if let Some(slots) = settings.slots {
        limit = limit.with_slots(slots).map_err(failed)?;
    }
    if let Some(burst) = settings.burst {
        limit = limit.with_burst(burst).map_err(failed)?;
    }
    if let Some(algorithm) = settings.algorithm {
        limit = limit.with_algorithm(algorithm).map_err(failed)?;
    }
    if let Some(lease) = settings.lease {
        limit = limit.with_lease(lease).map_err(failed)?;
    }
    if let Some(block) = settings.block {
        limit = limit.with_block(block).map_err(failed)?;
    }
    Ok(limit)
}

/// `{ max_in_flight = N, in_flight_ttl = "30s" }`: [`Limit::in_flight_with_ttl`].
fn in_flight(max_value: &Value, ttl_value: Option<&Value>) -> Result<Limit, FormError> {
    let max = positive("max_in_flight", max_value)?;
    let ttl = match ttl_value {
        None => Limit::DEFAULT_LEASE_TTL,
        Some(value @ Value::String(text)) => {
            parse_duration(text).map_err(|e| setting("in_flight_ttl", value, e.to_string()))?
        }
        Some(value) => match value {
            Value::Integer(seconds) => u64::try_from(*seconds)
                .ok()
                .and_then(|s| s.checked_mul(1_000_000)),
            _ => None,
        }
        .map(Duration::from_micros)
        .ok_or_else(|| {
            setting(
                "in_flight_ttl",
                value,
                "expected a duration such as \"30s\" or \"1m\", or whole seconds",
            )
        })?,
    };
    Limit::in_flight_with_ttl(max, ttl).map_err(|error| {
        let of_ttl = matches!(
            error,
            LimitError::ZeroPeriod | LimitError::Other(Problem::LeaseTtlOutOfRange { .. })
        );
        match ttl_value {
            Some(ttl_value) if of_ttl => setting("in_flight_ttl", ttl_value, error.to_string()),
            _ => setting("max_in_flight", max_value, error.to_string()),
        }
    })
}

/// Written in the shortest form that reads back to the same limit: the
/// rate alone (`"10/1m"`) for GCRA with its default burst, no lease and no
/// block; otherwise a table with `rate` and the settings that differ from
/// the defaults (`{ rate = "10/1m", algorithm = "sliding_log" }`, a block
/// as a duration: `{ rate = "5/1m", block_for = "15m" }`); a
/// concurrency limit as `{ max_in_flight = 10 }` (and `in_flight_ttl`
/// when not 10 s). A burst or slot count the algorithm does not use is not
/// written (the macro and the limits file refuse it): the limit read back
/// decides the same and has it at its default. The guide's
/// [operations](crate::guide::operations) page shows the forms in TOML.
impl Serialize for Limit {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.is_in_flight() {
            let ttl = (self.period() != Limit::DEFAULT_LEASE_TTL)
                .then(|| ratewall_grammar::format_duration(self.period_us));
            let mut table = serializer.serialize_struct("Limit", 1 + usize::from(ttl.is_some()))?;
            table.serialize_field("max_in_flight", &self.threshold)?;
            if let Some(ttl) = ttl {
                table.serialize_field("in_flight_ttl", &ttl)?;
            }
            return table.end();
        }
        let rate = format!(
            "{}/{}",
            self.threshold,
            ratewall_grammar::format_duration(self.period_us)
        );
        let algorithm = (self.algorithm != Algorithm::default()).then_some(self.algorithm);
        let burst =
            (self.algorithm.uses_burst() && self.burst != self.threshold).then_some(self.burst);
        let slots = (self.algorithm.uses_slots() && self.slots != Limit::DEFAULT_SLOTS)
            .then_some(self.slots);
        let lease = self.lease();
        let block = (self.block_us > 0).then(|| ratewall_grammar::format_duration(self.block_us));
        let settings = [burst, slots, lease].iter().flatten().count()
            + usize::from(algorithm.is_some())
            + usize::from(block.is_some());
        if settings == 0 {
            return serializer.serialize_str(&rate);
        }
        let mut table = serializer.serialize_struct("Limit", 1 + settings)?;
        table.serialize_field("rate", &rate)?;
        if let Some(algorithm) = algorithm {
            table.serialize_field("algorithm", algorithm.name())?;
        }
        for (key, value) in [("burst", burst), ("slots", slots), ("lease", lease)] {
            if let Some(value) = value {
                table.serialize_field(key, &value)?;
            }
        }
        if let Some(block) = block {
            table.serialize_field("block_for", &block)?;
        }
        table.end()
    }
}

/// Read from a rate (`"10/1m"`, `"10 per minute"`, `"5/30s"`), a rate
/// limit's table (`{ rate = "10/1m", algorithm = "sliding_log", burst = 5,
/// slots = 20, lease = 100 }`, `{ rate = "5/1m", block_for = "15m" }`,
/// every key but `rate` optional) or a
/// concurrency limit's (`{ max_in_flight = 10, in_flight_ttl = "30s" }`),
/// through [`Limit::from_str`](std::str::FromStr) and the builders: the
/// grammar and bounds of the macro and of the limits file. `burst` is
/// refused where the algorithm has no burst (the window algorithms) and
/// `slots` off the sliding window. Any self-describing format (JSON, TOML,
/// YAML, a config-rs or figment tree). An invalid limit is the format's
/// error, with a message naming the value and the fix.
///
/// ```
/// use ratewall::Limit;
/// // serde's traits (`serde_core` is what `serde` re-exports).
/// use serde_core::Deserialize as _;
/// use serde_core::de::value::{Error, MapDeserializer, StrDeserializer};
///
/// let read = |text: &str| Limit::deserialize(StrDeserializer::<Error>::new(text));
/// assert_eq!(read("10 per minute")?, Limit::per_minute(10)?);
/// let zero = read("0/1m").unwrap_err().to_string();
/// assert_eq!(zero, "rate \"0/1m\": threshold must be at least 1, got 0");
/// // A table: `block_for` is a penalty box (Limit::with_block).
/// let table = [("rate", "5/1m"), ("block_for", "15m")].into_iter();
/// let login = Limit::deserialize(MapDeserializer::<_, Error>::new(table))?;
/// assert_eq!(login, Limit::per_minute(5)?.with_block(std::time::Duration::from_secs(900))?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        read(&value, RateSettings::default()).map_err(de::Error::custom)
    }
}
