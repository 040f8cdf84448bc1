//! What `ratewall` prints: one report per command, as a table or as JSON.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ratewall::{
    Key, Limit,
    backend::{Block, Decisions},
};
use ratewall_redis::{LeaseRecord, RedisBackend, RegisteredLimits};
use serde::Serialize;

/// The outcome of one command.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum Report {
    /// `ratewall limits`.
    Limits(LimitsReport),
    /// `ratewall inspect`.
    Inspect(InspectReport),
    /// `ratewall reset`.
    Reset(ResetReport),
    /// `ratewall unblock`.
    Unblock(UnblockReport),
    /// `ratewall lists`, `allow`, `deny`, `unlist`.
    Lists(ListsReport),
}

/// The allow and deny lists shared under a prefix (after a change, when
/// the command made one).
#[derive(Debug, Clone, Serialize)]
pub struct ListsReport {
    /// The key prefix.
    pub prefix: String,
    /// What the command changed, e.g. `deny +33612345678 for sms_phone`.
    pub changed: Option<String>,
    /// Every entry, sorted by name and identity.
    pub entries: Vec<ListRow>,
}

/// One list entry.
#[derive(Debug, Clone, Serialize)]
pub struct ListRow {
    /// `allow` or `deny`.
    pub list: &'static str,
    /// The limit name; `*` for every limit.
    pub name: String,
    /// The identity, in its key form.
    pub identity: String,
    /// When the entry expires (ms since the Unix epoch); `null`: never.
    pub expires_at_ms: Option<u64>,
}

impl ListsReport {
    /// The report of `entries` under `prefix`.
    pub fn new(
        prefix: &str,
        changed: Option<String>,
        entries: &[ratewall::lists::ListEntry],
    ) -> Self {
        Self {
            prefix: prefix.to_owned(),
            changed,
            entries: entries
                .iter()
                .map(|e| ListRow {
                    list: e.kind.name(),
                    name: e.name.clone().unwrap_or_else(|| "*".to_owned()),
                    identity: e.identity.clone(),
                    expires_at_ms: e.expires_at.map(|at| {
                        at.duration_since(UNIX_EPOCH)
                            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                    }),
                })
                .collect(),
        }
    }
}

fn lists_table(report: &ListsReport) -> String {
    let mut out = String::new();
    if let Some(changed) = &report.changed {
        let _ = writeln!(out, "{changed}");
    }
    if report.entries.is_empty() {
        let _ = writeln!(
            out,
            "no allow or deny entries under prefix `{}`",
            report.prefix
        );
        return out;
    }
    let _ = writeln!(
        out,
        "{:<6} {:<20} {:<30} expires",
        "list", "name", "identity"
    );
    for row in &report.entries {
        let expires = row.expires_at_ms.map_or_else(
            || "never".to_owned(),
            |ms| {
                let at = UNIX_EPOCH + Duration::from_millis(ms);
                match at.duration_since(SystemTime::now()) {
                    Ok(left) => format!("in {}s", left.as_secs()),
                    Err(_) => "expired".to_owned(),
                }
            },
        );
        let _ = writeln!(
            out,
            "{:<6} {:<20} {:<30} {expires}",
            row.list, row.name, row.identity
        );
    }
    out
}

/// One limit as the registry describes it.
#[derive(Debug, Clone, Serialize)]
pub struct LimitDescription {
    /// E.g. `"5/1h"`.
    pub rate: String,
    /// E.g. `"sliding_log"`.
    pub algorithm: &'static str,
    /// Units per period.
    pub threshold: u64,
    /// The period in microseconds.
    pub period_us: u64,
    /// The configured burst.
    pub burst: u64,
    /// Sub-windows of the sliding-window counter.
    pub slots: u64,
    /// What one instant can admit (a decision's `limit`).
    pub capacity: u64,
    /// The storage-key suffix of this limit's state.
    pub suffix: String,
    /// Units one process may lease at most (quota leasing); `null`: none.
    pub lease: Option<u64>,
    /// How long an identity stays refused once this limit refused it, in
    /// milliseconds (rounded up; `block_for`); `null`: no block.
    pub block_ms: Option<u64>,
}

impl LimitDescription {
    fn new(limit: &Limit) -> Self {
        let text = limit.to_string();
        let rate = text
            .split_once(" (")
            .map_or(text.as_str(), |(rate, _)| rate);
        Self {
            rate: rate.to_owned(),
            algorithm: limit.algorithm().name(),
            threshold: limit.threshold(),
            period_us: limit.period_micros(),
            burst: limit.burst(),
            slots: limit.slots(),
            capacity: limit.capacity(),
            suffix: limit.storage_suffix(),
            lease: limit.lease(),
            block_ms: limit
                .block()
                .map(|block| block.as_micros().div_ceil(1_000) as u64),
        }
    }
}

/// One lease Redis records for an identity's limit (quota leasing): units
/// reserved by some process, some of which it may have used since.
#[derive(Debug, Clone, Serialize)]
pub struct LeaseRow {
    /// Units reserved beyond the call that took them.
    pub units: u64,
    /// When it was taken, ms since the Unix epoch.
    pub taken_at_ms: u64,
    /// The last time its units can be used, ms since the Unix epoch.
    pub until_ms: u64,
}

/// One limit name of the registry.
#[derive(Debug, Clone, Serialize)]
pub struct NameReport {
    /// The limit name.
    pub name: String,
    /// When a service last published it, in milliseconds since the epoch.
    pub published_at_ms: u64,
    /// Its limits.
    pub limits: Vec<LimitDescription>,
}

/// `ratewall limits`: every name in the registry.
#[derive(Debug, Clone, Serialize)]
pub struct LimitsReport {
    /// The key prefix.
    pub prefix: String,
    /// The registry's key.
    pub registry_key: String,
    /// The names, sorted.
    pub names: Vec<NameReport>,
}

impl LimitsReport {
    /// The report of `registered` under `prefix`.
    pub fn new(prefix: &str, registered: &[RegisteredLimits]) -> Self {
        Self {
            prefix: prefix.to_owned(),
            registry_key: RedisBackend::registry_key(prefix),
            names: registered
                .iter()
                .map(|r| NameReport {
                    name: r.name.clone(),
                    published_at_ms: epoch_ms(r.published_at),
                    limits: r.limits.iter().map(LimitDescription::new).collect(),
                })
                .collect(),
        }
    }
}

/// One limit's current state for one identity.
#[derive(Debug, Clone, Serialize)]
pub struct LimitState {
    /// The limit.
    #[serde(flatten)]
    pub limit: LimitDescription,
    /// The storage key of the state.
    pub key: String,
    /// Whether a call costing 1 would be allowed now.
    pub allowed: bool,
    /// The decision's `limit` (the capacity), `"limit"` in JSON.
    #[serde(rename = "limit")]
    pub limit_units: u64,
    /// Units available now.
    pub remaining: u64,
    /// How long until a call costing 1 would be allowed (0 when it is).
    pub retry_after_ms: u64,
    /// How long until the limit is back to its full quota.
    pub reset_after_ms: u64,
    /// The leases taken on it that may still be in use (a leasing limit).
    pub leases: Vec<LeaseRow>,
    /// For a concurrency limit (`max_in_flight`): the calls of the identity
    /// running now, over every instance (slots held with a live lease).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<u64>,
    /// How long the identity stays blocked by this limit, in milliseconds;
    /// `null`: not blocked.
    pub blocked_ms: Option<u64>,
}

/// One block of an identity: the limit it is on and the time left.
#[derive(Debug, Clone, Serialize)]
pub struct BlockRow {
    /// The blocking limit's storage suffix.
    pub suffix: String,
    /// The time left, in milliseconds.
    pub left_ms: u64,
}

impl BlockRow {
    fn of(blocks: &[Block]) -> Vec<Self> {
        blocks
            .iter()
            .map(|b| BlockRow {
                suffix: b.suffix.clone(),
                left_ms: millis(b.left),
            })
            .collect()
    }
}

/// `ratewall inspect`: one identity's state under one name.
#[derive(Debug, Clone, Serialize)]
pub struct InspectReport {
    /// The key prefix.
    pub prefix: String,
    /// The limit name.
    pub name: String,
    /// The identity.
    pub identity: String,
    /// The identity's key (each limit's state is under it plus a suffix).
    pub key: String,
    /// One state per limit, in the registry's order.
    pub limits: Vec<LimitState>,
    /// Every block of the identity under the name (a limit the registry no
    /// longer lists included), by suffix.
    pub blocks: Vec<BlockRow>,
}

impl InspectReport {
    /// The report of `decisions` (peeked for `registered`'s limits),
    /// `leases` (each limit's lease records, in the same order) and the
    /// identity's `blocks`.
    pub fn new(
        prefix: &str,
        registered: &RegisteredLimits,
        identity: &str,
        key: &Key,
        decisions: &Decisions,
        leases: &[Vec<LeaseRecord>],
        blocks: &[Block],
    ) -> Self {
        let blocks = BlockRow::of(blocks);
        Self {
            prefix: prefix.to_owned(),
            name: registered.name.clone(),
            identity: identity.to_owned(),
            key: key.to_string(),
            limits: registered
                .limits
                .iter()
                .zip(decisions.iter())
                .enumerate()
                .map(|(i, (limit, decision))| LimitState {
                    limit: LimitDescription::new(limit),
                    key: format!("{key}:{}", limit.storage_suffix()),
                    allowed: decision.allowed(),
                    limit_units: decision.limit(),
                    remaining: decision.remaining(),
                    retry_after_ms: millis(decision.retry_after()),
                    reset_after_ms: millis(decision.reset_after()),
                    leases: leases
                        .get(i)
                        .into_iter()
                        .flatten()
                        .map(|lease| LeaseRow {
                            units: lease.units,
                            taken_at_ms: lease.taken_at_micros / 1_000,
                            until_ms: lease.until_micros / 1_000,
                        })
                        .collect(),
                    in_flight: limit
                        .is_in_flight()
                        .then(|| decision.limit().saturating_sub(decision.remaining())),
                    blocked_ms: blocks
                        .iter()
                        .find(|b| b.suffix == limit.storage_suffix())
                        .map(|b| b.left_ms),
                })
                .collect(),
            blocks,
        }
    }
}

/// `ratewall unblock`: the blocks lifted.
#[derive(Debug, Clone, Serialize)]
pub struct UnblockReport {
    /// The key prefix.
    pub prefix: String,
    /// The limit name.
    pub name: String,
    /// The identity.
    pub identity: String,
    /// The key of the identity's blocks.
    pub key: String,
    /// Whether a block had not ended.
    pub lifted: bool,
    /// The blocks lifted, by suffix.
    pub blocks: Vec<BlockRow>,
}

impl UnblockReport {
    /// The report of lifting `blocks` of `identity` (key `key`) under `name`.
    pub fn new(
        prefix: &str,
        name: &str,
        identity: &str,
        key: &Key,
        lifted: bool,
        blocks: &[Block],
    ) -> Self {
        Self {
            prefix: prefix.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            key: format!("{key}:b"),
            lifted,
            blocks: BlockRow::of(blocks),
        }
    }
}

/// `ratewall reset`: what was forgotten.
#[derive(Debug, Clone, Serialize)]
pub struct ResetReport {
    /// The key prefix.
    pub prefix: String,
    /// The limit name.
    pub name: String,
    /// The identity.
    pub identity: String,
    /// Always true: the state of every limit of the name was forgotten.
    pub reset: bool,
    /// The limits whose state was forgotten.
    pub limits: Vec<LimitDescription>,
    /// The keys deleted (where they existed).
    pub keys: Vec<String>,
}

impl ResetReport {
    /// The report of a reset of `identity` (key `key`) for `registered`.
    pub fn new(prefix: &str, registered: &RegisteredLimits, identity: &str, key: &Key) -> Self {
        Self {
            prefix: prefix.to_owned(),
            name: registered.name.clone(),
            identity: identity.to_owned(),
            reset: true,
            limits: registered
                .limits
                .iter()
                .map(LimitDescription::new)
                .collect(),
            keys: registered
                .limits
                .iter()
                .map(|limit| format!("{key}:{}", limit.storage_suffix()))
                .collect(),
        }
    }
}

impl Report {
    /// Pretty JSON, ending with a newline.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self)
            .unwrap_or_else(|error| serde_json::json!({ "error": error.to_string() }).to_string());
        text.push('\n');
        text
    }

    /// A human-readable table.
    pub fn to_table(&self) -> String {
        match self {
            Report::Limits(report) => limits_table(report),
            Report::Lists(report) => lists_table(report),
            Report::Inspect(report) => inspect_table(report),
            Report::Unblock(report) if report.blocks.is_empty() && !report.lifted => format!(
                "identity `{}` under `{}` (prefix `{}`) was not blocked\n",
                report.identity, report.name, report.prefix
            ),
            Report::Unblock(report) => format!(
                "lifted the blocks of identity `{}` under `{}` (prefix `{}`): {}\n",
                report.identity,
                report.name,
                report.prefix,
                report
                    .blocks
                    .iter()
                    .map(|b| format!(
                        "{} ({} left)",
                        b.suffix,
                        human(Duration::from_millis(b.left_ms))
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Report::Reset(report) => format!(
                "reset `{}` for identity `{}` under prefix `{}`: {} limit(s) ({}) back to full, blocks lifted\n",
                report.name,
                report.identity,
                report.prefix,
                report.limits.len(),
                report
                    .limits
                    .iter()
                    .map(|l| l.rate.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

fn limits_table(report: &LimitsReport) -> String {
    if report.names.is_empty() {
        return format!(
            "no limits registered under prefix `{}` (`{}` is empty: no service with this prefix decided a call in the last 7 days)\n",
            report.prefix, report.registry_key
        );
    }
    let mut rows = Vec::new();
    for name in &report.names {
        for (i, limit) in name.limits.iter().enumerate() {
            let first = i == 0;
            rows.push(vec![
                if first {
                    name.name.clone()
                } else {
                    String::new()
                },
                limit.rate.clone(),
                limit.algorithm.to_owned(),
                if ratewall::Algorithm::ALL
                    .iter()
                    .find(|a| a.name() == limit.algorithm)
                    .is_some_and(|a| a.uses_burst())
                {
                    limit.burst.to_string()
                } else {
                    "-".to_owned()
                },
                if limit.algorithm == "sliding_window" {
                    limit.slots.to_string()
                } else {
                    "-".to_owned()
                },
                limit
                    .block_ms
                    .map_or_else(|| "-".to_owned(), |ms| human(Duration::from_millis(ms))),
                limit.suffix.clone(),
                if first {
                    ago(name.published_at_ms)
                } else {
                    String::new()
                },
            ]);
        }
    }
    let mut text = format!(
        "{} limit name(s) under prefix `{}` (registry `{}`)\n\n",
        report.names.len(),
        report.prefix,
        report.registry_key
    );
    text.push_str(&table(
        &[
            "NAME",
            "RATE",
            "ALGORITHM",
            "BURST",
            "SLOTS",
            "BLOCK",
            "STORAGE SUFFIX",
            "PUBLISHED",
        ],
        &rows,
    ));
    text
}

fn inspect_table(report: &InspectReport) -> String {
    let rows: Vec<Vec<String>> = report
        .limits
        .iter()
        .map(|state| {
            vec![
                state.limit.rate.clone(),
                state.limit.algorithm.to_owned(),
                state.limit_units.to_string(),
                state.remaining.to_string(),
                if state.allowed { "allowed" } else { "refused" }.to_owned(),
                human(Duration::from_millis(state.retry_after_ms)),
                human(Duration::from_millis(state.reset_after_ms)),
                state
                    .blocked_ms
                    .map_or_else(|| "-".to_owned(), |ms| human(Duration::from_millis(ms))),
            ]
        })
        .collect();
    let mut text = format!(
        "`{}` for identity `{}` under prefix `{}` (key {})\n\n",
        report.name, report.identity, report.prefix, report.key
    );
    text.push_str(&table(
        &[
            "RATE",
            "ALGORITHM",
            "LIMIT",
            "REMAINING",
            "NEXT CALL",
            "RETRY AFTER",
            "RESET AFTER",
            "BLOCKED",
        ],
        &rows,
    ));
    let others: Vec<&BlockRow> = report
        .blocks
        .iter()
        .filter(|b| !report.limits.iter().any(|l| l.limit.suffix == b.suffix))
        .collect();
    for block in others {
        let _ = writeln!(
            text,
            "\nblocked by a limit the registry no longer lists ({}): {} left",
            block.suffix,
            human(Duration::from_millis(block.left_ms))
        );
    }
    let leases: Vec<Vec<String>> = report
        .limits
        .iter()
        .flat_map(|state| {
            state.leases.iter().map(move |lease| {
                vec![
                    state.limit.rate.clone(),
                    lease.units.to_string(),
                    human(Duration::from_millis(
                        lease.until_ms.saturating_sub(lease.taken_at_ms),
                    )),
                ]
            })
        })
        .collect();
    if !leases.is_empty() {
        text.push_str("\nquota leases taken by processes (units they may not have used yet):\n");
        text.push_str(&table(&["RATE", "UNITS", "USABLE FOR AT MOST"], &leases));
    }
    for state in &report.limits {
        if let Some(running) = state.in_flight {
            let _ = writeln!(
                text,
                "\nin flight now: {running} of {} (slots leased for {}, across every instance)",
                state.limit_units,
                human(Duration::from_micros(state.limit.period_us))
            );
        }
    }
    text
}

/// Columns padded to their widest cell, two spaces apart.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let headers: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&headers).chain(rows) {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            let _ = write!(line, "{cell:<width$}  ");
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn epoch_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, millis)
}

/// `"3m 20s ago"`, from milliseconds since the epoch.
fn ago(published_at_ms: u64) -> String {
    let now = epoch_ms(SystemTime::now());
    format!(
        "{} ago",
        human(Duration::from_millis(now.saturating_sub(published_at_ms)))
    )
}

/// The two largest units, seconds rounded up: `"42s"`, `"3m 20s"`, `"1d 2h"`.
fn human(duration: Duration) -> String {
    let secs = duration.as_micros().div_ceil(1_000_000) as u64;
    let units = [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)];
    let parts: Vec<String> = units
        .iter()
        .scan(secs, |left, (unit, size)| {
            let count = *left / size;
            *left %= size;
            Some((count, *unit))
        })
        .skip_while(|(count, _)| *count == 0)
        .take(2)
        .filter(|(count, _)| *count > 0)
        .map(|(count, unit)| format!("{count}{unit}"))
        .collect();
    if parts.is_empty() {
        "0s".to_owned()
    } else {
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_the_two_largest_units() {
        assert_eq!(human(Duration::ZERO), "0s");
        assert_eq!(human(Duration::from_millis(1)), "1s");
        assert_eq!(human(Duration::from_secs(42)), "42s");
        assert_eq!(human(Duration::from_secs(200)), "3m 20s");
        assert_eq!(human(Duration::from_secs(3_600)), "1h");
        assert_eq!(human(Duration::from_secs(93_784)), "1d 2h");
    }

    #[test]
    fn tables_align_columns_without_trailing_spaces() {
        let text = table(
            &["A", "LONG HEADER"],
            &[vec!["wide cell".into(), "x".into()]],
        );
        assert_eq!(text, "A          LONG HEADER\nwide cell  x\n");
    }
}
