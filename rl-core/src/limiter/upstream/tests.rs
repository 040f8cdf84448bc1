use std::time::SystemTime;

use super::*;

fn read(headers: &[(&str, &str)], counts: &[Counts]) -> Hold {
    Hold::from_headers(headers.iter().map(|(n, v)| (*n, v.as_bytes())), counts)
}

const LLM: [Counts; 2] = [Counts::Requests, Counts::Tokens];

#[test]
fn retry_after_is_read_in_seconds_fractions_milliseconds_and_http_dates() {
    assert_eq!(
        read(&[("Retry-After", "20")], &LLM).paused(),
        Some(Duration::from_secs(20))
    );
    assert_eq!(
        read(&[("retry-after", "1.5")], &LLM).paused(),
        Some(Duration::from_millis(1_500))
    );
    assert_eq!(
        read(&[("retry-after-ms", "250")], &LLM).paused(),
        Some(Duration::from_millis(250))
    );
    let in_a_minute = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(61));
    let pause = read(&[("retry-after", &in_a_minute)], &LLM)
        .paused()
        .unwrap();
    assert!(
        pause > Duration::from_secs(55) && pause <= Duration::from_secs(61),
        "{pause:?}"
    );
    let past = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(600));
    assert_eq!(
        read(&[("retry-after", &past)], &LLM).paused(),
        Some(Duration::ZERO)
    );
    // The longest of two says.
    let both = read(&[("retry-after", "2"), ("retry-after-ms", "3500")], &LLM);
    assert_eq!(both.paused(), Some(Duration::from_millis(3_500)));
}

#[test]
fn remaining_counts_go_to_the_groups_that_count_them() {
    let openai = read(
        &[
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-remaining-tokens", "149984"),
        ],
        &LLM,
    );
    assert_eq!(
        (openai.left_in(0), openai.left_in(1)),
        (Some(59), Some(149_984))
    );
    let anthropic = read(
        &[
            ("anthropic-ratelimit-requests-remaining", "3"),
            ("anthropic-ratelimit-tokens-remaining", "900"),
        ],
        &[Counts::Tokens, Counts::Nothing, Counts::Requests],
    );
    assert_eq!(
        (
            anthropic.left_in(0),
            anthropic.left_in(1),
            anthropic.left_in(2)
        ),
        (Some(900), None, Some(3))
    );
    let ietf = read(
        &[("RateLimit", "\"default\";r=0;t=30, \"daily\";r=100;t=3600")],
        &LLM,
    );
    // The policy with none left: its group paused until it resets.
    assert_eq!(
        (ietf.left_in(0), ietf.reset_in(0), ietf.paused()),
        (Some(0), Some(Duration::from_secs(30)), None)
    );
    assert_eq!(ietf.paused_in(0), Some(Duration::from_secs(30)));
    assert_eq!(ietf.paused_in(1), None);
    assert_eq!(
        read(&[("RateLimit-Remaining", "7")], &LLM).left_in(0),
        Some(7)
    );
    let limits = read(
        &[
            ("x-ratelimit-limit-requests", "600"),
            ("x-ratelimit-limit-tokens", "60000"),
        ],
        &LLM,
    );
    assert_eq!(
        (limits.left_in(1), limits.limit_in(0), limits.limit_in(1)),
        (None, Some(600), Some(60_000))
    );
    assert!(!limits.is_empty() && limits.holds_nothing());
    let anthropic_limits = read(
        &[
            ("anthropic-ratelimit-tokens-limit", "80000"),
            (
                "RateLimit-Policy",
                "\"burst\";q=100;w=60, \"day\";q=1000;w=86400",
            ),
        ],
        &LLM,
    );
    assert_eq!(
        (anthropic_limits.limit_in(0), anthropic_limits.limit_in(1)),
        (Some(100), Some(80_000))
    );
    // A parameter without a value is skipped, not the field.
    let flagged = read(&[("ratelimit", "\"default\";r=4;partial;t=9")], &LLM);
    assert_eq!(flagged.left_in(0), Some(4));
}

#[test]
fn what_cannot_be_read_says_nothing() {
    for (name, value) in [
        ("retry-after", "soon"),
        ("retry-after", "-3"),
        ("retry-after-ms", "NaN"),
        ("x-ratelimit-remaining-tokens", "lots"),
        ("ratelimit", "\"default\";t=30"),
        ("x-unrelated", "5"),
        ("x-ratelimit-limit-tokens", "-1"),
        ("ratelimit-policy", "\"default\";w=60"),
    ] {
        assert!(read(&[(name, value)], &LLM).is_empty(), "{name}: {value}");
    }
    let invalid_utf8 = Hold::from_headers([("retry-after", &[0xff, 0xfe][..])], &LLM);
    assert!(invalid_utf8.is_empty());
    assert!(
        read(
            &[("x-ratelimit-remaining-tokens", "5")],
            &[Counts::Requests]
        )
        .is_empty()
    );
    assert!(Hold::new().left(usize::MAX, 3).is_empty(), "no such group");
    let long = Hold::new()
        .pause(Duration::from_secs(86_400))
        .capped(Duration::from_secs(300));
    assert_eq!(long.paused(), Some(Duration::from_secs(300)));
}

/// Headers as OpenAI's API sends them (its rate-limit guide's example, and
/// a `429`).
#[test]
fn openai_headers_are_read_with_their_resets() {
    let answered = read(
        &[
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-limit-tokens", "150000"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-remaining-tokens", "149984"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ],
        &LLM,
    );
    assert_eq!(
        (
            answered.limit_in(0),
            answered.left_in(0),
            answered.reset_in(0)
        ),
        (Some(60), Some(59), Some(Duration::from_secs(1)))
    );
    assert_eq!(
        (
            answered.limit_in(1),
            answered.left_in(1),
            answered.reset_in(1)
        ),
        (Some(150_000), Some(149_984), Some(Duration::from_secs(360)))
    );
    // Units left: nothing paused; the resets are recorded.
    assert!(!answered.pauses() && !answered.holds_nothing());
    let refused = read(
        &[
            ("x-ratelimit-remaining-requests", "412"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-requests", "1h2m3.5s"),
            ("x-ratelimit-reset-tokens", "20ms"),
        ],
        &LLM,
    );
    assert_eq!(refused.paused(), None);
    assert_eq!(refused.paused_in(0), None);
    assert_eq!(refused.paused_in(1), Some(Duration::from_millis(20)));
    assert_eq!(refused.reset_in(0), Some(Duration::from_millis(3_723_500)));
    assert!(refused.pauses());
}

/// Headers as Anthropic's API sends them: RFC 3339 resets, and input and
/// output token limits of their own.
#[test]
fn anthropic_headers_are_read_with_their_timestamps() {
    let in_a_minute = rfc3339(SystemTime::now() + Duration::from_secs(60));
    let long_ago = "2024-08-20T10:00:00Z";
    let headers = [
        ("anthropic-ratelimit-requests-limit", "50"),
        ("anthropic-ratelimit-requests-remaining", "0"),
        ("anthropic-ratelimit-requests-reset", in_a_minute.as_str()),
        ("anthropic-ratelimit-tokens-limit", "100000"),
        ("anthropic-ratelimit-tokens-remaining", "98000"),
        ("anthropic-ratelimit-tokens-reset", long_ago),
        ("anthropic-ratelimit-input-tokens-limit", "40000"),
        ("anthropic-ratelimit-input-tokens-remaining", "39000"),
        (
            "anthropic-ratelimit-input-tokens-reset",
            in_a_minute.as_str(),
        ),
        ("anthropic-ratelimit-output-tokens-limit", "8000"),
        ("anthropic-ratelimit-output-tokens-remaining", "7000"),
        ("anthropic-ratelimit-output-tokens-reset", long_ago),
        ("retry-after", "55"),
    ];
    let counts = [
        Counts::Requests,
        Counts::Tokens,
        Counts::InputTokens,
        Counts::OutputTokens,
    ];
    let hold = read(&headers, &counts);
    let requests_reset = hold.reset_in(0).unwrap();
    assert!(
        requests_reset > Duration::from_secs(55) && requests_reset <= Duration::from_secs(60),
        "{requests_reset:?}"
    );
    // None left in the requests: paused until they reset, past the 55 s
    // `retry-after`.
    assert_eq!(hold.paused_in(0), Some(requests_reset));
    assert_eq!(hold.paused_in(1), Some(Duration::from_secs(55)));
    assert_eq!(
        (hold.left_in(1), hold.limit_in(1), hold.reset_in(1)),
        (Some(98_000), Some(100_000), Some(Duration::ZERO))
    );
    assert_eq!(
        (hold.left_in(2), hold.limit_in(2)),
        (Some(39_000), Some(40_000))
    );
    assert_eq!(
        (hold.left_in(3), hold.limit_in(3)),
        (Some(7_000), Some(8_000))
    );
    // A spec counting only tokens reads only theirs.
    let tokens = read(&headers, &[Counts::Tokens]);
    assert_eq!((tokens.left_in(0), tokens.left_in(1)), (Some(98_000), None));
}

/// The IETF draft's examples (draft-ietf-httpapi-ratelimit-headers), and
/// names holding the separators a hand-split parser cut at.
#[test]
fn ietf_fields_are_read_as_structured_fields() {
    let hold = read(
        &[
            (
                "RateLimit-Policy",
                "\"burst\";q=100;w=60,\"daily\";q=1000;w=86400",
            ),
            ("RateLimit", "\"default\";r=50;t=30"),
        ],
        &LLM,
    );
    assert_eq!(
        (hold.limit_in(0), hold.left_in(0), hold.reset_in(0)),
        (Some(100), Some(50), Some(Duration::from_secs(30)))
    );
    assert_eq!((hold.left_in(1), hold.paused_in(0)), (None, None));
    let quoted = read(
        &[
            (
                "ratelimit-policy",
                "\"per user, per day; strict\";q=10;w=86400",
            ),
            (
                "ratelimit",
                "\"per user, per day; strict\";r=0;t=3600, \"burst;r=9\";r=9;t=1",
            ),
        ],
        &LLM,
    );
    assert_eq!(
        (quoted.limit_in(0), quoted.left_in(0), quoted.paused_in(0)),
        (Some(10), Some(0), Some(Duration::from_secs(3_600)))
    );
    // The draft's earlier separate fields.
    let earlier = read(
        &[
            ("RateLimit-Limit", "10"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "7"),
        ],
        &LLM,
    );
    assert_eq!(earlier.paused_in(0), Some(Duration::from_secs(7)));
    // An invalid field says nothing (RFC 9651 parsing is strict).
    assert!(read(&[("ratelimit", "\"open;r=0;t=30")], &LLM).is_empty());
}

#[test]
fn resets_keep_the_earliest_are_capped_and_pause_only_a_group_with_none_left() {
    let hold = Hold::new()
        .reset(0, Duration::from_secs(30))
        .reset(0, Duration::from_secs(10))
        .reset(1, Duration::MAX)
        .left(1, 0);
    assert_eq!(hold.reset_in(0), Some(Duration::from_secs(10)));
    assert_eq!(hold.paused_in(0), None, "units not said: not paused");
    assert_eq!(hold.paused_in(1), Some(Hold::MAX_PAUSE));
    let capped = hold.capped(Duration::from_secs(300));
    assert_eq!(capped.paused_in(1), Some(Duration::from_secs(300)));
    assert!(!Hold::new().reset(0, Duration::from_secs(1)).is_empty());
    assert!(Hold::new().reset(0, Duration::from_secs(1)).holds_nothing());
    assert!(
        Hold::new()
            .reset(usize::MAX, Duration::from_secs(1))
            .is_empty()
    );
}

/// `at` as an RFC 3339 timestamp in UTC, to the second.
fn rfc3339(at: SystemTime) -> String {
    let secs = at
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs();
    let (days, in_day) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's `civil_from_days`.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        in_day / 3_600,
        in_day / 60 % 60,
        in_day % 60
    )
}
