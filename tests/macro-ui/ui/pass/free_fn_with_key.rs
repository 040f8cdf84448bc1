//! A free function limited per user, with the key taken from an argument.

use ratewall::{Limiter, Rejection, rate_limit};

#[rate_limit(period = 30, threshold = 2, key = user_id)]
async fn say_hi(user_id: u64) -> Result<String, Rejection> {
    Ok(format!("hi {user_id}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    assert_eq!(say_hi(7).await.unwrap(), "hi 7");
    assert!(say_hi(7).await.is_ok());
    assert!(say_hi(7).await.is_err());
    assert!(say_hi(8).await.is_ok());
}
