//! Duration strings, read at compile time with the grammar of
//! `rl_core::parse_duration` (kept in step by the tests below).

/// The message for a string that is not a duration; the same wording as
/// `rl_core::LimitError::BadDuration`.
pub(crate) fn bad_duration_message(text: &str) -> String {
    format!(
        "cannot parse duration {text:?}: expected an integer followed by one of us, ms, s, m, h, d \
         (e.g. \"500ms\", \"1m\"); a bare integer is seconds"
    )
}

/// Microseconds in `text`: `"250us"`, `"500ms"`, `"30s"`, `"1m"`, `"1h"`,
/// `"1d"`, or a bare integer of seconds. `None` when unreadable or when the
/// value does not fit in a `u64` of microseconds.
pub(crate) fn parse_micros(text: &str) -> Option<u64> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: u64 = number.parse().ok()?;
    let micros_per_unit: u64 = match unit.trim() {
        "us" | "µs" => 1,
        "ms" => 1_000,
        "" | "s" | "sec" => 1_000_000,
        "m" | "min" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        _ => return None,
    };
    number.checked_mul(micros_per_unit)
}

/// Microseconds in a whole number of seconds, `None` on overflow.
pub(crate) fn seconds_to_micros(seconds: u64) -> Option<u64> {
    seconds.checked_mul(1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_of_the_core_grammar_is_read() {
        assert_eq!(parse_micros("250us"), Some(250));
        assert_eq!(parse_micros("250µs"), Some(250));
        assert_eq!(parse_micros("500ms"), Some(500_000));
        assert_eq!(parse_micros("30s"), Some(30_000_000));
        assert_eq!(parse_micros("30sec"), Some(30_000_000));
        assert_eq!(parse_micros("1m"), Some(60_000_000));
        assert_eq!(parse_micros("2min"), Some(120_000_000));
        assert_eq!(parse_micros("1h"), Some(3_600_000_000));
        assert_eq!(parse_micros("1d"), Some(86_400_000_000));
    }

    #[test]
    fn a_bare_integer_is_seconds() {
        assert_eq!(parse_micros("30"), Some(30_000_000));
        assert_eq!(seconds_to_micros(30), Some(30_000_000));
    }

    #[test]
    fn surrounding_and_inner_whitespace_is_ignored_like_in_core() {
        assert_eq!(parse_micros(" 5 m "), Some(300_000_000));
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
            "1 minute",
            "99999999999999999999d",
        ] {
            assert_eq!(parse_micros(text), None, "{text:?}");
        }
        assert_eq!(parse_micros("18446744073710s"), None);
        assert_eq!(seconds_to_micros(u64::MAX), None);
    }

    #[test]
    fn zero_is_read_as_zero_and_left_to_validation() {
        assert_eq!(parse_micros("0ms"), Some(0));
    }

    #[test]
    fn the_message_names_the_text_and_the_units() {
        let message = bad_duration_message("5 minutes");
        assert!(message.contains("\"5 minutes\""), "{message}");
        assert!(message.contains("us, ms, s, m, h, d"), "{message}");
    }
}
