//! `lease = N` on the function's limits and on an `also(...)` group.

use ratewall::{Limiter, Rejection, rate_limit};

#[rate_limit(period = 60, threshold = 1_000_000, key = tenant, algorithm = fixed_window, lease = 10_000)]
async fn hot(tenant: u64) -> Result<u64, Rejection> {
    Ok(tenant)
}

#[rate_limit(
    name = "api_key",
    key = api_key,
    limits = ["600/1m", "10000/1d"],
    lease = 50,
    also(name = "api_ip", key = ip, limits = ["1000/1m"], algorithm = token_bucket, lease = 100)
)]
async fn api(api_key: String, ip: String) -> Result<usize, Rejection> {
    Ok(api_key.len() + ip.len())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    // On the memory store every call is decided in process anyway.
    assert_eq!(hot(7).await.unwrap(), 7);
    assert_eq!(api("k".into(), "ip".into()).await.unwrap(), 3);
}
