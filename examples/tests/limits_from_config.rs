//! `limits-from-config`: limits from YAML and environment variables through
//! config-rs and ratewall's serde support, applied to a limiter, run as a
//! user runs it; a bad value is refused with the limit named.

use std::process::{Command, Output};

use ratewall_tests::harness::TempDir;

const PROGRAM: &str = env!("CARGO_BIN_EXE_limits-from-config");

/// Runs the program with only `env` in its environment.
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(PROGRAM)
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .expect("run limits-from-config")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn refusal(output: &Output) -> String {
    assert!(
        !output.status.success(),
        "accepted: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(
        output.stdout.is_empty(),
        "applied something before refusing"
    );
    String::from_utf8(output.stderr.clone()).unwrap()
}

#[test]
fn the_yaml_is_loaded_applied_and_decided_with() {
    let out = stdout(&run(&[], &[]));
    assert_eq!(
        out,
        "api@pro: 1000/1m (gcra), 20/1s (sliding_window), max_in_flight=10 (lease 30s)\n\
         login_ip: 100/1d (gcra), shadow\n\
         sms_phone: 1/1m (sliding_log), 5/1h (sliding_log), 10/1d (sliding_log), on_error local:4\n\
         deny 203.0.113.9 for every limit\n\
         allow +15550100 for sms_phone\n\
         sms_phone: 1 admitted at once on +33612345678, the next refused\n"
    );
}

#[test]
fn environment_variables_override_the_yaml() {
    let out = stdout(&run(
        &[],
        &[
            (
                "APP__RATEWALL__LIMITS__SMS_PHONE__RATES",
                "3/1m,20 per hour",
            ),
            (
                "APP__RATEWALL__LIMITS__SMS_PHONE__ALGORITHM",
                "fixed_window",
            ),
            ("APP__RATEWALL__LIMITS__LOGIN_IP__SHADOW", "false"),
            ("APP__RATEWALL__LISTS__DENY", "198.51.100.1,198.51.100.2"),
        ],
    ));
    assert!(
        out.contains("sms_phone: 3/1m (fixed_window), 20/1h (fixed_window), on_error local:4\n"),
        "{out}"
    );
    assert!(out.contains("login_ip: 100/1d (gcra)\n"), "{out}");
    assert!(
        out.contains("deny 198.51.100.1 for every limit\ndeny 198.51.100.2 for every limit\n"),
        "{out}"
    );
    assert!(!out.contains("203.0.113.9"), "{out}");
    assert!(
        out.contains("sms_phone: 3 admitted at once on +33612345678, the next refused"),
        "{out}"
    );
}

#[test]
fn a_bad_value_from_the_environment_is_refused_with_the_limit_named() {
    let error = refusal(&run(
        &[],
        &[("APP__RATEWALL__LIMITS__SMS_PHONE__RATES", "5 every hour")],
    ));
    assert!(
        error.starts_with(
            "limits-from-config: configuration: limit `sms_phone`: rate \"5 every hour\": cannot parse rate"
        ),
        "{error}"
    );
    let error = refusal(&run(
        &[],
        &[("APP__RATEWALL__LIMITS__SMS_PHONE__BURST", "4")],
    ));
    assert!(
        error
            .contains("limit `sms_phone`: rate \"1/1m\": `burst` has no effect with `sliding_log`"),
        "{error}"
    );
}

#[test]
fn a_yaml_file_of_ones_own_is_read_and_its_errors_name_the_limit() {
    let dir = TempDir::new("limits-from-config");
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        "ratewall:\n  limits:\n    export:\n      rates:\n        - 100/1h\n        - { max_in_flight: 4 }\n",
    )
    .unwrap();
    let out = stdout(&run(&[good.to_str().unwrap()], &[]));
    assert_eq!(out, "export: 100/1h (gcra), max_in_flight=4 (lease 10s)\n");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "ratewall:\n  limits:\n    export:\n      rates: [{ rate: 0/1h, algorithm: gcra }]\n",
    )
    .unwrap();
    let error = refusal(&run(&[bad.to_str().unwrap()], &[]));
    assert!(
        error.contains("limit `export`: rate \"0/1h\": threshold must be at least 1, got 0"),
        "{error}"
    );
}
