//! The INFO summary of refusals: every refusal is logged at DEBUG; at INFO
//! a limit name writes at most one line per [`INTERVAL`] and kind of
//! refusal. The first refusal after a quiet interval is written in full
//! (which limit, which identity, when to retry); the refusals after it are
//! counted, and the first refusal once the interval has passed writes
//! their number ("`sms_phone`: 12034 refusals in the last 10.2 s"). A flood
//! on one identity writes one line every ten seconds, not one per refusal.
//!
//! A count is written by the next refusal after its interval: refusals at
//! the very end of a flood are in the metrics (`ratewall_decisions_total`)
//! and at DEBUG, and in the next summary if the name is refused again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

/// The least time between two INFO lines of one limit name and kind.
pub(crate) const INTERVAL: Duration = Duration::from_secs(10);

/// What was refused: each kind has its own lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Refused by a limit.
    Limited,
    /// Refused by the deny list.
    Denied,
    /// Would have been refused, in shadow mode (admitted).
    Shadowed,
}

impl Kind {
    const ALL: usize = 3;

    const fn index(self) -> usize {
        match self {
            Kind::Limited => 0,
            Kind::Denied => 1,
            Kind::Shadowed => 2,
        }
    }

    /// "refusals", "calls denied by the deny list", ...: what a summary counts.
    const fn counted(self, one: bool) -> &'static str {
        match (self, one) {
            (Kind::Limited, true) => "refusal",
            (Kind::Limited, false) => "refusals",
            (Kind::Denied, true) => "call denied by the deny list",
            (Kind::Denied, false) => "calls denied by the deny list",
            (Kind::Shadowed, true) => "call that shadow mode would have refused",
            (Kind::Shadowed, false) => "calls that shadow mode would have refused",
        }
    }
}

/// What to write at INFO for one refusal ([`Summaries::heard`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line {
    /// Nothing: counted for the next summary.
    Counted,
    /// The refusal in full: the first after a quiet interval.
    First,
    /// A summary: `count` refusals (this one included) in `over`.
    Summary { count: u64, over: Duration },
}

impl Line {
    /// Writes a summary line of `name` (the first refusal's own line is the
    /// caller's, which knows its fields).
    pub(crate) fn write_summary(&self, name: &str, kind: Kind) {
        if let Line::Summary { count, over } = *self {
            tracing::info!(
                limit = name,
                count,
                "`{name}`: {count} {} in the last {:.1} s",
                kind.counted(count == 1),
                over.as_secs_f64()
            );
        }
    }
}

/// One name's count of one kind since its last INFO line.
#[derive(Debug)]
struct Tally {
    /// When the last line was written (the start of what `count` covers).
    since: Instant,
    /// Refusals since, not yet written.
    count: u64,
}

/// The tallies of one limiter, by kind and limit name.
#[derive(Debug, Default)]
pub(crate) struct Summaries {
    names: [RwLock<HashMap<Box<str>, Mutex<Tally>>>; Kind::ALL],
}

impl Summaries {
    /// A refusal of `kind` by `name`, heard at `now`: what to write.
    pub(crate) fn heard(&self, name: &str, kind: Kind, now: Instant) -> Line {
        let names = &self.names[kind.index()];
        if let Some(tally) = names.read().get(name) {
            return tally.lock().heard(now);
        }
        let mut names = names.write();
        if let Some(tally) = names.get(name) {
            return tally.lock().heard(now);
        }
        names.insert(
            Box::from(name),
            Mutex::new(Tally {
                since: now,
                count: 0,
            }),
        );
        Line::First
    }
}

impl Tally {
    fn heard(&mut self, now: Instant) -> Line {
        let over = now.saturating_duration_since(self.since);
        if over < INTERVAL {
            self.count += 1;
            return Line::Counted;
        }
        let count = std::mem::take(&mut self.count);
        self.since = now;
        if count == 0 {
            // Quiet for a whole interval: this one in full.
            Line::First
        } else {
            Line::Summary {
                count: count + 1,
                over,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_writes_its_first_refusal_then_one_summary_per_interval() {
        let summaries = Summaries::default();
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert_eq!(summaries.heard("sms", Kind::Limited, at(0)), Line::First);
        for ms in 1..1_000 {
            assert_eq!(summaries.heard("sms", Kind::Limited, at(ms)), Line::Counted);
        }
        // Another name, and another kind of the same name, have their own.
        assert_eq!(summaries.heard("ip", Kind::Limited, at(5)), Line::First);
        assert_eq!(summaries.heard("sms", Kind::Denied, at(5)), Line::First);
        assert_eq!(
            summaries.heard("sms", Kind::Limited, at(10_000)),
            Line::Summary {
                count: 1_000,
                over: Duration::from_secs(10)
            }
        );
        assert_eq!(
            summaries.heard("sms", Kind::Limited, at(10_001)),
            Line::Counted
        );
        assert_eq!(
            summaries.heard("sms", Kind::Limited, at(25_000)),
            Line::Summary {
                count: 2,
                over: Duration::from_secs(15)
            }
        );
        // Quiet for an interval: the next refusal is written in full again.
        assert_eq!(
            summaries.heard("sms", Kind::Limited, at(40_000)),
            Line::First
        );
    }
}
