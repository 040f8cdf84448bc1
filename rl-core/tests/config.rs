//! Limits files (feature `config`): the TOML format, its error messages, and
//! applying a file to a running limiter all-or-nothing.

use std::sync::Arc;

use ratewall::{
    Algorithm, FailurePolicy, Limit, Limiter,
    backend::Request,
    call::Admission,
    config::{ConfigError, LimitsFile},
};

const DOCUMENTED: &str = r#"
[limits.sms_phone]
rates = ["1/1m", "5/1h", "10/1d"]
algorithm = "sliding_log"   # optional, default gcra
burst = 10                  # optional
on_error = "fail_closed"    # optional: fail_open | fail_closed | local:<share>
shadow = true               # optional

[limits.login_ip]
rates = ["100/1d"]
"#;

fn limiter() -> Limiter {
    Limiter::builder().prefix("cfg").build().unwrap()
}

fn parse_error(text: &str) -> String {
    match LimitsFile::parse(text) {
        Ok(file) => panic!("accepted {text:?} as {file:?}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn the_documented_format_reads_every_setting() {
    let file = LimitsFile::parse(DOCUMENTED).unwrap();
    assert_eq!(file.names().collect::<Vec<_>>(), ["login_ip", "sms_phone"]);
    let sms = file.get("sms_phone").unwrap();
    let expected: Vec<Limit> = ["1/1m", "5/1h", "10/1d"]
        .iter()
        .map(|rate| {
            rate.parse::<Limit>()
                .and_then(|l| l.with_burst(10))
                .and_then(|l| l.with_algorithm(Algorithm::SlidingLog))
                .unwrap()
        })
        .collect();
    assert_eq!(sms.limits(), expected.as_slice());
    assert_eq!(sms.policy(), Some(FailurePolicy::FailClosed));
    assert!(sms.shadow());
}

#[test]
fn unset_settings_take_the_defaults_of_limit_and_limiter() {
    let file = LimitsFile::parse(DOCUMENTED).unwrap();
    let ip = file.get("login_ip").unwrap();
    assert_eq!(ip.limits(), [Limit::per_day(100).unwrap()]);
    assert_eq!(ip.limits()[0].algorithm(), Algorithm::Gcra);
    assert_eq!(ip.policy(), None);
    assert!(!ip.shadow());
}

#[test]
fn local_policies_and_slots_are_read() {
    let file = LimitsFile::parse(
        "[limits.api]\nrates = [\"600/1m\"]\nalgorithm = \"sliding_window\"\nslots = 20\non_error = \"local:4\"",
    )
    .unwrap();
    let api = file.get("api").unwrap();
    assert_eq!(api.limits()[0].slots(), 20);
    assert_eq!(api.limits()[0].algorithm(), Algorithm::SlidingWindow);
    assert_eq!(api.policy(), Some(FailurePolicy::local(4).unwrap()));
}

#[test]
fn a_lease_is_read_for_every_rate_and_refused_where_it_does_not_fit() {
    let file = LimitsFile::parse(
        "[limits.api]\nrates = [\"100000/1m\", \"1000000/1h\"]\nalgorithm = \"fixed_window\"\nlease = 10000",
    )
    .unwrap();
    let api = file.get("api").unwrap();
    assert!(api.limits().iter().all(|l| l.lease() == Some(10_000)));
    let limiter = limiter();
    file.apply(&limiter).unwrap();
    assert_eq!(
        limiter.settings().limits("api").unwrap()[0].lease(),
        Some(10_000)
    );
    for (text, expected) in [
        ("lease = 0", "positive integer"),
        (
            "lease = 100",
            "lease 100 must be smaller than the capacity of 100",
        ),
        (
            "lease = 10\nalgorithm = \"sliding_log\"",
            "`sliding_log` cannot lease",
        ),
    ] {
        let message = parse_error(&format!("[limits.api]\nrates = [\"100/1m\"]\n{text}"));
        assert!(message.starts_with("limit `api`"), "{message}");
        assert!(message.contains(expected), "{message}");
    }
}

#[test]
fn an_empty_file_sets_nothing() {
    let file = LimitsFile::parse("# nothing yet\n").unwrap();
    assert!(file.is_empty());
    file.apply(&limiter()).unwrap();
}

#[test]
fn errors_name_the_limit_the_key_and_the_bad_value() {
    let cases: &[(&str, &[&str])] = &[
        (
            "[limits.sms]\nrates = [\"5 every hour\"]",
            &["limit `sms`", "rate \"5 every hour\"", "THRESHOLD/PERIOD"],
        ),
        (
            "[limits.sms]\nrates = [\"5/1h\"]\nalgorithm = \"fast\"",
            &["limit `sms`", "`algorithm` = \"fast\"", "\"sliding_log\""],
        ),
        (
            "[limits.sms]\nrates = [\"5/1h\"]\nburst = 0",
            &["limit `sms`", "`burst` = 0", "positive integer"],
        ),
        (
            "[limits.sms]\nrates = [\"5/1h\"]\nburst = \"ten\"",
            &["`burst` = \"ten\"", "positive integer"],
        ),
        (
            "[limits.sms]\nrates = [\"5/1h\"]\nslots = -3",
            &["`slots` = -3", "positive integer"],
        ),
        (
            "[limits.sms]\nrates = [\"5/1h\"]\non_error = \"local:0\"",
            &["`on_error` = \"local:0\"", "local:<share>"],
        ),
        (
            "[limits.sms]\nrates = [\"5/1h\"]\non_error = \"closed\"",
            &["`on_error` = \"closed\"", "\"fail_closed\""],
        ),
        (
            "[limits.sms]\nrates = [\"5/1h\"]\nshadow = \"yes\"",
            &["`shadow` = \"yes\"", "true or false"],
        ),
        (
            "[limits.sms]\nrates = [\"5/1h\"]\nbrust = 10",
            &["limit `sms`", "unknown key `brust`", "`burst`"],
        ),
        (
            "[limits.sms]\nalgorithm = \"gcra\"",
            &["limit `sms`", "`rates` is missing"],
        ),
        (
            "[limits.sms]\nrates = []",
            &["`rates` = []", "at least one rate"],
        ),
        (
            "[limits.sms]\nrates = \"5/1h\"",
            &["`rates` = \"5/1h\"", "list"],
        ),
        ("[limits.sms]\nrates = [5]", &["`rates` = 5", "string"]),
        (
            "[limits.sms]\nrates = [\"5/1h\", \"10/1h\"]",
            &["limit `sms`", "5/1h (gcra) and 10/1h (gcra)"],
        ),
        (
            "[limits.sms]\nrates = [\"20000/1h\"]\nalgorithm = \"sliding_log\"",
            &["limit `sms`", "rate \"20000/1h\"", "sliding-window counter"],
        ),
        (
            "[limits.sms]\nrates = [\"7/1001us\"]\nalgorithm = \"sliding_window\"",
            &["rate \"7/1001us\"", "equal slots"],
        ),
        (
            "[limit.sms]\nrates = [\"5/1h\"]",
            &["unknown top-level key `limit`", "`limits`"],
        ),
        ("limits = 5", &["`limits` must be a table", "5"]),
        (
            "[limits]\nsms = 5",
            &["limit `sms` must be a table", "got 5"],
        ),
        (
            "[limits.sms]\nrates = [\"5/1h\"",
            &["not valid TOML", "line 2"],
        ),
    ];
    for (text, expected) in cases {
        let message = parse_error(text);
        for part in *expected {
            assert!(
                message.contains(part),
                "error for {text:?} is {message:?}, which lacks {part:?}"
            );
        }
    }
}

#[test]
fn one_bad_limit_refuses_the_whole_file() {
    let text = "[limits.a]\nrates = [\"1/1m\"]\n[limits.b]\nrates = [\"1 every minute\"]";
    assert!(matches!(
        LimitsFile::parse(text),
        Err(ConfigError::BadRate { ref name, .. }) if name == "b"
    ));
}

#[test]
fn apply_sets_limits_policy_and_shadow_of_every_name() {
    let limiter = limiter();
    LimitsFile::parse(DOCUMENTED)
        .unwrap()
        .apply(&limiter)
        .unwrap();
    let sms = limiter.settings().limits("sms_phone").expect("set");
    assert_eq!(sms.len(), 3);
    assert_eq!(sms[0].algorithm(), Algorithm::SlidingLog);
    assert_eq!(
        limiter.settings().policy_for("sms_phone", None),
        FailurePolicy::FailClosed
    );
    assert_eq!(
        limiter
            .settings()
            .policy_for("login_ip", Some(FailurePolicy::FailClosed)),
        FailurePolicy::FailClosed,
        "without on_error the macro's policy stays"
    );
    assert_eq!(
        limiter.settings().limits("login_ip").unwrap()[0].threshold(),
        100
    );
}

#[tokio::test]
async fn a_shadowed_name_is_decided_but_never_refused() {
    let limiter = limiter();
    LimitsFile::parse("[limits.sms_phone]\nrates = [\"1/1m\"]\nshadow = true")
        .unwrap()
        .apply(&limiter)
        .unwrap();
    let limits = limiter.settings().limits("sms_phone").unwrap();
    let key = limiter.key("sms_phone", &"+33612345678");
    let requests = [Request::new(&key, &limits[0], 1)];
    assert!(matches!(
        limiter.requests().check("sms_phone", &requests, None).await,
        Ok(Admission::Backend(_))
    ));
    assert!(matches!(
        limiter.requests().check("sms_phone", &requests, None).await,
        Ok(Admission::Shadowed(_))
    ));
    LimitsFile::parse("[limits.sms_phone]\nrates = [\"1/1m\"]")
        .unwrap()
        .apply(&limiter)
        .unwrap();
    assert!(
        limiter
            .requests()
            .check("sms_phone", &requests, None)
            .await
            .is_err(),
        "shadow = false (the default) refuses again"
    );
}

#[test]
fn applying_unchanged_limits_again_keeps_them_as_they_are() {
    let limiter = limiter();
    let file = LimitsFile::parse(DOCUMENTED).unwrap();
    file.apply(&limiter).unwrap();
    let before = limiter.settings().limits("sms_phone").unwrap();
    file.apply(&limiter).unwrap();
    assert!(Arc::ptr_eq(
        &before,
        &limiter.settings().limits("sms_phone").unwrap()
    ));
}

#[test]
fn a_reload_returns_names_gone_from_the_file_to_their_defaults() {
    let limiter = Limiter::builder()
        .failure_policy(FailurePolicy::FailOpen)
        .build()
        .unwrap();
    let first = LimitsFile::parse(DOCUMENTED).unwrap();
    first.apply(&limiter).unwrap();
    let second =
        LimitsFile::parse("[limits.login_ip]\nrates = [\"50/1d\"]\non_error = \"fail_closed\"")
            .unwrap();
    second.apply_over(&first, &limiter).unwrap();
    assert!(limiter.settings().limits("sms_phone").is_none());
    assert_eq!(
        limiter.settings().policy_for("sms_phone", None),
        FailurePolicy::FailOpen
    );
    assert_eq!(
        limiter.settings().limits("login_ip").unwrap()[0].threshold(),
        50
    );
    assert_eq!(
        limiter.settings().policy_for("login_ip", None),
        FailurePolicy::FailClosed
    );
    // And a policy dropped from the file is dropped from the limiter.
    LimitsFile::parse("[limits.login_ip]\nrates = [\"50/1d\"]")
        .unwrap()
        .apply_over(&second, &limiter)
        .unwrap();
    assert_eq!(
        limiter.settings().policy_for("login_ip", None),
        FailurePolicy::FailOpen
    );
}

#[test]
fn a_missing_file_is_an_error_naming_the_path() {
    let error = LimitsFile::load("/nonexistent/limits.toml").unwrap_err();
    assert!(matches!(error, ConfigError::Read { .. }));
    assert!(
        error.to_string().contains("/nonexistent/limits.toml"),
        "{error}"
    );
}
