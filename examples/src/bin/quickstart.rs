//! The README's first command: an annotated function on the global limiter.
//!
//! Runs on the in-memory backend, or on Redis when `REDIS_URL` is set.

use std::time::Duration;

use ratewall::{Limiter, Rejection, rate_limit};
use ratewall_examples::StartupError;

/// Two greetings per user every 30 seconds.
#[rate_limit(period = 30, threshold = 2, key = user_id)]
async fn say_hi(user_id: u64) -> Result<String, Rejection> {
    Ok(format!("hi {user_id}"))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratewall_examples::exit_code("quickstart", run().await)
}

async fn run() -> Result<(), StartupError> {
    ratewall_examples::init_tracing();
    let builder = ratewall_examples::builder_from_env(Limiter::builder()).await?;
    ratewall_examples::install(builder.prefix("demo"))?;

    for attempt in 1..=3 {
        match say_hi(7).await {
            Ok(greeting) => println!("attempt {attempt}: {greeting}"),
            Err(rejection) => println!(
                "attempt {attempt}: refused, retry after {:?}",
                rejection.retry_after().unwrap_or(Duration::ZERO)
            ),
        }
    }
    let greeting = say_hi(8)
        .await
        .map_err(|rejection| StartupError::new(rejection.to_string()))?;
    println!("another user: {greeting}");
    Ok(())
}
