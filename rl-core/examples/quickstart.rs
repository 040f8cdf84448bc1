//! The README's quick start: an annotated function on the global limiter,
//! in memory. `cargo run --example quickstart`
//!
//! The code below this comment is the README's first example and the
//! crate documentation's, word for word (`ratewall-tests` checks it).

use ratewall::{Limiter, Rejection, rate_limit};

#[rate_limit(period = 30, threshold = 2, key = user_id)]
async fn say_hi(user_id: u64) -> Result<String, Rejection> {
    Ok(format!("hi {user_id}"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    Limiter::builder().memory().prefix("demo").install()?; // once, at startup
    println!("{}", say_hi(7).await?);
    println!("{}", say_hi(7).await?);
    let refused = say_hi(7).await.unwrap_err(); // third call within 30 s: body not run
    // GCRA (the default) spaces 2 per 30 s as one every 15 s after the burst.
    let retry_after = refused.decision().unwrap().retry_after_secs();
    println!("refused by {}, retry after {retry_after} s", refused.name());
    assert_eq!(retry_after, 15);
    assert!(say_hi(8).await.is_ok()); // another user has their own quota
    Ok(())
}
