use std::time::Duration;

use ratewall::{Limiter, Rejection, rate_limit};

// A bucket (reserves a slot), a window (retries), several keys of one kind.
#[rate_limit(period = 1, threshold = 10, burst = 1, algorithm = leaky_bucket, key = id, wait = "2s")]
async fn smooth(id: u64) -> Result<u64, Rejection> {
    Ok(id)
}

#[rate_limit(limits = ["5/1s", "100/1m"], algorithm = sliding_log, key = id, wait = 3)]
async fn windowed(id: u64) -> Result<u64, Rejection> {
    Ok(id)
}

#[rate_limit(
    name = "jobs_tenant",
    key = tenant,
    limits = ["10/1s"],
    wait = "500ms",
    also(name = "jobs_all", limits = ["100/1s"], algorithm = token_bucket),
    headers,
    on_reject = |r| Err(r)
)]
async fn job(tenant: String) -> Result<axum::response::Response, Rejection> {
    let _ = tenant;
    Ok(axum::response::Response::new(axum::body::Body::empty()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    let started = std::time::Instant::now();
    for _ in 0..3 {
        smooth(1).await.unwrap();
    }
    assert!(started.elapsed() >= Duration::from_millis(200));
    windowed(1).await.unwrap();
    job("t".into()).await.unwrap();
}
