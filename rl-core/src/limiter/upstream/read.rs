//! Reading an upstream's response headers into a [`Hold`]
//! ([`Hold::from_headers`]): `Retry-After`, the remaining counts, limits
//! and resets of OpenAI, Anthropic and the IETF fields. The IETF
//! `RateLimit` and `RateLimit-Policy` fields are RFC 9651 structured fields,
//! parsed with `sfv`; the durations and timestamps others write are read
//! here.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrayvec::ArrayString;
use sfv::visitor::{EntryVisitor, Ignored, ItemVisitor, ListVisitor, ParameterVisitor};
use sfv::{BareItemFromInput, KeyRef};
use smallvec::SmallVec;

use super::{Counts, Hold};

/// What one header says, for the groups counting what it counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    /// `Retry-After`: seconds (fractions read too), or an HTTP date.
    RetryAfter,
    /// `retry-after-ms`.
    RetryAfterMs,
    /// The IETF `RateLimit` field.
    Ietf,
    /// The IETF `RateLimit-Policy` field.
    IetfPolicy,
    /// A remaining count.
    Remaining(Counts),
    /// The upstream's limit.
    Limit(Counts),
    /// When the count resets, written as `Format` says.
    Reset(Counts, Format),
}

/// How a reset is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// A Go duration (`6m0s`, `20ms`, `1h2m3.5s`), as OpenAI writes it; a
    /// bare number is seconds.
    GoDuration,
    /// An RFC 3339 timestamp (`2025-01-01T00:00:30Z`), as Anthropic
    /// writes it.
    Timestamp,
    /// Seconds from now.
    Seconds,
}

/// The longest header name read (`anthropic-ratelimit-output-tokens-remaining`
/// is 43 bytes): a longer one is none of these.
const LONGEST_NAME: usize = 48;

/// What the header `name` (lower case) says, if it is one read.
fn field(name: &str) -> Option<Field> {
    use Counts::{InputTokens, OutputTokens, Requests, Tokens};
    use Format::{GoDuration, Seconds, Timestamp};
    Some(match name {
        "retry-after" => Field::RetryAfter,
        "retry-after-ms" => Field::RetryAfterMs,
        "ratelimit" => Field::Ietf,
        "ratelimit-policy" => Field::IetfPolicy,
        "x-ratelimit-remaining-requests"
        | "anthropic-ratelimit-requests-remaining"
        | "ratelimit-remaining"
        | "x-ratelimit-remaining" => Field::Remaining(Requests),
        "x-ratelimit-remaining-tokens" | "anthropic-ratelimit-tokens-remaining" => {
            Field::Remaining(Tokens)
        }
        "anthropic-ratelimit-input-tokens-remaining" => Field::Remaining(InputTokens),
        "anthropic-ratelimit-output-tokens-remaining" => Field::Remaining(OutputTokens),
        "x-ratelimit-limit-requests"
        | "anthropic-ratelimit-requests-limit"
        | "ratelimit-limit"
        | "x-ratelimit-limit" => Field::Limit(Requests),
        "x-ratelimit-limit-tokens" | "anthropic-ratelimit-tokens-limit" => Field::Limit(Tokens),
        "anthropic-ratelimit-input-tokens-limit" => Field::Limit(InputTokens),
        "anthropic-ratelimit-output-tokens-limit" => Field::Limit(OutputTokens),
        "x-ratelimit-reset-requests" => Field::Reset(Requests, GoDuration),
        "x-ratelimit-reset-tokens" => Field::Reset(Tokens, GoDuration),
        "anthropic-ratelimit-requests-reset" => Field::Reset(Requests, Timestamp),
        "anthropic-ratelimit-tokens-reset" => Field::Reset(Tokens, Timestamp),
        "anthropic-ratelimit-input-tokens-reset" => Field::Reset(InputTokens, Timestamp),
        "anthropic-ratelimit-output-tokens-reset" => Field::Reset(OutputTokens, Timestamp),
        "ratelimit-reset" => Field::Reset(Requests, Seconds),
        _ => return None,
    })
}

impl Hold {
    /// What an upstream's response headers say, for a spec whose groups
    /// count what `counts` says (one per group, in order; a group past its
    /// end counts [`Counts::Nothing`]). Names are matched without regard to
    /// case. Read:
    ///
    /// - the pause: `Retry-After` (seconds, or an HTTP date),
    ///   `retry-after-ms`;
    /// - what is left ([`Hold::left`]): `x-ratelimit-remaining-requests` /
    ///   `-tokens` (OpenAI), `anthropic-ratelimit-requests-remaining` /
    ///   `-tokens-remaining` / `-input-tokens-remaining` /
    ///   `-output-tokens-remaining` (Anthropic), `RateLimit-Remaining`,
    ///   `x-ratelimit-remaining` (requests);
    /// - the limits ([`Hold::limit`]): the same names with `limit` for
    ///   `remaining`, and `RateLimit-Limit`, `x-ratelimit-limit`
    ///   (requests);
    /// - the resets ([`Hold::reset`]): `x-ratelimit-reset-requests` /
    ///   `-tokens` (Go durations such as `6m0s`, `20ms` or `1h2m3.5s`; a
    ///   bare number is seconds), `anthropic-ratelimit-*-reset` (RFC 3339
    ///   timestamps: the time from now until then, zero once past),
    ///   `RateLimit-Reset` (seconds);
    /// - the IETF fields, RFC 9651 lists of policies counting requests: of
    ///   `RateLimit`, the policy with the fewest units left (`r`; of equals,
    ///   the latest reset `t`, in seconds); of `RateLimit-Policy`, the first
    ///   policy's quota `q`, as the limit.
    ///
    /// Values that cannot be read are ignored (logged at debug level); an
    /// IETF field that is not a valid structured field is ignored whole,
    /// as RFC 9651 asks.
    pub fn from_headers<'h>(
        headers: impl IntoIterator<Item = (&'h str, &'h [u8])>,
        counts: &[Counts],
    ) -> Self {
        let mut hold = Hold::new();
        let groups_counting = |what: Counts| {
            counts
                .iter()
                .enumerate()
                .filter(move |(_, c)| **c == what)
                .map(|(g, _)| g)
        };
        for (name, value) in headers {
            let mut lower = ArrayString::<LONGEST_NAME>::new();
            if lower.try_push_str(name).is_err() {
                continue;
            }
            lower.make_ascii_lowercase();
            let Some(field) = field(&lower) else {
                continue;
            };
            let Ok(value) = std::str::from_utf8(value) else {
                continue;
            };
            let value = value.trim();
            let read = match field {
                Field::RetryAfter => retry_after(value).map(|pause| hold.clone().pause(pause)),
                Field::RetryAfterMs => seconds(value, 1_000).map(|pause| hold.clone().pause(pause)),
                Field::Ietf => ietf_ratelimit(value).map(|(left, reset)| {
                    groups_counting(Counts::Requests).fold(hold.clone(), |hold, g| {
                        let hold = hold.left(g, left);
                        match reset {
                            Some(reset) => hold.reset(g, reset),
                            None => hold,
                        }
                    })
                }),
                Field::IetfPolicy => ietf_quota(value).map(|quota| {
                    groups_counting(Counts::Requests)
                        .fold(hold.clone(), |hold, g| hold.limit(g, quota))
                }),
                Field::Remaining(what) => value.parse::<u64>().ok().map(|units| {
                    groups_counting(what).fold(hold.clone(), |hold, g| hold.left(g, units))
                }),
                Field::Limit(what) => value.parse::<u64>().ok().map(|units| {
                    groups_counting(what).fold(hold.clone(), |hold, g| hold.limit(g, units))
                }),
                Field::Reset(what, format) => {
                    let resets_in = match format {
                        Format::GoDuration => go_duration(value),
                        Format::Timestamp => timestamp(value),
                        Format::Seconds => seconds(value, 1),
                    };
                    resets_in.map(|resets_in| {
                        groups_counting(what).fold(hold.clone(), |hold, g| hold.reset(g, resets_in))
                    })
                }
            };
            match read {
                Some(read) => hold = read,
                None => {
                    tracing::debug!(header = name, value, "unreadable rate-limit header ignored")
                }
            }
        }
        hold
    }
}

/// `Retry-After`: delay-seconds (fractions read too), or an HTTP date.
fn retry_after(value: &str) -> Option<Duration> {
    if let Some(pause) = seconds(value, 1) {
        return Some(pause);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(until(at))
}

/// The time from now until `at`, zero once past.
fn until(at: SystemTime) -> Duration {
    at.duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO)
}

/// A non-negative number of `1 / per_second` seconds, fractions allowed.
fn seconds(value: &str, per_second: u32) -> Option<Duration> {
    let number: f64 = value.parse().ok()?;
    (number.is_finite() && number >= 0.0)
        .then(|| Duration::try_from_secs_f64(number / f64::from(per_second)).ok())
        .flatten()
}

/// A Go duration, as OpenAI writes its resets: numbers (fractions
/// allowed) each followed by a unit, `h`, `m`, `s`, `ms`, `us` (or `µs`)
/// or `ns`: `6m0s`, `1s`, `20ms`, `1h2m3.5s`. `0` and a bare number of
/// seconds are read too; a sign is not.
fn go_duration(value: &str) -> Option<Duration> {
    if let Some(bare) = seconds(value, 1) {
        return value
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b'.')
            .then_some(bare);
    }
    let mut rest = value;
    let mut total = 0.0_f64;
    while !rest.is_empty() {
        let digits = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let number: f64 = rest.get(..digits)?.parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(rest.len(), |(at, _)| at);
        let seconds_per = match &rest[..unit] {
            "h" => 3_600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[unit..];
        total += number * seconds_per;
    }
    (total.is_finite() && !value.is_empty())
        .then(|| Duration::try_from_secs_f64(total).ok())
        .flatten()
}

/// An RFC 3339 timestamp (`2025-01-01T00:00:30Z`, `...30.5+01:00`), as
/// Anthropic writes its resets: the time from now until then, zero once
/// past.
fn timestamp(value: &str) -> Option<Duration> {
    let number = |from: usize, to: usize| -> Option<i64> {
        let digits = value.get(from..to)?;
        digits.bytes().try_fold(0_i64, |n, b| {
            b.is_ascii_digit().then(|| n * 10 + i64::from(b - b'0'))
        })
    };
    let byte = |at: usize| value.as_bytes().get(at).copied();
    let (year, month, day) = (number(0, 4)?, number(5, 7)?, number(8, 10)?);
    let (hour, minute, second) = (number(11, 13)?, number(14, 16)?, number(17, 19)?);
    let separators = byte(4) == Some(b'-')
        && byte(7) == Some(b'-')
        && matches!(byte(10), Some(b'T' | b't' | b' '))
        && byte(13) == Some(b':')
        && byte(16) == Some(b':');
    let in_range = (1..=12).contains(&month)
        && (1..=days_in_month(year, month)).contains(&day)
        && hour < 24
        && minute < 60
        && second <= 60;
    if !separators || !in_range {
        return None;
    }
    let mut rest = value.get(19..)?;
    let mut nanos = 0_u32;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        for (i, b) in fraction.bytes().take(digits.min(9)).enumerate() {
            nanos += u32::from(b - b'0') * 10_u32.pow(8 - i as u32);
        }
        rest = &fraction[digits..];
    }
    let offset = match rest.as_bytes() {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (hours, minutes) = (
                number(value.len() - 5, value.len() - 3)?,
                number(value.len() - 2, value.len())?,
            );
            if hours > 23 || minutes > 59 {
                return None;
            }
            let offset = hours * 3_600 + minutes * 60;
            if *sign == b'-' { -offset } else { offset }
        }
        _ => return None,
    };
    // A leap second is read as the last second of its minute.
    let since_epoch =
        days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second.min(59)
            - offset;
    let Ok(since_epoch) = u64::try_from(since_epoch) else {
        return Some(Duration::ZERO);
    };
    let at = UNIX_EPOCH.checked_add(Duration::new(since_epoch, nanos))?;
    Some(until(at))
}

/// Days in `month` (1 to 12) of `year`, in the proleptic Gregorian calendar.
fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar
/// (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The parameters of one member of an IETF `RateLimit` or
/// `RateLimit-Policy` list that are read: remaining `r`, reset `t`
/// (seconds), quota `q`. A parameter that is not a non-negative integer is
/// not read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Policy {
    r: Option<u64>,
    t: Option<u64>,
    q: Option<u64>,
}

/// The members of an IETF list, read with `sfv` (RFC 9651): `None` when
/// the field is not a valid list (the whole field is then ignored).
fn policies(value: &str) -> Option<SmallVec<[Policy; 2]>> {
    let mut policies = Policies::default();
    sfv::Parser::new(value)
        .parse_list_with_visitor(&mut policies)
        .ok()?;
    Some(policies.0)
}

#[derive(Debug, Default)]
struct Policies(SmallVec<[Policy; 2]>);

/// One member's visitor: its parameters, when it is an item (an inner list
/// is no policy).
struct Member<'a>(&'a mut Policy);

impl<'de> ListVisitor<'de> for &mut Policies {
    type Out = ();
    type Error = Infallible;

    fn entry(&mut self) -> Result<impl EntryVisitor<'de>, Self::Error> {
        self.0.push(Policy::default());
        let last = self.0.len() - 1;
        Ok(Member(&mut self.0[last]))
    }

    fn finish(self) -> Result<(), Self::Error> {
        Ok(())
    }
}

impl<'de> EntryVisitor<'de> for Member<'_> {
    type Error = Infallible;

    fn item(self) -> Result<impl ItemVisitor<'de>, Self::Error> {
        Ok(move |_name: BareItemFromInput<'de>| Ok::<_, Infallible>(self))
    }

    fn inner_list(self) -> Result<impl sfv::visitor::InnerListVisitor<'de>, Self::Error> {
        Ok(Ignored)
    }
}

impl<'de> ParameterVisitor<'de> for Member<'_> {
    type Out = ();
    type Error = Infallible;

    fn parameter(
        &mut self,
        key: &'de KeyRef,
        value: BareItemFromInput<'de>,
    ) -> Result<(), Self::Error> {
        let count = value
            .as_integer()
            .and_then(|n| u64::try_from(i64::from(n)).ok());
        // A later parameter of the same name replaces an earlier one (RFC 9651).
        match key.as_str() {
            "r" => self.0.r = count,
            "t" => self.0.t = count,
            "q" => self.0.q = count,
            _ => {}
        }
        Ok(())
    }

    fn finish(self) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// The IETF `RateLimit` field (`"default";r=50;t=30, "daily";r=900`): the
/// policy with the fewest units left (of equals, the one resetting last),
/// and its reset.
fn ietf_ratelimit(value: &str) -> Option<(u64, Option<Duration>)> {
    policies(value)?
        .iter()
        .filter_map(|p| Some((p.r?, p.t)))
        .min_by_key(|(left, reset)| (*left, std::cmp::Reverse(*reset)))
        .map(|(left, reset)| (left, reset.map(Duration::from_secs)))
}

/// The IETF `RateLimit-Policy` field (`"default";q=100;w=60`): the first
/// policy's quota `q`.
fn ietf_quota(value: &str) -> Option<u64> {
    policies(value)?.iter().find_map(|p| p.q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_are_read_as_openai_writes_them() {
        let ms = Duration::from_millis;
        for (text, expected) in [
            ("6m0s", Some(ms(360_000))),
            ("1s", Some(ms(1_000))),
            ("20ms", Some(ms(20))),
            ("1h2m3.5s", Some(ms(3_723_500))),
            ("0", Some(Duration::ZERO)),
            ("0s", Some(Duration::ZERO)),
            ("2.5", Some(ms(2_500))),
            ("1.5m", Some(ms(90_000))),
            ("250us", Some(Duration::from_micros(250))),
            ("250µs", Some(Duration::from_micros(250))),
            ("10ns", Some(Duration::from_nanos(10))),
            ("", None),
            ("-1s", None),
            ("1d", None),
            ("s", None),
            ("1.2.3s", None),
            ("1e3s", None),
            ("1e3", None),
            ("inf", None),
            ("NaN", None),
            ("99999999999999999999999999h", None),
        ] {
            assert_eq!(go_duration(text), expected, "{text:?}");
        }
    }

    #[test]
    fn rfc_3339_timestamps_are_read_as_the_time_until_them() {
        let in_90_s = SystemTime::now() + Duration::from_secs(90);
        let secs = in_90_s.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let days = secs / 86_400;
        let in_day = secs % 86_400;
        // The civil date of `days` (the inverse of `days_from_civil`), by search.
        let year = (1970..3000)
            .find(|y| days_from_civil(y + 1, 1, 1) > days as i64)
            .unwrap();
        let (month, day) = (1..=12)
            .flat_map(|m| (1..=days_in_month(year, m)).map(move |d| (m, d)))
            .find(|(m, d)| days_from_civil(year, *m, *d) == days as i64)
            .unwrap();
        let (h, m, s) = (in_day / 3_600, in_day / 60 % 60, in_day % 60);
        let utc = format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z");
        let read = timestamp(&utc).unwrap();
        assert!(
            read > Duration::from_secs(85) && read <= Duration::from_secs(90),
            "{utc}: {read:?}"
        );
        // The same instant with a fraction and a zero offset; an hour later
        // written an hour west of UTC.
        let fraction = format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.250+00:00");
        let later = timestamp(&fraction).unwrap() - read;
        assert!(
            later > Duration::from_millis(200) && later < Duration::from_millis(300),
            "{later:?}"
        );
        let west = format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}-01:00");
        let hour = timestamp(&west).unwrap() - read;
        assert!(
            hour > Duration::from_secs(3_599) && hour < Duration::from_secs(3_601),
            "{hour:?}"
        );
        assert_eq!(timestamp("2000-01-01T00:00:00Z"), Some(Duration::ZERO));
        assert_eq!(timestamp("1969-12-31T23:59:59Z"), Some(Duration::ZERO));
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        let far = timestamp("9999-12-31T23:59:60.999999999999-23:59").unwrap();
        assert!(far > Duration::from_secs(86_400 * 365 * 7_000));
        for bad in [
            "",
            "2025-02-30T00:00:00Z",
            "2025-13-01T00:00:00Z",
            "2025-01-01T24:00:00Z",
            "2025-01-01T00:00:00",
            "2025-01-01T00:00:00.Z",
            "2025-01-01T00:00:00+1:00",
            "2025-01-01T00:00:00+24:00",
            "2025-01-01 00:00:00Zjunk",
            "+025-01-01T00:00:00Z",
            "2025-01-01T00:00:00ZZ",
            "２０２５-01-01T00:00:00Z",
        ] {
            assert_eq!(timestamp(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ietf_fields_are_structured_fields_with_quoted_names_of_any_text() {
        assert_eq!(
            ietf_ratelimit(r#""default";r=50;t=30"#),
            Some((50, Some(Duration::from_secs(30))))
        );
        // The fewest left holds; a name holding `,` and `;` is a name.
        assert_eq!(
            ietf_ratelimit(r#""a,b;r=0";r=7;t=5, "day";r=3;t=86400, "burst";r=3;t=60"#),
            Some((3, Some(Duration::from_secs(86_400))))
        );
        assert_eq!(
            ietf_quota(r#""x;q=1,y";q=100;w=60, "daily";q=1000;w=86400"#),
            Some(100)
        );
        // Tokens as names (earlier drafts), an inner list, unknown parameters.
        assert_eq!(
            ietf_ratelimit("default;r=4;partial;t=9"),
            Some((4, Some(Duration::from_secs(9))))
        );
        assert_eq!(ietf_ratelimit("(a b);r=1, p;r=2"), Some((2, None)));
        assert_eq!(ietf_quota("p;w=60;pk=:cHJvYmU=:, q;q=5"), Some(5));
        // Not a structured field: ignored whole.
        for bad in [
            r#""open;r=1"#,
            "a;r=1,",
            "a;r=-1;t=2",
            "a;r=1.5",
            "a;r=\"3\"",
            "",
        ] {
            assert_eq!(ietf_ratelimit(bad).map(|(r, _)| r), None, "{bad:?}");
        }
    }
}
