//! `name = ...` sets the rejection's name and the key scope: two functions
//! with one name share one counter.

use ratewall::{Limiter, Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 1, key = phone, name = "sms")]
async fn send_code(phone: &str) -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = 60, threshold = 1, key = phone, name = "sms")]
async fn resend_code(phone: &str) -> Result<(), Rejection> {
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    send_code("555").await.unwrap();
    let refused = resend_code("555").await.unwrap_err();
    assert_eq!(refused.name(), "sms");
}
