//! An annotated function decided in Redis: one verification code a minute
//! per phone number, on a sliding log (never two within any 60 s).
//!
//! `REDIS_URL=redis://127.0.0.1:6379/ cargo run -p ratewall-redis --example redis`
//!
//! Needs a Redis server of yours (7 or later runs the Functions library,
//! 4.0 to 6 the scripts); without `REDIS_URL`, or when the server does not
//! answer, it says so and exits with status 1. Each run writes under its own
//! key prefix (`ratewall-example-<pid>`); every key it writes expires: the
//! decisions' within a minute, the limits registry (`<prefix>:{limits}`,
//! for operators' tools) after seven days.

use std::process::ExitCode;
use std::time::Duration;

use ratewall::{Limiter, Rejection, rate_limit};
use ratewall_redis::{RedisBackend, redact_url};

#[rate_limit(period = 60, threshold = 1, key = phone, algorithm = sliding_log)]
async fn send_code(phone: &str) -> Result<(), Rejection> {
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let Ok(url) = std::env::var("REDIS_URL") else {
        eprintln!(
            "redis: REDIS_URL is not set. Give it a Redis server, e.g.\n  \
             REDIS_URL=redis://127.0.0.1:6379/ cargo run -p ratewall-redis --example redis\n\
             (`redis-server` starts one on port 6379)"
        );
        return ExitCode::FAILURE;
    };
    match run(&url).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("redis: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let backend = RedisBackend::builder(url)
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await
        .map_err(|error| format!("cannot use Redis at {}: {error}", redact_url(url)))?;
    println!(
        "connected to {} ({:?})",
        redact_url(url),
        backend.call_mode()
    );
    // A prefix of this run's own, so that a second run within the minute
    // starts from fresh state.
    let prefix = format!("ratewall-example-{}", std::process::id());
    Limiter::builder()
        .backend(backend)
        .prefix(prefix)
        .install()?;

    let phone = "+33 6 12 34 56 78";
    send_code(phone).await?;
    println!("first code to {phone}: sent");
    let refused = send_code(phone)
        .await
        .expect_err("a second code within the minute is refused");
    let retry_after = refused.retry_after().unwrap_or_default();
    println!(
        "second code: refused by {}, retry after {retry_after:?}",
        refused.name()
    );
    assert!(retry_after > Duration::from_secs(55) && retry_after <= Duration::from_secs(60));
    send_code("+33 6 98 76 54 32").await?;
    println!("a code to another phone: sent");
    Ok(())
}
