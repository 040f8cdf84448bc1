//! `LIMITS_FILE`: the login service applies a limits file at startup, applies
//! it again on SIGHUP, keeps its limits when the new file is bad, and refuses
//! to start on a bad file.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BACKENDS, Service};
use ratewall_tests::harness::TempDir;
use serde_json::json;

const LOGIN: &str = env!("CARGO_BIN_EXE_login");

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write the limits file");
}

fn user_failures(rate: &str) -> String {
    format!("[limits.login_user]\nrates = [\"{rate}\"]\nalgorithm = \"sliding_log\"\n")
}

fn hangup(service: &Service) {
    let status = Command::new("kill")
        .args(["-HUP", &service.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -HUP failed");
}

/// Wrong-password attempts for `username` until a captcha is required:
/// how many failures the per-user limit let through (at most `cap`).
async fn failures_before_captcha(service: &Service, username: &str, cap: usize) -> usize {
    for n in 0..=cap {
        let response = service
            .post_json(
                "/login",
                json!({ "username": username, "password": "nope" }),
            )
            .await;
        match response.status().as_u16() {
            401 => {}
            429 => return n,
            other => panic!("unexpected status {other} for {username}"),
        }
    }
    cap + 1
}

#[tokio::test]
async fn the_file_applies_at_startup_and_again_on_sighup() {
    for backend in BACKENDS {
        let dir = TempDir::new("limits-file");
        let path = dir.path().join("limits.toml");
        write(&path, &user_failures("5/1m"));
        let service = Service::start(LOGIN, backend, &[("LIMITS_FILE", path.to_str().unwrap())]);
        assert_eq!(
            failures_before_captcha(&service, "carol", 10).await,
            5,
            "{backend:?}: the file's 5/1m replaces the compiled-in 3/1m"
        );

        write(&path, &user_failures("2/1m"));
        hangup(&service);
        // The reload is asynchronous: poll with fresh usernames until one
        // is held to the new limit. A reload that lands during a poll holds
        // that username's failures so far to the new limit from then on
        // (the history carries over): it sees between the new limit and
        // the old one, never more than the old, never fewer than the new.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let seen = failures_before_captcha(&service, &format!("poll{attempt}"), 10).await;
            if seen == 2 {
                break;
            }
            assert!(
                (2..=5).contains(&seen),
                "{backend:?}: {seen} failures, not between the new limit (2) and the old (5)"
            );
            assert!(
                Instant::now() < deadline,
                "{backend:?}: SIGHUP did not apply the new file"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(failures_before_captcha(&service, "dave", 10).await, 2);

        // A bad file is logged and ignored: the limits in force stay.
        write(&path, "[limits.login_user]\nrates = [\"2 per minute\"]\n");
        hangup(&service);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            failures_before_captcha(&service, "erin", 10).await,
            2,
            "{backend:?}: the bad file changed nothing"
        );
        let ok = service
            .post_json(
                "/login",
                json!({ "username": "bob", "password": "builder" }),
            )
            .await;
        assert_eq!(ok.status(), 200, "{backend:?}: the service still serves");
    }
}

#[test]
fn a_bad_file_at_startup_stops_the_service_with_a_clear_message() {
    let dir = TempDir::new("limits-file");
    let path = dir.path().join("limits.toml");
    write(
        &path,
        "[limits.login_user]\nrates = [\"3/1m\"]\nburst = \"ten\"\n",
    );
    let mut child = Command::new(LOGIN)
        .env("LIMITS_FILE", &path)
        .env("BIND", "127.0.0.1:0")
        .env_remove("REDIS_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start login");
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("login started with a bad limits file");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("limit `login_user`: `burst` = \"ten\": expected a positive integer"),
        "{stderr}"
    );
    assert!(stderr.contains("limits.toml"), "names the file: {stderr}");
}
