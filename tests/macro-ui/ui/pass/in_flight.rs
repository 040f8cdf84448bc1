//! `max_in_flight`: alone, beside rate limits, in `also(...)`, with
//! counting; the slot is held while the body runs and given back after.

use std::sync::atomic::{AtomicU64, Ordering};

use ratewall::{Limiter, Rejection, rate_limit};

static RUNNING: AtomicU64 = AtomicU64::new(0);

#[rate_limit(key = tenant, max_in_flight = 1)]
async fn alone(tenant: u64, gate: tokio::sync::oneshot::Receiver<()>) -> Result<u64, Rejection> {
    RUNNING.fetch_add(1, Ordering::SeqCst);
    let _ = gate.await;
    RUNNING.fetch_sub(1, Ordering::SeqCst);
    Ok(tenant)
}

#[rate_limit(
    name = "export",
    key = user,
    limits = ["100/1h"],
    max_in_flight = 2,
    in_flight_ttl = "30s",
    also(name = "export_tenant", key = tenant, max_in_flight = 5, in_flight_ttl = 20),
    count = failures,
)]
async fn beside(user: u64, tenant: u64) -> Result<u64, Rejection> {
    Ok(user + tenant)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    Limiter::builder().memory().install().unwrap();
    let (open, gate) = tokio::sync::oneshot::channel();
    let first = tokio::spawn(alone(7, gate));
    while RUNNING.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let (_, idle) = tokio::sync::oneshot::channel();
    let refused = alone(7, idle).await.unwrap_err();
    assert!(refused.is_in_flight());
    open.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap(), 7);
    let (open, gate) = tokio::sync::oneshot::channel();
    open.send(()).unwrap();
    assert_eq!(alone(7, gate).await.unwrap(), 7, "the slot came back with the return");
    assert_eq!(beside(1, 2).await.unwrap(), 3);
}
