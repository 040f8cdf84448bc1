//! Without `key`, every call shares one limit.

use ratewall::{Limiter, Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 1)]
async fn ping() -> Result<(), Rejection> {
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    assert!(ping().await.is_ok());
    assert!(ping().await.is_err());
}
