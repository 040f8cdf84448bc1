//! `limiter = ...` takes anything implementing `AsLimiter`: a `Limiter`
//! place, a reference, an `Arc`, a `Box`, or a call returning one of them.

use std::sync::{Arc, LazyLock};

use ratewall::{Limiter, Rejection, rate_limit};

static LIMITER: LazyLock<Limiter> =
    LazyLock::new(|| Limiter::builder().prefix("static").build().unwrap());

fn shared() -> Arc<Limiter> {
    static SHARED: LazyLock<Arc<Limiter>> =
        LazyLock::new(|| Arc::new(Limiter::builder().build().unwrap()));
    SHARED.clone()
}

#[rate_limit(period = 60, threshold = 1, limiter = *LIMITER)]
async fn from_static() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = 60, threshold = 1, limiter = shared())]
async fn from_call() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(period = 60, threshold = 1, key = id, limiter = limiter)]
async fn from_argument(limiter: &Box<Limiter>, id: u8) -> Result<u8, Rejection> {
    Ok(id)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // No global limiter is installed: the custom limiters decide.
    from_static().await.unwrap();
    assert!(from_static().await.is_err());
    from_call().await.unwrap();
    assert!(from_call().await.is_err());
    let boxed = Box::new(Limiter::builder().build().unwrap());
    assert_eq!(from_argument(&boxed, 3).await.unwrap(), 3);
    assert!(from_argument(&boxed, 3).await.is_err());
}
