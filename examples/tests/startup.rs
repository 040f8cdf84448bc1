//! What the services print when they cannot start: one sentence naming what
//! failed and where, no secret, no Rust debug output, a non-zero exit.

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::run_to_exit;
use ratewall_tests::RedisServer;

const SMS: &str = env!("CARGO_BIN_EXE_sms");
const LOGIN: &str = env!("CARGO_BIN_EXE_login");

/// Runs `binary` until it exits and returns its one line of stderr, after
/// checking it failed and printed no debug form.
fn refusal(binary: &str, env: &[(&str, &str)]) -> String {
    let (code, stderr) = run_to_exit(binary, env, Duration::from_secs(20));
    assert_eq!(code, Some(1), "{binary} with {env:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one sentence: {stderr}");
    let line = lines[0];
    let name = std::path::Path::new(binary)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    assert!(line.starts_with(&format!("{name}: ")), "{line}");
    for debug in [
        "Error:",
        "Unavailable(",
        "Timeout(",
        "Custom {",
        "kind:",
        "Os {",
    ] {
        assert!(!line.contains(debug), "debug output `{debug}`: {line}");
    }
    line.to_owned()
}

#[test]
fn bad_settings_in_memory_name_the_setting() {
    let line = refusal(SMS, &[("SMS_PHONE_LIMITS", "1/1m,5 per fortnight")]);
    assert!(
        line.contains("invalid sms limits") && line.contains("5 per fortnight"),
        "{line}"
    );
    let line = refusal(SMS, &[("SMS_INSTANCES", "zero")]);
    assert!(line.contains("SMS_INSTANCES"), "{line}");
    let line = refusal(LOGIN, &[("LOGIN_CAPTCHA_TTL", "soon")]);
    assert!(line.contains("LOGIN_CAPTCHA_TTL"), "{line}");
    let line = refusal(LOGIN, &[("TRUSTED_PROXIES", "10.0.0.0/33")]);
    assert!(line.contains("TRUSTED_PROXIES"), "{line}");

    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let bind = taken.local_addr().unwrap().to_string();
    for binary in [SMS, LOGIN] {
        let line = refusal(binary, &[("BIND", &bind)]);
        assert!(line.contains(&format!("cannot listen on {bind}")), "{line}");
    }
}

#[tokio::test]
async fn redis_authentication_failures_say_so_without_the_password() {
    let redis = RedisServer::start();
    let password = "hunter2-5feceb66";
    let _: String = redis.cmd(&["CONFIG", "SET", "requirepass", password]).await;
    let port = redis.port();
    let none = format!("redis://127.0.0.1:{port}/");
    let wrong = format!("redis://default:not-{password}@127.0.0.1:{port}/");
    for binary in [SMS, LOGIN] {
        let line = refusal(binary, &[("REDIS_URL", &none)]);
        assert!(line.contains(&format!("Redis at {none}")), "{line}");
        assert!(line.contains("authentication required"), "{line}");

        let line = refusal(binary, &[("REDIS_URL", &wrong)]);
        assert!(
            line.contains(&format!("Redis at redis://***@127.0.0.1:{port}/")),
            "{line}"
        );
        assert!(line.contains("authentication failed"), "{line}");
        assert!(
            !line.contains(password) && !line.contains("default"),
            "{line}"
        );
    }
}

#[test]
fn a_redis_that_never_answers_or_refuses_connections_is_named() {
    let redis = RedisServer::start();
    redis.pause();
    let url = format!("redis://:pw@127.0.0.1:{}/", redis.port());
    let shown = format!("redis://***@127.0.0.1:{}/", redis.port());
    let lines: Vec<String> = std::thread::scope(|scope| {
        let runs: Vec<_> = [SMS, LOGIN]
            .into_iter()
            .map(|binary| scope.spawn(|| refusal(binary, &[("REDIS_URL", &url)])))
            .collect();
        runs.into_iter().map(|run| run.join().unwrap()).collect()
    });
    for line in lines {
        assert!(
            line.contains(&format!("Redis at {shown} did not answer within 5 s")),
            "{line}"
        );
    }
    redis.resume();

    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let line = refusal(SMS, &[("REDIS_URL", &format!("redis://127.0.0.1:{port}/"))]);
    assert!(
        line.contains(&format!(
            "Redis at redis://127.0.0.1:{port}/ refused the connection"
        )),
        "{line}"
    );
    let line = refusal(SMS, &[("REDIS_URL", "http://user:pw@host/")]);
    assert!(
        line.contains("REDIS_URL: invalid Redis URL `http://***@host/`: unknown scheme `http://`"),
        "{line}"
    );
}
