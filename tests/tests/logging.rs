//! A library's manners: under a flood of refusals a service logging at
//! `RUST_LOG=info` gets a handful of lines, not one per refusal. Every
//! refusal is a DEBUG line; at INFO a limit name writes its first refusal
//! in full, then at most one summary line every ten seconds.

use std::io::Write;
use std::sync::{Arc, Mutex};

use ratewall::{CallSpec, GroupSpec, Keys, Limit, Limiter, Rejection, rate_limit};
use tracing_subscriber::EnvFilter;

/// What a subscriber configured from `filter` (as `RUST_LOG` would be)
/// writes while `run` runs.
fn logged_at<T>(filter: &str, run: impl FnOnce() -> T) -> (T, Vec<String>) {
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let out = tracing::subscriber::with_default(subscriber, run);
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    (out, text.lines().map(str::to_owned).collect())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[rate_limit(name = "sms_phone", key = phone, period = "1h", threshold = 1, limiter = limiter)]
async fn send(limiter: &Limiter, phone: u64) -> Result<(), Rejection> {
    let _ = phone;
    Ok(())
}

/// At most this many lines for 100 000 refusals: the first in full, and a
/// summary per ten seconds (more than four would take the flood a minute).
const HANDFUL: usize = 5;

#[test]
fn a_hundred_thousand_refusals_through_the_macro_write_a_handful_of_lines_at_info() {
    let limiter = Limiter::builder().memory().build().unwrap();
    let (refused, lines) = logged_at("info", || {
        runtime().block_on(async {
            send(&limiter, 7).await.expect("the first send passes");
            let mut refused = 0;
            for _ in 0..100_000 {
                refused += usize::from(send(&limiter, 7).await.is_err());
            }
            refused
        })
    });
    assert_eq!(refused, 100_000);
    assert!(
        !lines.is_empty() && lines.len() <= HANDFUL,
        "{} lines: {lines:#?}",
        lines.len()
    );
    assert!(
        lines[0].contains("INFO") && lines[0].contains("rate limited"),
        "{lines:?}"
    );
    assert!(lines[0].contains("sms_phone"), "{lines:?}");
}

#[test]
fn a_hundred_thousand_refusals_of_a_call_of_two_limits_write_a_handful_of_lines_at_info() {
    let limiter = Limiter::builder().memory().build().unwrap();
    let spec = CallSpec::owned(
        "login",
        vec![
            GroupSpec::owned("login_user", vec![Limit::per_minute(1).unwrap()]),
            GroupSpec::owned("login_ip", vec![Limit::per_hour(10_000).unwrap()]),
        ],
    );
    let (refused, lines) = logged_at("info", || {
        runtime().block_on(async {
            let mut refused = 0;
            for _ in 0..100_001 {
                refused += usize::from(
                    limiter
                        .call_with(&spec, Keys::new(&[&"alice", &"10.0.0.1"]))
                        .await
                        .is_err(),
                );
            }
            refused
        })
    });
    assert_eq!(refused, 100_000);
    assert!(
        !lines.is_empty() && lines.len() <= HANDFUL,
        "{} lines: {lines:#?}",
        lines.len()
    );
}

#[test]
fn deny_listed_and_shadowed_calls_write_a_handful_of_lines_at_info() {
    let limiter = Limiter::builder().memory().build().unwrap();
    let spec = CallSpec::owned(
        "api",
        vec![GroupSpec::owned(
            "api_user",
            vec![Limit::per_hour(1).unwrap()],
        )],
    );
    let (_, lines) = logged_at("info", || {
        runtime().block_on(async {
            limiter.settings().set_shadow("api_user", true);
            for _ in 0..10_000 {
                let admitted = limiter.call_with(&spec, Keys::new(&[&"bob"])).await;
                drop(admitted.expect("shadow mode admits"));
            }
            limiter
                .settings()
                .deny(Some("api_user"), &"mallory", None)
                .await
                .unwrap();
            for _ in 0..10_000 {
                assert!(
                    limiter
                        .call_with(&spec, Keys::new(&[&"mallory"]))
                        .await
                        .is_err()
                );
            }
        })
    });
    // The two settings changed (two lines), then each kind's first line.
    assert!(
        lines.len() <= 2 + 2 * HANDFUL,
        "{} lines: {lines:#?}",
        lines.len()
    );
    assert!(
        lines.iter().any(|l| l.contains("shadow mode")),
        "{lines:#?}"
    );
    assert!(lines.iter().any(|l| l.contains("deny list")), "{lines:#?}");
}

#[test]
fn at_debug_every_refusal_is_a_line() {
    let limiter = Limiter::builder().memory().build().unwrap();
    let (_, lines) = logged_at("ratewall=debug", || {
        runtime().block_on(async {
            send(&limiter, 9).await.unwrap();
            for _ in 0..1_000 {
                assert!(send(&limiter, 9).await.is_err());
            }
        })
    });
    let debug = lines
        .iter()
        .filter(|l| l.contains(" DEBUG ") && l.contains("rate limited"))
        .count();
    assert_eq!(debug, 1_000, "{lines:#?}");
}
