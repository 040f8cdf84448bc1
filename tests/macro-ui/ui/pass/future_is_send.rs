//! A rate-limited function's future is `Send` (the key is rendered before
//! the first await, so no `&dyn Display` is held across it): it can be
//! spawned on a multi-threaded runtime and used as an axum handler.

use ratewall::{Limiter, Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 5, key = user_id)]
async fn handler(user_id: u64) -> Result<u64, Rejection> {
    Ok(user_id)
}

fn assert_send<T: Send>(value: T) -> T {
    value
}

#[tokio::main]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    let task = tokio::spawn(assert_send(handler(7)));
    assert_eq!(task.await.unwrap().unwrap(), 7);
}
