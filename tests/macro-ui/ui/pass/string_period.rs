//! Periods written as duration strings in every unit.

use ratewall::{Limiter, Rejection, rate_limit};

#[rate_limit(period = "250us", threshold = 1)]
async fn micros() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = "500ms", threshold = 5)]
async fn millis() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = "30s", threshold = 5)]
async fn seconds() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = "1m", threshold = 5)]
async fn minute() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = "1h", threshold = 5)]
async fn hour() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = "1d", threshold = 5)]
async fn day() -> Result<(), Rejection> {
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    micros().await.unwrap();
    millis().await.unwrap();
    seconds().await.unwrap();
    minute().await.unwrap();
    hour().await.unwrap();
    day().await.unwrap();
    let refused = hour().await;
    assert!(refused.is_ok(), "5 per hour with a burst of 5");
}
