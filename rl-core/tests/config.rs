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
        (
            "[limits.sms]\nrates = [5]",
            &[
                "limit `sms`",
                "`rates` = 5",
                "expected a rate such as \"5/1h\"",
            ],
        ),
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

#[test]
fn a_rate_may_be_a_table_with_settings_of_its_own_and_the_name_s_apply_to_the_others() {
    let file = LimitsFile::parse(
        r#"
        [limits.api]
        rates = ["600/1m", { rate = "20/1s", algorithm = "sliding_window", slots = 20 }, "10000/1d", { rate = "5/1h" }]
        algorithm = "token_bucket"
        burst = 50
        "#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let limits = file.get("api").unwrap().limits();
    let bucket = |rate: &str| {
        rate.parse::<Limit>()
            .and_then(|l| l.with_burst(50))
            .and_then(|l| l.with_algorithm(Algorithm::TokenBucket))
            .unwrap()
    };
    let window = "20/1s"
        .parse::<Limit>()
        .and_then(|l| l.with_slots(20))
        .and_then(|l| l.with_algorithm(Algorithm::SlidingWindow))
        .unwrap();
    assert_eq!(
        limits,
        [
            bucket("600/1m"),
            window,
            bucket("10000/1d"),
            Limit::per_hour(5).unwrap()
        ]
    );
}

#[test]
fn a_name_s_setting_with_no_rate_written_as_text_is_refused() {
    let message = parse_error(
        "[limits.api]\nrates = [{ rate = \"20/1s\", algorithm = \"fixed_window\" }]\nburst = 50",
    );
    assert_eq!(
        message,
        "limit `api`: `burst` = 50: it sets the rates written as text, and `rates` has none (a limit's \
         table carries its own settings); move it into the tables"
    );
}

#[test]
fn a_concurrency_limit_is_a_table_of_max_in_flight_beside_the_rates() {
    let file = LimitsFile::parse(
        "[limits.export]\nrates = [\"100/1h\", { max_in_flight = 4, in_flight_ttl = \"30s\" }, { max_in_flight = 2, in_flight_ttl = 60 }]",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let limits = file.get("export").unwrap().limits();
    assert_eq!(limits[0], Limit::per_hour(100).unwrap());
    assert_eq!(
        limits[1],
        Limit::in_flight_with_ttl(4, std::time::Duration::from_secs(30)).unwrap()
    );
    assert_eq!(
        limits[2],
        Limit::in_flight_with_ttl(2, std::time::Duration::from_secs(60)).unwrap()
    );
    let only = LimitsFile::parse("[limits.export]\nrates = [{ max_in_flight = 4 }]").unwrap();
    assert_eq!(
        only.get("export").unwrap().limits(),
        [Limit::in_flight(4).unwrap()]
    );
}

#[test]
fn the_forms_of_a_rate_are_refused_with_the_limit_and_the_fix_named() {
    let cases: &[(&str, &[&str])] = &[
        (
            "rates = [\"5/1h\"]\nalgorithm = \"fixed_window\"\nburst = 10",
            &["rate \"5/1h\"", "`burst` has no effect with `fixed_window`"],
        ),
        (
            "rates = [\"5/1h\"]\nslots = 6",
            &[
                "rate \"5/1h\"",
                "`slots` only applies to `algorithm = sliding_window`, not `gcra`",
            ],
        ),
        (
            "rates = [\"5/1h\"]\nalgorithm = \"in_flight\"",
            &["`algorithm` = \"in_flight\"", "max_in_flight = 10"],
        ),
        (
            "rates = [{ rate = \"5/1h\", brust = 2 }]",
            &["`rates` = {", "brust = 2", "unknown key `brust`", "`burst`"],
        ),
        (
            "rates = [{ rate = \"5/1h\", max_in_flight = 2 }]",
            &["one of them", "write two limits"],
        ),
        (
            "rates = [{ algorithm = \"gcra\" }]",
            &["`rates` = { algorithm = \"gcra\" }", "holds `rate`"],
        ),
        (
            "rates = [{ max_in_flight = 2, burst = 3 }]",
            &["`burst` does not go with `max_in_flight`"],
        ),
        (
            "rates = [{ rate = 5 }]",
            &["`rate` = 5", "expected a rate such as"],
        ),
        (
            "rates = [{ rate = \"5/1h\", burst = 0 }]",
            &["`burst` = 0", "positive integer"],
        ),
        (
            "rates = [{ rate = \"5/1h\", algorithm = \"sliding_log\", lease = 2 }]",
            &["rate \"5/1h\"", "`sliding_log` cannot lease"],
        ),
        (
            "rates = [{ max_in_flight = 0 }]",
            &["`max_in_flight` = 0", "positive integer"],
        ),
        (
            "rates = [{ max_in_flight = 200000 }]",
            &["`max_in_flight` = 200000", "at most 100000"],
        ),
        (
            "rates = [{ max_in_flight = 2, in_flight_ttl = \"2h\" }]",
            &["`in_flight_ttl` = \"2h\"", "from 1s to 1h"],
        ),
        (
            "rates = [{ max_in_flight = 2, in_flight_ttl = \"soon\" }]",
            &["`in_flight_ttl` = \"soon\"", "cannot parse duration"],
        ),
        (
            "rates = [{ max_in_flight = 2 }]\nburst = 3",
            &["`burst` = 3", "rates written as text"],
        ),
        (
            "rates = [\"5/1h\", { rate = \"10 per hour\", algorithm = \"gcra\" }]",
            &["5/1h (gcra) and 10/1h (gcra)", "keep one"],
        ),
        (
            "rates = [\"5/fortnight\"]",
            &["rate \"5/fortnight\"", "THRESHOLD/PERIOD"],
        ),
        (
            "rates = [\"0/1h\"]",
            &["rate \"0/1h\"", "threshold must be at least 1"],
        ),
    ];
    for (entry, expected) in cases {
        let text = format!("[limits.sms]\n{entry}");
        let message = parse_error(&text);
        assert!(message.starts_with("limit `sms`"), "{message}");
        for part in *expected {
            assert!(
                message.contains(part),
                "error for {text:?} is {message:?}, which lacks {part:?}"
            );
        }
    }
}

#[test]
fn list_identities_may_be_whole_numbers() {
    let file = LimitsFile::parse("[lists.sms_phone]\ndeny = [12345, \"alice\"]").unwrap();
    let identities: Vec<&str> = file.lists().iter().map(|e| e.identity.as_str()).collect();
    assert_eq!(identities, ["12345", "alice"]);
    let both = parse_error("[lists]\nallow = [7]\ndeny = [\"7\"]");
    assert!(
        both.contains("on the allow list and the deny list"),
        "{both}"
    );
}

#[test]
fn a_file_written_back_to_toml_reads_the_same() {
    let text = r#"
        [limits.sms_phone]
        rates = ["1/1m", "5/1h", "10/1d"]
        algorithm = "sliding_log"
        on_error = "local:4"
        shadow = true

        [limits."api@pro"]
        rates = ["1000/1m", { rate = "20/1s", algorithm = "sliding_window", slots = 20 }, { max_in_flight = 10, in_flight_ttl = "30s" }]
        burst = 1500

        [limits.tenant_api]
        rates = ["1000000/1m"]
        algorithm = "fixed_window"
        lease = 10000

        [lists]
        deny = ["203.0.113.9", "a:b{c}%"]

        [lists.sms_phone]
        allow = ["+15550100"]
        deny = ["+33612345678"]
    "#;
    let file = LimitsFile::parse(text).unwrap();
    let written = toml::to_string(&file).unwrap();
    assert_eq!(LimitsFile::parse(&written), Ok(file.clone()), "{written}");
    // Each rate in its shortest form: a table where it has settings.
    assert!(
        written.contains("rate = \"1/1m\"\nalgorithm = \"sliding_log\""),
        "{written}"
    );
    assert!(written.contains("on_error = \"local:4\""), "{written}");
    assert!(
        written.contains(r#"deny = ["203.0.113.9", "a:b{c}%"]"#),
        "{written}"
    );
    let empty = toml::to_string(&LimitsFile::default()).unwrap();
    assert_eq!(LimitsFile::parse(&empty), Ok(LimitsFile::default()));
}
