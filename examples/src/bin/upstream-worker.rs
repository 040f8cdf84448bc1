//! A worker of the `upstream` showcase (see `ratewall_examples::upstream`):
//! `CONCURRENCY` callers (default 8) for `SECS` seconds (default 60) against
//! the upstream at `UPSTREAM` (default `http://127.0.0.1:3004`), drawing on
//! one budget of `REQUESTS` requests and `TOKENS` tokens per window
//! (default 980 and 19 600, 2 % under the mock upstream's defaults) of
//! `WINDOW_MS` in `BUCKETS` slots (as the upstream counts: default 10 000
//! in 100) in the Redis at `REDIS_URL` (shared by every worker; in memory
//! without it), each request asking for up to `MAX_TOKENS` (default 40).
//! With `AUTO=1` the budget finds the upstream's limit (`Auto`), starting
//! from the stated one. Prints what it did as one JSON line.

use std::sync::Arc;
use std::time::Duration;

use ratewall::{Limiter, upstream::Auto};
use ratewall_examples::StartupError;
use ratewall_examples::upstream::{budget, env_number, shape_from_env, worker};

async fn run() -> Result<(), StartupError> {
    ratewall_examples::init_tracing();
    let learns = env_number("AUTO", 0)? != 0;
    let spec = budget(
        env_number("REQUESTS", 980)?,
        env_number("TOKENS", 19_600)?,
        shape_from_env()?,
    )
    .map_err(|e| StartupError::new(format!("invalid budget: {e}")))?;
    let limiter = ratewall_examples::builder_from_env(Limiter::builder().prefix("upstream"))
        .await?
        .build()
        .map_err(|e| StartupError::new(format!("cannot set up the rate limiter: {e}")))?;
    let auto = match learns {
        false => None,
        true => {
            let margin = env_number("MARGIN_PERCENT", 98)? as f64 / 100.0;
            let auto = Auto::new()
                .margin(margin)
                .map_err(|e| StartupError::new(format!("MARGIN_PERCENT: {e}")))?;
            Some(auto)
        }
    };
    let url = std::env::var("UPSTREAM").unwrap_or_else(|_| "http://127.0.0.1:3004".to_owned());
    let report = worker(
        Arc::new(limiter),
        spec,
        auto,
        url,
        env_number("CONCURRENCY", 8)? as usize,
        env_number("MAX_TOKENS", 40)?,
        Duration::from_secs(env_number("SECS", 60)?),
    )
    .await;
    let line = serde_json::to_string(&report)
        .map_err(|e| StartupError::new(format!("cannot print the report: {e}")))?;
    println!("{line}");
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratewall_examples::exit_code("upstream-worker", run().await)
}
