//! Durations (`"500ms"`, `"1m"`, `"30 seconds"`) and rates (`"5/1h"`,
//! `"10/minute"`, `"1000 per hour"`) as text.

use std::fmt;

/// The duration units and their size in microseconds; a bare integer is
/// seconds. The short forms first (what [`format_duration`] writes), then
/// the words users of other limiters type (`minute`, `2 hours`).
pub const DURATION_UNITS: [(&str, u64); 25] = [
    ("us", 1),
    ("µs", 1),
    ("ms", 1_000),
    ("s", 1_000_000),
    ("m", 60_000_000),
    ("h", 3_600_000_000),
    ("d", 86_400_000_000),
    ("microsecond", 1),
    ("microseconds", 1),
    ("millisecond", 1_000),
    ("milliseconds", 1_000),
    ("sec", 1_000_000),
    ("secs", 1_000_000),
    ("second", 1_000_000),
    ("seconds", 1_000_000),
    ("min", 60_000_000),
    ("mins", 60_000_000),
    ("minute", 60_000_000),
    ("minutes", 60_000_000),
    ("hr", 3_600_000_000),
    ("hrs", 3_600_000_000),
    ("hour", 3_600_000_000),
    ("hours", 3_600_000_000),
    ("day", 86_400_000_000),
    ("days", 86_400_000_000),
];

/// The size of `unit` in microseconds, if it is one of [`DURATION_UNITS`].
fn unit_micros(unit: &str) -> Option<u64> {
    DURATION_UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, size)| *size)
}

/// A text that is not a duration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadDuration(pub String);

impl fmt::Display for BadDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot parse duration {:?}: expected an integer followed by a unit: us, ms, s, m, h, d \
             or a word (second, minutes, hour, ...), e.g. \"500ms\", \"1m\", \"30 seconds\"; \
             a bare integer is seconds",
            self.0
        )
    }
}

impl std::error::Error for BadDuration {}

/// A text that is not a rate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRate(pub String);

impl fmt::Display for BadRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot parse rate {:?}: expected THRESHOLD/PERIOD or THRESHOLD per PERIOD, \
             e.g. \"5/1h\", \"100/30s\", \"10/minute\" or \"10 per minute\"",
            self.0
        )
    }
}

impl std::error::Error for BadRate {}

/// Microseconds in a duration such as `"250us"`, `"500ms"`, `"30s"`,
/// `"1m"`, `"1h"`, `"1d"`, the same with a word for the unit (`"30
/// seconds"`, `"1 minute"`, `"2 hours"`: [`DURATION_UNITS`]), or a bare
/// integer of seconds; whitespace around the number and the unit is
/// ignored. Zero is read as zero (whether it is allowed is
/// [`crate::check_limit`]'s business).
///
/// ```
/// use ratewall_grammar::parse_duration_micros;
/// assert_eq!(parse_duration_micros("1m"), Ok(60_000_000));
/// assert_eq!(parse_duration_micros("2 minutes"), Ok(120_000_000));
/// assert_eq!(parse_duration_micros(" 30 "), Ok(30_000_000));
/// assert!(parse_duration_micros("1.5s").is_err());
/// assert!(parse_duration_micros("99999999999999999999d").is_err());
/// ```
///
/// # Errors
/// [`BadDuration`] with the text when it is not a whole number with an
/// optional unit of [`DURATION_UNITS`] (`"1.5s"`, `"soon"`), or when the
/// duration does not fit a `u64` of microseconds.
pub fn parse_duration_micros(text: &str) -> Result<u64, BadDuration> {
    let bad = || BadDuration(text.to_owned());
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: u64 = number.parse().map_err(|_| bad())?;
    let unit = unit.trim();
    let size = if unit.is_empty() {
        1_000_000
    } else {
        unit_micros(unit).ok_or_else(bad)?
    };
    number.checked_mul(size).ok_or_else(bad)
}

/// A rate read from text: `threshold` units per `period_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Units per period (zero is read, and left to [`crate::check_limit`]).
    pub threshold: u64,
    /// The period in microseconds.
    pub period_us: u64,
}

/// Reads a threshold, then `/` or the word `per`, then a duration or a
/// bare unit meaning one of it: `"5/1h"`, `"100/30s"`, `"10/d"`,
/// `"10/minute"`, `"10 per minute"`, `"1000 per hour"`, `"5 per 30
/// seconds"` (the forms of Python's `limits` and most limiters).
///
/// ```
/// use ratewall_grammar::{Rate, parse_rate};
/// assert_eq!(parse_rate("10/d"), Ok(Rate { threshold: 10, period_us: 86_400_000_000 }));
/// assert_eq!(parse_rate(" 3 / 500ms ").unwrap().period_us, 500_000);
/// assert_eq!(parse_rate("10 per minute"), parse_rate("10/1m"));
/// assert_eq!(parse_rate("1000 per hour"), parse_rate("1000/1h"));
/// assert!(parse_rate("5 per").is_err());
/// assert!(parse_rate("5/").is_err());
/// ```
///
/// # Errors
/// [`BadRate`] with the text when it is not a whole threshold, `/` and a
/// duration [`parse_duration_micros`] reads (or a bare unit).
pub fn parse_rate(text: &str) -> Result<Rate, BadRate> {
    let bad = || BadRate(text.to_owned());
    let (threshold, period) = text
        .split_once('/')
        .or_else(|| text.trim().split_once(" per "))
        .ok_or_else(bad)?;
    let threshold: u64 = threshold.trim().parse().map_err(|_| bad())?;
    let period = period.trim();
    let period_us = if period.starts_with(|c: char| c.is_ascii_digit()) {
        parse_duration_micros(period).map_err(|_| bad())?
    } else {
        // A bare unit: one of it.
        unit_micros(period).ok_or_else(bad)?
    };
    Ok(Rate {
        threshold,
        period_us,
    })
}

/// A duration in the largest unit that divides it: `"1h"`, `"90s"`,
/// `"1500ms"`, `"7us"`.
///
/// ```
/// assert_eq!(ratewall_grammar::format_duration(3_600_000_000), "1h");
/// assert_eq!(ratewall_grammar::format_duration(1_500_000), "1500ms");
/// ```
pub fn format_duration(us: u64) -> String {
    const UNITS: [(u64, &str); 5] = [
        (86_400_000_000, "d"),
        (3_600_000_000, "h"),
        (60_000_000, "m"),
        (1_000_000, "s"),
        (1_000, "ms"),
    ];
    UNITS
        .iter()
        .find(|(size, _)| us != 0 && us.is_multiple_of(*size))
        .map(|(size, unit)| format!("{}{unit}", us / size))
        .unwrap_or_else(|| format!("{us}us"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_is_read() {
        for (text, micros) in [
            ("250us", 250),
            ("250µs", 250),
            ("500ms", 500_000),
            ("30s", 30_000_000),
            ("30sec", 30_000_000),
            ("30 seconds", 30_000_000),
            ("1 second", 1_000_000),
            ("1m", 60_000_000),
            ("2min", 120_000_000),
            ("1 minute", 60_000_000),
            ("2 hours", 7_200_000_000),
            ("1 day", 86_400_000_000),
            ("250 milliseconds", 250_000),
            ("1h", 3_600_000_000),
            ("1d", 86_400_000_000),
            ("30", 30_000_000),
            (" 5 m ", 300_000_000),
            ("0ms", 0),
        ] {
            assert_eq!(parse_duration_micros(text), Ok(micros), "{text:?}");
        }
    }

    #[test]
    fn garbage_unknown_units_and_overflow_are_refused() {
        for text in [
            "",
            "soon",
            "1w",
            "m",
            "-1s",
            "1.5s",
            "1 Minute",
            "1 fortnight",
            "minute",
            "99999999999999999999d",
            "18446744073710s",
        ] {
            assert!(parse_duration_micros(text).is_err(), "{text:?}");
        }
        let message = BadDuration("5 minutes".into()).to_string();
        assert!(message.contains("\"5 minutes\"") && message.contains("us, ms, s, m, h, d"));
        assert!(message.contains("30 seconds"), "{message}");
    }

    #[test]
    fn rates_take_a_duration_or_a_bare_unit() {
        assert_eq!(
            parse_rate("5/1h"),
            Ok(Rate {
                threshold: 5,
                period_us: 3_600_000_000
            })
        );
        assert_eq!(parse_rate("1/min").map(|r| r.period_us), Ok(60_000_000));
        assert_eq!(parse_rate("0/1h").map(|r| r.threshold), Ok(0));
        for text in ["5", "/1h", "x/1h", "5/1w", "5/", "5/ ", "-5/1h", "5/w"] {
            assert_eq!(parse_rate(text), Err(BadRate(text.to_owned())), "{text:?}");
        }
    }

    #[test]
    fn rates_take_the_words_other_limiters_use() {
        let rate = |threshold, period_us| {
            Ok(Rate {
                threshold,
                period_us,
            })
        };
        for (text, expected) in [
            ("10/minute", rate(10, 60_000_000)),
            ("10 per minute", rate(10, 60_000_000)),
            ("10/second", rate(10, 1_000_000)),
            ("10/seconds", rate(10, 1_000_000)),
            ("1000 per hour", rate(1_000, 3_600_000_000)),
            ("5/30s", rate(5, 30_000_000)),
            ("5 per 30 seconds", rate(5, 30_000_000)),
            ("5 per 30s", rate(5, 30_000_000)),
            ("100/day", rate(100, 86_400_000_000)),
            ("  7  per  2 minutes ", rate(7, 120_000_000)),
            ("3 / 1 hour", rate(3, 3_600_000_000)),
        ] {
            assert_eq!(parse_rate(text), expected, "{text:?}");
        }
        for text in [
            "10 per",
            "per minute",
            "10 per per minute",
            "10 per Minute",
            "10 minute",
            "10 every minute",
            "10perminute",
            "10 per minute/1m",
            "10/per minute",
        ] {
            assert_eq!(parse_rate(text), Err(BadRate(text.to_owned())), "{text:?}");
        }
        let message = BadRate("10 a minute".into()).to_string();
        assert!(message.contains("10 per minute"), "{message}");
    }

    #[test]
    fn formatting_picks_the_largest_whole_unit() {
        assert_eq!(format_duration(86_400_000_000), "1d");
        assert_eq!(format_duration(90_000_000), "90s");
        assert_eq!(format_duration(7), "7us");
        assert_eq!(format_duration(0), "0us");
        for us in [1, 999, 1_000, 60_000_000, 3_600_000_000 * 5] {
            let text = format_duration(us);
            assert_eq!(parse_duration_micros(&text), Ok(us), "{text}");
        }
    }
}
