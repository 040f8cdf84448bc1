//! The README's first command: an annotated function on the global limiter.
//!
//! Runs on the in-memory backend, or on Redis when `REDIS_URL` is set.

use std::time::Duration;

use rl_core::{Limiter, Rejection, rate_limit};

/// Two greetings per user every 30 seconds.
#[rate_limit(period = 30, threshold = 2, key = user_id)]
async fn say_hi(user_id: u64) -> Result<String, Rejection> {
    Ok(format!("hi {user_id}"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    rl_examples::init_tracing();
    let builder = rl_examples::builder_from_env(Limiter::builder()).await?;
    builder.prefix("demo").install()?;

    for attempt in 1..=3 {
        match say_hi(7).await {
            Ok(greeting) => println!("attempt {attempt}: {greeting}"),
            Err(rejection) => println!(
                "attempt {attempt}: refused, retry after {:?}",
                rejection.retry_after().unwrap_or(Duration::ZERO)
            ),
        }
    }
    println!("another user: {}", say_hi(8).await?);
    Ok(())
}
