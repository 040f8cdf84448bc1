//! `limits = [...]`: several limits on one key, decided together; with the
//! other arguments applying to each limit.

use ratewall::{Algorithm, Limiter, Rejection, rate_limit};

#[rate_limit(limits = ["1/1m", "5/1h", "10/1d"], key = phone)]
async fn sms(phone: &str) -> Result<(), Rejection> {
    let _ = phone;
    Ok(())
}

#[rate_limit(limits = ["2/1m", "3/h"], algorithm = sliding_window, slots = 6, cost = 2)]
async fn windowed() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(limits = ["10/30s"], algorithm = token_bucket, burst = 4, name = "bucket")]
async fn bucket() -> Result<(), Rejection> {
    Ok(())
}

/// The words other limiters use: `10/minute`, `1000 per hour`, `5 per 30
/// seconds`, read as `10/1m`, `1000/1h`, `5/30s` (checked at compile time
/// all the same).
#[rate_limit(limits = ["10/minute", "1000 per hour", "5 per 30 seconds"], key = user, name = "words")]
async fn worded(user: u64) -> Result<(), Rejection> {
    let _ = user;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    sms("+1").await.unwrap();
    let refused = sms("+1").await.unwrap_err();
    assert_eq!(
        refused.limit().unwrap().threshold(),
        1,
        "the minute limit binds"
    );
    windowed().await.unwrap();
    let refused = windowed().await.unwrap_err();
    assert_eq!(
        refused.limit().unwrap().algorithm(),
        Algorithm::SlidingWindow
    );
    for _ in 0..4 {
        bucket().await.unwrap();
    }
    assert_eq!(bucket().await.unwrap_err().limit().unwrap().burst(), 4);
    for _ in 0..5 {
        worded(1).await.unwrap();
    }
    let refused = worded(1).await.unwrap_err().limit().unwrap().clone();
    assert_eq!(
        (refused.threshold(), refused.period()),
        (5, std::time::Duration::from_secs(30)),
        "5 per 30 seconds binds first"
    );
}
