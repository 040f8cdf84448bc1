//! Limits and limits files through serde (feature `serde`): every valid
//! form reads back to the same value once written (JSON and TOML), the
//! forms read as `Limit::from_str` and the builders build them, and every
//! invalid form is an error naming the value, and in a limits file the
//! limit, with the fix.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use ratewall::config::{ConfigError, LimitsFile};
use ratewall::{Algorithm, Limit};
use serde_json::{Value, json};

/// Writes `limit` to JSON and to TOML (as `limit = ...`) and reads it back
/// from both.
fn round_trips(limit: &Limit) -> Result<(Value, Limit, Limit), String> {
    let json = serde_json::to_value(limit).map_err(|e| e.to_string())?;
    let from_json: Limit =
        serde_json::from_value(json.clone()).map_err(|e| format!("{json}: {e}"))?;
    let toml = toml::to_string(&BTreeMap::from([("limit", limit)])).map_err(|e| e.to_string())?;
    let mut table: BTreeMap<String, Limit> =
        toml::from_str(&toml).map_err(|e| format!("{toml}: {e}"))?;
    Ok((json, from_json, table.remove("limit").ok_or("no limit")?))
}

/// The periods a rate is written with: a count of one unit.
const UNITS: [(&str, u64); 6] = [
    ("ms", 1_000),
    ("s", 1_000_000),
    ("m", 60_000_000),
    ("h", 3_600_000_000),
    ("d", 86_400_000_000),
    ("us", 1),
];

/// A block (`block_for`): whole minutes (`"15m"`), or any count of
/// microseconds from 1 ms to 30 days (`"1500us"`, `"2d"`).
fn blocks() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (1u64..=120).prop_map(|m| Duration::from_secs(m * 60)),
        (1_000u64..=30 * 86_400_000_000).prop_map(Duration::from_micros),
    ]
}

/// A rate limit built with the builders: a threshold, a period, an
/// algorithm, and the settings that algorithm uses (a burst for GCRA and
/// the buckets, slots for the sliding window), perhaps a lease, else
/// perhaps a block (the two never go together).
fn rate_limits() -> impl Strategy<Value = Limit> {
    (
        1u64..=20_000,
        1u64..=90,
        0usize..UNITS.len(),
        prop::sample::select(Algorithm::ALL.to_vec()),
        prop::option::of(1u64..=40_000),
        prop::option::of(prop::sample::select(vec![1u64, 2, 4, 5, 10, 20, 60])),
        prop::option::of(1u64..=5_000),
        prop::option::of(blocks()),
    )
        .prop_filter_map(
            "a valid limit",
            |(threshold, count, unit, algorithm, burst, slots, lease, block)| {
                let period = Duration::from_micros(count * UNITS[unit].1);
                let mut limit = Limit::new(threshold, period).ok()?;
                if algorithm.uses_slots()
                    && let Some(slots) = slots
                {
                    limit = limit.with_slots(slots).ok()?;
                }
                if algorithm.uses_burst()
                    && let Some(burst) = burst
                {
                    limit = limit.with_burst(burst).ok()?;
                }
                limit = limit.with_algorithm(algorithm).ok()?;
                match (lease, block) {
                    (Some(lease), _) => limit.with_lease(lease).ok(),
                    (None, Some(block)) => limit.with_block(block).ok(),
                    (None, None) => Some(limit),
                }
            },
        )
}

/// A concurrency limit: 1 to 100 000 slots, a lease of 1 s to 1 h.
fn in_flight_limits() -> impl Strategy<Value = Limit> {
    (1u64..=100_000, 1u64..=3_600).prop_map(|(max, ttl)| {
        Limit::in_flight_with_ttl(max, Duration::from_secs(ttl)).expect("in bounds")
    })
}

fn limits() -> impl Strategy<Value = Limit> {
    prop_oneof![4 => rate_limits(), 1 => in_flight_limits()]
}

/// A rate as a user writes it, with the limit `Limit::from_str` reads from
/// it: `"10/1m"`, `"10/minute"`, `"10 per minute"`, `"10 per 2 minutes"`.
fn written_rates() -> impl Strategy<Value = (String, Limit)> {
    const WORDS: [(&str, &str, u64); 4] = [
        ("second", "seconds", 1_000_000),
        ("minute", "minutes", 60_000_000),
        ("hour", "hours", 3_600_000_000),
        ("day", "days", 86_400_000_000),
    ];
    (1u64..=1_000, 1u64..=30, 0usize..WORDS.len(), 0u8..5).prop_filter_map(
        "a valid limit",
        |(threshold, count, word, style)| {
            let (one, many, size) = WORDS[word];
            // A bare unit is one of it.
            let count = if matches!(style, 2 | 3) { 1 } else { count };
            let limit = Limit::new(threshold, Duration::from_micros(count * size)).ok()?;
            let text = match style {
                0 => format!("{threshold}/{count}{}", &one[..1]),
                1 => format!("{threshold} per {count} {many}"),
                2 => format!("{threshold}/{one}"),
                3 => format!("{threshold} per {one}"),
                _ => format!(" {threshold} / {count} {many} "),
            };
            Some((text, limit))
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn every_limit_reads_back_to_itself_from_json_and_toml(limit in limits()) {
        let (json, from_json, from_toml) = round_trips(&limit).map_err(TestCaseError::fail)?;
        prop_assert_eq!(from_json, limit, "JSON {}", json);
        prop_assert_eq!(from_toml, limit, "TOML of {}", json);
    }

    #[test]
    fn a_rate_as_users_write_it_reads_as_from_str_and_writes_back_the_same(
        (text, limit) in written_rates()
    ) {
        let read: Limit = serde_json::from_value(json!(text)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(read, limit);
        prop_assert_eq!(read, text.parse::<Limit>().unwrap());
        let (_, again, _) = round_trips(&read).map_err(TestCaseError::fail)?;
        prop_assert_eq!(again, read);
    }

    #[test]
    fn a_table_reads_as_the_builders_build_it(limit in rate_limits(), seconds in any::<bool>()) {
        // Every key written out, defaults included.
        let mut table = json!({
            "rate": format!("{}/{}us", limit.threshold(), limit.period_micros()),
            "algorithm": limit.algorithm().to_string(),
        });
        if limit.algorithm().uses_burst() {
            table["burst"] = json!(limit.burst());
        }
        if limit.algorithm().uses_slots() {
            table["slots"] = json!(limit.slots());
        }
        if let Some(lease) = limit.lease() {
            table["lease"] = json!(lease);
        }
        if let Some(block) = limit.block() {
            // Whole seconds as an integer, or a duration's text.
            table["block_for"] = if seconds && block.subsec_micros() == 0 {
                json!(block.as_secs())
            } else {
                json!(format!("{}us", block.as_micros()))
            };
        }
        let read: Limit = serde_json::from_value(table.clone()).map_err(|e| TestCaseError::fail(format!("{table}: {e}")))?;
        prop_assert_eq!(read, limit, "{}", table);
    }

    #[test]
    fn a_burst_or_slots_the_algorithm_ignores_are_not_written_and_decide_the_same(
        threshold in 1u64..=1_000,
        period_s in 1u64..=600,
        algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
        burst in 1u64..=1_000,
        slots in prop::sample::select(vec![1u64, 2, 5, 10, 20]),
    ) {
        // Built in code, a limit may carry a burst or slots its algorithm has
        // no use for: they are not written (the forms refuse them), and the
        // limit read back has them at their defaults, with the same state and
        // capacity.
        let Ok(limit) = Limit::from_parts(threshold, period_s * 1_000_000, algorithm, burst, slots) else {
            return Ok(());
        };
        let (json, read, _) = round_trips(&limit).map_err(TestCaseError::fail)?;
        prop_assert_eq!(read.state_id(), limit.state_id(), "{}", json);
        prop_assert_eq!(read.capacity(), limit.capacity());
        prop_assert_eq!(read.emission_interval_micros(), limit.emission_interval_micros());
        let expected = Limit::from_parts(
            threshold,
            period_s * 1_000_000,
            algorithm,
            if algorithm.uses_burst() { burst } else { threshold },
            if algorithm.uses_slots() { slots } else { Limit::DEFAULT_SLOTS },
        ).unwrap();
        prop_assert_eq!(read, expected);
    }
}

/// A limit name as a user writes it (a tier's `<name>@<tier>` included).
fn names() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_]{0,12}(@[a-z]{1,6})?"
}

/// An identity on a list, escaped characters (`%`, `{`, `}`, `:`) included.
fn identities() -> impl Strategy<Value = String> {
    "[a-z0-9+%{}:.]{1,12}"
}

/// A limits file as JSON: entries of distinct limits (one per algorithm,
/// each with its own period), with optional policy and shadow, and lists.
fn files() -> impl Strategy<Value = Value> {
    let entry = (
        prop::collection::vec(limits(), 1..4),
        prop::option::of(prop::sample::select(vec![
            "fail_open",
            "fail_closed",
            "local:3",
        ])),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(mut limits, policy, shadow)| {
            // Distinct state ids: keep the first limit of each.
            let mut seen = Vec::new();
            limits.retain(|l| {
                let fresh = !seen.contains(&l.state_id());
                seen.push(l.state_id());
                fresh
            });
            let mut entry = json!({ "rates": limits });
            if let Some(policy) = policy {
                entry["on_error"] = json!(policy);
            }
            if let Some(shadow) = shadow {
                entry["shadow"] = json!(shadow);
            }
            entry
        });
    (
        prop::collection::btree_map(names(), entry, 0..5),
        prop::collection::btree_set(identities(), 0..4),
        prop::collection::btree_map(
            names(),
            prop::collection::btree_set(identities(), 1..3),
            0..3,
        ),
    )
        .prop_map(|(limits, denied, allowed)| {
            let mut lists = json!({});
            if !denied.is_empty() {
                lists["deny"] = json!(denied);
            }
            for (name, identities) in allowed {
                lists[name] = json!({ "allow": identities });
            }
            json!({ "limits": limits, "lists": lists })
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_limits_file_reads_back_to_itself_from_json_and_toml(form in files()) {
        let file: LimitsFile = serde_json::from_value(form.clone())
            .map_err(|e| TestCaseError::fail(format!("{form}: {e}")))?;
        let json = serde_json::to_value(&file).unwrap();
        let from_json: LimitsFile = serde_json::from_value(json.clone())
            .map_err(|e| TestCaseError::fail(format!("{json}: {e}")))?;
        prop_assert_eq!(&from_json, &file, "{}", json);
        let toml = toml::to_string(&file).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let from_toml = LimitsFile::parse(&toml).map_err(|e| TestCaseError::fail(format!("{toml}: {e}")))?;
        prop_assert_eq!(&from_toml, &file, "{}", toml);
        // And TOML's reader is serde's: the same file from the same text.
        let through_serde: LimitsFile = toml::from_str(&toml).unwrap();
        prop_assert_eq!(&through_serde, &file);
    }
}

/// The message of the error reading `form` as a limits file, through
/// `Deserialize` (serde_json's error) and `from_deserializer`, which must
/// agree.
fn file_error(form: Value) -> String {
    let typed = match LimitsFile::from_deserializer(form.clone()) {
        Ok(file) => panic!("accepted {form} as {file:?}"),
        Err(error) => error.to_string(),
    };
    let through_serde = serde_json::from_value::<LimitsFile>(form)
        .unwrap_err()
        .to_string();
    assert_eq!(through_serde, typed);
    typed
}

#[test]
fn every_invalid_limit_in_a_file_is_an_error_naming_the_limit_and_the_fix() {
    let cases: Vec<(Value, &[&str])> = vec![
        (
            json!({ "rates": ["0/1m"] }),
            &["rate \"0/1m\"", "threshold must be at least 1, got 0"],
        ),
        (
            json!({ "rates": ["5/1h"], "algorithm": "fastest" }),
            &[
                "`algorithm` = \"fastest\"",
                "expected one of",
                "\"sliding_log\"",
            ],
        ),
        (
            json!({ "rates": [{ "rate": "5/1h", "algorithm": "fastest" }] }),
            &["`algorithm` = \"fastest\"", "\"token_bucket\""],
        ),
        (
            json!({ "rates": ["5/1h"], "algorithm": "fixed_window", "burst": 10 }),
            &[
                "rate \"5/1h\"",
                "`burst` has no effect with `fixed_window`",
                "remove it",
            ],
        ),
        (
            json!({ "rates": [{ "rate": "5/1h", "algorithm": "sliding_log", "burst": 10 }] }),
            &["`burst` has no effect with `sliding_log`"],
        ),
        (
            json!({ "rates": [{ "rate": "5/1h", "slots": 20 }] }),
            &["`slots` only applies to `algorithm = sliding_window`, not `gcra`"],
        ),
        (
            json!({ "rates": ["5/1fortnight"] }),
            &[
                "rate \"5/1fortnight\"",
                "THRESHOLD/PERIOD",
                "\"10 per minute\"",
            ],
        ),
        (
            json!({ "rates": ["5 every hour"] }),
            &["rate \"5 every hour\"", "cannot parse rate"],
        ),
        (
            json!({ "rates": [{ "max_in_flight": 3, "in_flight_ttl": "1.5s" }] }),
            &["`in_flight_ttl` = \"1.5s\"", "cannot parse duration"],
        ),
        (
            json!({ "rates": ["100/1m"], "algorithm": "sliding_log", "lease": 10 }),
            &["rate \"100/1m\"", "`sliding_log` cannot lease"],
        ),
        (
            json!({ "rates": [{ "rate": "100/1m", "lease": 100 }] }),
            &[
                "lease 100 must be smaller than the capacity of 100",
                "at most 99",
            ],
        ),
        (
            json!({ "rates": ["5/1m"], "block_for": "31d" }),
            &[
                "`block_for` = \"31d\"",
                "a block lasts from 1ms to 30d",
                "got 31d",
            ],
        ),
        (
            json!({ "rates": ["5/1m"], "block_for": "soon" }),
            &[
                "`block_for` = \"soon\"",
                "expected a duration such as \"15m\"",
            ],
        ),
        (
            json!({ "rates": ["5/1m"], "block_for": 0 }),
            &["`block_for` = 0", "from 1ms to 30d", "got 0us"],
        ),
        (
            json!({ "rates": ["5/1m"], "block_for": -5 }),
            &["`block_for` = -5", "or whole seconds"],
        ),
        (
            json!({ "rates": ["100/1m"], "lease": 10, "block_for": "1m" }),
            &[
                "rate \"100/1m\"",
                "cannot both lease and block",
                "remove `lease` or the block",
            ],
        ),
        (
            json!({ "rates": [{ "max_in_flight": 3 }], "block_for": "1m" }),
            &[
                "`block_for` = \"1m\"",
                "`rates` has none",
                "move it into the tables",
            ],
        ),
        (
            json!({ "rates": ["5/1h", "10 per hour"] }),
            &[
                "limits 5/1h (gcra) and 10/1h (gcra) share an algorithm and period",
                "keep one",
            ],
        ),
        (
            json!({ "rates": ["5/1h", "10/60m"] }),
            &["share an algorithm and period"],
        ),
        (
            json!({ "rates": ["20000/1m"], "algorithm": "sliding_log" }),
            &["sliding-window counter"],
        ),
        (
            json!({ "rates": ["1/1m"], "treshold": 3 }),
            &["unknown key `treshold`", "`rates`"],
        ),
        (json!({ "algorithm": "gcra" }), &["`rates` is missing"]),
        (json!({ "rates": [] }), &["at least one rate"]),
        (
            json!({ "rates": [true] }),
            &["`rates` = true", "expected a rate"],
        ),
        (
            json!({ "rates": ["1/1m"], "burst": -2 }),
            &["`burst` = -2", "positive integer"],
        ),
        (
            json!({ "rates": ["1/1m"], "burst": 2.5 }),
            &["`burst` = 2.5", "positive integer"],
        ),
        (
            json!({ "rates": ["1/1m"], "shadow": "yes" }),
            &["`shadow` = \"yes\"", "true or false"],
        ),
        (
            json!({ "rates": ["1/1m"], "on_error": "local:0" }),
            &["`on_error` = \"local:0\"", "local:<share>"],
        ),
        (json!(["1/1m"]), &["must be a table", "got [\"1/1m\"]"]),
    ];
    for (entry, expected) in cases {
        let message = file_error(json!({ "limits": { "sms_phone": entry.clone() } }));
        assert!(
            message.starts_with("limit `sms_phone`"),
            "{entry}: {message}"
        );
        for part in expected {
            assert!(
                message.contains(part),
                "{entry}: {message:?} lacks {part:?}"
            );
        }
    }
}

#[test]
fn a_key_given_twice_in_json_is_refused_with_its_place() {
    let twice = |text: &str| {
        let mut de = serde_json::Deserializer::from_str(text);
        LimitsFile::from_deserializer(&mut de).unwrap_err()
    };
    assert_eq!(
        twice(r#"{"limits": {"sms": {"rates": ["1/1m"], "burst": 2, "burst": 3}}}"#),
        ConfigError::Duplicate {
            name: Some("sms".into()),
            key: "burst".into()
        }
    );
    assert_eq!(
        twice(r#"{"limits": {"sms": {"rates": ["1/1m"]}, "sms": {"rates": ["2/1m"]}}}"#)
            .to_string(),
        "`limits.sms` given twice; keep one"
    );
    let item = twice(r#"{"limits": {"sms": {"rates": [{"rate": "1/1m", "rate": "2/1m"}]}}}"#);
    assert!(
        item.to_string().starts_with("limit `sms`: `rates` = ")
            && item.to_string().ends_with("`rate` given twice; keep one"),
        "{item}"
    );
}

#[test]
fn a_file_that_is_not_a_table_or_not_json_says_so() {
    assert_eq!(
        file_error(json!([1, 2])),
        "a limits file is a table of `limits` (e.g. `[limits.sms_phone]`) and `lists`; got [1, 2]"
    );
    assert!(file_error(json!({ "limit": {} })).contains("unknown top-level key `limit`"));
    let mut de = serde_json::Deserializer::from_str("{\"limits\": ");
    assert!(matches!(
        LimitsFile::from_deserializer(&mut de),
        Err(ConfigError::Format(_))
    ));
    // An empty document (YAML's `ratewall:` with nothing under it) is an
    // empty file.
    assert_eq!(
        serde_json::from_value::<LimitsFile>(Value::Null).unwrap(),
        LimitsFile::default()
    );
}

#[test]
fn every_invalid_limit_alone_is_an_error_naming_the_value_and_the_fix() {
    let cases: Vec<(Value, &str)> = vec![
        (
            json!("0/1m"),
            "rate \"0/1m\": threshold must be at least 1, got 0",
        ),
        (
            json!("5/0s"),
            "rate \"5/0s\": period must be at least 1 microsecond, got 0",
        ),
        (
            json!("ten per minute"),
            "rate \"ten per minute\": cannot parse rate",
        ),
        (json!(10), "10: expected a rate such as \"5/1h\""),
        (
            json!({ "rate": "10/1m", "algorithm": "leaky" }),
            "`algorithm` = \"leaky\": expected one of \"fixed_window\"",
        ),
        (
            json!({ "rate": "10/1m", "algorithm": "in_flight" }),
            "`algorithm` = \"in_flight\": expected one of",
        ),
        (
            json!({ "rate": "10/1m", "algorithm": "fixed_window", "burst": 20 }),
            "rate \"10/1m\": `burst` has no effect with `fixed_window`",
        ),
        (
            json!({ "rate": "10/1m", "algorithm": "sliding_window", "slots": 7 }),
            "rate \"10/1m\": a period of 60000000 µs cannot be split into 7 equal slots",
        ),
        (
            json!({ "rate": "10/1m", "lease": 0 }),
            "`lease` = 0: expected a positive integer",
        ),
        (
            json!({ "rate": "10/1m", "brust": 1 }),
            "unknown key `brust`",
        ),
        (json!({ "burst": 1 }), "holds `rate`"),
        (
            json!({ "max_in_flight": 0 }),
            "`max_in_flight` = 0: expected a positive integer",
        ),
        (
            json!({ "max_in_flight": 10, "in_flight_ttl": "500ms" }),
            "`in_flight_ttl` = \"500ms\": an in-flight lease lives from 1s to 1h",
        ),
        (
            json!({ "max_in_flight": 10, "algorithm": "gcra" }),
            "`algorithm` does not go with `max_in_flight`",
        ),
        (
            json!({ "max_in_flight": 10, "block_for": "1m" }),
            "`block_for` does not go with `max_in_flight`",
        ),
        (
            json!({ "rate": "10/1m", "block_for": "500us" }),
            "`block_for` = \"500us\": a block lasts from 1ms to 30d",
        ),
        (
            json!({ "rate": "10/1m", "block_for": true }),
            "`block_for` = true: expected a duration such as \"15m\" or \"1h\", or whole seconds",
        ),
        (
            json!({ "rate": "10/1m", "block_for": "15m", "lease": 2 }),
            "rate \"10/1m\": a limit cannot both lease and block",
        ),
    ];
    for (form, expected) in cases {
        let message = match serde_json::from_value::<Limit>(form.clone()) {
            Ok(limit) => panic!("accepted {form} as {limit:?}"),
            Err(error) => error.to_string(),
        };
        assert!(
            message.contains(expected),
            "{form}: {message:?} lacks {expected:?}"
        );
    }
}

#[test]
fn algorithms_read_and_write_their_names() {
    for algorithm in Algorithm::EVERY {
        let written = serde_json::to_value(algorithm).unwrap();
        assert_eq!(written, json!(algorithm.name()));
        assert_eq!(
            serde_json::from_value::<Algorithm>(written).unwrap(),
            algorithm
        );
    }
    let unknown = serde_json::from_value::<Algorithm>(json!("gcr")).unwrap_err();
    assert!(
        unknown
            .to_string()
            .starts_with("unknown algorithm \"gcr\": expected one of")
    );
}

#[test]
fn the_shortest_forms_are_what_a_person_would_write() {
    let write = |limit: Limit| serde_json::to_value(limit).unwrap();
    assert_eq!(write(Limit::per_minute(10).unwrap()), json!("10/1m"));
    assert_eq!(
        write(Limit::new(5, Duration::from_secs(30)).unwrap()),
        json!("5/30s")
    );
    assert_eq!(
        write(Limit::per_minute(10).unwrap().with_burst(20).unwrap()),
        json!({ "rate": "10/1m", "burst": 20 })
    );
    let window = Limit::per_hour(600)
        .unwrap()
        .with_algorithm(Algorithm::SlidingWindow)
        .unwrap()
        .with_slots(20)
        .unwrap();
    assert_eq!(
        write(window),
        json!({ "rate": "600/1h", "algorithm": "sliding_window", "slots": 20 })
    );
    assert_eq!(
        write(Limit::per_minute(1000).unwrap().with_lease(100).unwrap()),
        json!({ "rate": "1000/1m", "lease": 100 })
    );
    assert_eq!(
        write(
            Limit::per_minute(5)
                .unwrap()
                .with_block(Duration::from_secs(900))
                .unwrap()
        ),
        json!({ "rate": "5/1m", "block_for": "15m" })
    );
    assert_eq!(
        write(
            Limit::per_minute(5)
                .unwrap()
                .with_block(Duration::from_micros(1_500))
                .unwrap()
        ),
        json!({ "rate": "5/1m", "block_for": "1500us" })
    );
    assert_eq!(
        write(Limit::in_flight(4).unwrap()),
        json!({ "max_in_flight": 4 })
    );
    assert_eq!(
        write(Limit::in_flight_with_ttl(4, Duration::from_secs(90)).unwrap()),
        json!({ "max_in_flight": 4, "in_flight_ttl": "90s" })
    );
}

#[test]
fn a_name_s_block_for_blocks_its_rates_written_as_text_and_writes_back_on_each() {
    let file = LimitsFile::parse(
        "[limits.login]\n\
         rates = [\"5/1m\", \"20/1h\", { rate = \"100/1d\", algorithm = \"fixed_window\" }, { max_in_flight = 2 }]\n\
         block_for = \"15m\"\n\
         [limits.api]\n\
         rates = [\"5/1s\"]\n\
         block_for = 30\n",
    )
    .unwrap();
    let login = file.get("login").unwrap().limits();
    let block = Some(Duration::from_secs(900));
    assert_eq!(
        login.iter().map(Limit::block).collect::<Vec<_>>(),
        [block, block, None, None],
        "a table carries its own settings"
    );
    let api = file.get("api").unwrap().limits();
    assert_eq!(api[0].block(), Some(Duration::from_secs(30)));
    // Written back, each limit carries its block in its table.
    let written = serde_json::to_value(&file).unwrap();
    assert_eq!(
        written["limits"]["login"]["rates"][0],
        json!({ "rate": "5/1m", "block_for": "15m" })
    );
    assert_eq!(
        written["limits"]["api"]["rates"][0],
        json!({ "rate": "5/1s", "block_for": "30s" })
    );
    let toml = toml::to_string(&file).unwrap();
    assert_eq!(LimitsFile::parse(&toml).unwrap(), file, "{toml}");
}
